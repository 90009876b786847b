package maps_test

// These tests sit outside package maps so that they can build states the way
// the agent does, with loader/mapstate.FromPlan on the shared fixtures of
// loader/mapstate/mapstatetest (FromPlan's own tests are in loader/mapstate);
// they import maps with a dot. export_test.go lends them the few unexported
// helpers they use.

import (
	"encoding/binary"
	"errors"
	"fmt"
	stdmaps "maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/loader/mapstate"
	"github.com/isthmus-dev/isthmus/loader/mapstate/mapstatetest"
	"github.com/isthmus-dev/isthmus/loader/plan"
	. "github.com/isthmus-dev/isthmus/maps"
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

// TestAddrTo16IsNetworkOrderInMemory: the key of pod_addrs6 holds the address's
// 16 bytes in network order, as struct pod_addr6_key's __be32 addr[4].
func TestAddrTo16IsNetworkOrderInMemory(t *testing.T) {
	a := addr("fd10::1:2:3")
	v := AddrTo16(a)
	var b [16]byte
	for i, w := range v {
		binary.NativeEndian.PutUint32(b[4*i:], w)
	}
	if b != a.As16() {
		t.Fatalf("in-memory bytes of AddrTo16(%v) = %x, want %x", a, b, a.As16())
	}
	if got := From16ToAddr(v); got != a {
		t.Fatalf("From16ToAddr round trip = %v", got)
	}
	if AddrTo16(netip.Addr{}) != [4]uint32{} || AddrTo16(addr("10.1.2.3")) != [4]uint32{} ||
		AddrTo16(addr("::ffff:10.1.2.3")) != [4]uint32{} {
		t.Fatal("invalid, IPv4 and IPv4-mapped addresses must give zeros")
	}
}

// TestDiffPodAddrsByFamily: a pod's IPv4 reservations go to pod_addrs, its IPv6
// ones to pod_addrs6, before the interface's flag; removing them deletes each from
// its own map.
func TestDiffPodAddrsByFamily(t *testing.T) {
	want := NewState()
	want.PodIfaces[7] = PodIface{Flags: PodIfaceFlagReserved}
	want.PodAddrs[PodAddr{Ifindex: 7, Addr: addr("10.1.0.5")}] = struct{}{}
	want.PodAddrs[PodAddr{Ifindex: 7, Addr: addr("fd10::5")}] = struct{}{}
	var got []string
	for _, c := range Diff(NewState(), want) {
		if c.Map != MapConfig {
			got = append(got, fmt.Sprintf("%s %s", c.Op, Describe(c.Map, c.Key, nil)))
		}
	}
	wantOps := []string{"update pod_addrs 7 10.1.0.5", "update pod_addrs6 7 fd10::5", "update pod_ifaces 7"}
	if !slices.Equal(got, wantOps) {
		t.Fatalf("Diff from empty:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantOps, "\n"))
	}
	for _, c := range Diff(NewState(), want) {
		if c.Map == MapPodAddrs6 {
			k, ok := c.Key.(PodAddr6Key)
			if !ok || k.Ifindex != 7 || From16ToAddr(k.Addr) != addr("fd10::5") {
				t.Errorf("pod_addrs6 key %#v", c.Key)
			}
		}
	}
	gone := want.Clone()
	delete(gone.PodAddrs, PodAddr{Ifindex: 7, Addr: addr("fd10::5")})
	changes := Diff(want, gone)
	if len(changes) != 1 || changes[0].Op != OpDelete || changes[0].Map != MapPodAddrs6 {
		t.Fatalf("Diff removing the IPv6 reservation = %+v, want one pod_addrs6 delete", changes)
	}
}

// TestDiffRoutesAndSourcesByFamily: IPv6 routes and allowed sources go to routes6 and
// peer_sources6, with keys that read back (insert, as Read does) to the same State.
func TestDiffRoutesAndSourcesByFamily(t *testing.T) {
	want := NewState()
	want.Peers[addr("172.16.2.11")] = Peer{}
	want.Routes[pfx("10.1.0.0/24")] = Route{Peer: addr("172.16.2.11")}
	want.Routes[pfx("fd00:1::/64")] = Route{Peer: addr("172.16.2.11")}
	want.Routes[pfx("fd00:2::/48")] = Route{Group: 3, Flags: 1 << 2}
	want.PeerSources[PeerSource{Peer: addr("172.16.2.11"), Src: pfx("10.1.0.0/24")}] = struct{}{}
	want.PeerSources[PeerSource{Peer: addr("172.16.2.11"), Src: pfx("fd00:1::/64")}] = struct{}{}
	var got []string
	back := NewState()
	for _, c := range Diff(NewState(), want) {
		if c.Map == MapConfig || c.Map == MapNexthopGroups {
			continue
		}
		got = append(got, c.String())
		if err := back.Insert(c.Map, c.Key, c.Value); err != nil {
			t.Fatal(err)
		}
	}
	wantOps := []string{
		"update peers 172.16.2.11",
		"update peer_sources 172.16.2.11 10.1.0.0/24",
		"update peer_sources6 172.16.2.11 fd00:1::/64",
		"update routes 10.1.0.0/24 -> 172.16.2.11",
		"update routes6 fd00:1::/64 -> 172.16.2.11",
		"update routes6 fd00:2::/48 -> group 3 flags=0x4",
	}
	if !slices.Equal(got, wantOps) {
		t.Fatalf("Diff from empty:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantOps, "\n"))
	}
	if !stdmaps.Equal(back.Routes, want.Routes) || !stdmaps.Equal(back.PeerSources, want.PeerSources) {
		t.Fatalf("read back routes %v sources %v, want %v %v", back.Routes, back.PeerSources, want.Routes, want.PeerSources)
	}
	if k := PeerSource6KeyFrom(PeerSource{Peer: addr("172.16.2.11"), Src: pfx("fd00:1::/64")}); k.Prefixlen != 32+64 {
		t.Errorf("peer_sources6 prefixlen %d, want 96", k.Prefixlen)
	}
	if c := want.Counts(); c[MapRoutes] != 1 || c[MapRoutes6] != 2 || c[MapPeerSources] != 1 || c[MapPeerSources6] != 1 {
		t.Errorf("Counts = %v", c)
	}
	gone := want.Clone()
	delete(gone.Routes, pfx("fd00:1::/64"))
	delete(gone.PeerSources, PeerSource{Peer: addr("172.16.2.11"), Src: pfx("fd00:1::/64")})
	var dels []string
	for _, c := range Diff(want, gone) {
		dels = append(dels, c.String())
	}
	if want := []string{"delete routes6 fd00:1::/64", "delete peer_sources6 172.16.2.11 fd00:1::/64"}; !slices.Equal(dels, want) {
		t.Fatalf("Diff removing the IPv6 route and source = %v, want %v", dels, want)
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
	s := NewState()
	s.Config = ConfigFromKernel(DatapathConfig{})
	for n, es := range f.entries {
		for k, v := range es {
			if err := s.Insert(n, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.ResolveHandles()
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
	s1, _ := mapstate.FromPlan(mapstatetest.Plan(), mapstatetest.Node())
	res := sync(t, f, s1)
	want := []string{
		"update config vni=7 underlay=172.16.1.10 underlay_ifindex=2 overlay_ifindex=5 overlay_mac=02:00:00:00:00:05 tunnel_mtu=1450",
		"update peers 172.16.2.11",
		"update peers 172.16.2.12",
		"update peer_sources 172.16.2.11 10.1.0.0/24",
		"update peer_sources6 172.16.2.11 fd00:1::/64",
		"update peer_sources 172.16.2.12 10.1.1.0/24",
		"update pod_ifaces 9",
		"update pod_ifaces 11",
		"update routes 10.1.0.0/24 -> 172.16.2.11",
		"update routes 10.1.1.0/24 -> 172.16.2.12",
		"update routes6 fd00:1::/64 -> 172.16.2.11",
	}
	if diff := cmp.Diff(want, f.take()); diff != "" {
		t.Fatalf("first sync transcript (-want +got):\n%s", diff)
	}
	if res.Updated != 11 || res.Deleted != 0 || len(res.Applied) != 11 {
		t.Fatalf("result = %d updated %d deleted, want 11/0", res.Updated, res.Deleted)
	}

	// Same state again: nothing written.
	sync(t, f, s1)
	if l := f.take(); len(l) != 0 {
		t.Fatalf("second sync of the same state wrote %q", l)
	}

	// b2 leaves, b1's route moves to b3, a new prefix appears, a pod goes away.
	p := mapstatetest.Plan()
	p.Peers = []plan.Peer{
		{Name: "b1", Underlay: addr("172.16.2.11"), AllowedSources: []netip.Prefix{pfx("10.1.0.0/24")}},
		{Name: "b3", Underlay: addr("172.16.2.13"), AllowedSources: []netip.Prefix{pfx("10.1.0.0/24"), pfx("10.1.3.0/24")}},
	}
	p.Routes = []plan.Route{
		{Prefix: pfx("10.1.0.0/24"), Peer: "b3", Via: addr("172.16.2.13")},
		{Prefix: pfx("10.1.3.0/24"), Peer: "b3", Via: addr("172.16.2.13")},
	}
	n := mapstatetest.Node()
	n.PodIfindexes = []int{9}
	s2, _ := mapstate.FromPlan(p, n)
	sync(t, f, s2)
	want = []string{
		"update peers 172.16.2.13",
		"update peer_sources 172.16.2.13 10.1.0.0/24",
		"update peer_sources 172.16.2.13 10.1.3.0/24",
		"update routes 10.1.0.0/24 -> 172.16.2.13",
		"update routes 10.1.3.0/24 -> 172.16.2.13",
		"delete routes 10.1.1.0/24",
		"delete routes6 fd00:1::/64",
		"delete pod_ifaces 11",
		"delete peer_sources6 172.16.2.11 fd00:1::/64",
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
	s1, _ := mapstate.FromPlan(mapstatetest.Plan(), mapstatetest.Node())
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
		s := NewState()
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
		for id := range uint32(r.IntN(3)) {
			var live []netip.Addr
			for k := range 1 + r.IntN(3) {
				live = append(live, netip.AddrFrom4([4]byte{172, 16, 3, byte(10 + k + r.IntN(2))}))
			}
			s.Groups[id+1] = Rendezvous(live)
			s.Routes[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(2 * id), 0}), 23)] = Route{Group: id + 1}
		}
		for range r.IntN(3) {
			s.FabricPrefixes[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(10 + r.IntN(3)), 0}), 24)] = struct{}{}
			s.SNATExempt[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(r.IntN(3)), 0}), 24)] = struct{}{}
		}
		if i%3 == 0 {
			s.Config.TunnelIP = addr("10.0.1.1")
			s.Config.SNATPortMin, s.Config.SNATPortMax = 61000, 65535
		}
		// Peers on the IPv6 underlay, each with the same handle in every state
		// (AssignHandles keeps a peer's handle while it stays).
		for range r.IntN(3) {
			k := byte(r.IntN(4))
			peer := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 15: 10 + k})
			s.Peers[peer] = Peer{}
			s.Handles[peer] = netip.AddrFrom4([4]byte{0, 0, 1, k})
			src := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 7, k, 0}), 24)
			s.PeerSources[PeerSource{peer, src}] = struct{}{}
			s.PeerSources[PeerSource{peer, netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x70, 3: k}), 64)}] = struct{}{}
			s.Routes[src] = Route{Peer: peer}
		}
		out = append(out, s)
	}
	return out
}

