package maps

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
)

// Op is what a Change does to one entry.
type Op int

const (
	// OpUpdate creates or overwrites an entry.
	OpUpdate Op = iota
	// OpDelete removes an entry.
	OpDelete
)

func (o Op) String() string {
	if o == OpDelete {
		return "delete"
	}
	return "update"
}

// Change is one entry to write or remove. Key and Value are the kernel types of map
// Map (Value is nil for a delete).
type Change struct {
	Op    Op
	Map   Name
	Key   any
	Value any
}

// String renders c as one transcript line, such as
// "update routes 10.1.0.0/24 -> 172.16.2.11".
func (c Change) String() string {
	if c.Op == OpDelete {
		return "delete " + Describe(c.Map, c.Key, nil)
	}
	return "update " + Describe(c.Map, c.Key, c.Value)
}

// Describe renders a kernel key (and value, unless nil) of map m as text:
// "routes 10.1.0.0/24 -> 172.16.2.11", "routes6 fd00:1::/64 -> 172.16.2.11", "peers 172.16.2.11",
// "peer_sources 172.16.2.11 10.1.0.0/24", "pod_ifaces 7",
// "routes 10.0.2.0/23 -> group 1", "routes 172.16.3.10/32 -> underlay (exception) flags=0x1",
// "nexthop_groups 1 live=2 172.16.2.11:30 172.16.2.12:34"
// (slots per member), "fabric_prefixes 10.0.2.0/23", "snat_exempt 10.1.0.0/24",
// "config vni=1 underlay=172.16.1.10 ...".
func Describe(m Name, key, value any) string {
	s := NewState()
	keyOnly := value == nil
	if keyOnly {
		value = zeroValue(m)
	}
	if err := s.insert(m, key, value); err != nil {
		return fmt.Sprintf("%s %v -> %v", m, key, value)
	}
	switch m {
	case MapRoutes, MapRoutes6:
		for p, r := range s.Routes {
			if keyOnly {
				return fmt.Sprintf("%s %v", m, p)
			}
			if r.Flags&RouteFlagUnderlay != 0 {
				return fmt.Sprintf("%s %v -> underlay (exception)%s", m, p, flags(r.Flags))
			}
			if r.Group != 0 {
				return fmt.Sprintf("%s %v -> group %d%s", m, p, r.Group, flags(r.Flags))
			}
			return fmt.Sprintf("%s %v -> %v%s", m, p, r.Peer, flags(r.Flags))
		}
	case MapPeers:
		for a, p := range s.Peers {
			if v, ok := value.(PeerValue); ok && p.Flags&PeerFlagUnderlay6 != 0 {
				return fmt.Sprintf("peers %v %v%s", a, From16ToAddr(v.Underlay6), flags(p.Flags))
			}
			return fmt.Sprintf("peers %v%s", a, flags(p.Flags))
		}
	case MapPeers6:
		for a, h := range s.Handles {
			if keyOnly {
				return fmt.Sprintf("peers6 %v", a)
			}
			return fmt.Sprintf("peers6 %v -> %v", a, h)
		}
	case MapPeerSources, MapPeerSources6:
		for ps := range s.PeerSources {
			return fmt.Sprintf("%s %v %v", m, ps.Peer, ps.Src)
		}
	case MapPodIfaces:
		for i, p := range s.PodIfaces {
			return fmt.Sprintf("pod_ifaces %d%s", i, flags(p.Flags))
		}
	case MapNexthopGroups:
		id, _ := key.(uint32)
		g := s.Groups[id]
		if keyOnly {
			return fmt.Sprintf("nexthop_groups %d", id)
		}
		return fmt.Sprintf("nexthop_groups %d live=%d%s", id, g.Live, slotCounts(g))
	case MapFabricPrefixes:
		for p := range s.FabricPrefixes {
			return fmt.Sprintf("fabric_prefixes %v", p)
		}
	case MapSNATExempt:
		for p := range s.SNATExempt {
			return fmt.Sprintf("snat_exempt %v", p)
		}
	case MapMasqExempt:
		for p := range s.MasqExempt {
			return fmt.Sprintf("masq_exempt %v", p)
		}
	case MapPodAddrs, MapPodAddrs6:
		for pa := range s.PodAddrs {
			if n, _ := pa.entry(); n == m {
				return fmt.Sprintf("%s %d %v", m, pa.Ifindex, pa.Addr)
			}
		}
	case MapConfig:
		c := s.Config
		out := fmt.Sprintf("config vni=%d underlay=%v underlay_ifindex=%d overlay_ifindex=%d overlay_mac=%v tunnel_mtu=%d%s",
			c.VNI, c.UnderlayIP, c.UnderlayIfindex, c.OverlayIfindex, net.HardwareAddr(c.OverlayMAC[:]), c.TunnelMTU, flags(c.Flags))
		if c.TunnelIP.IsValid() {
			out += fmt.Sprintf(" tunnel_ip=%v", c.TunnelIP)
		}
		if c.SNATPortMin != 0 || c.SNATPortMax != 0 {
			out += fmt.Sprintf(" snat_ports=%d-%d", c.SNATPortMin, c.SNATPortMax)
		}
		if c.WireGuardIfindex != 0 {
			out += fmt.Sprintf(" wg_ifindex=%d", c.WireGuardIfindex)
		}
		return out
	}
	return string(m)
}

