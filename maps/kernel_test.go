package maps_test

// These tests sit outside package maps so that they can build states the way
// the agent does, with loader/mapstate.FromPlan on the shared fixtures of
// loader/mapstate/mapstatetest (FromPlan's own tests are in loader/mapstate);
// they import maps with a dot. export_test.go lends them the few unexported
// helpers they use.

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/loader/mapstate"
	"github.com/isthmus-dev/isthmus/loader/mapstate/mapstatetest"
	. "github.com/isthmus-dev/isthmus/maps"
)

var newKernelSet = NewKernelSet

func TestKernelApplyAndRead(t *testing.T) {
	s := newKernelSet(t)
	empty, err := s.Read()
	if err != nil {
		t.Fatalf("read fresh maps: %v", err)
	}
	if !empty.Equal(State{}) {
		t.Fatalf("fresh maps read as %+v, want the zero State", empty)
	}
	s1, _ := mapstate.FromPlan(mapstatetest.Plan(), mapstatetest.Node())
	if _, err := Apply(s, Diff(empty, s1)); err != nil {
		t.Fatalf("apply: %v", err)
	}
	got, err := s.Read()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !got.Equal(s1) {
		t.Fatalf("kernel maps hold %+v\nwant %+v", got, s1)
	}
	if d := Diff(got, s1); len(d) != 0 {
		t.Fatalf("diff after apply is not empty: %v", d)
	}
	// Lookups through the LPM tries behave as the datapath will use them.
	var rv RouteValue
	if err := s.Map(MapRoutes).Lookup(RouteKey{Prefixlen: 32, Addr: AddrToBE32(addr("10.1.1.77"))}, &rv); err != nil {
		t.Fatalf("LPM lookup 10.1.1.77: %v", err)
	}
	if BE32ToAddr(rv.Peer) != addr("172.16.2.12") {
		t.Fatalf("10.1.1.77 routes to %v, want 172.16.2.12", BE32ToAddr(rv.Peer))
	}
	var psv PeerSourceValue
	key := PeerSourceKey{Prefixlen: 64, Peer: AddrToBE32(addr("172.16.2.11")), Src: AddrToBE32(addr("10.1.1.5"))}
	if err := s.Map(MapPeerSources).Lookup(key, &psv); err == nil {
		t.Fatal("peer 172.16.2.11 may send from 10.1.1.5, but only 10.1.0.0/24 was allowed")
	}
	key.Src = AddrToBE32(addr("10.1.0.5"))
	if err := s.Map(MapPeerSources).Lookup(key, &psv); err != nil {
		t.Fatalf("peer 172.16.2.11 from 10.1.0.5: %v", err)
	}
	// Back to empty, except config which is overwritten, never deleted.
	if _, err := Apply(s, Diff(got, State{})); err != nil {
		t.Fatalf("apply empty: %v", err)
	}
	got, err = s.Read()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !got.Equal(State{}) {
		t.Fatalf("after clearing, maps hold %+v", got)
	}
}

func TestKernelReadMetricsSumsCPUs(t *testing.T) {
	s := newKernelSet(t)
	m := s.Map(MapMetrics)
	n, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]MetricsValue, n)
	for i := range vals {
		vals[i] = MetricsValue{Packets: uint64(i + 1), Bytes: uint64(100 * (i + 1))}
	}
	if err := m.Put(MetricSlot(MetricKey{Code: 137, Hook: HookUnderlayTC}), vals); err != nil {
		t.Fatalf("put metrics: %v", err)
	}
	got, err := ReadMetrics(m)
	if err != nil {
		t.Fatal(err)
	}
	wantP := uint64(n * (n + 1) / 2)
	k := MetricKey{Code: 137, Hook: HookUnderlayTC}
	if c := got[k]; c.Packets != wantP || c.Bytes != 100*wantP || len(got) != 1 {
		t.Fatalf("metrics = %+v, want %d packets %d bytes under %+v", got, wantP, 100*wantP, k)
	}
	if k.Name() != "unknown_peer" || !k.IsDrop() {
		t.Fatalf("code 137 names %q (drop %v), want unknown_peer", k.Name(), k.IsDrop())
	}
}

