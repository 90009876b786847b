package plan

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// TestRouteRewriteEqualsCopy checks the in-place rebuild of a route list
// against a plain copy into a new slice, over random lists where each route
// is kept, dropped (replaced by no piece) or replaced by one to four pieces:
// in place, a route must never be overwritten before it is read.
func TestRouteRewriteEqualsCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 12))
	for range 2000 {
		n := r.IntN(12)
		src := make([]Route, n)
		for i := range src {
			src[i] = Route{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16), Origin: "route"}
		}
		// pieces[i] < 0 keeps route i; otherwise it is replaced by that many.
		pieces := make([]int, n)
		for i := range pieces {
			pieces[i] = -1
			if r.IntN(4) == 0 {
				pieces[i] = r.IntN(5)
			}
		}
		var want []Route
		for i, rt := range src {
			if pieces[i] < 0 {
				want = append(want, rt)
				continue
			}
			for k := range pieces[i] {
				want = append(want, piece(rt, k))
			}
		}

		w := rewriteRoutes(slices.Clone(src))
		for i, rt := range w.src {
			if !rt.Equal(src[i]) {
				t.Fatalf("route %d read as %v after the rewrite wrote over it, want %v (pieces %v)", i, rt, src[i], pieces)
			}
			if pieces[i] < 0 {
				w.keep(rt)
				continue
			}
			w.replace(pieces[i])
			for k := range pieces[i] {
				w.add(piece(rt, k))
			}
		}
		if !slices.EqualFunc(w.out, want, Route.Equal) {
			t.Fatalf("pieces %v: rewritten\n%v\nwant\n%v", pieces, w.out, want)
		}
	}
}

// piece returns the k-th piece of rt: a /24 inside it.
func piece(rt Route, k int) Route {
	a := rt.Prefix.Addr().As4()
	a[2] = byte(k)
	rt.Prefix = netip.PrefixFrom(netip.AddrFrom4(a), 24)
	rt.Origin = "piece"
	return rt
}
