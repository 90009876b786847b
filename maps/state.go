package maps

import (
	"fmt"
	"maps"
	"net"
	"net/netip"

	"github.com/isthmus-dev/isthmus/loader/plan"
)

// State is the contents of the datapath's writable maps as plain data: what a node
// should hold (FromPlan) or what it holds (Set.Read). The metrics map is not part
// of it. The zero State is empty; Diff treats nil maps as empty.
type State struct {
	Routes      map[netip.Prefix]Route
	Peers       map[netip.Addr]Peer
	PeerSources map[PeerSource]struct{}
	PodIfaces   map[uint32]PodIface
	Config      Config
}

// Route is the value of a routes entry: the peer that owns the prefix.
type Route struct {
	Peer  netip.Addr
	Flags uint32
}

// Peer is the value of a peers entry.
type Peer struct {
	Flags uint32
}

// PeerSource allows inner sources in Src from the peer whose underlay address is Peer.
type PeerSource struct {
	Peer netip.Addr
	Src  netip.Prefix
}

// PodIface is the value of a pod_ifaces entry.
type PodIface struct {
	Flags uint32
}

// Config is the single entry of the config map. A zero UnderlayIP is the invalid
// netip.Addr, so a Config read from a fresh map equals the zero Config.
type Config struct {
	VNI             uint32
	UnderlayIP      netip.Addr
	UnderlayIfindex uint32
	OverlayIfindex  uint32
	OverlayMAC      [6]byte
	TunnelMTU       uint16
	Flags           uint32
}

// NodeConfig carries what the datapath needs that the plan does not know: facts of
// this node's kernel, found by loader/datapath.
type NodeConfig struct {
	VNI             uint32
	UnderlayIfindex int
	OverlayIfindex  int
	OverlayMAC      net.HardwareAddr
	TunnelMTU       int
	// PodIfindexes are the pod-facing interfaces the agent has attached to.
	PodIfindexes []int
}

// Clone returns a deep copy of s.
func (s State) Clone() State {
	return State{
		Routes:      maps.Clone(s.Routes),
		Peers:       maps.Clone(s.Peers),
		PeerSources: maps.Clone(s.PeerSources),
		PodIfaces:   maps.Clone(s.PodIfaces),
		Config:      s.Config,
	}
}

// Equal reports whether s and o hold the same entries (nil and empty maps are equal).
func (s State) Equal(o State) bool {
	return maps.Equal(s.Routes, o.Routes) && maps.Equal(s.Peers, o.Peers) &&
		maps.Equal(s.PeerSources, o.PeerSources) && maps.Equal(s.PodIfaces, o.PodIfaces) &&
		s.Config == o.Config
}

// Len is the number of entries in s, the config entry included.
func (s State) Len() int {
	return len(s.Routes) + len(s.Peers) + len(s.PeerSources) + len(s.PodIfaces) + 1
}

func newState() State {
	return State{
		Routes:      map[netip.Prefix]Route{},
		Peers:       map[netip.Addr]Peer{},
		PeerSources: map[PeerSource]struct{}{},
		PodIfaces:   map[uint32]PodIface{},
	}
}