func TestRendezvous(t *testing.T) {
	all := []netip.Addr{mapstatetest.M1, mapstatetest.M2, mapstatetest.M3, mapstatetest.M4}
	g := Rendezvous(all)
	if g.Live != 4 {
		t.Fatalf("live = %d", g.Live)
	}
	count := map[netip.Addr]int{}
	for _, a := range g.Slots {
		count[a]++
	}
	for _, m := range all {
		if count[m] < NHGSlots/len(all)/2 {
			t.Errorf("member %v owns %d of %d slots: not spread (%v)", m, count[m], NHGSlots, count)
		}
	}
	// Order and duplicates do not matter.
	if Rendezvous([]netip.Addr{mapstatetest.M4, mapstatetest.M2, mapstatetest.M1, mapstatetest.M3, mapstatetest.M2}) != g {
		t.Error("Rendezvous depends on the order of its input")
	}
	// Removing any one member moves exactly its slots, to the others.
	for _, gone := range all {
		var rest []netip.Addr
		for _, m := range all {
			if m != gone {
				rest = append(rest, m)
			}
		}
		h := Rendezvous(rest)
		if h.Live != 3 {
			t.Errorf("without %v live = %d", gone, h.Live)
		}
		for s := range NHGSlots {
			switch {
			case g.Slots[s] == gone && h.Slots[s] == gone:
				t.Errorf("without %v: slot %d still on it", gone, s)
			case g.Slots[s] != gone && h.Slots[s] != g.Slots[s]:
				t.Errorf("without %v: slot %d moved from %v to %v", gone, s, g.Slots[s], h.Slots[s])
			}
		}
		// And adding it back restores the group exactly.
		if Rendezvous(append(rest, gone)) != g {
			t.Errorf("re-adding %v does not restore the slots", gone)
		}
	}
	if !Rendezvous(nil).IsZero() || !Rendezvous([]netip.Addr{addr("fd00::1")}).IsZero() {
		t.Error("no IPv4 member must give the zero group")
	}
}

