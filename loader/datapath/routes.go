package datapath

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RouteProtocol marks the routes the agent owns (rtnetlink protocol "isthmus").
const RouteProtocol = 201

var errAddrNotAvail = unix.EADDRNOTAVAIL

// Route is one agent route: Prefix dev Ifindex [src Src] proto 201 scope link
// into isthmus0 (main and PodTable); with Via, Prefix through the gateways in
// Via on the underlay device Ifindex [mtu MTU] proto 201 (FabricTable; one
// gateway, or a multipath route over several); or with Throw `throw Prefix
// proto 201` (no device, no source): a throw route ends the table's lookup
// without a match, so the kernel goes on to the next rule's table (main),
// where the prefix reaches the underlay. It is how an exception inside a
// transit-only route (plan.Route.Underlay) reads in the kernel.
type Route struct {
	Prefix  netip.Prefix
	Ifindex int
	Src     netip.Addr
	// Via are the next hops, sorted; none for a route straight into a device.
	Via []netip.Addr
	// MTU is the route's MTU metric, 0 for none.
	MTU   int
	Throw bool
}

func (r Route) String() string {
	if r.Throw {
		return fmt.Sprintf("throw %v proto 201", r.Prefix)
	}
	s := fmt.Sprintf("%v", r.Prefix)
	for _, v := range r.Via {
		s += " via " + v.String()
	}
	s += fmt.Sprintf(" dev#%d", r.Ifindex)
	if r.Src.IsValid() {
		s += " src " + r.Src.String()
	}
	if r.MTU != 0 {
		s += fmt.Sprintf(" mtu %d", r.MTU)
	}
	return s + " proto 201"
}

// Equal reports whether two routes are the same.
func (r Route) Equal(o Route) bool {
	return r.Prefix == o.Prefix && r.Ifindex == o.Ifindex && r.Src == o.Src && r.MTU == o.MTU && r.Throw == o.Throw &&
		slices.Equal(r.Via, o.Via)
}

// RouteTable is the kernel's main table as the route sync sees it: only the routes
// with protocol 201.
type RouteTable interface {
	List() ([]Route, error)
	// Replace adds or overwrites the route for r.Prefix.
	Replace(r Route) error
	// Delete removes the route; a route already gone is not an error.
	Delete(r Route) error
}

// FabricRoutes returns the routes that send each IPv4 prefix over the
// underlay device underlayIfindex to its gateways (the IPv4 addresses among
// them, sorted; a prefix with none is left out), with the route MTU mtu (0:
// none), for FabricTable.
func FabricRoutes(prefixes []netip.Prefix, gateways [][]netip.Addr, underlayIfindex, mtu int) []Route {
	var out []Route
	for i, p := range prefixes {
		if !p.Addr().Unmap().Is4() {
			continue
		}
		var via []netip.Addr
		for _, g := range gateways[i] {
			if g = g.Unmap(); g.Is4() {
				via = append(via, g)
			}
		}
		if len(via) == 0 {
			continue
		}
		slices.SortFunc(via, netip.Addr.Compare)
		out = append(out, Route{Prefix: netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked(),
			Ifindex: underlayIfindex, Via: slices.Compact(via), MTU: mtu})
	}
	return out
}

// OverlayRoutes returns the routes that send each prefix (either family) into
// isthmus0, with source src for the prefixes of src's family (none for the others,
// or when src is invalid).
func OverlayRoutes(prefixes []netip.Prefix, overlayIfindex int, src netip.Addr) []Route {
	var out []Route
	src = src.Unmap()
	for _, p := range prefixes {
		p, ok := unmapPrefix(p)
		if !ok {
			continue
		}
		r := Route{Prefix: p, Ifindex: overlayIfindex}
		if src.IsValid() && src.Is4() == p.Addr().Is4() {
			r.Src = src
		}
		out = append(out, r)
	}
	return out
}

// ThrowRoutes returns a throw route for each prefix (either family).
func ThrowRoutes(prefixes []netip.Prefix) []Route {
	var out []Route
	for _, p := range prefixes {
		if p, ok := unmapPrefix(p); ok {
			out = append(out, Route{Prefix: p, Throw: true})
		}
	}
	return out
}

// unmapPrefix returns p masked, an IPv4-mapped one as IPv4, and whether p is valid.
func unmapPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	bits := p.Bits()
	if p.Addr().Is4In6() {
		bits -= 96
		if bits < 0 {
			return netip.Prefix{}, false
		}
	}
	return netip.PrefixFrom(p.Addr().Unmap(), bits).Masked(), true
}

