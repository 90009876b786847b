package maps

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
)

// State is the contents of the datapath's writable maps as plain data: what a node
// should hold (loader/mapstate.FromPlan) or what it holds (Set.Read). The metrics and nat maps are
// not part of it (the datapath writes them). The zero State is empty; Diff treats
// nil maps as empty.
type State struct {
	// Routes are the routes (IPv4 prefixes) and routes6 (IPv6) entries.
	Routes map[netip.Prefix]Route
	Peers  map[netip.Addr]Peer
	// PeerSources are the peer_sources (IPv4 sources) and peer_sources6 (IPv6)
	// entries.
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
	// PodAddrs are the pod_addrs (IPv4) and pod_addrs6 (IPv6) entries: the
	// addresses the CNI plugin reserved for the pod behind each host interface.
	PodAddrs map[PodAddr]struct{}
	// Handles are the peers6 entries: the handle (an address in 0.0.0.0/8,
	// IsHandle) of each peer on the IPv6 underlay, which the kernel's peers,
	// routes and peer_sources hold in place of its 16-byte address. Everywhere
	// else in a State such a peer is its IPv6 address (AssignHandles).
	Handles map[netip.Addr]netip.Addr
	Config  Config
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
	// WireGuardIfindex is the WireGuard device encrypted peers' GENEVE goes
	// into; 0 means none (what is for an encrypted peer is dropped).
	WireGuardIfindex uint32
	// UnderlayIP6 is the node's IPv6 tunnel endpoint, the outer source to peers
	// on the IPv6 underlay; invalid means none.
	UnderlayIP6 netip.Addr
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
		Handles:        maps.Clone(s.Handles),
		Config:         s.Config,
	}
}

// Equal reports whether s and o hold the same entries (nil and empty maps are equal).
func (s State) Equal(o State) bool {
	return maps.Equal(s.Routes, o.Routes) && maps.Equal(s.Peers, o.Peers) &&
		maps.Equal(s.PeerSources, o.PeerSources) && maps.Equal(s.PodIfaces, o.PodIfaces) &&
		maps.Equal(s.Groups, o.Groups) && maps.Equal(s.FabricPrefixes, o.FabricPrefixes) &&
		maps.Equal(s.SNATExempt, o.SNATExempt) && maps.Equal(s.MasqExempt, o.MasqExempt) &&
		maps.Equal(s.PodAddrs, o.PodAddrs) && maps.Equal(s.Handles, o.Handles) && s.Config == o.Config
}

// Len is the number of entries in s, the config entry included.
func (s State) Len() int {
	return len(s.Routes) + len(s.Peers) + len(s.PeerSources) + len(s.PodIfaces) +
		len(s.Groups) + len(s.FabricPrefixes) + len(s.SNATExempt) + len(s.MasqExempt) + len(s.PodAddrs) +
		len(s.Handles) + 1
}

// NewState returns an empty State with every map made.
func NewState() State {
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
		Handles:        map[netip.Addr]netip.Addr{},
	}
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
		WgIfindex:       c.WireGuardIfindex,
		UnderlayIp6:     AddrTo16(c.UnderlayIP6),
	}
}

func configFromKernel(k DatapathConfig) Config {
	c := Config{
		VNI:              k.Vni,
		UnderlayIfindex:  k.UnderlayIfindex,
		OverlayIfindex:   k.OverlayIfindex,
		OverlayMAC:       k.OverlayMac,
		TunnelMTU:        k.TunnelMtu,
		Flags:            k.Flags,
		SNATPortMin:      k.SnatPortMin,
		SNATPortMax:      k.SnatPortMax,
		WireGuardIfindex: k.WgIfindex,
	}
	if k.UnderlayIp != 0 {
		c.UnderlayIP = BE32ToAddr(k.UnderlayIp)
	}
	if k.TunnelIp != 0 {
		c.TunnelIP = BE32ToAddr(k.TunnelIp)
	}
	if k.UnderlayIp6 != [4]uint32{} {
		c.UnderlayIP6 = From16ToAddr(k.UnderlayIp6)
	}
	return c
}

