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

// Route is one agent route: Prefix dev Ifindex [src Src] proto 201 scope
// link, or with Throw `throw Prefix proto 201` (no device, no source): in the
// pods' table (PodTable) a throw route ends the table's lookup without a
// match, so the kernel goes on to the next rule's table (main), where the
// prefix reaches the underlay. It is how an exception inside a transit-only
// route (plan.Route.Underlay) reads in the kernel.
type Route struct {
	Prefix  netip.Prefix
	Ifindex int
	Src     netip.Addr
	Throw   bool
}

func (r Route) String() string {
	if r.Throw {
		return fmt.Sprintf("throw %v proto 201", r.Prefix)
	}
	s := fmt.Sprintf("%v dev#%d", r.Prefix, r.Ifindex)
	if r.Src.IsValid() {
		s += " src " + r.Src.String()
	}
	return s + " proto 201"
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
		if c, ok := cur[p]; !ok || c != r {
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
// the main table when Table is zero, else that table (PodTable).
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
		out = append(out, Route{Prefix: netip.PrefixFrom(ip.Unmap(), ones), Ifindex: r.LinkIndex, Src: src, Throw: r.Type == unix.RTN_THROW})
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
