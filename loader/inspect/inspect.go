// Package inspect reads the pinned maps of a node and turns them into the views
// `isthmus inspect` prints: routes, peers, the nat table, counters, next-hop groups
// and config, as plain data with JSON tags and as text tables. It only reads; it
// works whether or not the agent runs, and needs the rights to open pinned maps
// (root, or CAP_BPF with access to the pin directory).
package inspect

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/maps"
)

// Views lists the views Read accepts, in the order of the usage text.
var Views = []string{"routes", "peers", "nat", "counters", "groups", "config"}

// ErrNotBPFFS is wrapped by Open when the pin directory is not on a BPF file system.
var ErrNotBPFFS = errors.New("not on a bpf file system")

// Maps is a node's pinned maps open for reading, with the clock nat ages are
// measured against.
type Maps struct {
	set *maps.Set
	// Now returns CLOCK_MONOTONIC in ns (maps.MonotonicNow); tests replace it.
	Now func() (uint64, error)
	// Plan, if set, is the node's plan: Groups then names each group's remote
	// site and every member it plans, with whether that member reaches the
	// site now, and lists the groups no member reaches.
	Plan *plan.NodePlan
}

// Open opens the maps pinned in dir. It fails with a clear message when dir does
// not exist, is not a directory on bpffs (wrapping ErrNotBPFFS), or lacks a map.
// Close releases the maps; the pins stay.
func Open(dir string) (*Maps, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("open pin dir %s: %w (is the agent installed on this node? see --pin-dir)", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("open pin dir %s: not a directory", dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil, fmt.Errorf("open pin dir %s: %w", dir, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return nil, fmt.Errorf("open pin dir %s: %w (mount one with: mount -t bpf bpf /sys/fs/bpf)", dir, ErrNotBPFFS)
	}
	set, err := maps.OpenPinned(dir)
	if err != nil {
		return nil, fmt.Errorf("open pin dir %s: %w", dir, err)
	}
	return &Maps{set: set, Now: maps.MonotonicNow}, nil
}

// Close closes the maps.
func (m *Maps) Close() error { return m.set.Close() }

// Route is a routes entry, with the live members of its group.
type Route struct {
	Prefix netip.Prefix `json:"prefix"`
	// Peer is the underlay address of the peer, invalid when Group is set.
	Peer  netip.Addr `json:"peer,omitzero"`
	Group uint32     `json:"group,omitempty"`
	// Members are the slot owners of the group now; empty for a group with no
	// live member (the datapath drops with no_nexthop).
	Members []maps.SlotOwner `json:"members,omitempty"`
	// Flags are ROUTE_F_*: 0x1 (maps.RouteFlagUnderlay) marks an exception,
	// a prefix not tunnelled here (no peer, no group).
	Flags uint32 `json:"flags"`
}

// Peer is a peers entry with its allowed inner sources (peer_sources).
type Peer struct {
	Underlay       netip.Addr     `json:"underlay"`
	Flags          uint32         `json:"flags"`
	AllowedSources []netip.Prefix `json:"allowedSources"`
}

// NatFlow is a translated connection: both directions of the nat table paired.
type NatFlow struct {
	Proto string `json:"proto"`
	// Pod is the pod's address and port, Dst where it talks to, Translated the
	// source its packets leave with.
	Pod        netip.AddrPort `json:"pod"`
	Dst        netip.AddrPort `json:"dst"`
	Translated netip.AddrPort `json:"translated"`
	// State is the TCP state; "" for other protocols.
	State string `json:"state,omitempty"`
	// IdleSeconds is the time since the last packet either way.
	IdleSeconds float64 `json:"idleSeconds"`
	Live        bool    `json:"live"`
	// Halves says which entries exist: "both", "forward" or "reply" (the LRU
	// table evicted the other).
	Halves string `json:"halves"`
}

// Counter is one non-zero metrics counter summed over CPUs.
type Counter struct {
	Name string `json:"name"`
	Hook string `json:"hook"`
	// Drop is true for a drop reason; Description then says what was dropped.
	Drop        bool   `json:"drop"`
	Description string `json:"description,omitempty"`
	Packets     uint64 `json:"packets"`
	Bytes       uint64 `json:"bytes"`
}

// Group is a next-hop group.
type Group struct {
	ID     uint32           `json:"id"`
	Live   uint32           `json:"live"`
	Owners []maps.SlotOwner `json:"owners"`
	// Site and Members come from Maps.Plan: the remote site the group leads to
	// ("" for a group of nodes that deliver the prefix themselves) and every
	// member the plan gives it.
	Site    string        `json:"site,omitempty"`
	Members []GroupMember `json:"members,omitempty"`
}

// GroupMember is a planned member of a group. Reaches is true when it owns
// slots: it answers its health checks and reaches the group's site.
type GroupMember struct {
	Peer     string     `json:"peer"`
	Underlay netip.Addr `json:"underlay"`
	Reaches  bool       `json:"reaches"`
}

// Config is the config entry and the small sets that go with it.
type Config struct {
	VNI             uint32         `json:"vni"`
	UnderlayIP      netip.Addr     `json:"underlayIP,omitzero"`
	UnderlayIfindex uint32         `json:"underlayIfindex"`
	OverlayIfindex  uint32         `json:"overlayIfindex"`
	OverlayMAC      string         `json:"overlayMAC"`
	TunnelMTU       uint16         `json:"tunnelMTU"`
	Flags           []string       `json:"flags"`
	TunnelIP        netip.Addr     `json:"tunnelIP,omitzero"`
	SNATPortMin     uint16         `json:"snatPortMin"`
	SNATPortMax     uint16         `json:"snatPortMax"`
	PodIfindexes    []uint32       `json:"podIfindexes"`
	FabricPrefixes  []netip.Prefix `json:"fabricPrefixes"`
	SNATExempt      []netip.Prefix `json:"snatExempt"`
	MasqExempt      []netip.Prefix `json:"masqExempt"`
}

// Routes returns the routes, sorted by prefix, with their groups' live members.
func (m *Maps) Routes() ([]Route, error) {
	st, err := m.set.Read()
	if err != nil {
		return nil, err
	}
	var out []Route
	for p, r := range st.Routes {
		rt := Route{Prefix: p, Group: r.Group, Flags: r.Flags}
		switch {
		case r.Flags&maps.RouteFlagUnderlay != 0:
			// An exception: neither peer nor group.
		case r.Group != 0:
			rt.Members = st.Groups[r.Group].Owners()
		default:
			rt.Peer = r.Peer
		}
		out = append(out, rt)
	}
	slices.SortFunc(out, func(a, b Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	return out, nil
}

// Peers returns the peers sorted by underlay address, each with its allowed
// sources. A peer_sources entry of an address that is no peer is listed as a peer
// with flags 0, so nothing the maps hold is hidden.
func (m *Maps) Peers() ([]Peer, error) {
	st, err := m.set.Read()
	if err != nil {
		return nil, err
	}
	byAddr := map[netip.Addr]*Peer{}
	for a, p := range st.Peers {
		byAddr[a] = &Peer{Underlay: a, Flags: p.Flags, AllowedSources: []netip.Prefix{}}
	}
	for s := range st.PeerSources {
		p := byAddr[s.Peer]
		if p == nil {
			p = &Peer{Underlay: s.Peer, AllowedSources: []netip.Prefix{}}
			byAddr[s.Peer] = p
		}
		p.AllowedSources = append(p.AllowedSources, s.Src)
	}
	var out []Peer
	for _, p := range byAddr {
		slices.SortFunc(p.AllowedSources, comparePrefix)
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return a.Underlay.Compare(b.Underlay) })
	return out, nil
}

// Nat returns the nat table (return-path SNAT) and then the masq_nat table
// (egress masquerade, translated to the underlay address) as flows, aged against
// m.Now.
func (m *Maps) Nat() ([]NatFlow, error) {
	var flows []maps.NatFlow
	for _, n := range []maps.Name{maps.MapNat, maps.MapMasqNat} {
		entries, err := maps.ReadNat(m.set.Map(n))
		if err != nil {
			return nil, err
		}
		flows = append(flows, maps.PairNat(entries)...)
	}
	now, err := m.Now()
	if err != nil {
		return nil, err
	}
	var out []NatFlow
	for _, f := range flows {
		nf := NatFlow{
			Proto: maps.ProtoName(f.Proto), Pod: f.Pod, Dst: f.Dst, Translated: f.Translated,
			IdleSeconds: f.Idle(now).Seconds(), Live: f.Live(now), Halves: "both",
		}
		if f.Proto == maps.ProtoTCP {
			nf.State = maps.NatStateName(f.State())
		}
		switch {
		case f.Forward == nil:
			nf.Halves = "reply"
		case f.Reply == nil:
			nf.Halves = "forward"
		}
		out = append(out, nf)
	}
	return out, nil
}

// Counters returns the non-zero counters, verdicts first, then drops, each by
// name and hook.
func (m *Maps) Counters() ([]Counter, error) {
	all, err := maps.ReadMetrics(m.set.Map(maps.MapMetrics))
	if err != nil {
		return nil, err
	}
	var out []Counter
	for k, c := range all {
		if c.Packets == 0 && c.Bytes == 0 {
			continue
		}
		ct := Counter{Name: k.Name(), Hook: k.Hook.String(), Drop: k.IsDrop(), Packets: c.Packets, Bytes: c.Bytes}
		if r, ok := maps.DropReasonByCode(-int32(k.Code)); ok {
			ct.Description = r.Description
		}
		out = append(out, ct)
	}
	after, err := m.redirectDrops()
	if err != nil {
		return nil, err
	}
	out = append(out, after...)
	slices.SortFunc(out, func(a, b Counter) int {
		if a.Drop != b.Drop {
			if a.Drop {
				return 1
			}
			return -1
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Hook, b.Hook)
	})
	return out, nil
}

// redirectDrops returns the kfree_skb tracer's non-zero counters as drops named
// "kernel:<reason>", with the running kernel's name for the reason.
func (m *Maps) redirectDrops() ([]Counter, error) {
	all, err := maps.ReadRedirectDrops(m.set.Map(maps.MapRedirectDrops))
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, nil
	}
	names, _ := maps.KernelDropReasons() // without BTF: reason_<n>
	var out []Counter
	for k, c := range all {
		if c.Packets == 0 && c.Bytes == 0 {
			continue
		}
		reason := maps.KernelDropReasonName(names, k.Reason)
		out = append(out, Counter{Name: "kernel:" + reason, Hook: k.Hook.String(), Drop: true,
			Description: "The kernel freed the packet (SKB_DROP_REASON_" + reason + ") after the program redirected it.",
			Packets:     c.Packets, Bytes: c.Bytes})
	}
	return out, nil
}

// Groups returns the next-hop groups with a live member, by id. With Plan
// set, every group a planned route points at is listed, with its site and
// planned members, also when no member reaches the site (no live member).
func (m *Maps) Groups() ([]Group, error) {
	st, err := m.set.Read()
	if err != nil {
		return nil, err
	}
	byID := map[uint32]*Group{}
	for id, g := range st.Groups {
		byID[id] = &Group{ID: id, Live: g.Live, Owners: g.Owners()}
	}
	if m.Plan != nil {
		for _, r := range m.Plan.Routes {
			pr, ok := maps.Prefix4(r.Prefix)
			if len(r.Group) == 0 || !ok {
				continue
			}
			kr, ok := st.Routes[pr]
			if !ok || kr.Group == 0 {
				continue
			}
			g := byID[kr.Group]
			if g == nil {
				g = &Group{ID: kr.Group}
				byID[kr.Group] = g
			}
			if g.Members != nil {
				continue
			}
			g.Site = r.Site
			for _, nh := range r.Group {
				owns := slices.ContainsFunc(g.Owners, func(o maps.SlotOwner) bool { return o.Member == nh.Via.Unmap() })
				g.Members = append(g.Members, GroupMember{Peer: nh.Peer, Underlay: nh.Via, Reaches: owns})
			}
		}
	}
	out := make([]Group, 0, len(byID))
	for _, g := range byID {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b Group) int { return int(a.ID) - int(b.ID) })
	return out, nil
}

// Config returns the config entry with the pod interfaces, fabric prefixes and
// SNAT exempt sources.
func (m *Maps) Config() (Config, error) {
	st, err := m.set.Read()
	if err != nil {
		return Config{}, err
	}
	c := st.Config
	out := Config{
		VNI: c.VNI, UnderlayIP: c.UnderlayIP, UnderlayIfindex: c.UnderlayIfindex, OverlayIfindex: c.OverlayIfindex,
		OverlayMAC: netMAC(c.OverlayMAC), TunnelMTU: c.TunnelMTU, Flags: []string{}, TunnelIP: c.TunnelIP,
		SNATPortMin: c.SNATPortMin, SNATPortMax: c.SNATPortMax,
		PodIfindexes: []uint32{}, FabricPrefixes: []netip.Prefix{}, SNATExempt: []netip.Prefix{},
		MasqExempt: []netip.Prefix{},
	}
	if c.Flags&maps.ConfigFlagTransit != 0 {
		out.Flags = append(out.Flags, "transit")
	}
	if c.Flags&maps.ConfigFlagTrace != 0 {
		out.Flags = append(out.Flags, "trace")
	}
	if c.Flags&maps.ConfigFlagMasquerade != 0 {
		out.Flags = append(out.Flags, "masquerade")
	}
	if c.Flags&maps.ConfigFlagFabricEgress != 0 {
		out.Flags = append(out.Flags, "fabric-egress")
	}
	if c.Flags&maps.ConfigFlagFIBDirect != 0 {
		out.Flags = append(out.Flags, "fib-direct")
	}
	if rest := c.Flags &^ (maps.ConfigFlagTransit | maps.ConfigFlagTrace | maps.ConfigFlagMasquerade | maps.ConfigFlagFabricEgress | maps.ConfigFlagFIBDirect); rest != 0 {
		out.Flags = append(out.Flags, fmt.Sprintf("0x%x", rest))
	}
	for i := range st.PodIfaces {
		out.PodIfindexes = append(out.PodIfindexes, i)
	}
	slices.Sort(out.PodIfindexes)
	for p := range st.FabricPrefixes {
		out.FabricPrefixes = append(out.FabricPrefixes, p)
	}
	slices.SortFunc(out.FabricPrefixes, comparePrefix)
	for p := range st.SNATExempt {
		out.SNATExempt = append(out.SNATExempt, p)
	}
	slices.SortFunc(out.SNATExempt, comparePrefix)
	for p := range st.MasqExempt {
		out.MasqExempt = append(out.MasqExempt, p)
	}
	slices.SortFunc(out.MasqExempt, comparePrefix)
	return out, nil
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

func netMAC(b [6]byte) string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}