func TestGroupIDsAreStable(t *testing.T) {
	a := MemberSet{Addrs: []netip.Addr{mapstatetest.M1, mapstatetest.M2}}
	b := MemberSet{Addrs: []netip.Addr{mapstatetest.M4}}
	ids := GroupIDs([]MemberSet{b, a, a}, nil)
	if ids[a.Key()] != 1 || ids[b.Key()] != 2 || len(ids) != 2 {
		t.Fatalf("ids %v, want a=1 b=2", ids)
	}
	// A set that sorts after the others leaves their ids alone.
	c := MemberSet{Addrs: []netip.Addr{addr("172.16.9.1")}}
	ids2 := GroupIDs([]MemberSet{a, b, c}, nil)
	if ids2[a.Key()] != 1 || ids2[b.Key()] != 2 || ids2[c.Key()] != 3 {
		t.Fatalf("ids %v after adding c", ids2)
	}
	// A set that sorts first takes a free id, not one in use.
	first := MemberSet{Addrs: []netip.Addr{addr("10.0.0.1")}}
	ids3 := GroupIDs([]MemberSet{a, b, first}, map[string]uint32{a.Key(): 1, b.Key(): 2})
	if ids3[a.Key()] != 1 || ids3[b.Key()] != 2 || ids3[first.Key()] != 3 {
		t.Fatalf("ids %v after adding a set that sorts first, want a=1 b=2 first=3", ids3)
	}
	// Two sets claiming the same id: the first in order keeps it.
	ids4 := GroupIDs([]MemberSet{a, b}, map[string]uint32{a.Key(): 5, b.Key(): 5})
	if ids4[a.Key()] != 5 || ids4[b.Key()] != 1 {
		t.Fatalf("ids %v, want a=5 b=1", ids4)
	}
	// The same gateways for two remote sites are two groups: a gateway may
	// reach one site and not the other.
	east, west := MemberSet{Site: "east", Addrs: a.Addrs}, MemberSet{Site: "west", Addrs: a.Addrs}
	ids5 := GroupIDs([]MemberSet{west, east, a}, nil)
	if ids5[a.Key()] != 1 || ids5[east.Key()] != 2 || ids5[west.Key()] != 3 {
		t.Fatalf("ids %v, want a=1 east=2 west=3", ids5)
	}
}

