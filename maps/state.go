package maps

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"

	"github.com/isthmus-dev/isthmus/loader/plan"
)

// State is the contents of the datapath's writable maps as plain data: what a node
// should hold (FromPlan) or what it holds (Set.Read). The metrics and nat maps are
// not part of it (the datapath writes them). The zero State is empty; Diff treats
// nil maps as empty.
type State struct {
	Routes      map[netip.Prefix]Route
	Peers       map[netip.Addr]Peer
	PeerSources map[PeerSource]struct{}
	PodIfaces   map[uint32]PodIface
	// Groups are the nexthop_groups entries by id that have a live member; an id
	// missing here is the zero entry.
	Groups map[uint32]NexthopGroup
	// FabricPrefixes are the fabric_prefixes entries: inner destinations handed to
	// the site fabric after decapsulation.
	FabricPrefixes map[netip.Prefix]struct{}
	// SNATExempt are the snat_exempt entries: pod sources that keep their address
	// in the tunnel.
	SNATExempt map[netip.Prefix]struct{}
	// MasqExempt are the masq_exempt entries: destinations a managed pod reaches
	// without egress masquerade.
	MasqExempt map[netip.Prefix]struct{}
	// PodAddrs are the pod_addrs entries: the addresses the CNI plugin reserved
	// for the pod behind each host interface.
	PodAddrs map[PodAddr]struct{}
	Config   Config
}

