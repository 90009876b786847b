package plan

import (
	"net/netip"
	"slices"
)

// Subtract returns the largest prefixes that together cover from minus every
// prefix in remove, sorted by address. An address is removed by passing it as
// a full-length prefix (see HostPrefix). Prefixes of the other address family
// are ignored; host bits are masked off first, so equivalent spellings
// (10.0.2.5/23 and 10.0.2.0/23, 2001:DB8::/32 and 2001:db8::/32) behave alike.
// The result is empty when remove covers all of from.
func Subtract(from netip.Prefix, remove ...netip.Prefix) []netip.Prefix {
	from = from.Masked()
	var holes []netip.Prefix
	for _, r := range remove {
		if r.IsValid() && r.Addr().Is4() == from.Addr().Is4() {
			holes = append(holes, netip.PrefixFrom(r.Addr().Unmap(), r.Bits()).Masked())
		}
	}
	return subtract(from, holes, nil)
}

// subtract halves p until each half is either clear of every hole (kept) or
// inside one (dropped). It reorders holes: each half is handed only the
// holes inside it, so the work is bounded by holes times address length
// (a Site's /20 of nodeCidrs cut around its 100 InternalIPs looks at each
// address about 20 times, not all 100 at every one of some 2,000 halves).
func subtract(p netip.Prefix, holes []netip.Prefix, out []netip.Prefix) []netip.Prefix {
	inside := 0 // holes[:inside] lie inside p
	for i, h := range holes {
		if !h.Overlaps(p) {
			continue
		}
		if h.Bits() <= p.Bits() {
			return out // p lies inside h
		}
		holes[inside], holes[i] = holes[i], holes[inside]
		inside++
	}
	if inside == 0 {
		return append(out, p)
	}
	holes = holes[:inside]
	lo, hi := halves(p)
	inLo := 0 // holes[:inLo] lie inside lo, the others inside hi
	for i, h := range holes {
		if lo.Contains(h.Addr()) {
			holes[inLo], holes[i] = holes[i], holes[inLo]
			inLo++
		}
	}
	out = subtract(lo, holes[:inLo], out)
	return subtract(hi, holes[inLo:], out)
}

// halves splits p into its two prefixes one bit longer.
func halves(p netip.Prefix) (lo, hi netip.Prefix) {
	bits := p.Bits() + 1
	b := p.Addr().AsSlice()
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	hiAddr, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(p.Addr(), bits), netip.PrefixFrom(hiAddr, bits)
}

// HostPrefix returns the prefix holding only addr: addr/32 or addr/128.
func HostPrefix(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	return netip.PrefixFrom(addr, addr.BitLen())
}

// comparePrefix orders prefixes by address family, then address, then length
// (netip.Prefix.Compare puts length before address, which reads badly in a
// route table).
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

func sortPrefixes(ps []netip.Prefix) {
	slices.SortFunc(ps, comparePrefix)
}

// sortedUnique sorts ps in place and drops repeats; nil stays nil.
func sortedUnique(ps []netip.Prefix) []netip.Prefix {
	sortPrefixes(ps)
	return slices.Compact(ps)
}
