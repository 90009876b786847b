package controller

import (
	"net/netip"
	"slices"
)

// firstFree returns the lowest block of length bits inside pool that overlaps
// none of taken, and false when there is none (pool full, or bits shorter
// than the pool). Prefixes of taken of the other family are ignored.
//
// It walks the pool once in address order, jumping over each taken prefix,
// so it costs O(len(taken) log len(taken)) however many blocks the pool
// holds: a /48 carved into /64s is as cheap as a /24 carved into /25s.
func firstFree(pool netip.Prefix, bits int, taken []netip.Prefix) (netip.Prefix, bool) {
	pool = pool.Masked()
	if !pool.IsValid() || bits < pool.Bits() || bits > pool.Addr().BitLen() {
		return netip.Prefix{}, false
	}
	var in []netip.Prefix
	for _, t := range taken {
		if t.IsValid() && t.Addr().Is4() == pool.Addr().Is4() && t.Overlaps(pool) {
			in = append(in, t.Masked())
		}
	}
	slices.SortFunc(in, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	a, i := pool.Addr(), 0
	for a.IsValid() && pool.Contains(a) {
		c := netip.PrefixFrom(a, bits)
		for i < len(in) && lastAddr(in[i]).Less(a) {
			i++
		}
		if i == len(in) || !in[i].Overlaps(c) {
			return c, true
		}
		// Sorted by start, so in[i] is the only one that can overlap c: any
		// later prefix starts at or after in[i], which already starts inside
		// or before c. Skip to the first block boundary after it.
		a = alignUp(lastAddr(in[i]).Next(), bits)
	}
	return netip.Prefix{}, false
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// alignUp returns the first address at or after a that starts a block of
// length bits; the zero Addr when a is invalid or the address space ends
// first.
func alignUp(a netip.Addr, bits int) netip.Addr {
	if !a.IsValid() {
		return a
	}
	start := netip.PrefixFrom(a, bits).Masked()
	if start.Addr() == a {
		return a
	}
	return lastAddr(start).Next()
}
