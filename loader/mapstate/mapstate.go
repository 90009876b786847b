// Package mapstate translates a node's plan into the contents of its pinned
// maps (maps.State): the loader's side of the boundary between the plan
// (loader/plan) and the kernel's maps (maps), so that package maps knows
// nothing of plans. FromPlan is a pure function.
package mapstate

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/maps"
)

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
	// PodNoPeer are those of them without a peer device (a bridge, not a
	// veth): marked PodIfaceFlagNoPeer.
	PodNoPeer []int
	// PodAddrs are the CNI plugin's reservations by host interface (read from
	// its store). Those of an attached interface go to pod_addrs (IPv4) or
	// pod_addrs6 (IPv6), and the interface is marked PodIfaceFlagReserved.
	PodAddrs []maps.PodAddr
	// SNATPortMin and SNATPortMax are the SNAT port range (--snat-ports).
	SNATPortMin, SNATPortMax uint16
	// Down are the next-hop group members whose health checks fail for the
	// route's remote site (plan.Route.Site): they own no slot in that site's
	// groups. nil means every member is up.
	Down map[maps.GroupMember]bool
	// CurrentGroups is the group id each route prefix has in the kernel now (the
	// Routes of the state read back). A member set keeps the id its routes use, so
	// ids do not move under live flows when groups come and go, nor across agent
	// restarts. nil: ids are numbered afresh.
	CurrentGroups map[netip.Prefix]uint32
	// WireGuardIfindex is the WireGuard device encrypted peers' GENEVE goes
	// into (config.wg_ifindex); 0 when the node has none.
	WireGuardIfindex int
	// CurrentHandles are the handles the kernel holds for peers on the IPv6
	// underlay (the Handles of the state read back): a peer keeps its handle
	// (maps.AssignHandles). nil: handles are numbered afresh.
	CurrentHandles map[netip.Addr]netip.Addr
}

