package mapstate_test

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

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

func TestFromPlan(t *testing.T) {
	got, warnings := mapstate.FromPlan(mapstatetest.Plan(), mapstatetest.Node())
	want := State{
		Routes: map[netip.Prefix]Route{
			pfx("10.1.0.0/24"): {Peer: addr("172.16.2.11")},
			pfx("10.1.1.0/24"): {Peer: addr("172.16.2.12")},
			pfx("fd00:1::/64"): {Peer: addr("172.16.2.11")},
		},
		Peers: map[netip.Addr]Peer{addr("172.16.2.11"): {}, addr("172.16.2.12"): {}},
		PeerSources: map[PeerSource]struct{}{
			{Peer: addr("172.16.2.11"), Src: pfx("10.1.0.0/24")}: {},
			{Peer: addr("172.16.2.11"), Src: pfx("fd00:1::/64")}: {},
			{Peer: addr("172.16.2.12"), Src: pfx("10.1.1.0/24")}: {},
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
	if len(warnings) != 1 || !strings.Contains(warnings[0], "different families") {
		t.Fatalf("want 1 warning (the peer on the IPv6 underlay, which this node on the IPv4 one cannot reach), got %q", warnings)
	}
}

func TestFromPlanUnmanaged(t *testing.T) {
	n := mapstatetest.Node()
	n.SNATPortMin, n.SNATPortMax = 61000, 65535
	got, warnings := mapstate.FromPlan(mapstatetest.UnmanagedPlan(), n)
	if len(warnings) != 1 {
		t.Errorf("warnings %q, want only the one of the peer at an IPv6 underlay address", warnings)
	}
	// Groups are numbered in the order of their sorted member lists.
	for p, want := range map[string]Route{
		"10.0.2.0/23":   {Group: 1},
		"10.0.6.0/24":   {Group: 1},
		"10.8.0.0/16":   {Group: 2},
		"10.250.0.1/32": {Peer: mapstatetest.M1},
	} {
		if r := got.Routes[pfx(p)]; r != want {
			t.Errorf("route %s = %+v, want %+v", p, r, want)
		}
	}
	if g := got.Groups[1]; g != Rendezvous([]netip.Addr{mapstatetest.M1, mapstatetest.M2, mapstatetest.M3}) || g.Live != 3 {
		t.Errorf("group 1 = %+v, want Rendezvous of c1..c3", g)
	}
	if g := got.Groups[2]; g != Rendezvous([]netip.Addr{mapstatetest.M4}) || g.Slots[17] != mapstatetest.M4 {
		t.Errorf("group 2 = %+v, want every slot on d1", g)
	}
	if len(got.Groups) != 2 {
		t.Errorf("groups %v, want ids 1 and 2", got.Groups)
	}
	if !maps.Equal(got.FabricPrefixes, map[netip.Prefix]struct{}{pfx("10.0.10.0/23"): {}}) {
		t.Errorf("fabric prefixes %v", got.FabricPrefixes)
	}
	if !maps.Equal(got.SNATExempt, map[netip.Prefix]struct{}{pfx("10.0.1.0/24"): {}, pfx("10.0.10.0/23"): {}}) {
		t.Errorf("snat exempt %v", got.SNATExempt)
	}
	if c := got.Config; c.TunnelIP != addr("10.0.1.1") || c.SNATPortMin != 61000 || c.SNATPortMax != 65535 {
		t.Errorf("config tunnel_ip %v ports %d-%d", c.TunnelIP, c.SNATPortMin, c.SNATPortMax)
	}

	// c2 down: group 1 loses c2's slots only, ids stay; d1 down: group 2 is empty
	// (zero entry), its route stays and points at it.
	n.Down = map[GroupMember]bool{{Addr: mapstatetest.M2}: true, {Addr: mapstatetest.M4}: true}
	down, _ := mapstate.FromPlan(mapstatetest.UnmanagedPlan(), n)
	if g := down.Groups[1]; g != Rendezvous([]netip.Addr{mapstatetest.M1, mapstatetest.M3}) || g.Live != 2 {
		t.Errorf("group 1 with c2 down = %+v", g)
	}
	if _, ok := down.Groups[2]; ok || down.Routes[pfx("10.8.0.0/16")] != (Route{Group: 2}) {
		t.Errorf("group 2 with d1 down: entry %v route %+v; want no entry, route kept", down.Groups[2], down.Routes[pfx("10.8.0.0/16")])
	}
}

// TestFromPlanGroupsPerSite: two remote sites reached through the same two
// gateways get a group each, and a gateway that no longer reaches one site
// (down for it) leaves that site's group only.
func TestFromPlanGroupsPerSite(t *testing.T) {
	p := mapstatetest.Plan()
	p.Peers = append(p.Peers,
		plan.Peer{Name: "gw1", Underlay: mapstatetest.M1, TunnelAddr: addr("10.250.0.1")},
		plan.Peer{Name: "gw2", Underlay: mapstatetest.M2, TunnelAddr: addr("10.250.0.2")},
	)
	gws := []plan.NextHop{{Peer: "gw1", Via: mapstatetest.M1}, {Peer: "gw2", Via: mapstatetest.M2}}
	p.Routes = append(p.Routes,
		plan.Route{Prefix: pfx("10.61.0.0/16"), Group: gws, Site: "east"},
		plan.Route{Prefix: pfx("10.62.0.0/16"), Group: gws, Site: "north"},
		plan.Route{Prefix: pfx("10.63.0.0/16"), Group: gws, Site: "north"},
	)
	n := mapstatetest.Node()
	n.Down = map[GroupMember]bool{{Site: "north", Addr: mapstatetest.M2}: true, {Site: "", Addr: mapstatetest.M1}: true}
	got, _ := mapstate.FromPlan(p, n)
	east, north := got.Routes[pfx("10.61.0.0/16")], got.Routes[pfx("10.62.0.0/16")]
	if east.Group == 0 || north.Group == 0 || east.Group == north.Group || got.Routes[pfx("10.63.0.0/16")] != north {
		t.Fatalf("routes east %+v north %+v 10.63/16 %+v: want one group per site", east, got.Routes[pfx("10.62.0.0/16")], got.Routes[pfx("10.63.0.0/16")])
	}
	// Down for no site (liveness) is another key: it moves nothing here.
	if g := got.Groups[east.Group]; g != Rendezvous([]netip.Addr{mapstatetest.M1, mapstatetest.M2}) {
		t.Errorf("east group %+v, want both gateways", g)
	}
	if g := got.Groups[north.Group]; g != Rendezvous([]netip.Addr{mapstatetest.M1}) {
		t.Errorf("north group %+v, want gw1 only (gw2 does not reach north)", g)
	}
}

// TestFromPlanKeepsGroupIDs: a new group whose members sort before an existing
// group's does not take the existing group's id when the current routes are given.
func TestFromPlanKeepsGroupIDs(t *testing.T) {
	n := mapstatetest.Node()
	p := mapstatetest.UnmanagedPlan()
	before, _ := mapstate.FromPlan(p, n)
	current := map[netip.Prefix]uint32{}
	for pr, r := range before.Routes {
		if r.Group != 0 {
			current[pr] = r.Group
		}
	}
	if len(current) == 0 {
		t.Fatal("unmanagedPlan has no group route")
	}
	// A second unmanaged site whose only member sorts before every other.
	p2 := p.Clone()
	p2.Routes = append(p2.Routes, plan.Route{Prefix: netip.MustParsePrefix("10.99.0.0/16"),
		Group: []plan.NextHop{{Peer: "early", Via: addr("10.0.0.1")}}, Origin: "test"})
	n.CurrentGroups = current
	after, _ := mapstate.FromPlan(p2, n)
	for pr, id := range current {
		if got := after.Routes[pr].Group; got != id {
			t.Errorf("route %v moved from group %d to %d", pr, id, got)
		}
	}
	if id := after.Routes[netip.MustParsePrefix("10.99.0.0/16")].Group; id == 0 || slices.Contains(slices.Collect(maps.Values(current)), id) {
		t.Errorf("new group got id %d, want a free one (in use: %v)", id, current)
	}
}

// TestFromPlanUnderlayException: an Underlay route becomes an entry with
// ROUTE_F_UNDERLAY and neither peer nor group, so the datapath reads it as
// a miss; it takes no next-hop group.
func TestFromPlanUnderlayException(t *testing.T) {
	gw := netip.MustParseAddr("10.0.0.4")
	p := &plan.NodePlan{Node: "a", Underlay: netip.MustParseAddr("10.0.0.5"), Routes: []plan.Route{
		{Prefix: netip.MustParsePrefix("192.168.10.0/28"), Group: []plan.NextHop{{Peer: "g", Via: gw}}, Site: "flex", TransitOnly: true},
		{Prefix: netip.MustParsePrefix("192.168.10.10/32"), TransitOnly: true, Underlay: true},
	}}
	s, warns := mapstate.FromPlan(p, mapstate.NodeConfig{})
	if len(warns) != 0 {
		t.Errorf("warnings %v", warns)
	}
	got := s.Routes[netip.MustParsePrefix("192.168.10.10/32")]
	if got != (Route{Flags: RouteFlagUnderlay}) {
		t.Errorf("exception entry %+v, want flags ROUTE_F_UNDERLAY only", got)
	}
	if r := s.Routes[netip.MustParsePrefix("192.168.10.0/28")]; r.Group == 0 || r.Flags != 0 || len(s.Groups) != 1 {
		t.Errorf("covering route %+v, groups %v: want one group, no flags", r, s.Groups)
	}
}

// TestFromPlanRouteFlags: a route's ViaFabric and NotForPods become
// ROUTE_F_VIA_FABRIC and ROUTE_F_NOT_FOR_PODS of its entry, each alone and
// together, on a route to a peer and on one to a group; a route with neither
// has no flag.
func TestFromPlanRouteFlags(t *testing.T) {
	gw, peer := addr("172.16.0.10"), addr("172.16.0.11")
	group := []plan.NextHop{{Peer: "gw", Via: gw}}
	p := &plan.NodePlan{Node: "a", Underlay: addr("172.16.0.12"), Routes: []plan.Route{
		{Prefix: pfx("10.20.0.0/24"), Group: group, Site: "edge"},
		{Prefix: pfx("10.20.1.0/24"), Group: group, Site: "edge", ViaFabric: true},
		{Prefix: pfx("172.16.0.11/32"), Peer: "m", Via: peer, TransitOnly: true, NotForPods: true},
		{Prefix: pfx("10.20.2.0/24"), Group: group, Site: "edge", ViaFabric: true, NotForPods: true},
		{Prefix: pfx("10.20.3.0/24"), Peer: "m", Via: peer},
	}}
	s, warns := mapstate.FromPlan(p, mapstate.NodeConfig{})
	if len(warns) != 0 {
		t.Errorf("warnings %v", warns)
	}
	want := map[string]uint32{
		"10.20.0.0/24":   0,
		"10.20.1.0/24":   RouteFlagViaFabric,
		"172.16.0.11/32": RouteFlagNotForPods,
		"10.20.2.0/24":   RouteFlagViaFabric | RouteFlagNotForPods,
		"10.20.3.0/24":   0,
	}
	for prefix, flags := range want {
		r, ok := s.Routes[pfx(prefix)]
		if !ok {
			t.Errorf("%s: no entry", prefix)
			continue
		}
		if r.Flags != flags {
			t.Errorf("%s: flags %#x, want %#x", prefix, r.Flags, flags)
		}
	}
}

// An attached pod interface without a peer (a bridge) carries
// PodIfaceFlagNoPeer, beside PodIfaceFlagReserved when the plugin reserved
// addresses on it; one not attached gets no entry.
func TestFromPlanPodNoPeer(t *testing.T) {
	n := mapstatetest.Node() // pods on 9 and 11
	n.PodNoPeer = []int{11, 12}
	n.PodAddrs = []PodAddr{{Ifindex: 11, Addr: addr("10.1.0.5")}}
	got, _ := mapstate.FromPlan(mapstatetest.Plan(), n)
	want := map[uint32]PodIface{9: {}, 11: {Flags: PodIfaceFlagNoPeer | PodIfaceFlagReserved}}
	if diff := cmp.Diff(want, got.PodIfaces); diff != "" {
		t.Errorf("pod_ifaces (-want +got):\n%s", diff)
	}
}

// TestFromPlanPodAddrsBothFamilies: a pod's IPv4 and IPv6 reservations both
// reach the maps (pod_ingress checks the sources of both families), the
// interface is reserved by either, and a reservation on an interface the agent
// has not attached is left out.
func TestFromPlanPodAddrsBothFamilies(t *testing.T) {
	n := mapstatetest.Node() // pods on 9 and 11
	n.PodAddrs = []PodAddr{
		{Ifindex: 9, Addr: addr("10.1.0.5")}, {Ifindex: 9, Addr: addr("fd10::5")},
		{Ifindex: 11, Addr: addr("fd10::6")},
		{Ifindex: 12, Addr: addr("fd10::7")},
	}
	got, _ := mapstate.FromPlan(mapstatetest.Plan(), n)
	want := map[PodAddr]struct{}{
		{Ifindex: 9, Addr: addr("10.1.0.5")}: {}, {Ifindex: 9, Addr: addr("fd10::5")}: {},
		{Ifindex: 11, Addr: addr("fd10::6")}: {},
	}
	if diff := cmp.Diff(want, got.PodAddrs); diff != "" {
		t.Errorf("pod addrs (-want +got):\n%s", diff)
	}
	wantIfaces := map[uint32]PodIface{9: {Flags: PodIfaceFlagReserved}, 11: {Flags: PodIfaceFlagReserved}}
	if diff := cmp.Diff(wantIfaces, got.PodIfaces); diff != "" {
		t.Errorf("pod_ifaces (-want +got):\n%s", diff)
	}
}

// TestFromPlanEncryptedPeers: an encrypted peer's entries are keyed by its tunnel
// address (plan.Peer.Via) with PEER_F_WIREGUARD, and PEER_F_WIREGUARD_NO_KEY while
// its key is unknown; config.wg_ifindex is set only on a node with encrypted
// peers, so a node without them never sends into a device it does not use.
func TestFromPlanEncryptedPeers(t *testing.T) {
	p := &plan.NodePlan{
		Node: "a1", Underlay: addr("172.16.1.10"), Encrypted: true,
		Peers: []plan.Peer{
			{Name: "a2", Underlay: addr("172.16.1.11"), TunnelAddr: addr("10.0.2.1"), AllowedSources: []netip.Prefix{pfx("10.0.2.0/24")}},
			{Name: "b1", Underlay: addr("172.16.2.11"), TunnelAddr: addr("10.1.0.1"), AllowedSources: []netip.Prefix{pfx("10.1.0.0/24")},
				Encrypted: true, WireGuardKey: "key"},
			{Name: "b2", Underlay: addr("172.16.2.12"), TunnelAddr: addr("10.1.1.1"), AllowedSources: []netip.Prefix{pfx("10.1.1.0/24")},
				Encrypted: true},
		},
		Routes: []plan.Route{
			{Prefix: pfx("10.0.2.0/24"), Peer: "a2", Via: addr("172.16.1.11")},
			{Prefix: pfx("10.1.0.0/24"), Peer: "b1", Via: addr("10.1.0.1")},
			{Prefix: pfx("10.1.1.0/24"), Peer: "b2", Via: addr("10.1.1.1")},
		},
	}
	n := mapstatetest.Node()
	n.WireGuardIfindex = 42
	got, warnings := mapstate.FromPlan(p, n)
	if len(warnings) != 0 {
		t.Errorf("warnings %q", warnings)
	}
	wantPeers := map[netip.Addr]Peer{
		addr("172.16.1.11"): {},
		addr("10.1.0.1"):    {Flags: PeerFlagWireGuard},
		addr("10.1.1.1"):    {Flags: PeerFlagWireGuard | PeerFlagWireGuardNoKey},
	}
	if !maps.Equal(got.Peers, wantPeers) {
		t.Errorf("peers %v, want %v", got.Peers, wantPeers)
	}
	for ps := range got.PeerSources {
		if _, ok := wantPeers[ps.Peer]; !ok {
			t.Errorf("peer source %v of no peer entry", ps)
		}
	}
	for pr, r := range got.Routes {
		if _, ok := wantPeers[r.Peer]; !ok {
			t.Errorf("route %v to %v, which has no peer entry", pr, r.Peer)
		}
	}
	if got.Config.WireGuardIfindex != 42 {
		t.Errorf("wg_ifindex %d, want 42", got.Config.WireGuardIfindex)
	}
	p.Encrypted = false
	for i := range p.Peers {
		p.Peers[i].Encrypted = false
	}
	if clear, _ := mapstate.FromPlan(p, n); clear.Config.WireGuardIfindex != 0 {
		t.Errorf("wg_ifindex %d on a node without encrypted peers, want 0", clear.Config.WireGuardIfindex)
	}
}

// TestExplainAgreesWithMaps: plan.Explain never says an address goes into the
// tunnel by a route the datapath's maps (FromPlan) do not hold, in either family:
// for an address inside each route of the fixtures, and of the same fixtures with
// IPv6 routes through gateways, transit only and to a peer at an IPv6 underlay
// address added, a verdict "into the tunnel by route P" has routes[P] (or routes6)
// and the route's peer or group; a route missing from the maps is "not carried" or
// not a tunnel verdict at all. Two functions, written apart, on one plan.
func TestExplainAgreesWithMaps(t *testing.T) {
	withV6 := mapstatetest.UnmanagedPlan()
	withV6.Routes = append(withV6.Routes,
		plan.Route{Prefix: pfx("fd30::/48"), Group: []plan.NextHop{{Peer: "c1", Via: mapstatetest.M1}}, Site: "c"},
		plan.Route{Prefix: pfx("fd40::/48"), Peer: "c1", Via: mapstatetest.M1, TransitOnly: true},
		plan.Route{Prefix: pfx("fd50::/48"), Peer: "v6", Via: addr("fd00::12")},
	)
	for name, p := range map[string]*plan.NodePlan{"plan": mapstatetest.Plan(), "unmanaged": mapstatetest.UnmanagedPlan(), "ipv6": withV6} {
		st, _ := mapstate.FromPlan(p, mapstatetest.Node())
		for _, r := range p.Routes {
			a := r.Prefix.Addr().Next()
			e := plan.Explain(p, a)
			if e.Match == nil || e.Match.Prefix != r.Prefix {
				continue // a longer entry wins for this address
			}
			tunnel := strings.HasPrefix(e.Verdict, "into the tunnel") || strings.Contains(e.Verdict, "go into the tunnel")
			mr, inMaps := st.Routes[r.Prefix]
			if tunnel && (!inMaps || mr.Flags&RouteFlagUnderlay != 0 || (!mr.Peer.IsValid() && mr.Group == 0)) {
				t.Errorf("%s: %v: verdict %q, but the maps hold %+v (present %v)", name, a, e.Verdict, mr, inMaps)
			}
			if !inMaps && !r.Underlay && !strings.HasPrefix(e.Verdict, "not carried") {
				t.Errorf("%s: %v: route %v is not in the maps, yet the verdict is %q", name, a, r.Prefix, e.Verdict)
			}
		}
	}
}

// TestFromPlanUnderlay6: on a node of the IPv6 underlay, config.underlay_ip6 is its
// address; its peers on that underlay and their routes go in by their IPv6
// addresses, each with a handle (kept from node.CurrentHandles, else a fresh one);
// a peer on the IPv4 underlay is left out with its route, with warnings; an
// encrypted peer stays known by its IPv4 tunnel address.
func TestFromPlanUnderlay6(t *testing.T) {
	b1, b2 := addr("fd00:b::11"), addr("fd00:b::12")
	n := mapstatetest.Node()
	n.CurrentHandles = map[netip.Addr]netip.Addr{b2: addr("0.0.0.7")}
	got, warnings := mapstate.FromPlan(mapstatetest.Underlay6Plan(), n)
	if got.Config.UnderlayIP6 != addr("fd00:a::10") || got.Config.UnderlayIP.IsValid() {
		t.Errorf("config underlay %v / %v, want only the IPv6 one", got.Config.UnderlayIP, got.Config.UnderlayIP6)
	}
	wantRoutes := map[netip.Prefix]Route{
		pfx("10.1.0.0/24"): {Peer: b1}, pfx("fd00:1::/64"): {Peer: b1},
		pfx("10.1.1.0/24"): {Peer: b2}, pfx("10.3.0.0/24"): {Peer: addr("10.3.0.1")},
	}
	if !maps.Equal(got.Routes, wantRoutes) {
		t.Errorf("routes %v, want %v", got.Routes, wantRoutes)
	}
	wantHandles := map[netip.Addr]netip.Addr{b2: addr("0.0.0.7"), b1: addr("0.0.0.1")}
	if !maps.Equal(got.Handles, wantHandles) {
		t.Errorf("handles %v, want %v (b2 keeps its own)", got.Handles, wantHandles)
	}
	if _, ok := got.Peers[addr("172.16.3.11")]; ok || len(got.Peers) != 3 {
		t.Errorf("peers %v, want b1, b2 and d1's tunnel address", got.Peers)
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], "different families") || !strings.Contains(warnings[1], "underlay family") {
		t.Errorf("warnings %q, want the IPv4 peer's and its route's", warnings)
	}
}