// TestApplyTranscriptGroups: a member going down rewrites only its group entry; a
// group going away is zeroed after its routes are gone.
func TestApplyTranscriptGroups(t *testing.T) {
	f := newFake()
	n := mapstatetest.Node()
	n.SNATPortMin, n.SNATPortMax = 61000, 65535
	s1, _ := mapstate.FromPlan(mapstatetest.UnmanagedPlan(), n)
	sync(t, f, s1)
	got := f.take()
	g1 := "update nexthop_groups 1 live=3" + SlotCounts(s1.Groups[1])
	want := []string{
		"update config vni=7 underlay=172.16.1.10 underlay_ifindex=2 overlay_ifindex=5 overlay_mac=02:00:00:00:00:05 tunnel_mtu=1450 tunnel_ip=10.0.1.1 snat_ports=61000-65535",
		"update peers 172.16.2.11",
		"update peers 172.16.2.12",
		"update peers 172.16.3.11",
		"update peers 172.16.3.12",
		"update peers 172.16.3.13",
		"update peers 172.16.4.11",
	}
	if diff := cmp.Diff(want, got[:len(want)]); diff != "" {
		t.Fatalf("first sync transcript head (-want +got):\n%s", diff)
	}
	tail := []string{
		"update fabric_prefixes 10.0.10.0/23",
		"update snat_exempt 10.0.1.0/24",
		"update snat_exempt 10.0.10.0/23",
		g1,
		"update nexthop_groups 2 live=1 172.16.4.11:64",
		"update routes 10.0.2.0/23 -> group 1",
		"update routes 10.0.6.0/24 -> group 1",
		"update routes 10.1.0.0/24 -> 172.16.2.11",
		"update routes 10.1.1.0/24 -> 172.16.2.12",
		"update routes 10.8.0.0/16 -> group 2",
		"update routes 10.250.0.1/32 -> 172.16.3.11",
		"update routes6 fd00:1::/64 -> 172.16.2.11",
	}
	if diff := cmp.Diff(tail, got[len(got)-len(tail):]); diff != "" {
		t.Fatalf("first sync transcript tail (-want +got):\n%s", diff)
	}

	n.Down = map[GroupMember]bool{{Addr: mapstatetest.M2}: true}
	s2, _ := mapstate.FromPlan(mapstatetest.UnmanagedPlan(), n)
	sync(t, f, s2)
	if diff := cmp.Diff([]string{"update nexthop_groups 1 live=2" + SlotCounts(s2.Groups[1])}, f.take()); diff != "" {
		t.Fatalf("member down transcript (-want +got):\n%s", diff)
	}

	// d1's site goes away: routes first, then the group entry is zeroed.
	p := mapstatetest.UnmanagedPlan()
	p.Routes = slices.DeleteFunc(p.Routes, func(r plan.Route) bool { return r.Prefix == pfx("10.8.0.0/16") })
	s3, _ := mapstate.FromPlan(p, n)
	sync(t, f, s3)
	if diff := cmp.Diff([]string{"delete routes 10.8.0.0/16", "delete nexthop_groups 2"}, f.take()); diff != "" {
		t.Fatalf("group removal transcript (-want +got):\n%s", diff)
	}
	if !f.state(t).Equal(s3) {
		t.Fatal("fake does not hold the desired state")
	}
}

