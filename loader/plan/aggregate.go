package plan

import (
	"fmt"
	"net/netip"
	"slices"
)

// AggregatePrefixes returns the smallest sorted list of prefixes I could find
// that holds exactly the addresses of ps: duplicates and prefixes inside
// another dropped, two halves of a prefix merged into it, repeatedly.
func AggregatePrefixes(ps []netip.Prefix) []netip.Prefix {
	if len(ps) < 2 || minimal(ps) {
		return ps
	}
	return mergePrefixes(ps)
}

// mergePrefixes is AggregatePrefixes without the check for a list that is
// minimal already. One sweep in address order (the holder of an address
// first) with a stack of kept prefixes: a prefix inside the last kept one is
// dropped, and two kept halves of one prefix become it, repeatedly. The
// hash map it replaces needed a pass per merged bit over every prefix; a
// hub gateway's allowed sources are thousands.
func mergePrefixes(ps []netip.Prefix) []netip.Prefix {
	sorted := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		sorted[i] = p.Masked()
	}
	sortPrefixes(sorted)
	// out shares sorted's array: it never grows past the element read.
	out := sorted[:0]
	for _, p := range sorted {
		// Kept prefixes are disjoint and ascending: only the last can hold p.
		if n := len(out); n > 0 && out[n-1].Bits() <= p.Bits() && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
		for n := len(out); n >= 2; n = len(out) {
			if s, ok := sibling(out[n-1]); !ok || s != out[n-2] {
				break
			}
			out = append(out[:n-2], parent(out[n-1]))
		}
	}
	return out
}

// prefixMap is a map keyed by prefix that finds the longest prefix holding
// another by trying only the lengths it holds (a plan's tables have a few:
// /16 blocks, /24 podCIDRs, /32 addresses), not all 32 or 128.
type prefixMap[V any] struct {
	m       map[netip.Prefix]V
	lengths [129]int // keys of each length
}

func newPrefixMap[V any](n int) *prefixMap[V] {
	return &prefixMap[V]{m: make(map[netip.Prefix]V, n)}
}

func (pm *prefixMap[V]) has(p netip.Prefix) bool { _, ok := pm.m[p]; return ok }

func (pm *prefixMap[V]) put(p netip.Prefix, v V) {
	if _, ok := pm.m[p]; !ok {
		pm.lengths[p.Bits()]++
	}
	pm.m[p] = v
}

func (pm *prefixMap[V]) remove(p netip.Prefix) {
	if _, ok := pm.m[p]; ok {
		pm.lengths[p.Bits()]--
		delete(pm.m, p)
	}
}

// covering returns the value of the longest key strictly containing p.
func (pm *prefixMap[V]) covering(p netip.Prefix) (V, bool) {
	for bits := p.Bits() - 1; bits >= 0; bits-- {
		if pm.lengths[bits] == 0 {
			continue
		}
		if v, ok := pm.m[netip.PrefixFrom(p.Addr(), bits).Masked()]; ok {
			return v, true
		}
	}
	var zero V
	return zero, false
}

// minimal reports whether ps is sorted, masked and already the smallest
// list: no prefix overlaps an earlier one and no two neighbours are halves
// of one prefix. Most allowed-source lists of a plan are (a podCIDR and a
// tunnel address), and this check costs no map. Prefixes either nest or are
// disjoint, so in sorted order a prefix inside an earlier one is inside the
// last one that was inside none.
func minimal(ps []netip.Prefix) bool {
	reach := ps[0]
	if reach.Masked() != reach {
		return false
	}
	for i, p := range ps[1:] {
		if p.Masked() != p || comparePrefix(ps[i], p) >= 0 || reach.Contains(p.Addr()) {
			return false
		}
		if s, ok := sibling(p); ok && s == ps[i] {
			return false
		}
		reach = p
	}
	return true
}

// target is what a route sends to: routes with equal targets may merge.
// The remote site is part of it: a group's members are chosen per site (a
// gateway may reach one site and not another), so routes to two sites never
// merge even through the same gateways. Comparable, so the aggregation
// compares targets without formatting them.
type target struct {
	peer     string
	via      netip.Addr
	transit  bool
	underlay bool
	site     string
	group    string // the group's members, "peer via" joined by "|"
}

