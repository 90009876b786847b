// Package maps is the Go side of the datapath's pinned BPF maps: the key and value
// types (aliases of the bpf2go output, which mirrors bpf/lib/types.h field by field),
// conversions between netip values and their network-order fields, a plain-data
// desired State computed from a plan, a Diff between two States, an applier that
// writes only the changed entries, readers for the maps' current contents and the
// per-CPU counters, and the names of the drop reasons.
//
// Nothing here decides what the kernel should hold beyond the plan; loader/datapath
// creates and pins the maps and loader/agent drives the sync.
package maps

import (
	"encoding/binary"
	"net/netip"

	"github.com/isthmus-dev/isthmus/bpf"
)

// Kernel-side key and value types. They are the bpf2go-generated mirrors of the
// structs in bpf/lib/types.h; every __be32 field holds the address bytes in network
// order in memory (see AddrToBE32).
type (
	RouteKey        = bpf.IsthmusRouteKey
	Route6Key       = bpf.IsthmusRoute6Key
	RouteValue      = bpf.IsthmusRouteValue
	PeerValue       = bpf.IsthmusPeerValue
	Peer6Key        = bpf.IsthmusPeer6Key
	Peer6Value      = bpf.IsthmusPeer6Value
	PeerSourceKey   = bpf.IsthmusPeerSourceKey
	PeerSource6Key  = bpf.IsthmusPeerSource6Key
	PeerSourceValue = bpf.IsthmusPeerSourceValue
	DatapathConfig  = bpf.IsthmusDatapathConfig
	PodIfaceValue   = bpf.IsthmusPodIfaceValue
	MetricsKey      = bpf.IsthmusMetricsKey
	MetricsValue    = bpf.IsthmusMetricsValue
	// NexthopGroupValue is struct nexthop_group (the Go name NexthopGroup is the
	// plain-data form).
	NexthopGroupValue = bpf.IsthmusNexthopGroup
	FabricPrefixValue = bpf.IsthmusFabricPrefixValue
	SNATExemptValue   = bpf.IsthmusSnatExemptValue
	MasqExemptValue   = bpf.IsthmusMasqExemptValue
	PodAddrKey        = bpf.IsthmusPodAddrKey
	PodAddr6Key       = bpf.IsthmusPodAddr6Key
	PodAddrValue      = bpf.IsthmusPodAddrValue
	NatKey            = bpf.IsthmusNatKey
	NatValue          = bpf.IsthmusNatValue
	NatSourceKey      = bpf.IsthmusNatSourceKey
	NatSourceValue    = bpf.IsthmusNatSourceValue
	CtCloseKey        = bpf.IsthmusCtCloseKey
	CtClose6Key       = bpf.IsthmusCtClose6Key
	CtCloseValue      = bpf.IsthmusCtCloseValue
)

// Name is the name of a pinned map, as in the C source and under the pin directory.
type Name string

// The maps of the datapath (docs/architecture.md, "Maps").
// RouteFlagUnderlay is ROUTE_F_UNDERLAY of bpf/lib/types.h (Route.Flags): the
// route is an exception inside a shorter one, its prefix not tunnelled here
// (plan.Route.Underlay); every lookup in routes treats it as a miss.
const RouteFlagUnderlay uint32 = 1 << 1

// ConfigFlagTransit is CFG_F_TRANSIT of bpf/lib/types.h (a #define, so not in the
// object's BTF; TestConfigFlagsMatchHeader compares them): the node is a gateway
// and forwards GENEVE whose inner destination routes to another peer.
const ConfigFlagTransit uint32 = 1 << 0

// ConfigFlagMasquerade is CFG_F_MASQUERADE: the node's pods reach destinations
// outside masq_exempt from the underlay address (egress masquerade).
const ConfigFlagMasquerade uint32 = 1 << 2

// ConfigFlagFabricEgress is CFG_F_FABRIC_EGRESS: the node's declared pods (sources
// in fabric_prefixes) reach the gateways of its site by the underlay device, where
// their answers arrive; their packets on RouteFlagViaFabric routes are encapsulated
// as they leave it (plan.NodePlan.FabricEgress).
const ConfigFlagFabricEgress uint32 = 1 << 3

// ConfigFlagFIBDirect is CFG_F_FIB_DIRECT: the node's policy rules are the
// kernel's own and isthmus', so the fast path's FIB lookups may ask the main table
// alone first (datapath.DirectFIB, bpf/lib/fib.h fib_lookup_v4_fast).
const ConfigFlagFIBDirect uint32 = 1 << 4

// RouteFlagViaFabric is ROUTE_F_VIA_FABRIC of bpf/lib/types.h: the route's next hops
// are gateways of this node's own site, reached by the underlay device (not isthmus0)
// by packets from sources in fabric_prefixes (plan.Route.ViaFabric).
const RouteFlagViaFabric uint32 = 1 << 0