// TestAssignHandles: every IPv6 address gets a distinct handle in 0.0.0.0/8; one
// the kernel holds keeps it; a new one never takes a handle the kernel holds for
// another address (whose entries are deleted only after the new ones are written);
// IPv4 addresses get none; the result does not depend on the order of the input.
func TestAssignHandles(t *testing.T) {
	a, b, c := addr("fd00::a"), addr("fd00::b"), addr("fd00::c")
	first := AssignHandles([]netip.Addr{b, a, addr("172.16.2.11"), a}, nil)
	if len(first) != 2 || first[a] != addr("0.0.0.1") || first[b] != addr("0.0.0.2") {
		t.Fatalf("from nothing: %v, want a and b at 0.0.0.1 and 0.0.0.2", first)
	}
	// b goes, c comes: a keeps its handle, c does not take b's.
	second := AssignHandles([]netip.Addr{c, a}, first)
	if len(second) != 2 || second[a] != first[a] || second[c] == first[b] || !IsHandle(second[c]) {
		t.Fatalf("after b left and c came: %v (before %v)", second, first)
	}
	if got := AssignHandles([]netip.Addr{a, c}, second); !stdmaps.Equal(got, second) {
		t.Errorf("again: %v, want %v unchanged", got, second)
	}
	for _, h := range []string{"0.0.0.0", "0.1.2.3", "1.0.0.1", "10.0.0.1"} {
		if got, want := IsHandle(addr(h)), h == "0.1.2.3"; got != want {
			t.Errorf("IsHandle(%s) = %v, want %v", h, got, want)
		}
	}
}