// Route is the value of a routes entry: the peer that owns the prefix, or (Group
// not 0) the next-hop group whose members share it.
type Route struct {
	Peer  netip.Addr
	Flags uint32
	Group uint32
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

// PodAddr is a pod_addrs entry: Addr is reserved for the pod behind the host
// interface Ifindex.
type PodAddr struct {
	Ifindex uint32
	Addr    netip.Addr
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
	// TunnelIP is the node's tunnel address, the return-path SNAT source and the
	// one local address decapsulated packets are delivered to; invalid means
	// neither.
	TunnelIP netip.Addr
	// SNATPortMin and SNATPortMax bound the ports SNAT picks when a flow's own
	// port is taken.
	SNATPortMin, SNATPortMax uint16
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
	// PodAddrs are the CNI plugin's reservations by host interface (read from
	// its store). Those of an attached interface go to pod_addrs, and the
	// interface is marked PodIfaceFlagReserved; IPv6 ones are left out.
	PodAddrs []PodAddr
	// SNATPortMin and SNATPortMax are the SNAT port range (--snat-ports).
	SNATPortMin, SNATPortMax uint16
	// Down are the next-hop group members whose health checks fail for the
	// route's remote site (plan.Route.Site): they own no slot in that site's
	// groups. nil means every member is up.
	Down map[GroupMember]bool
	// CurrentGroups is the group id each route prefix has in the kernel now (the
	// Routes of the state read back). A member set keeps the id its routes use, so
	// ids do not move under live flows when groups come and go, nor across agent
	// restarts. nil: ids are numbered afresh.
	CurrentGroups map[netip.Prefix]uint32
}

// Clone returns a deep copy of s.
func (s State) Clone() State {
	return State{
		Routes:         maps.Clone(s.Routes),
		Peers:          maps.Clone(s.Peers),
		PeerSources:    maps.Clone(s.PeerSources),
		PodIfaces:      maps.Clone(s.PodIfaces),
		Groups:         maps.Clone(s.Groups),
		FabricPrefixes: maps.Clone(s.FabricPrefixes),
		SNATExempt:     maps.Clone(s.SNATExempt),
		MasqExempt:     maps.Clone(s.MasqExempt),
		PodAddrs:       maps.Clone(s.PodAddrs),
		Config:         s.Config,
	}
}

// Equal reports whether s and o hold the same entries (nil and empty maps are equal).
func (s State) Equal(o State) bool {
	return maps.Equal(s.Routes, o.Routes) && maps.Equal(s.Peers, o.Peers) &&
		maps.Equal(s.PeerSources, o.PeerSources) && maps.Equal(s.PodIfaces, o.PodIfaces) &&
		maps.Equal(s.Groups, o.Groups) && maps.Equal(s.FabricPrefixes, o.FabricPrefixes) &&
		maps.Equal(s.SNATExempt, o.SNATExempt) && maps.Equal(s.MasqExempt, o.MasqExempt) &&
		maps.Equal(s.PodAddrs, o.PodAddrs) && s.Config == o.Config
}

// Len is the number of entries in s, the config entry included.
func (s State) Len() int {
	return len(s.Routes) + len(s.Peers) + len(s.PeerSources) + len(s.PodIfaces) +
		len(s.Groups) + len(s.FabricPrefixes) + len(s.SNATExempt) + len(s.MasqExempt) + len(s.PodAddrs) + 1
}

func newState() State {
	return State{
		Routes:         map[netip.Prefix]Route{},
		Peers:          map[netip.Addr]Peer{},
		PeerSources:    map[PeerSource]struct{}{},
		PodIfaces:      map[uint32]PodIface{},
		Groups:         map[uint32]NexthopGroup{},
		FabricPrefixes: map[netip.Prefix]struct{}{},
		SNATExempt:     map[netip.Prefix]struct{}{},
		MasqExempt:     map[netip.Prefix]struct{}{},
		PodAddrs:       map[PodAddr]struct{}{},
	}
}

// FromPlan returns the map contents that realise p on a node described by node.
// It is a pure function. The datapath is IPv4 only: IPv6 routes, peers and sources
// are left out, each with a warning in the returned slice. A nil plan gives a State
// with only the node's config and pod interfaces.
//
// A route with a Group goes to a next-hop group: one id per distinct remote site
// and set of member underlay addresses, the id its routes have now
// (node.CurrentGroups) or else the smallest free one, in the sorted order of the
// sets (groupIDs), whose slots are spread by Rendezvous over the members not in
// node.Down for the route's site. A group
// whose members are all down has no entry (the zero entry: the datapath drops with
// DROP_NO_NEXTHOP). config.tunnel_ip is p.SNAT.Addr, the SNAT port range comes from
// node, fabric_prefixes from p.FabricPrefixes and snat_exempt from p.SNAT.Exempt.
// With p.Masquerade.Addr set, CFG_F_MASQUERADE is on and masq_exempt holds
// p.Masquerade.Exempt.
func FromPlan(p *plan.NodePlan, node NodeConfig) (State, []string) {
	s := newState()
	var warnings []string
	s.Config = Config{
		VNI:             node.VNI & 0xffffff,
		UnderlayIfindex: uint32(node.UnderlayIfindex),
		OverlayIfindex:  uint32(node.OverlayIfindex),
		TunnelMTU:       uint16(min(max(node.TunnelMTU, 0), 0xffff)),
		SNATPortMin:     node.SNATPortMin,
		SNATPortMax:     node.SNATPortMax,
	}
	copy(s.Config.OverlayMAC[:], node.OverlayMAC)
	for _, ifindex := range node.PodIfindexes {
		s.PodIfaces[uint32(ifindex)] = PodIface{}
	}
	for _, pa := range node.PodAddrs {
		pi, attached := s.PodIfaces[pa.Ifindex]
		if a := pa.Addr.Unmap(); attached && a.Is4() {
			s.PodAddrs[PodAddr{Ifindex: pa.Ifindex, Addr: a}] = struct{}{}
			s.PodIfaces[pa.Ifindex] = PodIface{Flags: pi.Flags | PodIfaceFlagReserved}
		}
	}
	if p == nil {
		return s, nil
	}
	if p.Gateway {
		s.Config.Flags |= ConfigFlagTransit
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
	if a := p.SNAT.Addr.Unmap(); a.Is4() {
		s.Config.TunnelIP = a
	} else if a.IsValid() {
		warnings = append(warnings, fmt.Sprintf("SNAT address %v is not IPv4: no return-path SNAT", a))
	}
	for _, e := range p.SNAT.Exempt {
		if pr, ok := prefix4(e.Prefix); ok {
			s.SNATExempt[pr] = struct{}{}
		} else {
			warnings = append(warnings, fmt.Sprintf("SNAT exempt source %v (%s): not IPv4, skipped", e.Prefix, e.Origin))
		}
	}
	if p.Masquerade.Addr.IsValid() {
		s.Config.Flags |= ConfigFlagMasquerade
	}
	for _, e := range p.Masquerade.Exempt {
		if pr, ok := prefix4(e.Prefix); ok {
			s.MasqExempt[pr] = struct{}{}
		}
	}
	for _, fp := range p.FabricPrefixes {
		if pr, ok := prefix4(fp); ok {
			s.FabricPrefixes[pr] = struct{}{}
		} else {
			warnings = append(warnings, fmt.Sprintf("fabric prefix %v: not IPv4, skipped", fp))
		}
	}

	// Member sets first: group ids depend on all of them.
	members := make([][]netip.Addr, len(p.Routes))
	var sets []memberSet
	for i, r := range p.Routes {
		if len(r.Group) == 0 {
			continue
		}
		for _, nh := range r.Group {
			if v := nh.Via.Unmap(); v.Is4() {
				members[i] = append(members[i], v)
			} else {
				warnings = append(warnings, fmt.Sprintf("route %v: group member %s via %v is not IPv4, left out", r.Prefix, nh.Peer, nh.Via))
			}
		}
		slices.SortFunc(members[i], cmpAddr)
		members[i] = slices.Compact(members[i])
		if len(members[i]) > 0 {
			sets = append(sets, memberSet{site: r.Site, addrs: members[i]})
		}
	}
	prefer := map[string]uint32{}
	for i, r := range p.Routes {
		if len(members[i]) == 0 {
			continue
		}
		if pr, ok := prefix4(r.Prefix); ok {
			if id := node.CurrentGroups[pr]; id != 0 {
				k := memberSet{site: r.Site, addrs: members[i]}.key()
				if _, seen := prefer[k]; !seen {
					prefer[k] = id
				}
			}
		}
	}
	ids := groupIDs(sets, prefer)
	for i, r := range p.Routes {
		prefix, ok := prefix4(r.Prefix)
		if len(r.Group) == 0 {
			via := r.Via.Unmap()
			if !ok || !via.Is4() {
				warnings = append(warnings, fmt.Sprintf("route %v via %v (%s): not IPv4, skipped", r.Prefix, r.Via, r.Peer))
				continue
			}
			s.Routes[prefix] = Route{Peer: via}
			continue
		}
		if !ok || len(members[i]) == 0 {
			warnings = append(warnings, fmt.Sprintf("route %v to a group: not IPv4, skipped", r.Prefix))
			continue
		}
		id, ok := ids[memberSet{site: r.Site, addrs: members[i]}.key()]
		if !ok {
			warnings = append(warnings, fmt.Sprintf("route %v: more than %d next-hop groups, skipped", r.Prefix, MaxGroupID))
			continue
		}
		s.Routes[prefix] = Route{Group: id}
		if _, done := s.Groups[id]; done {
			continue
		}
		var live []netip.Addr
		for _, m := range members[i] {
			if !node.Down[GroupMember{Site: r.Site, Addr: m}] {
				live = append(live, m)
			}
		}
		if g := Rendezvous(live); !g.IsZero() {
			s.Groups[id] = g
		}
	}
	return s, warnings
}

// prefix4 returns p masked, with its address unmapped, and whether it is IPv4.
func prefix4(p netip.Prefix) (netip.Prefix, bool) {
	a := p.Addr().Unmap()
	if !a.Is4() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, p.Bits()).Masked(), true
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
		TunnelIp:        AddrToBE32(c.TunnelIP),
		SnatPortMin:     c.SNATPortMin,
		SnatPortMax:     c.SNATPortMax,
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
		SNATPortMin:     k.SnatPortMin,
		SNATPortMax:     k.SnatPortMax,
	}
	if k.UnderlayIp != 0 {
		c.UnderlayIP = BE32ToAddr(k.UnderlayIp)
	}
	if k.TunnelIp != 0 {
		c.TunnelIP = BE32ToAddr(k.TunnelIp)
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
		r := Route{Flags: v.Flags, Group: v.Group}
		if v.Peer != 0 || v.Group == 0 {
			r.Peer = BE32ToAddr(v.Peer)
		}
		s.Routes[PrefixFromRouteKey(k)] = r
		return nil
	case MapNexthopGroups:
		k, ok1 := key.(uint32)
		v, ok2 := value.(NexthopGroupValue)
		if !ok1 || !ok2 {
			break
		}
		if g := groupFromKernel(v); !g.IsZero() {
			s.Groups[k] = g
		} else {
			delete(s.Groups, k)
		}
		return nil
	case MapFabricPrefixes:
		k, ok := key.(RouteKey)
		if !ok {
			break
		}
		s.FabricPrefixes[PrefixFromRouteKey(k)] = struct{}{}
		return nil
	case MapSNATExempt:
		k, ok := key.(RouteKey)
		if !ok {
			break
		}
		s.SNATExempt[PrefixFromRouteKey(k)] = struct{}{}
		return nil
	case MapPodAddrs:
		k, ok := key.(PodAddrKey)
		if !ok {
			break
		}
		s.PodAddrs[PodAddr{Ifindex: k.Ifindex, Addr: BE32ToAddr(k.Addr)}] = struct{}{}
		return nil
	case MapMasqExempt:
		k, ok := key.(RouteKey)
		if !ok {
			break
		}
		s.MasqExempt[PrefixFromRouteKey(k)] = struct{}{}
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
