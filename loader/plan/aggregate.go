package plan

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// AggregatePrefixes returns the smallest sorted list of prefixes I could find
// that holds exactly the addresses of ps: duplicates and prefixes inside
// another dropped, two halves of a prefix merged into it, repeatedly.
func AggregatePrefixes(ps []netip.Prefix) []netip.Prefix {
	if len(ps) < 2 {
		return ps
	}
	set := make(map[netip.Prefix]bool, len(ps))
	for _, p := range ps {
		set[p.Masked()] = true
	}
	for {
		changed := false
		for _, p := range slices.Collect(maps.Keys(set)) {
			if !set[p] {
				continue
			}
			if coveringKey(set, p) {
				delete(set, p)
				changed = true
				continue
			}
			if s, ok := sibling(p); ok && set[s] {
				delete(set, p)
				delete(set, s)
				set[parent(p)] = true
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	out := slices.Collect(maps.Keys(set))
	sortPrefixes(out)
	return out
}

// routeTarget is what a route sends to: routes with equal targets may merge.
// The remote site is part of it: a group's members are chosen per site (a
// gateway may reach one site and not another), so routes to two sites never
// merge even through the same gateways.
func routeTarget(r Route) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%v|%s", r.Peer, r.Via, r.TransitOnly, r.Site)
	for _, h := range r.Group {
		fmt.Fprintf(&b, "|%s %s", h.Peer, h.Via)
	}
	return b.String()
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
	byPrefix := make(map[netip.Prefix]Route, len(routes))
	merged := make(map[netip.Prefix]int) // routes folded into each, besides itself
	for _, r := range routes {
		byPrefix[r.Prefix] = r
	}
	for {
		changed := false
		keys := slices.Collect(maps.Keys(byPrefix))
		// Longest first, so halves merge before their parents are looked at.
		slices.SortFunc(keys, func(a, b netip.Prefix) int { return b.Bits() - a.Bits() })
		for _, p := range keys {
			r, ok := byPrefix[p]
			if !ok {
				continue
			}
			t := routeTarget(r)
			if c, ok := nearestCovering(byPrefix, p); ok && routeTarget(c) == t {
				merged[c.Prefix] += 1 + merged[p]
				delete(byPrefix, p)
				delete(merged, p)
				changed = true
				continue
			}
			s, ok := sibling(p)
			if !ok {
				continue
			}
			if o, ok := byPrefix[s]; ok && routeTarget(o) == t {
				first, second := r, o
				if comparePrefix(s, p) < 0 {
					first, second = o, r
				}
				up := first
				up.Prefix = parent(p)
				up.Group = slices.Clone(first.Group)
				n := 1 + merged[first.Prefix] + merged[second.Prefix]
				if old, ok := byPrefix[up.Prefix]; ok && routeTarget(old) == t {
					n += 1 + merged[up.Prefix] // the same target: folded in too
				}
				delete(byPrefix, p)
				delete(byPrefix, s)
				delete(merged, p)
				delete(merged, s)
				byPrefix[up.Prefix] = up
				merged[up.Prefix] = n
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	out := make([]Route, 0, len(byPrefix))
	for p, r := range byPrefix {
		if n := merged[p]; n > 0 {
			r.Origin = fmt.Sprintf("%s and %d more", r.Origin, n)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	return out
}

// nearestCovering returns the route of the longest prefix strictly
// containing p.
func nearestCovering(byPrefix map[netip.Prefix]Route, p netip.Prefix) (Route, bool) {
	for bits := p.Bits() - 1; bits >= 0; bits-- {
		if r, ok := byPrefix[netip.PrefixFrom(p.Addr(), bits).Masked()]; ok {
			return r, true
		}
	}
	return Route{}, false
}

// coveringKey reports whether a prefix strictly containing p is in set.
func coveringKey(set map[netip.Prefix]bool, p netip.Prefix) bool {
	for bits := p.Bits() - 1; bits >= 0; bits-- {
		if set[netip.PrefixFrom(p.Addr(), bits).Masked()] {
			return true
		}
	}
	return false
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