// routeTarget returns r's target.
func routeTarget(r Route) target {
	t := target{peer: r.Peer, via: r.Via, transit: r.TransitOnly, underlay: r.Underlay, site: r.Site}
	if len(r.Group) > 0 {
		// One allocation: this runs for every route of a hub node.
		b := make([]byte, 0, len(r.Group)*32)
		for _, h := range r.Group {
			b = append(b, h.Peer...)
			b = append(b, ' ')
			b = h.Via.AppendTo(b)
			b = append(b, '|')
		}
		t.group = string(b)
	}
	return t
}

// targeted is a route with its target computed once.
type targeted struct {
	route  Route
	target target
	// merged counts the routes folded into this one, besides itself.
	merged int
}

// aggregateRoutes returns routes that send every address where routes do (by
// longest prefix match) with fewer entries: a route inside a shorter one
// with the same target, where nothing between them sends elsewhere, is
// dropped; two halves with the same target become their parent (which
// replaces a parent route they shadow). The merged route keeps the origin of
// its first part, with the number of the others. Sorted by prefix.
func aggregateRoutes(routes []Route) []Route {
	if len(routes) < 2 {
		return routes
	}
	return withOrigins(aggregateTargeted(targetedOf(routes)))
}

// targetedOf returns routes with their targets, in one allocation (not one
// per route).
func targetedOf(routes []Route) []targeted {
	slab := make([]targeted, len(routes))
	for i, r := range routes {
		slab[i] = targeted{route: r, target: routeTarget(r)}
	}
	return slab
}

// aggregateTargeted is aggregateRoutes on routes with their targets and the
// counts of routes already folded into them (see Cache.aggregate), before
// the origins name those counts. It changes the entries of ts.
func aggregateTargeted(ts []targeted) []targeted {
	byPrefix := newPrefixMap[*targeted](len(ts))
	var byLength [129][]netip.Prefix
	for i := range ts {
		p := ts[i].route.Prefix
		byPrefix.put(p, &ts[i])
		byLength[p.Bits()] = append(byLength[p.Bits()], p)
	}
	// One pass, longest first: halves merge before their parent's length is
	// looked at (a merge adds the parent to the next, shorter length), and
	// nothing done at a shorter length changes where a longer prefix's
	// covering route sends (a dropped route was covered by one with its
	// target, a merged parent has its halves' target), so nothing longer
	// needs a second look.
	for bits := len(byLength) - 1; bits >= 0; bits-- {
		// In any order: a merge at this length neither needs nor changes
		// another's route at it, and a covering route is shorter.
		for _, p := range byLength[bits] {
			r, ok := byPrefix.m[p]
			if !ok {
				continue
			}
			if c, ok := byPrefix.covering(p); ok && c.target == r.target {
				c.merged += 1 + r.merged
				byPrefix.remove(p)
				continue
			}
			s, ok := sibling(p)
			if !ok {
				continue
			}
			if o, ok := byPrefix.m[s]; ok && o.target == r.target {
				first, second := r, o
				if comparePrefix(s, p) < 0 {
					first, second = o, r
				}
				up := &targeted{route: first.route, target: r.target, merged: 1 + first.merged + second.merged}
				up.route.Prefix = parent(p)
				up.route.Group = slices.Clone(first.route.Group)
				old, replaced := byPrefix.m[up.route.Prefix]
				if replaced && old.target == r.target {
					up.merged += 1 + old.merged // the same target: folded in too
				}
				byPrefix.remove(p)
				byPrefix.remove(s)
				byPrefix.put(up.route.Prefix, up)
				if !replaced {
					byLength[bits-1] = append(byLength[bits-1], up.route.Prefix)
				}
			}
		}
	}
	out := make([]targeted, 0, len(byPrefix.m))
	for _, t := range byPrefix.m {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b targeted) int { return comparePrefix(a.route.Prefix, b.route.Prefix) })
	return out
}

// withOrigins returns the routes of ts, each merged one's origin followed by
// the number of routes folded into it.
func withOrigins(ts []targeted) []Route {
	out := make([]Route, len(ts))
	for i, t := range ts {
		out[i] = t.route
		if t.merged > 0 {
			out[i].Origin = fmt.Sprintf("%s and %d more", t.route.Origin, t.merged)
		}
	}
	return out
}

// sibling returns the other half of p's parent; false for a /0.
func sibling(p netip.Prefix) (netip.Prefix, bool) {
	if p.Bits() == 0 {
		return netip.Prefix{}, false
	}
	lo, hi := halves(parent(p))
	if lo == p {
		return hi, true
	}
	return lo, true
}

// parent returns the prefix one bit shorter that holds p.
func parent(p netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked()
}