// routeFromKernel is the Route of a routes or routes6 value: a peer, or a group
// (whose entry has no peer).
func routeFromKernel(v RouteValue) Route {
	r := Route{Flags: v.Flags, Group: v.Group}
	if v.Peer != 0 || v.Group == 0 {
		r.Peer = BE32ToAddr(v.Peer)
	}
	return r
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
		s.Routes[PrefixFromRouteKey(k)] = routeFromKernel(v)
		return nil
	case MapRoutes6:
		k, ok1 := key.(Route6Key)
		v, ok2 := value.(RouteValue)
		if !ok1 || !ok2 {
			break
		}
		s.Routes[PrefixFromRoute6Key(k)] = routeFromKernel(v)
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
	case MapPodAddrs6:
		k, ok := key.(PodAddr6Key)
		if !ok {
			break
		}
		s.PodAddrs[PodAddr{Ifindex: k.Ifindex, Addr: From16ToAddr(k.Addr)}] = struct{}{}
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
		// A handle's flags keep PeerFlagUnderlay6 until resolveHandles.
		s.Peers[BE32ToAddr(k)] = Peer{Flags: v.Flags}
		return nil
	case MapPeers6:
		k, ok1 := key.(Peer6Key)
		v, ok2 := value.(Peer6Value)
		if !ok1 || !ok2 {
			break
		}
		s.Handles[From16ToAddr(k.Addr)] = BE32ToAddr(v.Handle)
		return nil
	case MapPeerSources:
		k, ok := key.(PeerSourceKey)
		if !ok {
			break
		}
		s.PeerSources[PeerSourceFromKey(k)] = struct{}{}
		return nil
	case MapPeerSources6:
		k, ok := key.(PeerSource6Key)
		if !ok {
			break
		}
		s.PeerSources[PeerSourceFrom6Key(k)] = struct{}{}
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

// ErrCapacity is wrapped by CheckCapacity's errors: a map is too small for the
// state it is to hold.
var ErrCapacity = errors.New("map too small")

// Counts returns the number of entries s puts in each map whose entries are
// keyed by what the plan holds (routes, routes6, peers, peer_sources,
// peer_sources6, pod_ifaces, fabric_prefixes, snat_exempt).
func (s State) Counts() map[Name]int {
	c := map[Name]int{
		MapPeers:          len(s.Peers),
		MapPodIfaces:      len(s.PodIfaces),
		MapFabricPrefixes: len(s.FabricPrefixes),
		MapSNATExempt:     len(s.SNATExempt),
		MapPeers6:         len(s.Handles),
	}
	for p := range s.Routes {
		n, _ := routeEntry(p)
		c[n]++
	}
	for ps := range s.PeerSources {
		n, _ := ps.entry()
		c[n]++
	}
	return c
}

// CheckCapacity reports, wrapping ErrCapacity, every map of set that holds
// fewer entries than desired needs. Writing such a state would fail part way
// (the kernel refuses an insert into a full map) and leave routes missing.
func (set *Set) CheckCapacity(desired State) error {
	var errs []error
	counts := desired.Counts()
	for _, n := range AllMaps {
		need, ok := counts[n]
		m := set.maps[n]
		if !ok || m == nil || need <= int(m.MaxEntries()) {
			continue
		}
		errs = append(errs, fmt.Errorf("%w: %s holds %d entries and the plan needs %d", ErrCapacity, n, m.MaxEntries(), need))
	}
	return errors.Join(errs...)
}

// Prefix4 returns p masked, with its address unmapped, and whether it is
// IPv4: the form of every prefix key of the maps.
func Prefix4(p netip.Prefix) (netip.Prefix, bool) {
	a := p.Addr().Unmap()
	if !a.Is4() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, p.Bits()).Masked(), true
}