// slotCounts renders how many slots each member of g owns: " 172.16.2.11:30 ...",
// members in address order.
func slotCounts(g NexthopGroup) string {
	n := map[netip.Addr]int{}
	for _, a := range g.Slots {
		if a.IsValid() {
			n[a]++
		}
	}
	var b strings.Builder
	for _, a := range sortedKeys(n, cmpAddr) {
		fmt.Fprintf(&b, " %v:%d", a, n[a])
	}
	return b.String()
}

func flags(f uint32) string {
	if f == 0 {
		return ""
	}
	return fmt.Sprintf(" flags=%#x", f)
}

func zeroValue(m Name) any {
	switch m {
	case MapRoutes, MapRoutes6:
		return RouteValue{}
	case MapPeers:
		return PeerValue{}
	case MapPeers6:
		return Peer6Value{}
	case MapPeerSources, MapPeerSources6:
		return PeerSourceValue{}
	case MapPodIfaces:
		return PodIfaceValue{}
	case MapConfig:
		return DatapathConfig{}
	case MapNexthopGroups:
		return NexthopGroupValue{}
	case MapFabricPrefixes:
		return FabricPrefixValue{}
	case MapSNATExempt:
		return SNATExemptValue{}
	case MapMasqExempt:
		return MasqExemptValue{}
	case MapPodAddrs, MapPodAddrs6:
		return PodAddrValue{}
	}
	return nil
}

