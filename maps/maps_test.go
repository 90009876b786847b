package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/loader/plan"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

func TestAddrToBE32IsNetworkOrderInMemory(t *testing.T) {
	v := AddrToBE32(addr("10.1.2.3"))
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	if b != [4]byte{10, 1, 2, 3} {
		t.Fatalf("in-memory bytes of AddrToBE32(10.1.2.3) = %v, want [10 1 2 3]", b)
	}
	if got := BE32ToAddr(v); got != addr("10.1.2.3") {
		t.Fatalf("BE32ToAddr round trip = %v", got)
	}
	if AddrToBE32(netip.Addr{}) != 0 || AddrToBE32(addr("fd00::1")) != 0 {
		t.Fatal("invalid and IPv6 addresses must give 0")
	}
}

func TestKeyConversionsRoundTrip(t *testing.T) {
	k := RouteKeyFromPrefix(pfx("10.1.7.9/16"))
	if k.Prefixlen != 16 || BE32ToAddr(k.Addr) != addr("10.1.0.0") {
		t.Fatalf("RouteKeyFromPrefix(10.1.7.9/16) = %+v, want masked 10.1.0.0/16", k)
	}
	if got := PrefixFromRouteKey(k); got != pfx("10.1.0.0/16") {
		t.Fatalf("PrefixFromRouteKey = %v", got)
	}
	ps := PeerSource{Peer: addr("172.16.2.11"), Src: pfx("10.1.0.0/24")}
	psk := PeerSourceKeyFrom(ps)
	if psk.Prefixlen != 56 {
		t.Fatalf("peer source prefixlen = %d, want 32+24", psk.Prefixlen)
	}
	if got := PeerSourceFromKey(psk); got != ps {
		t.Fatalf("PeerSourceFromKey = %+v, want %+v", got, ps)
	}
}

func testPlan() *plan.NodePlan {
	return &plan.NodePlan{
		Node:       "a1",
		Site:       "a",
		Underlay:   addr("172.16.1.10"),
		TunnelAddr: addr("10.0.1.1"),
		Peers: []plan.Peer{
			{Name: "b1", Underlay: addr("172.16.2.11"), AllowedSources: []netip.Prefix{pfx("10.1.0.0/24"), pfx("fd00:1::/64")}},
			{Name: "b2", Underlay: addr("172.16.2.12"), AllowedSources: []netip.Prefix{pfx("10.1.1.0/24")}},
			{Name: "v6", Underlay: addr("fd00::12"), AllowedSources: []netip.Prefix{pfx("10.9.0.0/24")}},
		},
		Routes: []plan.Route{
			{Prefix: pfx("10.1.0.0/24"), Peer: "b1", Via: addr("172.16.2.11")},
			{Prefix: pfx("10.1.1.0/24"), Peer: "b2", Via: addr("172.16.2.12")},
			{Prefix: pfx("fd00:1::/64"), Peer: "b1", Via: addr("172.16.2.11")},
		},
	}
}

func testNode() NodeConfig {
	return NodeConfig{
		VNI: 7, UnderlayIfindex: 2, OverlayIfindex: 5,
		OverlayMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 5}, TunnelMTU: 1450,
		PodIfindexes: []int{9, 11},
	}
}

func TestFromPlan(t *testing.T) {
	got, warnings := FromPlan(testPlan(), testNode())
	want := State{
		Routes: map[netip.Prefix]Route{
			pfx("10.1.0.0/24"): {Peer: addr("172.16.2.11")},
			pfx("10.1.1.0/24"): {Peer: addr("172.16.2.12")},
		},
		Peers: map[netip.Addr]Peer{addr("172.16.2.11"): {}, addr("172.16.2.12"): {}},
		PeerSources: map[PeerSource]struct{}{
			{addr("172.16.2.11"), pfx("10.1.0.0/24")}: {},
			{addr("172.16.2.12"), pfx("10.1.1.0/24")}: {},
		},
		PodIfaces: map[uint32]PodIface{9: {}, 11: {}},
		Config: Config{
			VNI: 7, UnderlayIP: addr("172.16.1.10"), UnderlayIfindex: 2, OverlayIfindex: 5,
			OverlayMAC: [6]byte{0x02, 0, 0, 0, 0, 5}, TunnelMTU: 1450,
		},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Fatalf("FromPlan (-want +got):\n%s", diff)
	}
	if len(warnings) != 3 {
		t.Fatalf("want 3 warnings (IPv6 source, IPv6 peer, IPv6 route), got %q", warnings)
	}
	for _, w := range warnings {
		if !strings.Contains(w, "not IPv4") {
			t.Errorf("warning %q does not say why", w)
		}
	}
}

