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

// OverlayRoutes returns the routes that send each IPv4 prefix into isthmus0 with
// source src (no source when src is invalid). Non-IPv4 prefixes are left out.
func OverlayRoutes(prefixes []netip.Prefix, overlayIfindex int, src netip.Addr) []Route {
	var out []Route
	if !src.Unmap().Is4() {
		src = netip.Addr{}
	}
	for _, p := range prefixes {
		if !p.Addr().Unmap().Is4() {
			continue
		}
		out = append(out, Route{Prefix: netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked(), Ifindex: overlayIfindex, Src: src.Unmap()})
	}
	return out
}

// ThrowRoutes returns a throw route for each IPv4 prefix; others are left out.
func ThrowRoutes(prefixes []netip.Prefix) []Route {
	var out []Route
	for _, p := range prefixes {
		if p.Addr().Unmap().Is4() {
			out = append(out, Route{Prefix: netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked(), Throw: true})
		}
	}
	return out
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

// List returns the IPv4 routes with protocol 201 in the table.
func (k KernelRoutes) List() ([]Route, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Protocol: RouteProtocol, Table: k.table()},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
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

func (k KernelRoutes) nl(r Route) *netlink.Route {
	if r.Throw {
		return &netlink.Route{
			Type:     unix.RTN_THROW,
			Dst:      &net.IPNet{IP: r.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(r.Prefix.Bits(), 32)},
			Protocol: RouteProtocol,
			Table:    k.table(),
		}
	}
	nr := &netlink.Route{
		LinkIndex: r.Ifindex,
		Dst:       &net.IPNet{IP: r.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(r.Prefix.Bits(), 32)},
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
