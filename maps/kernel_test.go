package maps

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/bpf"
)

// newKernelSet creates unpinned maps from the object's specs.
func newKernelSet(t *testing.T) *Set {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test creates BPF maps and needs root; run it as root (sudo go test ./maps)")
	}
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	s := &Set{maps: map[Name]*ebpf.Map{}, own: true}
	t.Cleanup(func() { s.Close() })
	for _, n := range AllMaps {
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create map %s: %v", n, err)
		}
		s.maps[n] = m
	}
	return s
}

func TestKernelApplyAndRead(t *testing.T) {
	s := newKernelSet(t)
	empty, err := s.Read()
	if err != nil {
		t.Fatalf("read fresh maps: %v", err)
	}
	if !empty.Equal(State{}) {
		t.Fatalf("fresh maps read as %+v, want the zero State", empty)
	}
	s1, _ := FromPlan(testPlan(), testNode())
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
	if err := m.Put(MetricsKey{Code: 137, Hook: 2}, vals); err != nil {
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
