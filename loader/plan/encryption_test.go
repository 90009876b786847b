package plan

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// wgKey is a valid public key for tests: 32 bytes of b in base64.
func wgKey(b byte) string {
	return base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(rune(b)), 32)))
}

// withKey adds the WireGuard public key annotation to a Node document.
func withKey(doc, name, key string) string {
	return strings.Replace(doc, "metadata: {name: "+name+"}",
		fmt.Sprintf("metadata:\n  name: %s\n  annotations: {%s: %q}", name, v1alpha1.AnnotationWireGuardPublicKey, key), 1)
}

// TestEncryptedPeering: a meshing SitePeering with encryption WireGuard
// encrypts the tunnels between its sites' nodes, and only those: the peers of
// the other site are Encrypted, known to the datapath by their tunnel
// addresses (routes, groups), with their published keys; peers of the node's
// own site stay in the clear, known by their InternalIPs.
func TestEncryptedPeering(t *testing.T) {
	set := load(t,
		site("a", "10.0.0.0/24", "10.100.0.0/16", ""),
		site("b", "10.1.0.0/24", "10.101.0.0/16", ""),
		peering("ab", "a, b", "  encryption: WireGuard\n"),
		withKey(node("a1", "10.0.0.1", "10.100.1.0/24"), "a1", wgKey('a')),
		withKey(node("a2", "10.0.0.2", "10.100.2.0/24"), "a2", wgKey('b')),
		withKey(node("b1", "10.1.0.1", "10.101.1.0/24"), "b1", wgKey('c')),
		node("b2", "10.1.0.2", "10.101.2.0/24"),
	)
	p, err := Compute(set, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if !p.Encrypted {
		t.Error("plan not Encrypted with encrypted peers")
	}
	want := map[string]struct {
		encrypted bool
		key       string
		via       string
	}{
		"a2": {false, "", "10.0.0.2"},
		"b1": {true, wgKey('c'), "10.101.1.1"},
		"b2": {true, "", "10.101.2.1"},
	}
	if len(p.Peers) != len(want) {
		t.Fatalf("peers %v, want %d", p.Peers, len(want))
	}
	for _, pr := range p.Peers {
		w := want[pr.Name]
		if pr.Encrypted != w.encrypted || pr.WireGuardKey != w.key || pr.Via() != netip.MustParseAddr(w.via) {
			t.Errorf("peer %s: encrypted %v key %q via %s, want %v %q %s", pr.Name, pr.Encrypted, pr.WireGuardKey, pr.Via(), w.encrypted, w.key, w.via)
		}
	}
	for _, r := range p.Routes {
		if r.Peer != "" && r.Via != netip.MustParseAddr(want[r.Peer].via) {
			t.Errorf("route %s to %s via %s, want %s", r.Prefix, r.Peer, r.Via, want[r.Peer].via)
		}
	}
	if !slices.ContainsFunc(p.Warnings, func(w string) bool {
		return strings.Contains(w, `peer Node "b2" has not published its WireGuard public key`)
	}) {
		t.Errorf("no warning about b2's missing key: %q", p.Warnings)
	}

	// Without encryption nothing is Encrypted and every Via is an InternalIP.
	clear := load(t,
		site("a", "10.0.0.0/24", "10.100.0.0/16", ""),
		site("b", "10.1.0.0/24", "10.101.0.0/16", ""),
		peering("ab", "a, b", "  encryption: None\n"),
		node("a1", "10.0.0.1", "10.100.1.0/24"),
		node("b1", "10.1.0.1", "10.101.1.0/24"),
	)
	q, err := Compute(clear, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if q.Encrypted || len(q.Peers) != 1 || q.Peers[0].Encrypted || q.Peers[0].Via() != netip.MustParseAddr("10.1.0.1") {
		t.Errorf("encryption None: plan encrypted %v, peers %+v", q.Encrypted, q.Peers)
	}
}

// TestEncryptedPeerNeedsTunnelAddresses: GENEVE inside WireGuard goes from
// tunnel address to tunnel address, so a peer of an encrypted pair that has
// none (an unmanaged site's node without the annotation) is left out with a
// warning rather than tunnelled to in the clear.
func TestEncryptedPeerNeedsTunnelAddresses(t *testing.T) {
	set := load(t,
		site("a", "10.0.0.0/24", "10.100.0.0/16", ""),
		site("b", "10.1.0.0/24", "10.101.0.0/16", "  manageCniPlugin: false\n"),
		peering("ab", "a, b", "  encryption: WireGuard\n"),
		node("a1", "10.0.0.1", "10.100.1.0/24"),
		node("b1", "10.1.0.1", ""),
	)
	p, err := Compute(set, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Peers) != 0 {
		t.Errorf("peers %+v, want none", p.Peers)
	}
	if !slices.ContainsFunc(p.Warnings, func(w string) bool { return strings.Contains(w, "has no tunnel address") }) {
		t.Errorf("no warning: %q", p.Warnings)
	}
}

// TestEncryptedAssignment: a SiteGatewayPoolAssignment with encryption
// WireGuard encrypts the tunnels between gateways of different sites; a
// member's tunnel to its own site's gateway stays in the clear, and group
// routes to encrypted gateways name them by their tunnel addresses.
func TestEncryptedAssignment(t *testing.T) {
	set := load(t,
		site("a", "10.0.0.0/24", "10.100.0.0/16", ""),
		site("b", "10.1.0.0/24", "10.101.0.0/16", ""),
		pool("gw", "Internal", "gw", ""),
		assignmentDoc("ab", "a, b", "gw", "  encryption: WireGuard\n"),
		gw("a-gw", "10.0.0.1", "10.100.1.0/24", "gw"),
		node("a1", "10.0.0.2", "10.100.2.0/24"),
		gw("b-gw", "10.1.0.1", "10.101.1.0/24", "gw"),
		node("b1", "10.1.0.2", "10.101.2.0/24"),
	)
	g, err := Compute(set, "a-gw")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Compute(set, "a1")
	if err != nil {
		t.Fatal(err)
	}
	encrypted := func(p *NodePlan) map[string]bool {
		out := map[string]bool{}
		for _, pr := range p.Peers {
			out[pr.Name] = pr.Encrypted
		}
		return out
	}
	if got, want := encrypted(g), map[string]bool{"a1": false, "b-gw": true}; !sameFlags(got, want) {
		t.Errorf("gateway a-gw: peers encrypted %v, want %v", got, want)
	}
	if got, want := encrypted(m), map[string]bool{"a-gw": false}; !sameFlags(got, want) {
		t.Errorf("member a1: peers encrypted %v, want %v", got, want)
	}
	if !g.Encrypted || m.Encrypted {
		t.Errorf("plans encrypted: gateway %v, member %v; want true, false", g.Encrypted, m.Encrypted)
	}
	for _, r := range g.Routes {
		for _, h := range r.Group {
			if h.Peer == "b-gw" && h.Via != netip.MustParseAddr("10.101.1.1") {
				t.Errorf("route %s: member b-gw via %s, want its tunnel address", r.Prefix, h.Via)
			}
		}
	}
}

func sameFlags(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestEncryptionSymmetric: for random fleets (a third of their joins
// encrypted), encryption is a property of the pair: when x has y as a peer, y
// has x, and both see the pair encrypted or both in the clear; only nodes of
// different sites are encrypted; every route and group member naming an
// encrypted peer goes to its tunnel address, and a plan with an encrypted peer
// says so.
func TestEncryptionSymmetric(t *testing.T) {
	pairs := 0
	for seed := range uint64(300) {
		set, plans := randomPlans(t, seed, 12)
		for x, p := range plans {
			vias := map[string]netip.Addr{}
			any := false
			for _, pr := range p.Peers {
				vias[pr.Name] = pr.Via()
				any = any || pr.Encrypted
				back := slices.IndexFunc(plans[pr.Name].Peers, func(q Peer) bool { return q.Name == x })
				if back < 0 {
					continue // a one-way peer (a gateway's member, say) is another test's business
				}
				if q := plans[pr.Name].Peers[back]; q.Encrypted != pr.Encrypted {
					t.Fatalf("seed %d: %s sees %s encrypted %v, %s sees %s encrypted %v\nset: %s",
						seed, x, pr.Name, pr.Encrypted, pr.Name, x, q.Encrypted, describeSet(set))
				}
				if pr.Encrypted {
					pairs++
					if pr.Site == p.Site {
						t.Fatalf("seed %d: %s encrypts to %s of its own site", seed, x, pr.Name)
					}
					if !pr.TunnelAddr.IsValid() || pr.Via() != pr.TunnelAddr {
						t.Fatalf("seed %d: %s: encrypted peer %s via %s, tunnel address %s", seed, x, pr.Name, pr.Via(), pr.TunnelAddr)
					}
				}
			}
			if any != p.Encrypted {
				t.Fatalf("seed %d: %s: Encrypted %v with encrypted peers %v", seed, x, p.Encrypted, any)
			}
			for _, r := range p.Routes {
				if r.Peer != "" && r.Via != vias[r.Peer] {
					t.Fatalf("seed %d: %s: route %s to %s via %s, want %s", seed, x, r.Prefix, r.Peer, r.Via, vias[r.Peer])
				}
				for _, h := range r.Group {
					if h.Via != vias[h.Peer] {
						t.Fatalf("seed %d: %s: route %s member %s via %s, want %s", seed, x, r.Prefix, h.Peer, h.Via, vias[h.Peer])
					}
				}
			}
		}
	}
	if pairs < 100 {
		t.Fatalf("only %d encrypted peer entries in 300 fleets: the property was hardly tested", pairs)
	}
	t.Logf("%d encrypted peer entries checked", pairs)
}

// TestEncryptedGatewayBehindNAT: a gateway of an External pool without an
// ExternalIP (behind a NAT; every assignment of the pool encrypted) is a peer of
// the remote gateways with no underlay address, known by its tunnel address, with
// nothing cut from the routes for it; it reaches the remote gateway at its
// ExternalIP.
func TestEncryptedGatewayBehindNAT(t *testing.T) {
	set := load(t,
		site("cloud", "10.0.0.0/24", "10.100.0.0/16", ""),
		site("edge", "192.168.50.0/24", "10.101.0.0/16", ""),
		pool("public", "External", "gw", ""),
		assignmentDoc("ce", "cloud, edge", "public", "  encryption: WireGuard\n"),
		withKey(withExternal(gw("cl-gw", "10.0.0.10", "10.100.1.0/24", "gw"), "198.51.100.30"), "cl-gw", wgKey('c')),
		withKey(gw("ed-gw", "192.168.50.10", "10.101.1.0/24", "gw"), "ed-gw", wgKey('e')),
	)
	cloud, err := Compute(set, "cl-gw")
	if err != nil {
		t.Fatal(err)
	}
	edge, err := Compute(set, "ed-gw")
	if err != nil {
		t.Fatal(err)
	}
	if len(cloud.Peers) != 1 || cloud.Peers[0].Underlay.IsValid() || !cloud.Peers[0].Encrypted || cloud.Peers[0].Via() != netip.MustParseAddr("10.101.1.1") {
		t.Errorf("cloud gateway's peers %+v, want ed-gw encrypted without an underlay address", cloud.Peers)
	}
	if len(edge.Peers) != 1 || edge.Peers[0].Underlay != netip.MustParseAddr("198.51.100.30") || !edge.Peers[0].Encrypted {
		t.Errorf("edge gateway's peers %+v, want cl-gw encrypted at its ExternalIP", edge.Peers)
	}
	for _, r := range cloud.Routes {
		if r.Prefix.Contains(netip.MustParseAddr("10.101.1.5")) && (r.Underlay || (r.Via != netip.MustParseAddr("10.101.1.1") && len(r.Group) == 0)) {
			t.Errorf("cloud route %+v for the edge's pods", r)
		}
	}
}

// natSites writes three sites joined by one encrypted assignment of an
// External pool: cloud, whose gateway cl-gw has an ExternalIP, and the edges
// ea and eb, each behind its own NAT (gateways without one), each with a
// member. sites lists the assignment's sites.
func natSites(t *testing.T, sites string) *objects.Set {
	t.Helper()
	return load(t,
		site("cloud", "10.0.0.0/24", "10.100.0.0/16", ""),
		site("ea", "192.168.50.0/24", "10.101.0.0/16", ""),
		site("eb", "192.168.60.0/24", "10.102.0.0/16", ""),
		pool("public", "External", "gw", ""),
		assignmentDoc("edges", sites, "public", "  encryption: WireGuard\n"),
		withKey(withExternal(gw("cl-gw", "10.0.0.10", "10.100.1.0/24", "gw"), "198.51.100.30"), "cl-gw", wgKey('c')),
		withKey(node("cl-1", "10.0.0.11", "10.100.2.0/24"), "cl-1", wgKey('d')),
		withKey(gw("ea-gw", "192.168.50.10", "10.101.1.0/24", "gw"), "ea-gw", wgKey('e')),
		withKey(node("ea-1", "192.168.50.11", "10.101.2.0/24"), "ea-1", wgKey('f')),
		withKey(gw("eb-gw", "192.168.60.10", "10.102.1.0/24", "gw"), "eb-gw", wgKey('g')),
		withKey(node("eb-1", "192.168.60.11", "10.102.2.0/24"), "eb-1", wgKey('h')),
	)
}

// TestGatewaysBehindTwoNATsRelay: two edge sites behind NATs, joined by one
// encrypted assignment with a reachable cloud site, reach each other through
// the cloud gateway: each edge gateway routes the other edge's prefixes (its
// gateway's own too) to cl-gw and accepts them from it, and has no peer in
// the other edge; cl-gw has both edge gateways as peers, without addresses.
// The packet model walks every pod pair and its reply through the plans, and
// checks that no tunnel joins two ends without an address for each other.
func TestGatewaysBehindTwoNATsRelay(t *testing.T) {
	set := natSites(t, "cloud, ea, eb")
	plans := map[string]*NodePlan{}
	for _, n := range []string{"cl-gw", "ea-gw", "eb-gw"} {
		p, err := Compute(set, n)
		if err != nil {
			t.Fatal(err)
		}
		plans[n] = p
	}
	for _, tc := range []struct{ at, other, otherPod string }{
		{"ea-gw", "eb-gw", "10.102.1.5"},
		{"ea-gw", "eb-gw", "10.102.2.5"},
		{"eb-gw", "ea-gw", "10.101.1.5"},
		{"eb-gw", "ea-gw", "10.101.2.5"},
	} {
		p := plans[tc.at]
		if slices.ContainsFunc(p.Peers, func(pr Peer) bool { return pr.Name == tc.other }) {
			t.Errorf("%s has %s as a peer: neither has an address for the other", tc.at, tc.other)
		}
		r, ok := lookup(p, netip.MustParseAddr(tc.otherPod), true)
		if !ok || r.TransitOnly || !slices.Equal(nextHops(r), []string{"cl-gw"}) {
			t.Errorf("%s routes %s by %+v (found %v), want to the group {cl-gw}", tc.at, tc.otherPod, r, ok)
		}
		i := slices.IndexFunc(p.Peers, func(pr Peer) bool { return pr.Name == "cl-gw" })
		if i < 0 || !inPrefixes(p.Peers[i].AllowedSources, netip.MustParseAddr(tc.otherPod)) || !p.Peers[i].Encrypted {
			t.Errorf("%s does not accept %s from cl-gw, encrypted", tc.at, tc.otherPod)
		}
	}
	for _, edge := range []string{"ea-gw", "eb-gw"} {
		i := slices.IndexFunc(plans["cl-gw"].Peers, func(pr Peer) bool { return pr.Name == edge })
		if i < 0 || plans["cl-gw"].Peers[i].Underlay.IsValid() || !plans["cl-gw"].Peers[i].Encrypted {
			t.Errorf("cl-gw's peer %s: want encrypted without an underlay address; peers %+v", edge, plans["cl-gw"].Peers)
		}
	}

	m, errs := newModel(set, unmanagedPods{})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	n, fails := m.check()
	for _, pf := range fails {
		if pf.a.kind == epHost && pf.b.kind == epHost {
			continue // the model's underlay reaches every InternalIP; the NATs do not
		}
		t.Errorf("%s", pf)
	}
	t.Logf("%d pairs walked both ways", n)
}

// TestGatewaysBehindTwoNATsNoRelay: without a reachable third site in the
// assignment, the two edges are left unjoined with a warning, and the model
// finds their pods' pairs broken (it tells a relay from none).
func TestGatewaysBehindTwoNATsNoRelay(t *testing.T) {
	set := natSites(t, "ea, eb")
	p, err := Compute(set, "ea-gw")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(p.Warnings, func(w string) bool { return strings.Contains(w, "both behind NATs") }) {
		t.Errorf("no warning about the unjoinable edges: %q", p.Warnings)
	}
	if _, ok := lookup(p, netip.MustParseAddr("10.102.2.5"), true); ok {
		t.Error("ea-gw routes eb's pods with no way to reach them")
	}
	m, errs := newModel(set, unmanagedPods{})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	broken := 0
	for _, pf := range func() []pairFailure { _, f := m.check(); return f }() {
		if pf.a.kind == epPod && pf.b.kind == epPod {
			broken++
		}
	}
	if broken == 0 {
		t.Error("the model finds every pod pair across the two NATs working")
	}
}

// TestGatewaysPartlyBehindNATWarn: a site with one gateway at a public address
// and one behind its NAT, joined to a site wholly behind a NAT: the gateway
// without an address and the other site's cannot meet, and the plan says so.
func TestGatewaysPartlyBehindNATWarn(t *testing.T) {
	set := load(t,
		site("cloud", "10.0.0.0/24", "10.100.0.0/16", ""),
		site("ea", "192.168.50.0/24", "10.101.0.0/16", ""),
		pool("public", "External", "gw", ""),
		assignmentDoc("ce", "cloud, ea", "public", "  encryption: WireGuard\n"),
		withKey(withExternal(gw("cl-gw", "10.0.0.10", "10.100.1.0/24", "gw"), "198.51.100.30"), "cl-gw", wgKey('c')),
		withKey(gw("cl-gw2", "10.0.0.11", "10.100.2.0/24", "gw"), "cl-gw2", wgKey('d')),
		withKey(gw("ea-gw", "192.168.50.10", "10.101.1.0/24", "gw"), "ea-gw", wgKey('e')),
	)
	p, err := Compute(set, "cl-gw2")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(p.Warnings, func(w string) bool { return strings.Contains(w, `"cl-gw2" cannot reach them`) }) {
		t.Errorf("no warning for the gateway partly behind the NAT: %q", p.Warnings)
	}
	q, err := Compute(set, "cl-gw")
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(q.Warnings, func(w string) bool { return strings.Contains(w, "cannot reach them") }) {
		t.Errorf("the gateway with an address warned: %q", q.Warnings)
	}
}

// TestTunnelOverheadOf: 50 bytes of GENEVE over an IPv4 underlay, 70 over an IPv6
// one (a site with a node whose only InternalIP is IPv6), and with WireGuard 50 for
// the GENEVE inside it (between IPv4 tunnel addresses) plus WireGuard's 60 over IPv4
// or 80 over IPv6.
func TestTunnelOverheadOf(t *testing.T) {
	set := load(t,
		site("a", "10.0.0.0/24", "10.100.0.0/16", ""),
		site("b", "fd00:b::/64", "10.101.0.0/16", ""),
		site("c", "10.2.0.0/24", "10.102.0.0/16", ""),
		site("d", "fd00:d::/64", "10.103.0.0/16", ""),
		peering("cd", "c, d", "  encryption: WireGuard\n"),
		node("a1", "10.0.0.1", "10.100.1.0/24"),
		node("b1", "fd00:b::1", "10.101.1.0/24"),
		node("c1", "10.2.0.1", "10.102.1.0/24"),
		node("d1", "fd00:d::1", "10.103.1.0/24"),
	)
	for site, want := range map[string]int{"a": 50, "b": 70, "c": 110, "d": 130} {
		if got := TunnelOverheadOf(set, site); got != want {
			t.Errorf("site %s: overhead %d, want %d", site, got, want)
		}
	}
}