// fakeMaps is a Writer that keeps entries in memory and records each operation as a
// line of text.
type fakeMaps struct {
	entries map[Name]map[any]any
	log     []string
	failOn  string
}

func newFake() *fakeMaps {
	f := &fakeMaps{entries: map[Name]map[any]any{}}
	for _, n := range AllMaps {
		f.entries[n] = map[any]any{}
	}
	return f
}

func (f *fakeMaps) Update(m Name, key, value any) error {
	line := "update " + Describe(m, key, value)
	if f.failOn != "" && line == f.failOn {
		return errors.New("injected failure")
	}
	f.log = append(f.log, line)
	f.entries[m][key] = value
	return nil
}

func (f *fakeMaps) Delete(m Name, key any) error {
	f.log = append(f.log, "delete "+Describe(m, key, nil))
	if _, ok := f.entries[m][key]; !ok {
		return fmt.Errorf("lookup: %w", ebpf.ErrKeyNotExist)
	}
	delete(f.entries[m], key)
	return nil
}

func (f *fakeMaps) state(t *testing.T) State {
	t.Helper()
	s := newState()
	s.Config = configFromKernel(DatapathConfig{})
	for n, es := range f.entries {
		for k, v := range es {
			if err := s.insert(n, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	return s
}

func (f *fakeMaps) take() []string { l := f.log; f.log = nil; return l }

func sync(t *testing.T, f *fakeMaps, desired State) Result {
	t.Helper()
	res, err := Apply(f, Diff(f.state(t), desired))
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return res
}

func TestApplyTranscript(t *testing.T) {
	f := newFake()
	s1, _ := FromPlan(testPlan(), testNode())
	res := sync(t, f, s1)
	want := []string{
		"update config vni=7 underlay=172.16.1.10 underlay_ifindex=2 overlay_ifindex=5 overlay_mac=02:00:00:00:00:05 tunnel_mtu=1450",
		"update peers 172.16.2.11",
		"update peers 172.16.2.12",
		"update peer_sources 172.16.2.11 10.1.0.0/24",
		"update peer_sources 172.16.2.12 10.1.1.0/24",
		"update pod_ifaces 9",
		"update pod_ifaces 11",
		"update routes 10.1.0.0/24 -> 172.16.2.11",
		"update routes 10.1.1.0/24 -> 172.16.2.12",
	}
	if diff := cmp.Diff(want, f.take()); diff != "" {
		t.Fatalf("first sync transcript (-want +got):\n%s", diff)
	}
	if res.Updated != 9 || res.Deleted != 0 || len(res.Applied) != 9 {
		t.Fatalf("result = %d updated %d deleted, want 9/0", res.Updated, res.Deleted)
	}

	// Same state again: nothing written.
	sync(t, f, s1)
	if l := f.take(); len(l) != 0 {
		t.Fatalf("second sync of the same state wrote %q", l)
	}

	// b2 leaves, b1's route moves to b3, a new prefix appears, a pod goes away.
	p := testPlan()
	p.Peers = []plan.Peer{
		{Name: "b1", Underlay: addr("172.16.2.11"), AllowedSources: []netip.Prefix{pfx("10.1.0.0/24")}},
		{Name: "b3", Underlay: addr("172.16.2.13"), AllowedSources: []netip.Prefix{pfx("10.1.0.0/24"), pfx("10.1.3.0/24")}},
	}
	p.Routes = []plan.Route{
		{Prefix: pfx("10.1.0.0/24"), Peer: "b3", Via: addr("172.16.2.13")},
		{Prefix: pfx("10.1.3.0/24"), Peer: "b3", Via: addr("172.16.2.13")},
	}
	n := testNode()
	n.PodIfindexes = []int{9}
	s2, _ := FromPlan(p, n)
	sync(t, f, s2)
	want = []string{
		"update peers 172.16.2.13",
		"update peer_sources 172.16.2.13 10.1.0.0/24",
		"update peer_sources 172.16.2.13 10.1.3.0/24",
		"update routes 10.1.0.0/24 -> 172.16.2.13",
		"update routes 10.1.3.0/24 -> 172.16.2.13",
		"delete routes 10.1.1.0/24",
		"delete pod_ifaces 11",
		"delete peer_sources 172.16.2.12 10.1.1.0/24",
		"delete peers 172.16.2.12",
	}
	if diff := cmp.Diff(want, f.take()); diff != "" {
		t.Fatalf("change transcript (-want +got):\n%s", diff)
	}
	if !f.state(t).Equal(s2) {
		t.Fatal("fake does not hold the desired state after the change")
	}
}

func TestApplyDeleteOfMissingEntryIsSuccess(t *testing.T) {
	f := newFake()
	current := State{Routes: map[netip.Prefix]Route{pfx("10.9.0.0/16"): {Peer: addr("172.16.9.9")}}}
	res, err := Apply(f, Diff(current, State{}))
	if err != nil {
		t.Fatalf("delete of an entry already gone: %v", err)
	}
	if res.Deleted != 1 {
		t.Fatalf("Deleted = %d, want 1", res.Deleted)
	}
}

func TestApplyStopsAtFirstErrorAndReportsProgress(t *testing.T) {
	f := newFake()
	f.failOn = "update peers 172.16.2.12"
	s1, _ := FromPlan(testPlan(), testNode())
	res, err := Apply(f, Diff(f.state(t), s1))
	if err == nil || !strings.Contains(err.Error(), "update peers 172.16.2.12") {
		t.Fatalf("error = %v, want one naming the failed entry", err)
	}
	if res.Updated != 2 {
		t.Fatalf("Updated = %d, want 2 (config, first peer)", res.Updated)
	}
	// The next sync from what is really there completes the job.
	f.failOn = ""
	sync(t, f, s1)
	if !f.state(t).Equal(s1) {
		t.Fatal("resync after a partial failure did not reach the desired state")
	}
}

// TestApplyRandomTransitions replays random sequences of states; whatever the path,
// the fake ends holding exactly the last state, and a state already reached writes
// nothing.
func TestApplyRandomTransitions(t *testing.T) {
	states := randomStates(8)
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		f := newFake()
		order := r.Perm(len(states))
		for _, i := range order {
			sync(t, f, states[i])
			if !f.state(t).Equal(states[i]) {
				t.Fatalf("round %d: after state %d the fake holds something else", round, i)
			}
			f.take()
			sync(t, f, states[i])
			if l := f.take(); len(l) != 0 {
				t.Fatalf("round %d: resync of state %d wrote %q", round, i, l)
			}
		}
	}
}

func randomStates(n int) []State {
	r := rand.New(rand.NewPCG(3, 4))
	var out []State
	for i := range n {
		s := newState()
		s.Config = Config{VNI: uint32(1 + r.IntN(3)), UnderlayIP: addr("172.16.1.10"), TunnelMTU: 1450}
		for j := range 1 + r.IntN(4) {
			peer := netip.AddrFrom4([4]byte{172, 16, 2, byte(10 + r.IntN(5))})
			s.Peers[peer] = Peer{}
			src := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(r.IntN(6)), 0}), 24)
			s.PeerSources[PeerSource{peer, src}] = struct{}{}
			s.Routes[src] = Route{Peer: peer}
			if j == 0 && i%2 == 0 {
				s.Routes[pfx("10.200.0.0/16")] = Route{Peer: peer}
			}
		}
		for range r.IntN(3) {
			s.PodIfaces[uint32(10+r.IntN(4))] = PodIface{}
		}
		out = append(out, s)
	}
	return out
}