// FromPlan returns the map contents that realise p on a node described by node.
// It is a pure function. The underlay may be IPv4 or IPv6 (config.underlay_ip or
// underlay_ip6): a peer or route next hop at an IPv6 underlay address is written by
// the handle maps.AssignHandles gives it (the one in node.CurrentHandles if any),
// except an encrypted peer known by an IPv6 tunnel address and a next-hop group
// member at an IPv6 address, which are left out with a warning in the returned
// slice (gateways and WireGuard run over IPv4). Routes and allowed sources of
// either family go in (IPv6 ones to routes6 and peer_sources6); the SNAT,
// masquerade and fabric maps are IPv4 only, and their IPv6 entries are left out
// with a warning. A nil plan gives a State with only the node's config and pod
// interfaces.
//
// A route with a Group goes to a next-hop group: one id per distinct remote site
// and set of member underlay addresses, the id its routes have now
// (node.CurrentGroups) or else the smallest free one, in the sorted order of the
// sets (maps.GroupIDs), whose slots are spread by maps.Rendezvous over the members not in
// node.Down for the route's site. A group
// whose members are all down has no entry (the zero entry: the datapath drops with
// DROP_NO_NEXTHOP). An Underlay route (an exception) is an entry with
// maps.RouteFlagUnderlay and neither peer nor group. config.tunnel_ip is p.SNAT.Addr, the SNAT port range comes from
// node, fabric_prefixes from p.FabricPrefixes and snat_exempt from p.SNAT.Exempt.
// With p.Masquerade.Addr set, CFG_F_MASQUERADE is on and masq_exempt holds
// p.Masquerade.Exempt.
func FromPlan(p *plan.NodePlan, node NodeConfig) (maps.State, []string) {
	s := maps.NewState()
	var warnings []string
	s.Config = maps.Config{
		VNI:             node.VNI & 0xffffff,
		UnderlayIfindex: uint32(node.UnderlayIfindex),
		OverlayIfindex:  uint32(node.OverlayIfindex),
		TunnelMTU:       uint16(min(max(node.TunnelMTU, 0), 0xffff)),
		SNATPortMin:     node.SNATPortMin,
		SNATPortMax:     node.SNATPortMax,
		// Only a node with encrypted peers sends into WireGuard.
		WireGuardIfindex: uint32(max(node.WireGuardIfindex, 0)),
	}
	if p == nil || !p.Encrypted {
		s.Config.WireGuardIfindex = 0
	}
	copy(s.Config.OverlayMAC[:], node.OverlayMAC)
	for _, ifindex := range node.PodIfindexes {
		s.PodIfaces[uint32(ifindex)] = maps.PodIface{}
	}
	for _, ifindex := range node.PodNoPeer {
		if _, attached := s.PodIfaces[uint32(ifindex)]; attached {
			s.PodIfaces[uint32(ifindex)] = maps.PodIface{Flags: maps.PodIfaceFlagNoPeer}
		}
	}
	for _, pa := range node.PodAddrs {
		pi, attached := s.PodIfaces[pa.Ifindex]
		if a := pa.Addr.Unmap(); attached && a.IsValid() {
			s.PodAddrs[maps.PodAddr{Ifindex: pa.Ifindex, Addr: a}] = struct{}{}
			s.PodIfaces[pa.Ifindex] = maps.PodIface{Flags: pi.Flags | maps.PodIfaceFlagReserved}
		}
	}
	if p == nil {
		return s, nil
	}
	// Sized once: a mesh node's 5,000 peers, sources and routes grew the
	// maps by doubling, rehashing every entry each time.
	sources := 0
	for _, peer := range p.Peers {
		sources += len(peer.AllowedSources)
	}
	s.Peers = make(map[netip.Addr]maps.Peer, len(p.Peers))
	s.PeerSources = make(map[maps.PeerSource]struct{}, sources)
	s.Routes = make(map[netip.Prefix]maps.Route, len(p.Routes))
	if p.Gateway {
		s.Config.Flags |= maps.ConfigFlagTransit
	}
	if len(p.FabricEgress) > 0 {
		s.Config.Flags |= maps.ConfigFlagFabricEgress
	}
	switch u := p.Underlay.Unmap(); {
	case u.Is4():
		s.Config.UnderlayIP = u
	case u.Is6():
		s.Config.UnderlayIP6 = u
	default:
		warnings = append(warnings, fmt.Sprintf("node underlay address %v is not valid: the datapath has no tunnel endpoint", p.Underlay))
	}
	// GENEVE in the clear runs over the node's own underlay family: a peer of
	// the other family has no outer header this node can send it. An encrypted
	// peer is known by its IPv4 tunnel address, whatever the underlay.
	nodeV6 := p.Underlay.Unmap().Is6()
	encrypted := map[netip.Addr]bool{}
	var underlay6 []netip.Addr
	for _, peer := range p.Peers {
		u := peer.Via().Unmap()
		switch {
		case !u.IsValid() || (u.Is6() && peer.Encrypted):
			warnings = append(warnings, fmt.Sprintf("peer %s: encrypted, and its tunnel address %v is not IPv4 (WireGuard carries GENEVE over IPv4 tunnel addresses), skipped", peer.Name, peer.Via()))
			continue
		case !peer.Encrypted && u.Is6() != nodeV6:
			warnings = append(warnings, fmt.Sprintf("peer %s: underlay address %v and this node's %v are of different families: no tunnel between them, skipped", peer.Name, u, p.Underlay))
			continue
		case peer.Encrypted:
			encrypted[u] = true
		}
		if u.Is6() {
			underlay6 = append(underlay6, u)
		}
		s.Peers[u] = maps.Peer{Flags: peerFlags(peer)}
		for _, src := range peer.AllowedSources {
			if src, ok := prefixKey(src); ok {
				s.PeerSources[maps.PeerSource{Peer: u, Src: src}] = struct{}{}
			}
		}
	}
	if a := p.SNAT.Addr.Unmap(); a.Is4() {
		s.Config.TunnelIP = a
	} else if a.IsValid() {
		warnings = append(warnings, fmt.Sprintf("SNAT address %v is not IPv4: no return-path SNAT", a))
	}
	for _, e := range p.SNAT.Exempt {
		if pr, ok := maps.Prefix4(e.Prefix); ok {
			s.SNATExempt[pr] = struct{}{}
		} else {
			warnings = append(warnings, fmt.Sprintf("SNAT exempt source %v (%s): not IPv4, skipped", e.Prefix, e.Origin))
		}
	}
	if p.Masquerade.Addr.IsValid() {
		s.Config.Flags |= maps.ConfigFlagMasquerade
	}
	for _, e := range p.Masquerade.Exempt {
		if pr, ok := maps.Prefix4(e.Prefix); ok {
			s.MasqExempt[pr] = struct{}{}
		}
	}
	for _, fp := range p.FabricPrefixes {
		if pr, ok := maps.Prefix4(fp); ok {
			s.FabricPrefixes[pr] = struct{}{}
		} else {
			warnings = append(warnings, fmt.Sprintf("fabric prefix %v: not IPv4, skipped", fp))
		}
	}

	// Member sets first: group ids depend on all of them.
	members := make([][]netip.Addr, len(p.Routes))
	var sets []maps.MemberSet
	for i, r := range p.Routes {
		if len(r.Group) == 0 {
			continue
		}
		for _, nh := range r.Group {
			if v := nh.Via.Unmap(); v.Is4() && (encrypted[v] || !nodeV6) {
				members[i] = append(members[i], v)
			} else {
				warnings = append(warnings, fmt.Sprintf("route %v: group member %s via %v is not on the IPv4 underlay with this node (gateways run over the IPv4 underlay), left out", r.Prefix, nh.Peer, nh.Via))
			}
		}
		slices.SortFunc(members[i], netip.Addr.Compare)
		members[i] = slices.Compact(members[i])
		if len(members[i]) > 0 {
			sets = append(sets, maps.MemberSet{Site: r.Site, Addrs: members[i]})
		}
	}
	prefer := map[string]uint32{}
	for i, r := range p.Routes {
		if len(members[i]) == 0 {
			continue
		}
		if pr, ok := prefixKey(r.Prefix); ok {
			if id := node.CurrentGroups[pr]; id != 0 {
				k := maps.MemberSet{Site: r.Site, Addrs: members[i]}.Key()
				if _, seen := prefer[k]; !seen {
					prefer[k] = id
				}
			}
		}
	}
	ids := maps.GroupIDs(sets, prefer)
	for i, r := range p.Routes {
		prefix, ok := prefixKey(r.Prefix)
		if r.Underlay {
			// An exception: no peer, no group; lookups read it as a miss.
			if !ok {
				warnings = append(warnings, fmt.Sprintf("route %v (not tunnelled): not a valid prefix, skipped", r.Prefix))
				continue
			}
			s.Routes[prefix] = maps.Route{Flags: maps.RouteFlagUnderlay}
			continue
		}
		if len(r.Group) == 0 {
			via := r.Via.Unmap()
			if !ok || !via.IsValid() {
				warnings = append(warnings, fmt.Sprintf("route %v via %v (%s): no valid next hop, skipped", r.Prefix, r.Via, r.Peer))
				continue
			}
			if !encrypted[via] && via.Is6() != nodeV6 {
				warnings = append(warnings, fmt.Sprintf("route %v via %v (%s): not of this node's underlay family, skipped", r.Prefix, r.Via, r.Peer))
				continue
			}
			if via.Is6() {
				underlay6 = append(underlay6, via)
			}
			s.Routes[prefix] = maps.Route{Peer: via, Flags: routeFlags(r)}
			continue
		}
		if !ok || len(members[i]) == 0 {
			warnings = append(warnings, fmt.Sprintf("route %v to a group: no member at an IPv4 address, skipped", r.Prefix))
			continue
		}
		id, ok := ids[maps.MemberSet{Site: r.Site, Addrs: members[i]}.Key()]
		if !ok {
			warnings = append(warnings, fmt.Sprintf("route %v: more than %d next-hop groups, skipped", r.Prefix, maps.MaxGroupID))
			continue
		}
		s.Routes[prefix] = maps.Route{Group: id, Flags: routeFlags(r)}
		if _, done := s.Groups[id]; done {
			continue
		}
		var live []netip.Addr
		for _, m := range members[i] {
			if !node.Down[maps.GroupMember{Site: r.Site, Addr: m}] {
				live = append(live, m)
			}
		}
		if g := maps.Rendezvous(live); !g.IsZero() {
			s.Groups[id] = g
		}
	}
	s.Handles = maps.AssignHandles(underlay6, node.CurrentHandles)
	return s, warnings
}

// prefixKey returns p masked with its address unmapped, the form of every prefix of
// a State, and whether p is valid.
func prefixKey(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	a := p.Addr().Unmap()
	bits := p.Bits()
	if p.Addr().Is4In6() {
		bits -= 96
	}
	if bits < 0 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, bits).Masked(), true
}

// peerFlags returns the PEER_F_* flags of pr's peers entry.
func peerFlags(pr plan.Peer) uint32 {
	if !pr.Encrypted {
		return 0
	}
	if pr.WireGuardKey == "" {
		return maps.PeerFlagWireGuard | maps.PeerFlagWireGuardNoKey
	}
	return maps.PeerFlagWireGuard
}

// routeFlags returns the ROUTE_F_* flags of r's routes entry.
func routeFlags(r plan.Route) uint32 {
	var f uint32
	if r.ViaFabric {
		f |= maps.RouteFlagViaFabric
	}
	if r.NotForPods {
		f |= maps.RouteFlagNotForPods
	}
	return f
}