// DiffRoutes returns the routes to add or replace (in desired but not identical in
// current) and those to delete (prefix in current only), each sorted by prefix.
func DiffRoutes(current, desired []Route) (replace, del []Route) {
	cur := map[netip.Prefix]Route{}
	for _, r := range current {
		cur[r.Prefix] = r
	}
	want := map[netip.Prefix]Route{}
	for _, r := range desired {
		want[r.Prefix] = r
	}
	for p, r := range want {
		if c, ok := cur[p]; !ok || !c.Equal(r) {
			replace = append(replace, r)
		}
	}
	for p, r := range cur {
		if _, ok := want[p]; !ok {
			del = append(del, r)
		}
	}
	byPrefix := func(a, b Route) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits())
	}
	slices.SortFunc(replace, byPrefix)
	slices.SortFunc(del, byPrefix)
	return replace, del
}

// RouteResult counts what SyncRoutes changed.
type RouteResult struct {
	Replaced, Deleted int
}

// SyncRoutes brings t to desired by difference: adds and replaces first, then
// deletes. It stops at the first error and returns what it did up to there.
func SyncRoutes(t RouteTable, desired []Route) (RouteResult, error) {
	var res RouteResult
	current, err := t.List()
	if err != nil {
		return res, err
	}
	replace, del := DiffRoutes(current, desired)
	for _, r := range replace {
		if err := t.Replace(r); err != nil {
			return res, fmt.Errorf("replace route %v: %w", r, err)
		}
		res.Replaced++
	}
	for _, r := range del {
		if err := t.Delete(r); err != nil {
			return res, fmt.Errorf("delete route %v: %w", r, err)
		}
		res.Deleted++
	}
	return res, nil
}

// KernelRoutes is a routing table of the calling thread's network namespace:
// the main table when Table is zero, else that table (PodTable, FabricTable).
type KernelRoutes struct {
	Table int
}

func (k KernelRoutes) table() int {
	if k.Table == 0 {
		return unix.RT_TABLE_MAIN
	}
	return k.Table
}

var _ RouteTable = KernelRoutes{}

// List returns the routes (both families) with protocol 201 in the table.
func (k KernelRoutes) List() ([]Route, error) {
	var rs []netlink.Route
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		f, err := netlink.RouteListFiltered(family,
			&netlink.Route{Protocol: RouteProtocol, Table: k.table()},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		rs = append(rs, f...)
	}
	var out []Route
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		var src netip.Addr
		if s, ok := netip.AddrFromSlice(r.Src); ok {
			src = s.Unmap()
		}
		rt := Route{Prefix: netip.PrefixFrom(ip.Unmap(), ones), Ifindex: r.LinkIndex, Src: src, MTU: r.MTU, Throw: r.Type == unix.RTN_THROW}
		if rt.Throw {
			rt.Ifindex = 0 // the kernel hangs an IPv6 throw route on lo
		}
		if gw, ok := netip.AddrFromSlice(r.Gw); ok {
			rt.Via = append(rt.Via, gw.Unmap())
		}
		for _, nh := range r.MultiPath {
			if gw, ok := netip.AddrFromSlice(nh.Gw); ok {
				rt.Via = append(rt.Via, gw.Unmap())
				rt.Ifindex = nh.LinkIndex
			}
		}
		slices.SortFunc(rt.Via, netip.Addr.Compare)
		out = append(out, rt)
	}
	return out, nil
}

// prefixNet returns p as a net.IPNet of its own family.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func (k KernelRoutes) nl(r Route) *netlink.Route {
	if r.Throw {
		return &netlink.Route{
			Type:     unix.RTN_THROW,
			Dst:      prefixNet(r.Prefix),
			Protocol: RouteProtocol,
			Table:    k.table(),
		}
	}
	nr := &netlink.Route{
		LinkIndex: r.Ifindex,
		Dst:       prefixNet(r.Prefix),
		Protocol:  RouteProtocol,
		Scope:     netlink.SCOPE_LINK,
		Table:     k.table(),
	}
	if r.Src.IsValid() {
		nr.Src = r.Src.AsSlice()
	}
	nr.MTU = r.MTU
	switch {
	case len(r.Via) == 1:
		nr.Scope = netlink.SCOPE_UNIVERSE
		nr.Gw = r.Via[0].AsSlice()
	case len(r.Via) > 1:
		nr.Scope, nr.LinkIndex = netlink.SCOPE_UNIVERSE, 0
		for _, v := range r.Via {
			nr.MultiPath = append(nr.MultiPath, &netlink.NexthopInfo{LinkIndex: r.Ifindex, Gw: v.AsSlice()})
		}
	}
	return nr
}

// Replace adds or overwrites the route for r.Prefix.
func (k KernelRoutes) Replace(r Route) error {
	return netlink.RouteReplace(k.nl(r))
}

// Delete removes the route; ESRCH (already gone) is success.
func (k KernelRoutes) Delete(r Route) error {
	err := netlink.RouteDel(k.nl(r))
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}
