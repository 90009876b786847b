package datapath

import (
	"errors"
	stdmaps "maps"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/bpf"
	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv/testns"
)

// migrationEnv is a fresh pin dir under /sys/fs/bpf, removed when the test ends.
func migrationEnv(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test pins BPF maps and links and needs root (sudo go test ./loader/datapath)")
	}
	if err := CheckBPFFS("/sys/fs/bpf"); err != nil {
		if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, ""); err != nil {
			t.Fatalf("mount bpffs on /sys/fs/bpf: %v", err)
		}
	}
	testns.Leftovers(t, "isthmus-test")
	dir := filepath.Join(testns.PinRoot, testns.Name("isthmus-test"))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// inNewNetns locks the test's thread into a new network namespace with a veth
// pair up, and returns its index; the thread is never unlocked.
func inNewNetns(t *testing.T, name string) int {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Set(orig); ns.Close(); orig.Close() })
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatalf("create veth %s: %v", name, err)
	}
	for _, n := range []string{name + "p", name} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

func natKey(i int) maps.NatKey {
	return maps.NatKey{Saddr: uint32(0x0a000000 + i), Daddr: 0x0a0a0a0a, Sport: uint16(1000 + i), Dport: 53, Proto: 17}
}

func pinnedMapID(t *testing.T, dir string, n maps.Name) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, string(n)), nil)
	if err != nil {
		t.Fatalf("open pinned %s: %v", n, err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

func linkProg(t *testing.T, path string) (link.ID, ebpf.ProgramID) {
	t.Helper()
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		t.Fatalf("open pinned link %s: %v", path, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.ID, info.Program
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

func noTempPins(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), tempSuffix) {
			t.Errorf("temporary pin %s left in %s", e.Name(), dir)
		}
	}
}

// TestLoadMigratesNatSize: a pinned nat map of another size (a new
// --snat-table-size) is migrated instead of refused: the new size is pinned, the
// nat entries and counters are kept, the pinned link keeps its id and runs the new
// program, no temporary pin is left, and a second Load is a no-op.
func TestLoadMigratesNatSize(t *testing.T) {
	dir := migrationEnv(t)
	ifindex := inNewNetns(t, "mig0")

	dp, err := Load(dir, Options{NatEntries: 1024})
	if err != nil {
		t.Fatalf("first load: %v", err)
	}
	if r, ok := readLayout(dir); !ok || r.Version != maps.LayoutVersion {
		t.Errorf("layout record after the first load = %+v, %v; want version %d", r, ok, maps.LayoutVersion)
	}
	nat, met := dp.Maps.Map(maps.MapNat), dp.Maps.Map(maps.MapMetrics)
	for i := range 100 {
		if err := nat.Update(natKey(i), maps.NatValue{Addr: 0x01020304, Port: uint16(i), LastSeen: uint64(i)}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	counters := make([]maps.MetricsValue, ncpu)
	counters[0] = maps.MetricsValue{Packets: 7, Bytes: 700}
	mk := maps.MetricSlot(maps.MetricKey{Code: 3, Hook: maps.HookOverlayEgress})
	if err := met.Update(mk, counters, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	route := maps.RouteKeyFromPrefix(netip.MustParsePrefix("10.9.0.0/16"))
	if err := dp.Maps.Update(maps.MapRoutes, route, maps.RouteValue{}); err != nil {
		t.Fatal(err)
	}
	att, err := Attach(dir, HookPodIngress, dp.Program(HookPodIngress), "mig0", ifindex)
	if err != nil {
		t.Fatal(err)
	}
	oldProg := progID(t, dp.Program(HookPodIngress))
	oldRoutes := pinnedMapID(t, dir, maps.MapRoutes)
	dp.Close()

	dp, err = Load(dir, Options{NatEntries: 2048})
	if err != nil {
		t.Fatalf("load with another nat size: %v", err)
	}
	noTempPins(t, dir)
	pinned, err := ebpf.LoadPinnedMap(filepath.Join(dir, string(maps.MapNat)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if pinned.MaxEntries() != 2048 {
		t.Errorf("pinned nat has %d entries, want 2048", pinned.MaxEntries())
	}
	for i := range 100 {
		var v maps.NatValue
		if err := pinned.Lookup(natKey(i), &v); err != nil {
			t.Errorf("nat entry %d lost in the migration: %v", i, err)
		} else if v.Port != uint16(i) || v.LastSeen != uint64(i) {
			t.Errorf("nat entry %d = %+v after the migration", i, v)
		}
	}
	pinned.Close()
	got := make([]maps.MetricsValue, ncpu)
	if err := dp.Maps.Map(maps.MapMetrics).Lookup(mk, got); err != nil || got[0] != counters[0] {
		t.Errorf("metrics after the migration = %+v, %v; want %+v", got[0], err, counters[0])
	}
	if pinnedMapID(t, dir, maps.MapRoutes) != oldRoutes {
		t.Error("routes, whose layout did not change, was replaced")
	}
	var rv maps.RouteValue
	if err := dp.Maps.Map(maps.MapRoutes).Lookup(route, &rv); err != nil {
		t.Errorf("route lost: %v", err)
	}
	lid, pid := linkProg(t, LinkPin(dir, "mig0", HookPodIngress))
	if lid != att.LinkID {
		t.Errorf("link id %d became %d", att.LinkID, lid)
	}
	if newProg := progID(t, dp.Program(HookPodIngress)); pid != newProg || pid == oldProg {
		t.Errorf("link runs program %d; old %d, new %d", pid, oldProg, newProg)
	}
	// The new program uses the migrated nat map.
	natID := pinnedMapID(t, dir, maps.MapNat)
	info, err := dp.Program(HookPodIngress).Info()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := info.MapIDs()
	found := false
	for _, id := range ids {
		found = found || id == natID
	}
	if !found {
		t.Errorf("pod_ingress uses maps %v, not the pinned nat %d", ids, natID)
	}
	dp.Close()

	dp, err = Load(dir, Options{NatEntries: 2048})
	if err != nil {
		t.Fatalf("third load: %v", err)
	}
	defer dp.Close()
	if id := pinnedMapID(t, dir, maps.MapNat); id != natID {
		t.Errorf("a load with the same layout replaced nat (%d -> %d)", natID, id)
	}
}

// TestLoadMigratesOldLayout: maps pinned by an older build whose peers value was
// another size (no converter: the agent rewrites it through Fill before the
// switch) and whose nat had another size are migrated; Fill sees the new maps.
func TestLoadMigratesOldLayout(t *testing.T) {
	dir := migrationEnv(t)
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range maps.AllMaps {
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinNone
		switch n {
		case maps.MapNat:
			ms.MaxEntries = 512
		case maps.MapPeers:
			ms.ValueSize += 8
			ms.Key, ms.Value = nil, nil
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create old %s: %v", n, err)
		}
		if n == maps.MapNat {
			if err := m.Update(natKey(1), maps.NatValue{Port: 4242}, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}
		if n == maps.MapPeers {
			if err := m.Update(uint32(9), make([]byte, ms.ValueSize), ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Pin(filepath.Join(dir, string(n))); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	if err := writeLayout(dir, maps.LayoutRecord{Version: 0}); err != nil {
		t.Fatal(err)
	}
	filled := false
	peer := uint32(0x0101a8c0)
	dp, err := Load(dir, Options{NatEntries: 1024, Fill: func(s *maps.Set) error {
		filled = true
		return s.Update(maps.MapPeers, peer, maps.PeerValue{})
	}})
	if err != nil {
		t.Fatalf("load over an old layout: %v", err)
	}
	defer dp.Close()
	if !filled {
		t.Error("Fill was not called during the migration")
	}
	noTempPins(t, dir)
	if r, _ := readLayout(dir); r.Version != maps.LayoutVersion {
		t.Errorf("layout record says %d after the migration, want %d", r.Version, maps.LayoutVersion)
	}
	st, err := dp.Maps.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Peers) != 1 {
		t.Errorf("peers after the migration = %v, want only the one Fill wrote", st.Peers)
	}
	pinned, err := maps.OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if vs := pinned.Map(maps.MapPeers).ValueSize(); vs != spec.Maps[string(maps.MapPeers)].ValueSize {
		t.Errorf("pinned peers value size %d, want this build's", vs)
	}
	var v maps.NatValue
	if err := pinned.Map(maps.MapNat).Lookup(natKey(1), &v); err != nil || v.Port != 4242 {
		t.Errorf("nat entry after the migration = %+v, %v", v, err)
	}
}

// TestLoadCreatesNewerMaps: upgrading a pin directory of layout 8, which has no
// routes6 and peer_sources6 (and, from layout 7, no pod_addrs6 either; nor, before
// layout 10, ct_close6), creates and pins them and lets Fill write the agent's
// before the links switch, while the other maps keep their pins and entries.
func TestLoadCreatesNewerMaps(t *testing.T) {
	dir := migrationEnv(t)
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	newer := []maps.Name{maps.MapRoutes6, maps.MapPeerSources6, maps.MapPodAddrs6, maps.MapCtClose6}
	for _, n := range maps.AllMaps {
		if slices.Contains(newer, n) {
			continue
		}
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create old %s: %v", n, err)
		}
		if n == maps.MapNat {
			if err := m.Update(natKey(1), maps.NatValue{Port: 4242}, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Pin(filepath.Join(dir, string(n))); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	if err := writeLayout(dir, maps.LayoutRecord{Version: 8}); err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParseAddr("192.168.2.2")
	want := maps.NewState()
	want.Peers[peer] = maps.Peer{}
	want.Routes[netip.MustParsePrefix("fd20::/64")] = maps.Route{Peer: peer}
	want.PeerSources[maps.PeerSource{Peer: peer, Src: netip.MustParsePrefix("fd20::/64")}] = struct{}{}
	want.PodIfaces[7] = maps.PodIface{Flags: maps.PodIfaceFlagReserved}
	want.PodAddrs[maps.PodAddr{Ifindex: 7, Addr: netip.MustParseAddr("fd10::5")}] = struct{}{}
	dp, err := Load(dir, Options{NatEntries: 1024, Fill: func(s *maps.Set) error {
		_, err := maps.Apply(s, maps.Diff(maps.NewState(), want))
		return err
	}})
	if err != nil {
		t.Fatalf("load over layout 8: %v", err)
	}
	defer dp.Close()
	noTempPins(t, dir)
	for _, n := range newer {
		if _, err := os.Stat(filepath.Join(dir, string(n))); err != nil {
			t.Errorf("%s not pinned after the upgrade: %v", n, err)
		}
	}
	st, err := dp.Maps.Read()
	if err != nil {
		t.Fatal(err)
	}
	if !stdmaps.Equal(st.Routes, want.Routes) || !stdmaps.Equal(st.PeerSources, want.PeerSources) || !stdmaps.Equal(st.PodAddrs, want.PodAddrs) {
		t.Errorf("after the upgrade routes %v sources %v pod addresses %v, want what Fill wrote", st.Routes, st.PeerSources, st.PodAddrs)
	}
	pinned, err := maps.OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	var v maps.NatValue
	if err := pinned.Map(maps.MapNat).Lookup(natKey(1), &v); err != nil || v.Port != 4242 {
		t.Errorf("nat entry after the upgrade = %+v, %v", v, err)
	}
	if r, _ := readLayout(dir); r.Version != maps.LayoutVersion {
		t.Errorf("layout record says %d after the upgrade, want %d", r.Version, maps.LayoutVersion)
	}
}

// TestLoadMigratesMetricsHash: the counters of a metrics map pinned by layout 5, a
// per-CPU hash keyed by (code, hook), are in the per-CPU array after an upgrade, CPU
// by CPU, each at its (code, hook), and a code or hook the array has no slot for adds
// to the out-of-range slot that counts it; none is lost. (Key and value sizes are
// alike, so without the converter the entries would be copied byte for byte: a key
// read as an index, most of them past the array.)
func TestLoadMigratesMetricsHash(t *testing.T) {
	dir := migrationEnv(t)
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	type old struct {
		code   uint16
		hook   uint8
		perCPU map[int]maps.MetricsValue
	}
	last := ncpu - 1
	entries := []old{
		{1, 0, map[int]maps.MetricsValue{0: {Packets: 10, Bytes: 1000}, last: {Packets: 5, Bytes: 500}}}, // encap at pod_ingress
		{18, 2, map[int]maps.MetricsValue{0: {Packets: 1 << 40, Bytes: 1 << 50}}},                        // ct_fast at underlay_tc
		{137, 3, map[int]maps.MetricsValue{last: {Packets: 2, Bytes: 200}}},                              // unknown_peer at underlay_xdp
		{2, 4, map[int]maps.MetricsValue{0: {Packets: 3, Bytes: 300}}},                                   // decap at underlay_egress
		{300, 1, map[int]maps.MetricsValue{0: {Packets: 4, Bytes: 400}}},                                 // no such code
		{400, 1, map[int]maps.MetricsValue{last: {Packets: 1, Bytes: 100}}},                              // nor this one
		{1, 9, map[int]maps.MetricsValue{0: {Packets: 6, Bytes: 600}}},                                   // no such hook
	}
	for _, n := range maps.AllMaps {
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinNone
		if n == maps.MapMetrics {
			// Layout 5's metrics.
			ms.Type, ms.MaxEntries, ms.Key = ebpf.PerCPUHash, 1024, nil
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create old %s: %v", n, err)
		}
		if n == maps.MapMetrics {
			for _, e := range entries {
				vs := make([]maps.MetricsValue, ncpu)
				for cpu, v := range e.perCPU {
					vs[cpu] = v
				}
				if err := m.Update(maps.MetricsKey{Code: e.code, Hook: e.hook}, vs, ebpf.UpdateAny); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := m.Pin(filepath.Join(dir, string(n))); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	pinned := loadOverLayout(t, dir, 5)
	met := pinned.Map(maps.MapMetrics)
	if met.Type() != ebpf.PerCPUArray || met.MaxEntries() != maps.MetricSlots {
		t.Fatalf("pinned metrics is a %s of %d entries after the migration, want a per-CPU array of %d", met.Type(), met.MaxEntries(), maps.MetricSlots)
	}
	// Per CPU, what each slot must hold: the old values, out-of-range ones summed.
	want := map[uint32][]maps.MetricsValue{}
	add := func(slot uint32, cpu int, v maps.MetricsValue) {
		if want[slot] == nil {
			want[slot] = make([]maps.MetricsValue, ncpu)
		}
		want[slot][cpu].Packets += v.Packets
		want[slot][cpu].Bytes += v.Bytes
	}
	for _, e := range entries {
		slot := uint32(e.hook)*256 + uint32(e.code)
		switch {
		case e.hook >= 8:
			slot = 8 * 256
		case e.code >= 256:
			slot = uint32(e.hook) * 256
		}
		for cpu, v := range e.perCPU {
			add(slot, cpu, v)
		}
	}
	if len(want) != 6 {
		t.Fatalf("the test expects 6 slots, computed %d", len(want))
	}
	for slot, w := range want {
		got := make([]maps.MetricsValue, ncpu)
		if err := met.Lookup(slot, &got); err != nil {
			t.Errorf("slot %d: %v", slot, err)
			continue
		}
		for cpu := range ncpu {
			if got[cpu] != w[cpu] {
				t.Errorf("slot %d (%+v) on CPU %d = %+v after the migration, want %+v", slot, maps.MetricKeyOfSlot(slot), cpu, got[cpu], w[cpu])
			}
		}
	}
	counters, err := maps.ReadMetrics(met)
	if err != nil {
		t.Fatal(err)
	}
	if len(counters) != len(want) {
		t.Errorf("metrics read %d counters after the migration, want %d: %v", len(counters), len(want), counters)
	}
	for k, c := range map[maps.MetricKey]maps.Counter{
		{Code: 1, Hook: maps.HookPodIngress}:                            {Packets: 15, Bytes: 1500},
		{Code: 137, Hook: maps.HookUnderlayXDP}:                         {Packets: 2, Bytes: 200},
		{Code: maps.MetricCodeOutOfRange, Hook: maps.HookOverlayEgress}: {Packets: 5, Bytes: 500},
		{Code: maps.MetricCodeOutOfRange, Hook: maps.HookOutOfRange}:    {Packets: 6, Bytes: 600},
	} {
		if counters[k] != c {
			t.Errorf("counter %s at %s = %+v after the migration, want %+v", k.Name(), k.Hook, counters[k], c)
		}
	}
	if r, _ := readLayout(dir); r.Version != maps.LayoutVersion {
		t.Errorf("layout record says %d after the migration, want %d", r.Version, maps.LayoutVersion)
	}
}

// TestTablesFor: a small fleet keeps the object's sizes; one that needs more
// than half of a map gets twice its need, rounded up to a power of two.
func TestTablesFor(t *testing.T) {
	small := maps.NewState()
	small.Peers[netip.MustParseAddr("10.0.0.1")] = maps.Peer{}
	got, err := TablesFor(small)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatal(err)
	}
	def := Tables{Routes: spec.Maps[string(maps.MapRoutes)].MaxEntries, Peers: spec.Maps[string(maps.MapPeers)].MaxEntries,
		PeerSources: spec.Maps[string(maps.MapPeerSources)].MaxEntries}
	if got != def {
		t.Errorf("one peer: tables %+v, want the object's %+v", got, def)
	}
	// A mesh of 20,000 nodes: 19,999 of each.
	big := maps.NewState()
	for i := range 19999 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		big.Peers[a] = maps.Peer{}
		big.Routes[netip.PrefixFrom(a, 32)] = maps.Route{Peer: a}
		big.PeerSources[maps.PeerSource{Peer: a, Src: netip.PrefixFrom(a, 32)}] = struct{}{}
	}
	if got, _ := TablesFor(big); got != (Tables{Routes: 65536, Peers: 65536, PeerSources: 65536}) {
		t.Errorf("20,000-node mesh: tables %+v, want 65536 each", got)
	}
}

// TestLoadSizesTables: Load makes the growing maps the sizes asked for, and a
// later Load with other sizes migrates them keeping their entries; the
// maps' CheckCapacity then measures against the new sizes.
func TestLoadSizesTables(t *testing.T) {
	dir := migrationEnv(t)
	first := Tables{Routes: 32768, Peers: 8192, PeerSources: 32768}
	dp, err := Load(dir, Options{NatEntries: 1024, Tables: first})
	if err != nil {
		t.Fatalf("first load: %v", err)
	}
	peer := netip.MustParseAddr("10.1.0.1")
	if err := dp.Maps.Update(maps.MapPeers, maps.AddrToBE32(peer), maps.PeerValue{}); err != nil {
		t.Fatal(err)
	}
	sizes := func(dp *Datapath) Tables {
		return Tables{Routes: dp.Maps.Map(maps.MapRoutes).MaxEntries(), Peers: dp.Maps.Map(maps.MapPeers).MaxEntries(),
			PeerSources: dp.Maps.Map(maps.MapPeerSources).MaxEntries()}
	}
	if got := sizes(dp); got != first {
		t.Errorf("after the first load: sizes %+v, want %+v", got, first)
	}
	need := maps.NewState()
	for i := range 8193 {
		need.Peers[netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)})] = maps.Peer{}
	}
	if err := dp.Maps.CheckCapacity(need); !errors.Is(err, maps.ErrCapacity) || !strings.Contains(err.Error(), "peers holds 8192 entries and the plan needs 8193") {
		t.Errorf("CheckCapacity of 8,193 peers in 8,192: %v", err)
	}
	dp.Close()

	second := Tables{Routes: 65536, Peers: 16384, PeerSources: 65536}
	dp, err = Load(dir, Options{NatEntries: 1024, Tables: second})
	if err != nil {
		t.Fatalf("load with other sizes: %v", err)
	}
	defer dp.Close()
	noTempPins(t, dir)
	if got := sizes(dp); got != second {
		t.Errorf("after the migration: sizes %+v, want %+v", got, second)
	}
	var v maps.PeerValue
	if err := dp.Maps.Map(maps.MapPeers).Lookup(maps.AddrToBE32(peer), &v); err != nil {
		t.Errorf("peer lost in the migration: %v", err)
	}
	if err := dp.Maps.CheckCapacity(need); err != nil {
		t.Errorf("CheckCapacity of 8,193 peers in 16,384: %v", err)
	}
}

// TestLoadSplitsNatOfLayout3: a pin dir of layout 3, where return-path SNAT and
// masquerade shared one LRU nat map, is migrated with nothing lost: the
// masquerade flow's entries (translated to the underlay address the pinned config
// names) move to masq_nat, the SNAT flow's stay in nat (now a hash), nat_sources
// counts one flow of each pod in its table, and an expired entry is collected.
func TestLoadSplitsNatOfLayout3(t *testing.T) {
	dir := migrationEnv(t)
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	be := func(s string) uint32 { return maps.AddrToBE32(netip.MustParseAddr(s)) }
	now, err := maps.MonotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	underlay, tunnel := be("192.168.1.1"), be("100.64.0.4")
	snatPod, masqPod, remote, world := be("10.0.4.10"), be("10.1.0.5"), be("10.2.0.7"), be("1.1.1.1")
	port := maps.HostToBE16
	entries := []struct {
		k    maps.NatKey
		v    maps.NatValue
		masq bool
		live bool
	}{
		{maps.NatKey{Saddr: snatPod, Daddr: remote, Sport: port(33000), Dport: port(80), Proto: 6},
			maps.NatValue{Addr: tunnel, Port: port(33000), State: maps.NatStateEstablished, LastSeen: now}, false, true},
		{maps.NatKey{Saddr: remote, Daddr: tunnel, Sport: port(80), Dport: port(33000), Proto: 6},
			maps.NatValue{Addr: snatPod, Port: port(33000), State: maps.NatStateEstablished, Flags: maps.NatFlagReply, LastSeen: now}, false, true},
		{maps.NatKey{Saddr: masqPod, Daddr: world, Sport: port(34000), Dport: port(443), Proto: 6},
			maps.NatValue{Addr: underlay, Port: port(34000), State: maps.NatStateEstablished, LastSeen: now}, true, true},
		{maps.NatKey{Saddr: world, Daddr: underlay, Sport: port(443), Dport: port(34000), Proto: 6},
			maps.NatValue{Addr: masqPod, Port: port(34000), State: maps.NatStateEstablished, Flags: maps.NatFlagReply, LastSeen: now}, true, true},
		// A UDP flow idle for two minutes: expired.
		{maps.NatKey{Saddr: masqPod, Daddr: world, Sport: port(5353), Dport: port(53), Proto: 17},
			maps.NatValue{Addr: underlay, Port: port(5353), LastSeen: now - uint64(120e9)}, true, false},
	}
	for _, n := range maps.AllMaps {
		if n == maps.MapMasqNat || n == maps.MapNatSources {
			continue // not in layout 3
		}
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinNone
		if n == maps.MapNat {
			ms.Type = ebpf.LRUHash // layout 3's nat
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create old %s: %v", n, err)
		}
		switch n {
		case maps.MapNat:
			for _, e := range entries {
				if err := m.Update(e.k, e.v, ebpf.UpdateAny); err != nil {
					t.Fatal(err)
				}
			}
		case maps.MapConfig:
			if err := m.Update(uint32(0), maps.DatapathConfig{UnderlayIp: underlay, TunnelIp: tunnel}, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Pin(filepath.Join(dir, string(n))); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	pinned := loadOverLayout(t, dir, 3)
	if typ := pinned.Map(maps.MapNat).Type(); typ != ebpf.Hash {
		t.Errorf("pinned nat is a %s after the migration, want a hash", typ)
	}
	for _, e := range entries {
		for _, tbl := range []maps.Name{maps.MapNat, maps.MapMasqNat} {
			var v maps.NatValue
			err := pinned.Map(tbl).Lookup(e.k, &v)
			want := e.live && e.masq == (tbl == maps.MapMasqNat)
			if want && (err != nil || v != e.v) {
				t.Errorf("%s entry %+v after the migration = %+v, %v; want %+v", tbl, e.k, v, err, e.v)
			}
			if !want && err == nil {
				t.Errorf("%s holds %+v after the migration, want it %s", tbl, e.k, map[bool]string{true: "in the other table", false: "collected"}[e.live])
			}
		}
	}
	for _, c := range []struct {
		addr  uint32
		table uint32
	}{{snatPod, maps.NatTableSNAT}, {masqPod, maps.NatTableMasq}} {
		var v maps.NatSourceValue
		if err := pinned.Map(maps.MapNatSources).Lookup(maps.NatSourceKey{Addr: c.addr, Table: c.table}, &v); err != nil || v.Flows != 1 {
			t.Errorf("nat_sources of %s in table %d = %+v, %v; want 1 flow", maps.BE32ToAddr(c.addr), c.table, v, err)
		}
	}
}

// loadOverLayout records layout version in dir, whose maps the test pinned in that
// version's shape, loads this build over them (Options.NatEntries 1024, nothing
// filled), checks that no temporary pin is left, and returns the pinned maps after
// the migration; the test's cleanup closes the datapath and the maps.
func loadOverLayout(t *testing.T, dir string, version uint32) *maps.Set {
	t.Helper()
	if err := writeLayout(dir, maps.LayoutRecord{Version: version}); err != nil {
		t.Fatal(err)
	}
	dp, err := Load(dir, Options{NatEntries: 1024})
	if err != nil {
		t.Fatalf("load over layout %d: %v", version, err)
	}
	t.Cleanup(dp.Close)
	noTempPins(t, dir)
	pinned, err := maps.OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pinned.Close() })
	return pinned
}
