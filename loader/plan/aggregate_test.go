package plan

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// oracleRoute is a plain longest-prefix match by linear scan over the
// unaggregated routes, independent of the aggregation's maps and merges.
func oracleRoute(routes []Route, a netip.Addr) (target, bool) {
	best := -1
	var t target
	for _, r := range routes {
		if r.Prefix.Contains(a) && r.Prefix.Bits() > best {
			best, t = r.Prefix.Bits(), routeTarget(r)
		}
	}
	return t, best >= 0
}

func oracleContains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// randomPrefix returns a prefix inside 10.0.0.0/20 of length 20-32, so
// random tables overlap, nest and sit side by side often.
func randomPrefix(r *rand.Rand) netip.Prefix {
	a := netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(16)), byte(r.IntN(256))})
	return netip.PrefixFrom(a, 20+r.IntN(13)).Masked()
}

// probes returns random addresses plus the first and last address of every
// prefix given and their neighbours: where an aggregation error would show.
func probes(r *rand.Rand, ps []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for range 200 {
		out = append(out, netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(17)), byte(r.IntN(256))}))
	}
	for _, p := range ps {
		first := p.Masked().Addr()
		last := lastAddr(p)
		out = append(out, first, first.Prev(), last, last.Next())
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(b)
}

// TestAggregateRoutesProperty: for random route tables (nested, adjacent,
// duplicated prefixes to three peers, a group and transit-only routes), the
// aggregated table sends every probed address where the original does, and is
// no larger; aggregating again changes nothing.
func TestAggregateRoutesProperty(t *testing.T) {
	targets := []Route{
		{Peer: "n1", Via: netip.MustParseAddr("172.16.0.1")},
		{Peer: "n2", Via: netip.MustParseAddr("172.16.0.2")},
		{Peer: "n3", Via: netip.MustParseAddr("172.16.0.3")},
		{Group: []NextHop{{Peer: "g1", Via: netip.MustParseAddr("172.16.1.1")}, {Peer: "g2", Via: netip.MustParseAddr("172.16.1.2")}}},
		{Group: []NextHop{{Peer: "g1", Via: netip.MustParseAddr("172.16.1.1")}, {Peer: "g2", Via: netip.MustParseAddr("172.16.1.2")}}, TransitOnly: true},
	}
	for seed := range uint64(600) {
		r := rand.New(rand.NewPCG(seed, 2))
		var routes []Route
		seen := map[netip.Prefix]bool{}
		for range 1 + r.IntN(40) {
			rt := targets[r.IntN(len(targets))]
			rt.Prefix = randomPrefix(r)
			if o := routes; r.IntN(4) == 0 && len(o) > 0 && o[len(o)-1].Prefix.Bits() < 32 { // a half of the last
				lo, hi := halves(o[len(o)-1].Prefix)
				rt.Prefix = []netip.Prefix{lo, hi}[r.IntN(2)]
			}
			if seen[rt.Prefix] {
				continue // one route per prefix, as dedupeRoutes leaves it
			}
			seen[rt.Prefix] = true
			rt.Origin = "test"
			routes = append(routes, rt)
		}
		agg := aggregateRoutes(append([]Route(nil), routes...))
		if len(agg) > len(routes) {
			t.Fatalf("seed %d: %d routes became %d", seed, len(routes), len(agg))
		}
		var ps []netip.Prefix
		for _, x := range append(append([]Route(nil), routes...), agg...) {
			ps = append(ps, x.Prefix)
		}
		for _, a := range probes(r, ps) {
			wt, wok := oracleRoute(routes, a)
			gt, gok := oracleRoute(agg, a)
			if wt != gt || wok != gok {
				t.Fatalf("seed %d: %s goes to %+v (%v) aggregated, %+v (%v) before\nbefore: %v\nafter: %v", seed, a, gt, gok, wt, wok, routes, agg)
			}
		}
		if again := aggregateRoutes(append([]Route(nil), agg...)); len(again) != len(agg) {
			t.Fatalf("seed %d: aggregating twice gives %d then %d routes", seed, len(agg), len(again))
		}
	}
}