// Diff returns the changes that turn current into desired: every update first
// (config, peers6, peers, peer_sources, pod_addrs, pod_ifaces, fabric_prefixes, snat_exempt, masq_exempt,
// nexthop_groups, routes: each family's entries in its own map (routes6,
// peer_sources6, pod_addrs6 for IPv6); a route is only written once its peer is accepted and
// its group filled), then every delete in the reverse order, each map's entries in
// key order. Entries equal in both are not touched. The config entry is never
// deleted, only overwritten. A nexthop_groups delete (an array entry) means writing
// the zero entry; Set.Delete does that. Only the groups that changed are written.
// A peer on the IPv6 underlay is written by its handle (State.Handles): its
// peers6 entry, then its peers entry with PeerFlagUnderlay6 and its address, and
// the routes and sources that name it hold the handle.
func Diff(current, desired State) []Change {
	var updates, deletes []Change
	if current.Config != desired.Config {
		updates = append(updates, Change{OpUpdate, MapConfig, uint32(0), desired.Config.toKernel()})
	}
	// Peers on the IPv6 underlay by their handles, as the kernel holds them.
	current, desired, handles := current.kernelView(), desired.kernelView(), desired.Handles
	for _, a := range sortedWhere(handles, cmpAddr, func(a, h netip.Addr) bool { c, ok := current.Handles[a]; return !ok || c != h }) {
		updates = append(updates, Change{OpUpdate, MapPeers6, Peer6Key{Addr: AddrTo16(a)}, Peer6Value{Handle: AddrToBE32(handles[a])}})
	}
	underlay6 := byHandle(handles)
	for _, a := range sortedWhere(desired.Peers, cmpAddr, func(a netip.Addr, v Peer) bool { c, ok := current.Peers[a]; return !ok || c != v }) {
		updates = append(updates, Change{OpUpdate, MapPeers, AddrToBE32(a), PeerValue{Flags: desired.Peers[a].Flags, Underlay6: AddrTo16(underlay6[a])}})
	}
	for _, ps := range sortedMissing(desired.PeerSources, current.PeerSources, cmpPeerSource) {
		n, k := ps.entry()
		updates = append(updates, Change{OpUpdate, n, k, PeerSourceValue{}})
	}
	// A pod's addresses before its interface's flag, so the check never runs
	// on an empty list.
	for _, pa := range sortedMissing(desired.PodAddrs, current.PodAddrs, cmpPodAddr) {
		n, k := pa.entry()
		updates = append(updates, Change{OpUpdate, n, k, PodAddrValue{}})
	}
	for _, i := range sortedWhere(desired.PodIfaces, cmp.Compare[uint32], func(i uint32, v PodIface) bool { c, ok := current.PodIfaces[i]; return !ok || c != v }) {
		updates = append(updates, Change{OpUpdate, MapPodIfaces, i, PodIfaceValue{Flags: desired.PodIfaces[i].Flags}})
	}
	for _, p := range sortedMissing(desired.FabricPrefixes, current.FabricPrefixes, cmpPrefix) {
		updates = append(updates, Change{OpUpdate, MapFabricPrefixes, RouteKeyFromPrefix(p), FabricPrefixValue{}})
	}
	for _, p := range sortedMissing(desired.SNATExempt, current.SNATExempt, cmpPrefix) {
		updates = append(updates, Change{OpUpdate, MapSNATExempt, RouteKeyFromPrefix(p), SNATExemptValue{}})
	}
	for _, p := range sortedMissing(desired.MasqExempt, current.MasqExempt, cmpPrefix) {
		updates = append(updates, Change{OpUpdate, MapMasqExempt, RouteKeyFromPrefix(p), MasqExemptValue{}})
	}
	for _, id := range sortedWhere(desired.Groups, cmp.Compare[uint32], func(id uint32, g NexthopGroup) bool { return current.Groups[id] != g }) {
		updates = append(updates, Change{OpUpdate, MapNexthopGroups, id, desired.Groups[id].toKernel()})
	}
	for _, p := range sortedWhere(desired.Routes, cmpPrefix, func(p netip.Prefix, r Route) bool { c, ok := current.Routes[p]; return !ok || c != r }) {
		r := desired.Routes[p]
		n, k := routeEntry(p)
		updates = append(updates, Change{OpUpdate, n, k, RouteValue{Peer: AddrToBE32(r.Peer), Flags: r.Flags, Group: r.Group}})
	}

	for _, p := range sortedMissing(current.Routes, desired.Routes, cmpPrefix) {
		n, k := routeEntry(p)
		deletes = append(deletes, Change{Op: OpDelete, Map: n, Key: k})
	}
	for _, id := range sortedWhere(current.Groups, cmp.Compare[uint32], func(id uint32, g NexthopGroup) bool { _, ok := desired.Groups[id]; return !ok && !g.IsZero() }) {
		deletes = append(deletes, Change{Op: OpDelete, Map: MapNexthopGroups, Key: id})
	}
	for _, pa := range sortedMissing(current.PodAddrs, desired.PodAddrs, cmpPodAddr) {
		n, k := pa.entry()
		deletes = append(deletes, Change{Op: OpDelete, Map: n, Key: k})
	}
	for _, p := range sortedMissing(current.MasqExempt, desired.MasqExempt, cmpPrefix) {
		deletes = append(deletes, Change{Op: OpDelete, Map: MapMasqExempt, Key: RouteKeyFromPrefix(p)})
	}
	for _, p := range sortedMissing(current.SNATExempt, desired.SNATExempt, cmpPrefix) {
		deletes = append(deletes, Change{Op: OpDelete, Map: MapSNATExempt, Key: RouteKeyFromPrefix(p)})
	}
	for _, p := range sortedMissing(current.FabricPrefixes, desired.FabricPrefixes, cmpPrefix) {
		deletes = append(deletes, Change{Op: OpDelete, Map: MapFabricPrefixes, Key: RouteKeyFromPrefix(p)})
	}
	for _, i := range sortedMissing(current.PodIfaces, desired.PodIfaces, cmp.Compare[uint32]) {
		deletes = append(deletes, Change{Op: OpDelete, Map: MapPodIfaces, Key: i})
	}
	for _, ps := range sortedMissing(current.PeerSources, desired.PeerSources, cmpPeerSource) {
		n, k := ps.entry()
		deletes = append(deletes, Change{Op: OpDelete, Map: n, Key: k})
	}
	for _, a := range sortedMissing(current.Peers, desired.Peers, cmpAddr) {
		deletes = append(deletes, Change{Op: OpDelete, Map: MapPeers, Key: AddrToBE32(a)})
	}
	for _, a := range sortedMissing(current.Handles, handles, cmpAddr) {
		deletes = append(deletes, Change{Op: OpDelete, Map: MapPeers6, Key: Peer6Key{Addr: AddrTo16(a)}})
	}
	return append(updates, deletes...)
}