// RouteFlagNotForPods is ROUTE_F_NOT_FOR_PODS of bpf/lib/types.h: the route serves
// forwarded packets only; a pod's packet reads it as a miss and is left to the
// kernel's routes (plan.Route.NotForPods).
const RouteFlagNotForPods uint32 = 1 << 2

// PeerFlagWireGuard is PEER_F_WIREGUARD of bpf/lib/types.h: an encrypted peer,
// known by its tunnel address; GENEVE to it goes into the WireGuard device, GENEVE
// from it is accepted only out of that device (plan.Peer.Encrypted).
const PeerFlagWireGuard uint32 = 1 << 0

// PeerFlagWireGuardNoKey is PEER_F_WIREGUARD_NO_KEY: with PeerFlagWireGuard, the
// peer's public key is not known yet; what would go to it is dropped and counted.
const PeerFlagWireGuardNoKey uint32 = 1 << 1

// PeerFlagUnderlay6 is PEER_F_UNDERLAY6: the peer is reached over the IPv6
// underlay, and its peers key is a handle (State.Handles). The maps package sets
// it from the address family; a State's Peer.Flags never hold it.
const PeerFlagUnderlay6 uint32 = 1 << 2

// PodIfaceFlagReserved is POD_IFACE_F_RESERVED: the interface is the CNI
// plugin's, and pod_ingress accepts only the sources pod_addrs lists for it.
const PodIfaceFlagReserved uint32 = 1 << 0

// PodIfaceFlagNoPeer is POD_IFACE_F_NO_PEER: the interface is not one end of a
// veth (or netkit) pair but, say, a bridge whose ports are the pods' veths
// (the bridge plugin's and flannel's cni0); delivery to it redirects to its
// egress instead of bpf_redirect_peer, which the kernel would drop.
const PodIfaceFlagNoPeer uint32 = 1 << 1

const (
	MapRoutes Name = "routes"
	// MapRoutes6 is MapRoutes for IPv6 inner destinations (same value).
	MapRoutes6     Name = "routes6"
	MapPeers       Name = "peers"
	MapPeerSources Name = "peer_sources"
	// MapPeerSources6 is MapPeerSources for IPv6 inner sources.
	MapPeerSources6 Name = "peer_sources6"
	MapConfig       Name = "config"
	MapPodIfaces    Name = "pod_ifaces"
	MapMetrics      Name = "metrics"
	// MapNexthopGroups is an array: an entry is never deleted, only zeroed.
	MapNexthopGroups  Name = "nexthop_groups"
	MapFabricPrefixes Name = "fabric_prefixes"
	MapSNATExempt     Name = "snat_exempt"
	// MapMasqExempt holds the destinations a managed pod reaches with its own
	// address; every other one leaving by the underlay is masqueraded.
	MapMasqExempt Name = "masq_exempt"
	// MapPodAddrs holds (host interface, address) of every address the CNI
	// plugin reserved for a pod.
	MapPodAddrs Name = "pod_addrs"
	// MapPodAddrs6 is MapPodAddrs for IPv6 addresses.
	MapPodAddrs6 Name = "pod_addrs6"
	// MapNat is the return-path SNAT connection table. The datapath owns its
	// entries: it is pinned but never part of a State, and its size is set at load
	// time (loader/datapath). A hash, not an LRU: the agent removes expired entries
	// (CollectNat).
	MapNat Name = "nat"
	// MapMasqNat is egress masquerade's connection table, as MapNat.
	MapMasqNat Name = "masq_nat"
	// MapNatSources counts the flows of each pod source in MapNat and MapMasqNat
	// (the share --snat-flows-per-source bounds). Datapath-owned, recounted by
	// CollectNat.
	MapNatSources Name = "nat_sources"
	// MapCtClose records the close of conntrack fast-path flows (bpf/lib/ct.h
	// ct_close_track), keyed by the conntrack entry's original tuple.
	// Datapath-owned; pinned so that a restarted agent still knows which flows the
	// fast path closed (conntrack itself holds them ESTABLISHED).
	MapCtClose Name = "ct_close"
	// MapCtClose6 is MapCtClose for IPv6 flows.
	MapCtClose6 Name = "ct_close6"
	// MapPeers6 maps the IPv6 underlay address of a peer to the handle the other
	// maps know it by (State.Handles).
	MapPeers6 Name = "peers6"
)

// AllMaps lists every map the datapath pins, in a stable order.
var AllMaps = []Name{MapRoutes, MapPeers, MapPeerSources, MapConfig, MapPodIfaces, MapMetrics,
	MapNexthopGroups, MapFabricPrefixes, MapSNATExempt, MapNat, MapHealthReach, MapHealthProbers,
	MapMasqExempt, MapPodAddrs, MapRedirectLast, MapRedirectDrops, MapMasqNat, MapNatSources,
	MapCtClose, MapPodAddrs6, MapRoutes6, MapPeerSources6, MapCtClose6, MapPeers6}