// TestKernelGroupsAndPrefixes: next-hop groups, fabric_prefixes and snat_exempt
// through real maps; a group removed is the zero array entry, read back as absent.
func TestKernelGroupsAndPrefixes(t *testing.T) {
	s := newKernelSet(t)
	n := mapstatetest.Node()
	n.SNATPortMin, n.SNATPortMax = 61000, 65535
	want, _ := mapstate.FromPlan(mapstatetest.UnmanagedPlan(), n)
	if _, err := Apply(s, Diff(State{}, want)); err != nil {
		t.Fatalf("apply: %v", err)
	}
	got, err := s.Read()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !got.Equal(want) {
		t.Fatalf("kernel maps hold %+v\nwant %+v", got, want)
	}
	var rv RouteValue
	if err := s.Map(MapRoutes).Lookup(RouteKey{Prefixlen: 32, Addr: AddrToBE32(addr("10.0.3.200"))}, &rv); err != nil || rv.Group != 1 || rv.Peer != 0 {
		t.Fatalf("10.0.3.200 routes to %+v (%v), want group 1 and no peer", rv, err)
	}
	var gv NexthopGroupValue
	if err := s.Map(MapNexthopGroups).Lookup(uint32(1), &gv); err != nil || gv.Live != 3 || BE32ToAddr(gv.Slots[5]) != want.Groups[1].Slots[5] {
		t.Fatalf("group 1 = %+v (%v)", gv, err)
	}
	var fv FabricPrefixValue
	if err := s.Map(MapFabricPrefixes).Lookup(RouteKey{Prefixlen: 32, Addr: AddrToBE32(addr("10.0.11.9"))}, &fv); err != nil {
		t.Fatalf("fabric lookup 10.0.11.9: %v", err)
	}
	var cfg DatapathConfig
	if err := s.Map(MapConfig).Lookup(uint32(0), &cfg); err != nil || BE32ToAddr(cfg.TunnelIp) != addr("10.0.1.1") || cfg.SnatPortMin != 61000 || cfg.SnatPortMax != 65535 {
		t.Fatalf("config = %+v (%v)", cfg, err)
	}

	// Every group member down, and then the state cleared.
	n.Down = map[GroupMember]bool{{Addr: mapstatetest.M1}: true, {Addr: mapstatetest.M2}: true, {Addr: mapstatetest.M3}: true, {Addr: mapstatetest.M4}: true}
	down, _ := mapstate.FromPlan(mapstatetest.UnmanagedPlan(), n)
	res, err := Apply(s, Diff(got, down))
	if err != nil {
		t.Fatalf("apply all down: %v", err)
	}
	if res.Updated != 0 || res.Deleted != 2 {
		t.Errorf("all down wrote %d updates %d deletes, want the 2 groups zeroed", res.Updated, res.Deleted)
	}
	if err := s.Map(MapNexthopGroups).Lookup(uint32(1), &gv); err != nil || gv != (NexthopGroupValue{}) {
		t.Fatalf("group 1 after all down = %+v (%v), want the zero entry", gv, err)
	}
	if got, err = s.Read(); err != nil || !got.Equal(down) {
		t.Fatalf("read after all down: %v\n%+v\nwant %+v", err, got, down)
	}
	if _, err := Apply(s, Diff(got, State{})); err != nil {
		t.Fatalf("apply empty: %v", err)
	}
	if got, err = s.Read(); err != nil || !got.Equal(State{}) {
		t.Fatalf("after clearing maps hold %+v (%v)", got, err)
	}
}

// TestKernelUnderlay6: the state of a node on the IPv6 underlay, written to real
// maps, reads back as it was, and the kernel's lookups find what the datapath
// follows: a route's peer is a handle, whose peers entry carries
// PEER_F_UNDERLAY6 and the IPv6 address, which peers6 maps back to the handle;
// peer_sources hold the handle.
func TestKernelUnderlay6(t *testing.T) {
	s := newKernelSet(t)
	st, _ := mapstate.FromPlan(mapstatetest.Underlay6Plan(), mapstatetest.Node())
	if _, err := Apply(s, Diff(State{}, st)); err != nil {
		t.Fatalf("apply: %v", err)
	}
	got, err := s.Read()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !got.Equal(st) {
		t.Fatalf("kernel maps hold %+v\nwant %+v", got, st)
	}
	if d := Diff(got, st); len(d) != 0 {
		t.Fatalf("diff after apply is not empty: %v", d)
	}
	b1 := addr("fd00:b::11")
	var rv RouteValue
	if err := s.Map(MapRoutes).Lookup(RouteKey{Prefixlen: 32, Addr: AddrToBE32(addr("10.1.0.77"))}, &rv); err != nil {
		t.Fatalf("LPM lookup 10.1.0.77: %v", err)
	}
	h := BE32ToAddr(rv.Peer)
	if !IsHandle(h) || h != st.Handles[b1] {
		t.Fatalf("10.1.0.77 routes to %v, want b1's handle %v", h, st.Handles[b1])
	}
	var pv PeerValue
	if err := s.Map(MapPeers).Lookup(rv.Peer, &pv); err != nil || pv.Flags != PeerFlagUnderlay6 || From16ToAddr(pv.Underlay6) != b1 {
		t.Fatalf("peers[%v] = %+v (%v), want PEER_F_UNDERLAY6 and %v", h, pv, err, b1)
	}
	var p6 Peer6Value
	if err := s.Map(MapPeers6).Lookup(Peer6Key{Addr: AddrTo16(b1)}, &p6); err != nil || p6.Handle != rv.Peer {
		t.Fatalf("peers6[%v] = %+v (%v), want handle %v", b1, p6, err, h)
	}
	var psv PeerSourceValue
	if err := s.Map(MapPeerSources).Lookup(PeerSourceKey{Prefixlen: 64, Peer: rv.Peer, Src: AddrToBE32(addr("10.1.0.5"))}, &psv); err != nil {
		t.Fatalf("peer_sources of b1's handle from 10.1.0.5: %v", err)
	}
	if _, err := Apply(s, Diff(got, State{})); err != nil {
		t.Fatalf("apply empty: %v", err)
	}
	if got, err := s.Read(); err != nil || !got.Equal(State{}) {
		t.Fatalf("after clearing, maps hold %+v (%v)", got, err)
	}
}