// Writer is what the applier writes through: the pinned maps (Set) or a test fake.
// Key and value are the kernel types of map m.
type Writer interface {
	Update(m Name, key, value any) error
	Delete(m Name, key any) error
}

// Result is what Apply wrote.
type Result struct {
	// Applied are the changes that took effect, in order.
	Applied []Change
	// Updated and Deleted count them by kind.
	Updated, Deleted int
}

// Apply writes changes in order through w and stops at the first error, returning
// what it wrote up to there (the caller re-reads the maps before the next Diff, so a
// partial failure is repaired by the next sync). A delete that finds no entry
// (ebpf.ErrKeyNotExist) counts as done.
func Apply(w Writer, changes []Change) (Result, error) {
	var res Result
	for _, c := range changes {
		switch c.Op {
		case OpUpdate:
			if err := w.Update(c.Map, c.Key, c.Value); err != nil {
				return res, fmt.Errorf("update %s: %w", Describe(c.Map, c.Key, c.Value), err)
			}
			res.Updated++
		case OpDelete:
			if err := w.Delete(c.Map, c.Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return res, fmt.Errorf("delete %s: %w", Describe(c.Map, c.Key, nil), err)
			}
			res.Deleted++
		}
		res.Applied = append(res.Applied, c)
	}
	return res, nil
}

func sortedKeys[K comparable, V any](m map[K]V, f func(a, b K) int) []K {
	return sortedWhere(m, f, func(K, V) bool { return true })
}

// sortedWhere returns the keys of m whose entries keep accepts, ordered by f.
// Only those are sorted: a diff of two states of 5,000 entries each that
// differ in a few sorts the few, so a one-Node change costs what it changes.
func sortedWhere[K comparable, V any](m map[K]V, f func(a, b K) int, keep func(K, V) bool) []K {
	var keys []K
	for k, v := range m {
		if keep(k, v) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, f)
	return keys
}

// sortedMissing returns the keys of m that other lacks, ordered by f.
func sortedMissing[K comparable, V, W any](m map[K]V, other map[K]W, f func(a, b K) int) []K {
	return sortedWhere(m, f, func(k K, _ V) bool { _, ok := other[k]; return !ok })
}

func cmpAddr(a, b netip.Addr) int { return a.Compare(b) }

func cmpPrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

func cmpPeerSource(a, b PeerSource) int {
	if c := a.Peer.Compare(b.Peer); c != 0 {
		return c
	}
	return cmpPrefix(a.Src, b.Src)
}

func cmpPodAddr(a, b PodAddr) int {
	if c := cmp.Compare(a.Ifindex, b.Ifindex); c != 0 {
		return c
	}
	return a.Addr.Compare(b.Addr)
}

// entry returns the map and the key of pa: pod_addrs for an IPv4 address,
// pod_addrs6 for an IPv6 one.
func (pa PodAddr) entry() (Name, any) {
	if a := pa.Addr.Unmap(); a.Is4() {
		return MapPodAddrs, PodAddrKey{Ifindex: pa.Ifindex, Addr: AddrToBE32(a)}
	}
	return MapPodAddrs6, PodAddr6Key{Ifindex: pa.Ifindex, Addr: AddrTo16(pa.Addr)}
}