// FromPlan returns the map contents that realise p on a node described by node.
// It is a pure function. The datapath is IPv4 only: IPv6 routes, peers and sources
// are left out, each with a warning in the returned slice. A nil plan gives a State
// with only the node's config and pod interfaces.
func FromPlan(p *plan.NodePlan, node NodeConfig) (State, []string) {
	s := newState()
	var warnings []string
	s.Config = Config{
		VNI:             node.VNI & 0xffffff,
		UnderlayIfindex: uint32(node.UnderlayIfindex),
		OverlayIfindex:  uint32(node.OverlayIfindex),
		TunnelMTU:       uint16(min(max(node.TunnelMTU, 0), 0xffff)),
	}
	copy(s.Config.OverlayMAC[:], node.OverlayMAC)
	for _, ifindex := range node.PodIfindexes {
		s.PodIfaces[uint32(ifindex)] = PodIface{}
	}
	if p == nil {
		return s, nil
	}
	if u := p.Underlay.Unmap(); u.Is4() {
		s.Config.UnderlayIP = u
	} else {
		warnings = append(warnings, fmt.Sprintf("node underlay address %v is not IPv4: the datapath has no tunnel endpoint", p.Underlay))
	}
	for _, peer := range p.Peers {
		u := peer.Underlay.Unmap()
		if !u.Is4() {
			warnings = append(warnings, fmt.Sprintf("peer %s: underlay address %v is not IPv4, skipped", peer.Name, peer.Underlay))
			continue
		}
		s.Peers[u] = Peer{}
		for _, src := range peer.AllowedSources {
			if !src.Addr().Unmap().Is4() {
				warnings = append(warnings, fmt.Sprintf("peer %s: allowed source %v is not IPv4, skipped", peer.Name, src))
				continue
			}
			src = netip.PrefixFrom(src.Addr().Unmap(), src.Bits()).Masked()
			s.PeerSources[PeerSource{Peer: u, Src: src}] = struct{}{}
		}
	}
	for _, r := range p.Routes {
		via := r.Via.Unmap()
		if !r.Prefix.Addr().Unmap().Is4() || !via.Is4() {
			warnings = append(warnings, fmt.Sprintf("route %v via %v (%s): not IPv4, skipped", r.Prefix, r.Via, r.Peer))
			continue
		}
		prefix := netip.PrefixFrom(r.Prefix.Addr().Unmap(), r.Prefix.Bits()).Masked()
		s.Routes[prefix] = Route{Peer: via}
	}
	return s, warnings
}

// toKernel returns the config map value of c.
func (c Config) toKernel() DatapathConfig {
	return DatapathConfig{
		Vni:             c.VNI,
		UnderlayIp:      AddrToBE32(c.UnderlayIP),
		UnderlayIfindex: c.UnderlayIfindex,
		OverlayIfindex:  c.OverlayIfindex,
		OverlayMac:      c.OverlayMAC,
		TunnelMtu:       c.TunnelMTU,
		Flags:           c.Flags,
	}
}

func configFromKernel(k DatapathConfig) Config {
	c := Config{
		VNI:             k.Vni,
		UnderlayIfindex: k.UnderlayIfindex,
		OverlayIfindex:  k.OverlayIfindex,
		OverlayMAC:      k.OverlayMac,
		TunnelMTU:       k.TunnelMtu,
		Flags:           k.Flags,
	}
	if k.UnderlayIp != 0 {
		c.UnderlayIP = BE32ToAddr(k.UnderlayIp)
	}
	return c
}

// insert adds one kernel entry of map m to s; it is how Read and test fakes turn
// map contents back into a State.
func (s *State) insert(m Name, key, value any) error {
	switch m {
	case MapRoutes:
		k, ok1 := key.(RouteKey)
		v, ok2 := value.(RouteValue)
		if !ok1 || !ok2 {
			break
		}
		s.Routes[PrefixFromRouteKey(k)] = Route{Peer: BE32ToAddr(v.Peer), Flags: v.Flags}
		return nil
	case MapPeers:
		k, ok1 := key.(uint32)
		v, ok2 := value.(PeerValue)
		if !ok1 || !ok2 {
			break
		}
		s.Peers[BE32ToAddr(k)] = Peer{Flags: v.Flags}
		return nil
	case MapPeerSources:
		k, ok := key.(PeerSourceKey)
		if !ok {
			break
		}
		s.PeerSources[PeerSourceFromKey(k)] = struct{}{}
		return nil
	case MapPodIfaces:
		k, ok1 := key.(uint32)
		v, ok2 := value.(PodIfaceValue)
		if !ok1 || !ok2 {
			break
		}
		s.PodIfaces[k] = PodIface{Flags: v.Flags}
		return nil
	case MapConfig:
		v, ok := value.(DatapathConfig)
		if !ok {
			break
		}
		s.Config = configFromKernel(v)
		return nil
	}
	return fmt.Errorf("insert %s entry: unexpected key %T or value %T", m, key, value)
}