// TestApplyHandles: a peer on the IPv6 underlay is written by its handle (peers6,
// then peers with PEER_F_UNDERLAY6 and its address; its routes and sources hold the
// handle), reads back as the same State, and a peer replaced by another leaves its
// entries deleted after the new ones are written.
func TestApplyHandles(t *testing.T) {
	f := newFake()
	p1, p2 := addr("fd00:100::11"), addr("fd00:100::12")
	s := NewState()
	s.Peers[p1] = Peer{}
	s.Routes[pfx("10.2.0.0/24")] = Route{Peer: p1}
	s.Routes[pfx("fd00:b::/64")] = Route{Peer: p1}
	s.PeerSources[PeerSource{p1, pfx("10.2.0.0/24")}] = struct{}{}
	s.Handles = AssignHandles([]netip.Addr{p1}, nil)
	sync(t, f, s)
	want := []string{
		"update peers6 fd00:100::11 -> 0.0.0.1",
		"update peers 0.0.0.1 fd00:100::11 flags=0x4",
		"update peer_sources 0.0.0.1 10.2.0.0/24",
		"update routes 10.2.0.0/24 -> 0.0.0.1",
		"update routes6 fd00:b::/64 -> 0.0.0.1",
	}
	if d := cmp.Diff(want, f.take()); d != "" {
		t.Errorf("transcript (-want +got):\n%s", d)
	}
	if got := f.state(t); !got.Equal(s) {
		t.Fatalf("reads back as %+v, want %+v", got, s)
	}
	if res := sync(t, f, s); res.Updated+res.Deleted != 0 {
		t.Errorf("resync wrote %v", f.take())
	}

	// p1 replaced by p2: p2 takes a fresh handle; p1's entries go after.
	n := NewState()
	n.Peers[p2] = Peer{}
	n.Routes[pfx("10.2.0.0/24")] = Route{Peer: p2}
	n.PeerSources[PeerSource{p2, pfx("10.2.0.0/24")}] = struct{}{}
	n.Handles = AssignHandles([]netip.Addr{p2}, f.state(t).Handles)
	sync(t, f, n)
	want = []string{
		"update peers6 fd00:100::12 -> 0.0.0.2",
		"update peers 0.0.0.2 fd00:100::12 flags=0x4",
		"update peer_sources 0.0.0.2 10.2.0.0/24",
		"update routes 10.2.0.0/24 -> 0.0.0.2",
		"delete routes6 fd00:b::/64",
		"delete peer_sources 0.0.0.1 10.2.0.0/24",
		"delete peers 0.0.0.1",
		"delete peers6 fd00:100::11",
	}
	if d := cmp.Diff(want, f.take()); d != "" {
		t.Errorf("replacing the peer: transcript (-want +got):\n%s", d)
	}
	if got := f.state(t); !got.Equal(n) {
		t.Fatalf("reads back as %+v, want %+v", got, n)
	}
}
