package maps

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
)

// NHGSlots is the number of slots of a next-hop group (NHG_SLOTS in
// bpf/lib/types.h): a flow takes slot flow_hash % NHGSlots.
const NHGSlots = 64

// MaxGroupID is the largest next-hop group id the nexthop_groups array holds
// (NEXTHOP_GROUPS_MAX - 1 in bpf/lib/maps.h; id 0 means "no group").
const MaxGroupID = 1023

// NexthopGroup is the value of a nexthop_groups entry: Live members are up, and
// Slots[s] is the underlay address of the member that owns slot s. A group with no
// live member is the zero NexthopGroup, which State leaves out (the array entry is
// zero, and the datapath drops with DROP_NO_NEXTHOP).
type NexthopGroup struct {
	Live  uint32
	Slots [NHGSlots]netip.Addr
}

// IsZero reports whether g is the zero group (no live member).
func (g NexthopGroup) IsZero() bool { return g == NexthopGroup{} }

// Rendezvous returns the group that spreads the slots over live by rendezvous
// (highest random weight) hashing: slot s belongs to the member m with the highest
// rendezvousScore(m, s). It is a pure function of the set live (order and duplicates
// do not matter): removing a member moves exactly the slots it owned, each to the
// member with the next highest score, and no other slot; adding one takes only the
// slots where it scores highest. Invalid and non-IPv4 addresses are ignored; with no
// member left the result is the zero group.
func Rendezvous(live []netip.Addr) NexthopGroup {
	var ms []netip.Addr
	for _, m := range live {
		if m = m.Unmap(); m.Is4() && !slices.Contains(ms, m) {
			ms = append(ms, m)
		}
	}
	var g NexthopGroup
	if len(ms) == 0 {
		return g
	}
	g.Live = uint32(len(ms))
	for s := range NHGSlots {
		var best netip.Addr
		var bestScore uint64
		for _, m := range ms {
			sc := rendezvousScore(m, s)
			// Ties (practically never) go to the lower address, so the result does
			// not depend on the order of live.
			if !best.IsValid() || sc > bestScore || (sc == bestScore && m.Less(best)) {
				best, bestScore = m, sc
			}
		}
		g.Slots[s] = best
	}
	return g
}

// rendezvousScore is the weight of member m (IPv4) for slot s: the splitmix64
// finaliser of (address << 32 | slot), so every bit of both moves every bit of the
// score.
func rendezvousScore(m netip.Addr, s int) uint64 {
	b := m.As4()
	x := uint64(binary.BigEndian.Uint32(b[:]))<<32 | uint64(uint32(s))
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// GroupMember is a next-hop group member as the health checks see it: its
// underlay address, and the remote site it is checked for (a gateway that no
// longer reaches that site is down for it only); "" checks that it answers.
type GroupMember struct {
	Site string
	Addr netip.Addr
}

// MemberSet is what gets one group id: the members of a route's group (sorted,
// without duplicates) and the remote site they are checked for. Two sites
// reached through the same gateways need two groups, since a gateway may reach
// one and not the other.
type MemberSet struct {
	Site  string
	Addrs []netip.Addr
}

func (s MemberSet) Key() string {
	b := make([]byte, 0, len(s.Site)+1+4*len(s.Addrs))
	b = append(b, s.Site...)
	b = append(b, 0)
	for _, a := range s.Addrs {
		x := a.As4()
		b = append(b, x[:]...)
	}
	return string(b)
}

func compareSets(a, b MemberSet) int {
	if c := strings.Compare(a.Site, b.Site); c != 0 {
		return c
	}
	return slices.CompareFunc(a.Addrs, b.Addrs, cmpAddr)
}

// GroupIDs returns the id of every distinct member set in sets, by key: the
// id prefer gives it (what its routes use in the kernel) when no other set
// took that id first, else the smallest free id, sets taken in order of site,
// then members. So ids are a pure function of the plan and the current state,
// and never move under live flows: members going down or up never renumber, a
// new group never takes an id in use, and a member set that changes keeps its
// routes' id. Sets beyond MaxGroupID get no id.
func GroupIDs(sets []MemberSet, prefer map[string]uint32) map[string]uint32 {
	distinct := map[string]MemberSet{}
	for _, s := range sets {
		distinct[s.Key()] = s
	}
	ordered := make([]MemberSet, 0, len(distinct))
	for _, s := range distinct {
		ordered = append(ordered, s)
	}
	slices.SortFunc(ordered, compareSets)
	ids := map[string]uint32{}
	taken := map[uint32]bool{}
	// Ids in use stay with their member set, so flows never see a route's group id
	// point at another set while the maps are rewritten.
	for _, s := range ordered {
		k := s.Key()
		if id, ok := prefer[k]; ok && id >= 1 && id <= MaxGroupID && !taken[id] {
			ids[k] = id
			taken[id] = true
		}
	}
	next := uint32(1)
	for _, s := range ordered {
		k := s.Key()
		if _, ok := ids[k]; ok {
			continue
		}
		for taken[next] {
			next++
		}
		if next > MaxGroupID {
			break
		}
		ids[k] = next
		taken[next] = true
	}
	return ids
}

func (g NexthopGroup) toKernel() NexthopGroupValue {
	k := NexthopGroupValue{Live: g.Live}
	for i, a := range g.Slots {
		k.Slots[i] = AddrToBE32(a)
	}
	return k
}

func groupFromKernel(k NexthopGroupValue) NexthopGroup {
	g := NexthopGroup{Live: k.Live}
	for i, v := range k.Slots {
		if v != 0 {
			g.Slots[i] = BE32ToAddr(v)
		}
	}
	return g
}
