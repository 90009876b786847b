package maps

import (
	"maps"
	"net/netip"
	"slices"
)

// MaxHandles is how many peers on the IPv6 underlay a node can know: the handles
// 0.0.0.1 to 0.255.255.255.
const MaxHandles = 1<<24 - 1

// AssignHandles returns the handle of every IPv6 underlay address in addrs (other
// addresses are ignored): the one it has in current (the peers6 entries the kernel
// holds), so that no map entry moves under live traffic and an agent restart
// changes nothing; else the smallest handle that current does not hold, so a
// handle that an address held is never given to another in the same write (the
// entries of the old address are deleted only after the new ones are written).
// It is a pure function of addrs' set and current. Addresses beyond MaxHandles
// (with current's) get none.
func AssignHandles(addrs []netip.Addr, current map[netip.Addr]netip.Addr) map[netip.Addr]netip.Addr {
	out := map[netip.Addr]netip.Addr{}
	var fresh []netip.Addr
	for _, a := range addrs {
		if a = a.Unmap(); !a.Is6() {
			continue
		}
		if _, done := out[a]; done {
			continue
		}
		if h, ok := current[a]; ok && IsHandle(h) {
			out[a] = h
			continue
		}
		out[a] = netip.Addr{}
		fresh = append(fresh, a)
	}
	taken := make(map[netip.Addr]bool, len(current))
	for _, h := range current {
		taken[h] = true
	}
	slices.SortFunc(fresh, netip.Addr.Compare)
	next := uint32(1)
	for _, a := range fresh {
		for next <= MaxHandles && taken[BE32ToAddr(handleBE32(next))] {
			next++
		}
		if next > MaxHandles {
			delete(out, a)
			continue
		}
		out[a] = BE32ToAddr(handleBE32(next))
		next++
	}
	return out
}

// handleBE32 is handle number n (1..MaxHandles) as an address in 0.0.0.0/8, in
// __be32 form.
func handleBE32(n uint32) uint32 {
	return AddrToBE32(netip.AddrFrom4([4]byte{0, byte(n >> 16), byte(n >> 8), byte(n)}))
}

// byHandle returns the inverse of handles: each handle's IPv6 address.
func byHandle(handles map[netip.Addr]netip.Addr) map[netip.Addr]netip.Addr {
	inv := make(map[netip.Addr]netip.Addr, len(handles))
	for a, h := range handles {
		inv[h] = a
	}
	return inv
}

// kernelView returns s with every IPv6 peer address (Peers, Routes, PeerSources)
// replaced by its handle, as the kernel's maps hold it, and PeerFlagUnderlay6 on
// those peers. A peer without a handle is left out, and so are its routes and
// sources (FromPlan assigns one to every peer it writes). s itself when it has no
// IPv6 peer, the common case: nothing is copied.
func (s State) kernelView() State {
	if len(s.Handles) == 0 && !hasIPv6Peer(s) {
		return s
	}
	k := s
	k.Peers = make(map[netip.Addr]Peer, len(s.Peers))
	for a, p := range s.Peers {
		if !a.Is6() {
			k.Peers[a] = p
		} else if h, ok := s.Handles[a]; ok {
			k.Peers[h] = Peer{Flags: p.Flags | PeerFlagUnderlay6}
		}
	}
	k.Routes = make(map[netip.Prefix]Route, len(s.Routes))
	for p, r := range s.Routes {
		if r.Peer.Is6() {
			h, ok := s.Handles[r.Peer]
			if !ok {
				continue
			}
			r.Peer = h
		}
		k.Routes[p] = r
	}
	k.PeerSources = make(map[PeerSource]struct{}, len(s.PeerSources))
	for ps := range s.PeerSources {
		if ps.Peer.Is6() {
			h, ok := s.Handles[ps.Peer]
			if !ok {
				continue
			}
			ps.Peer = h
		}
		k.PeerSources[ps] = struct{}{}
	}
	return k
}

func hasIPv6Peer(s State) bool {
	for a := range s.Peers {
		if a.Is6() {
			return true
		}
	}
	return false
}

// resolveHandles is the inverse of kernelView, for a State read from the kernel:
// every handle in Peers, Routes and PeerSources is replaced by its IPv6 address
// (Handles), PeerFlagUnderlay6 removed. A handle peers6 does not name stays as it
// is, and shows up in the next Diff as an entry to delete.
func (s *State) resolveHandles() {
	if len(s.Handles) == 0 {
		return
	}
	inv := byHandle(s.Handles)
	peers := maps.Clone(s.Peers)
	for a, p := range peers {
		if v6, ok := inv[a]; ok {
			delete(s.Peers, a)
			s.Peers[v6] = Peer{Flags: p.Flags &^ PeerFlagUnderlay6}
		}
	}
	for p, r := range s.Routes {
		if v6, ok := inv[r.Peer]; ok {
			r.Peer = v6
			s.Routes[p] = r
		}
	}
	for ps := range maps.Clone(s.PeerSources) {
		if v6, ok := inv[ps.Peer]; ok {
			delete(s.PeerSources, ps)
			s.PeerSources[PeerSource{Peer: v6, Src: ps.Src}] = struct{}{}
		}
	}
}