// IsHandle reports whether a is a peer handle: an address in 0.0.0.0/8 other than
// 0.0.0.0, which no peer's IPv4 address can be.
func IsHandle(a netip.Addr) bool {
	return a.Is4() && a.As4()[0] == 0 && a != netip.IPv4Unspecified()
}

// AddrToBE32 returns the __be32 form of an IPv4 address: a uint32 whose in-memory
// bytes are the address in network order. An invalid or IPv6 address gives 0.
func AddrToBE32(a netip.Addr) uint32 {
	a = a.Unmap()
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// AddrTo16 returns the __be32[4] form of an IPv6 address (network order in
// memory); an IPv4 or invalid address gives zeros.
func AddrTo16(a netip.Addr) [4]uint32 {
	var out [4]uint32
	if !a.Is6() || a.Is4In6() {
		return out
	}
	b := a.As16()
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return out
}

// From16ToAddr is the inverse of AddrTo16.
func From16ToAddr(v [4]uint32) netip.Addr {
	var b [16]byte
	for i, w := range v {
		binary.NativeEndian.PutUint32(b[4*i:], w)
	}
	return netip.AddrFrom16(b)
}

// BE32ToAddr is the inverse of AddrToBE32.
func BE32ToAddr(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// RouteKeyFromPrefix returns the LPM key of an IPv4 prefix; the address is masked.
func RouteKeyFromPrefix(p netip.Prefix) RouteKey {
	p = p.Masked()
	return RouteKey{Prefixlen: uint32(p.Bits()), Addr: AddrToBE32(p.Addr())}
}

// PrefixFromRouteKey is the inverse of RouteKeyFromPrefix.
func PrefixFromRouteKey(k RouteKey) netip.Prefix {
	return netip.PrefixFrom(BE32ToAddr(k.Addr), int(k.Prefixlen))
}

// Route6KeyFromPrefix returns the LPM key of an IPv6 prefix; the address is masked.
func Route6KeyFromPrefix(p netip.Prefix) Route6Key {
	p = p.Masked()
	return Route6Key{Prefixlen: uint32(p.Bits()), Addr: AddrTo16(p.Addr())}
}

// PrefixFromRoute6Key is the inverse of Route6KeyFromPrefix.
func PrefixFromRoute6Key(k Route6Key) netip.Prefix {
	return netip.PrefixFrom(From16ToAddr(k.Addr), int(k.Prefixlen))
}

// routeEntry returns the map and the key of the route for p: routes for an IPv4
// prefix, routes6 for an IPv6 one.
func routeEntry(p netip.Prefix) (Name, any) {
	if p.Addr().Is4() {
		return MapRoutes, RouteKeyFromPrefix(p)
	}
	return MapRoutes6, Route6KeyFromPrefix(p)
}

// PeerSource6KeyFrom is PeerSourceKeyFrom for an IPv6 source prefix.
func PeerSource6KeyFrom(s PeerSource) PeerSource6Key {
	src := s.Src.Masked()
	return PeerSource6Key{
		Prefixlen: 32 + uint32(src.Bits()),
		Peer:      AddrToBE32(s.Peer),
		Src:       AddrTo16(src.Addr()),
	}
}

// PeerSourceFrom6Key is the inverse of PeerSource6KeyFrom.
func PeerSourceFrom6Key(k PeerSource6Key) PeerSource {
	bits := max(int(k.Prefixlen)-32, 0)
	return PeerSource{Peer: BE32ToAddr(k.Peer), Src: netip.PrefixFrom(From16ToAddr(k.Src), bits)}
}

// entry returns the map and the key of s: peer_sources for an IPv4 source prefix,
// peer_sources6 for an IPv6 one.
func (s PeerSource) entry() (Name, any) {
	if s.Src.Addr().Is4() {
		return MapPeerSources, PeerSourceKeyFrom(s)
	}
	return MapPeerSources6, PeerSource6KeyFrom(s)
}

// PeerSourceKeyFrom returns the LPM key that allows inner sources in src from the
// peer at underlay address peer: prefixlen is 32 (the peer) plus src's length.
func PeerSourceKeyFrom(s PeerSource) PeerSourceKey {
	src := s.Src.Masked()
	return PeerSourceKey{
		Prefixlen: 32 + uint32(src.Bits()),
		Peer:      AddrToBE32(s.Peer),
		Src:       AddrToBE32(src.Addr()),
	}
}

// PeerSourceFromKey is the inverse of PeerSourceKeyFrom.
func PeerSourceFromKey(k PeerSourceKey) PeerSource {
	bits := int(k.Prefixlen) - 32
	if bits < 0 {
		bits = 0
	}
	return PeerSource{Peer: BE32ToAddr(k.Peer), Src: netip.PrefixFrom(BE32ToAddr(k.Src), bits)}
}