// TestAggregatePrefixesProperty: for random prefix sets, the aggregate holds
// exactly the probed addresses the original holds, has no prefix inside
// another and no two halves of one prefix.
func TestAggregatePrefixesProperty(t *testing.T) {
	for seed := range uint64(600) {
		r := rand.New(rand.NewPCG(seed, 3))
		var ps []netip.Prefix
		for range 1 + r.IntN(40) {
			ps = append(ps, randomPrefix(r))
		}
		agg := AggregatePrefixes(append([]netip.Prefix(nil), ps...))
		// The shortcut for lists minimal already agrees with the merge: an
		// aggregate is minimal, and a sorted list it calls minimal is what
		// the merge returns.
		if len(agg) > 0 && !minimal(agg) {
			t.Fatalf("seed %d: aggregate %v not called minimal", seed, agg)
		}
		if sorted := sortedUnique(append([]netip.Prefix(nil), ps...)); minimal(sorted) &&
			!slices.Equal(mergePrefixes(append([]netip.Prefix(nil), sorted...)), sorted) {
			t.Fatalf("seed %d: %v called minimal, merged to %v", seed, sorted, mergePrefixes(sorted))
		}
		for _, a := range probes(r, append(append([]netip.Prefix(nil), ps...), agg...)) {
			if oracleContains(ps, a) != oracleContains(agg, a) {
				t.Fatalf("seed %d: %s in aggregate %v, in original %v\noriginal %v\naggregate %v", seed, a, oracleContains(agg, a), oracleContains(ps, a), ps, agg)
			}
		}
		for i, a := range agg {
			for j, b := range agg {
				if i == j {
					continue
				}
				if a.Overlaps(b) {
					t.Fatalf("seed %d: %s and %s overlap in %v", seed, a, b, agg)
				}
				if s, _ := sibling(a); s == b {
					t.Fatalf("seed %d: halves %s and %s not merged in %v", seed, a, b, agg)
				}
			}
		}
	}
}

// TestAggregateExamples: the fleet case of issue 12 (100 /24 podCIDRs of a
// site behind one gateway group become the few prefixes that cover them) and
// a hole that must stay.
func TestAggregateExamples(t *testing.T) {
	g := []NextHop{{Peer: "gw", Via: netip.MustParseAddr("172.16.0.1")}}
	var routes []Route
	for i := range 100 {
		routes = append(routes, Route{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 7, byte(i), 0}), 24), Group: g, Origin: "n"})
	}
	got := aggregateRoutes(routes)
	var prefixes []string
	for _, r := range got {
		prefixes = append(prefixes, r.Prefix.String())
	}
	if want := "[10.7.0.0/18 10.7.64.0/19 10.7.96.0/22]"; fmtList(prefixes) != want {
		t.Errorf("100 /24s aggregate to %v, want %s", prefixes, want)
	}
	if got[0].Origin != "n and 63 more" {
		t.Errorf("origin %q, want the first's with the count", got[0].Origin)
	}
	// 10.0.0.0/25 and 10.0.0.128/25 to one peer merge; with 10.0.0.5/32 to
	// another inside, the /32 stays.
	mixed := aggregateRoutes([]Route{
		{Prefix: netip.MustParsePrefix("10.0.0.0/25"), Peer: "a"},
		{Prefix: netip.MustParsePrefix("10.0.0.128/25"), Peer: "a"},
		{Prefix: netip.MustParsePrefix("10.0.0.5/32"), Peer: "b"},
	})
	if len(mixed) != 2 || mixed[0].Prefix != netip.MustParsePrefix("10.0.0.0/24") || mixed[1].Peer != "b" {
		t.Errorf("mixed = %+v, want 10.0.0.0/24 -> a and 10.0.0.5/32 -> b", mixed)
	}
}

func fmtList(s []string) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out + "]"
}
