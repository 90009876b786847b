package plan

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

func TestExplain(t *testing.T) {
	seed000, _, err := objects.LoadDir("../objects/testdata/seed000")
	if err != nil {
		t.Fatal(err)
	}
	gw := seed000Gateway(t)
	const (
		aksAnno   = `Node "aks-nodepool1-1" metadata.annotations["isthmus.dev/tunnel-ipv4"]`
		podBlock  = `Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]`
		localCidr = `Site "cluster" spec.localCidrs`
		routed    = `GatewayPool "gateways" spec.routedCidrs[0]`
	)
	for _, tc := range []struct {
		name       string
		set        *objects.Set
		node, addr string
		// kind, prefix, origin and peer of the winning match; kind "" means none.
		kind, prefix, origin, peer string
		group                      int // members of the matched route's group
		matches                    int
		verdict                    string   // substring of the verdict
		why                        []string // substrings of each correction's Why, in order
		translated                 bool
		exempt, exemptOrigin       string
	}{{
		name: "route to a peer's tunnel address", set: seed000, node: "aks-nodepool1-0", addr: "100.64.0.5",
		kind: MatchRoute, prefix: "100.64.0.5/32", origin: aksAnno, peer: "aks-nodepool1-1", matches: 1,
		verdict: "to peer aks-nodepool1-1 (underlay 10.0.0.5)", translated: true,
	}, {
		name: "pod block of an unmanaged site: local beats fabric at equal length", set: seed000, node: "aks-nodepool1-0", addr: "10.0.2.7",
		kind: MatchLocal, prefix: "10.0.2.0/23", origin: podBlock, matches: 3, verdict: "is local",
		exempt: "10.0.2.0/23", exemptOrigin: podBlock,
	}, {
		name: "localCidrs only", set: seed000, node: "aks-nodepool1-0", addr: "10.0.5.1",
		kind: MatchLocal, prefix: "10.0.0.0/16", origin: localCidr, matches: 1, verdict: "is local", translated: true,
	}, {
		name: "peer underlay inside localCidrs", set: seed000, node: "aks-nodepool1-0", addr: "10.0.0.5",
		kind: MatchPeerUnderlay, prefix: "10.0.0.5/32", origin: `Node "aks-nodepool1-1" status.addresses[InternalIP]`, peer: "aks-nodepool1-1",
		matches: 2, verdict: "tunnel endpoint", translated: true,
	}, {
		name: "own underlay", set: seed000, node: "aks-nodepool1-0", addr: "10.0.0.4",
		kind: MatchUnderlay, prefix: "10.0.0.4/32", matches: 2, verdict: "own underlay", translated: true,
	}, {
		name: "own tunnel address is exempt", set: seed000, node: "aks-nodepool1-0", addr: "100.64.0.4",
		kind: MatchTunnelAddr, prefix: "100.64.0.4/32", origin: `Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"]`,
		matches: 1, verdict: "own tunnel address",
		exempt: "100.64.0.4/32", exemptOrigin: `Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"]`,
	}, {
		name: "no route", set: seed000, node: "aks-nodepool1-0", addr: "8.8.8.8",
		verdict: "no route: stays on the underlay", translated: true,
	}, {
		name: "IPv4-mapped address is unmapped", set: seed000, node: "aks-nodepool1-0", addr: "::ffff:192.168.20.9",
		kind: MatchRoute, prefix: "192.168.20.0/25", origin: `Node "flex-1" spec.podCIDRs[0]`, peer: "flex-1", matches: 1,
		verdict: "to peer flex-1", translated: true,
	}, {
		name: "route to a group", set: seed000, node: "flex-1", addr: "10.0.2.9",
		kind: MatchRoute, prefix: "10.0.2.0/23", origin: podBlock, group: 2, matches: 1,
		verdict: "group of 2", translated: true,
	}, {
		name: "own pod", set: seed000, node: "flex-1", addr: "192.168.20.5",
		kind: MatchPodCIDR, prefix: "192.168.20.0/25", origin: `Node "flex-1" spec.podCIDRs[0]`, matches: 1,
		verdict: "a pod on this node", exempt: "192.168.20.0/25", exemptOrigin: `Node "flex-1" spec.podCIDRs[0]`,
	}, {
		name: "gateway route cut by both local prefixes", set: gw, node: "aks-2", addr: "10.0.2.9",
		kind: MatchLocal, prefix: "10.0.2.0/23", origin: podBlock, matches: 3, verdict: "is local",
		why: []string{
			"10.0.2.0/23 would cover this address but 10.0.0.0/16 is local on this node: " + localCidr + " (the route came from " + routed + ")",
			"10.0.2.0/23 would cover this address but 10.0.2.0/23 is local on this node: " + podBlock + " (the route came from " + routed + ")",
		},
		exempt: "10.0.2.0/23", exemptOrigin: podBlock,
	}, {
		// Its pods reach it through aks-1, which carries it to its peer: the
		// group route of the node range covers it, no exception.
		name: "remote gateway's underlay: inside the remote nodeCidrs, for pods through the gateway", set: gw, node: "aks-2", addr: "192.168.10.10",
		kind: MatchRoute, prefix: "192.168.10.0/28", group: 1, matches: 1,
		verdict: "own traffic stays on the underlay (route 192.168.10.0/28 is transit only)", translated: true,
	}, {
		name: "an address of the remote nodeCidrs no Node holds: transit only, as a known node's", set: gw, node: "aks-2", addr: "192.168.10.3",
		kind: MatchRoute, prefix: "192.168.10.0/28", origin: `Site "flex-site" spec.nodeCidrs[0] and 1 more`, group: 1, matches: 1,
		verdict: "own traffic stays on the underlay (route 192.168.10.0/28 is transit only); its pods and forwarded traffic go into the tunnel by route 192.168.10.0/28 to a group of 1 (one member per flow by consistent hash, among those that reach site flex-site): aks-1 10.0.0.4", translated: true,
	}, {
		name: "a known remote node: the same route", set: gw, node: "flex-1", addr: "10.0.0.5",
		kind: MatchRoute, prefix: "10.0.0.0/27", group: 1, matches: 1,
		verdict: "own traffic stays on the underlay (route 10.0.0.0/27 is transit only)", translated: true,
	}, {
		name: "gateway: peer gateway underlay", set: gw, node: "flex-1", addr: "10.0.0.4",
		kind: MatchPeerUnderlay, prefix: "10.0.0.4/32", peer: "aks-1", origin: `Node "aks-1" status.addresses[InternalIP]`, matches: 3,
		// The pods' way to it is the tunnel, straight to that peer.
		verdict: "peer aks-1: a tunnel endpoint, stays on the underlay; this node's pods and forwarded traffic go into the tunnel by route 10.0.0.4/32 (transit only)", translated: true,
	}, {
		name: "gateway: fabric prefix from nodeCidrs", set: gw, node: "flex-1", addr: "192.168.10.3",
		kind: MatchFabric, prefix: "192.168.10.0/28", origin: `Site "flex-site" fabric prefixes (its pod blocks, or on a gateway its nodeCidrs)`,
		matches: 1, verdict: "handed to this site's fabric", translated: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compute(tc.set, tc.node)
			if err != nil {
				t.Fatal(err)
			}
			orig := p.Clone()
			e := Explain(p, netip.MustParseAddr(tc.addr))
			if !p.Equal(orig) {
				t.Error("Explain changed the plan")
			}
			if e.Node != tc.node || e.Addr != netip.MustParseAddr(tc.addr).Unmap() {
				t.Errorf("node %q addr %v, want %q %v", e.Node, e.Addr, tc.node, tc.addr)
			}
			if tc.kind == "" {
				if e.Match != nil {
					t.Errorf("match %+v, want none", *e.Match)
				}
			} else if e.Match == nil {
				t.Errorf("no match, want %s %s", tc.kind, tc.prefix)
			} else {
				m := e.Match
				if m.Kind != tc.kind || m.Prefix.String() != tc.prefix || m.Peer != tc.peer || len(m.Group) != tc.group {
					t.Errorf("match %s %v peer %q group %d, want %s %s peer %q group %d", m.Kind, m.Prefix, m.Peer, len(m.Group), tc.kind, tc.prefix, tc.peer, tc.group)
				}
				if tc.origin != "" && m.Origin != tc.origin {
					t.Errorf("origin %q, want %q", m.Origin, tc.origin)
				}
			}
			if len(e.Matches) != tc.matches {
				t.Errorf("%d matches %+v, want %d", len(e.Matches), e.Matches, tc.matches)
			}
			for i := 1; i < len(e.Matches); i++ {
				if e.Matches[i].Prefix.Bits() > e.Matches[i-1].Prefix.Bits() {
					t.Errorf("matches not longest first: %v before %v", e.Matches[i-1].Prefix, e.Matches[i].Prefix)
				}
			}
			if !strings.Contains(e.Verdict, tc.verdict) {
				t.Errorf("verdict %q, want it to contain %q", e.Verdict, tc.verdict)
			}
			if len(e.Corrections) != len(tc.why) {
				t.Fatalf("%d corrections %+v, want %d", len(e.Corrections), e.Corrections, len(tc.why))
			}
			for i, w := range tc.why {
				if !strings.Contains(e.Corrections[i].Why, w) {
					t.Errorf("correction %d: %q, want it to contain %q", i, e.Corrections[i].Why, w)
				}
			}
			s := e.SNAT
			if s.Translated != tc.translated {
				t.Errorf("translated %v (%s), want %v", s.Translated, s.Reason, tc.translated)
			}
			if s.Translated && s.To != p.SNAT.Addr {
				t.Errorf("translated to %v, want %v", s.To, p.SNAT.Addr)
			}
			switch {
			case tc.exempt == "" && s.Exempt != nil:
				t.Errorf("exempt by %+v, want no entry", *s.Exempt)
			case tc.exempt != "" && (s.Exempt == nil || s.Exempt.Prefix.String() != tc.exempt || s.Exempt.Origin != tc.exemptOrigin):
				t.Errorf("exempt by %+v, want %s from %s", s.Exempt, tc.exempt, tc.exemptOrigin)
			}
			if _, err := json.Marshal(e); err != nil {
				t.Errorf("marshal: %v", err)
			}
		})
	}
}

// TestExplainSNATOff: a node without a tunnel address translates nothing, and
// says why.
func TestExplainSNATOff(t *testing.T) {
	p := &NodePlan{Node: "n", SNAT: SNATPolicy{Reason: "no tunnel address"}}
	e := Explain(p, netip.MustParseAddr("10.9.9.9"))
	if e.SNAT.Translated || e.SNAT.Exempt != nil || !strings.Contains(e.SNAT.Reason, "no tunnel address") {
		t.Errorf("SNAT %+v, want off with the plan's reason", e.SNAT)
	}
	if e.Match != nil || !strings.HasPrefix(e.Verdict, "no route") {
		t.Errorf("match %v verdict %q, want none", e.Match, e.Verdict)
	}
}

// TestExplainLongestExempt: the longest exempt prefix is the one reported.
func TestExplainLongestExempt(t *testing.T) {
	p := &NodePlan{Node: "n", SNAT: SNATPolicy{Addr: netip.MustParseAddr("10.1.0.1"), Exempt: []ExemptSource{
		{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Origin: "wide"},
		{Prefix: netip.MustParsePrefix("10.1.0.0/24"), Origin: "narrow"},
	}}}
	if e := Explain(p, netip.MustParseAddr("10.1.0.7")); e.SNAT.Exempt == nil || e.SNAT.Exempt.Origin != "narrow" {
		t.Errorf("exempt %+v, want narrow", e.SNAT.Exempt)
	}
}

// TestExplainPair: on seed 000's gateway topology, the member aks-2's declared
// pod reaches the flex pod by the underlay device (its fabric table) and must
// hear the answer there; its host reaches it by isthmus0; the flex node's pod
// reaches the declared pod by isthmus0 (the pods' table). Both directions name
// the same device: that is strict rp_filter's condition.
func TestExplainPair(t *testing.T) {
	gw := seed000Gateway(t)
	for _, tc := range []struct {
		node, local, remote string
		table, device       string
		route               string
	}{
		{"aks-2", "10.0.2.200", "192.168.20.6", TableFabric, DeviceUnderlay, "192.168.20.0/25"},
		{"aks-2", "10.0.0.5", "192.168.20.6", TableMain, DeviceOverlay, "192.168.20.0/25"},
		{"aks-2", "10.0.2.200", "10.0.0.4", TableMain, DeviceUnderlay, ""},
		{"flex-1", "192.168.20.6", "10.0.2.200", TablePods, DeviceOverlay, "10.0.2.0/23"},
		{"aks-1", "10.0.2.128", "192.168.20.6", TablePods, DeviceOverlay, "192.168.20.0/25"},
	} {
		p, err := Compute(gw, tc.node)
		if err != nil {
			t.Fatal(err)
		}
		e := ExplainPair(p, netip.MustParseAddr(tc.local), netip.MustParseAddr(tc.remote))
		route := ""
		if e.Request.Route != nil {
			route = e.Request.Route.Prefix.String()
		}
		if e.Request.Table != tc.table || e.Request.Device != tc.device || route != tc.route {
			t.Errorf("%s: %s -> %s: table %s, device %s, route %q; want %s, %s, %q", tc.node, tc.local, tc.remote,
				e.Request.Table, e.Request.Device, route, tc.table, tc.device, tc.route)
		}
		if e.Reply.Device != e.Request.Device || e.Reply.From != e.Request.To || e.Reply.To != e.Request.From {
			t.Errorf("%s: reply %+v does not mirror request %+v", tc.node, e.Reply, e.Request)
		}
		if e.Says == "" {
			t.Errorf("%s: no explanation", tc.node)
		}
	}
}

// TestExplainIPv6: an IPv6 address is explained as the datapath carries IPv6: a
// route to a meshed peer or through gateways goes into the tunnel; a transit-only
// or via-fabric route and a route to a peer at an IPv6 underlay address are "not
// carried", each saying why; no IPv6 source is translated;
// an IPv6 pair is routed by main, whatever the pods' rules say for IPv4.
func TestExplainIPv6(t *testing.T) {
	a, pfx := netip.MustParseAddr, netip.MustParsePrefix
	p := &NodePlan{
		Node: "a1", Site: "a", Underlay: a("172.16.1.10"), TunnelAddr: a("10.10.1.1"),
		PodCIDRs:      []netip.Prefix{pfx("10.10.1.0/24"), pfx("fd10:0:0:1::/64")},
		TunnelSources: []netip.Prefix{pfx("10.10.1.0/24"), pfx("fd10:0:0:1::/64")},
		SNAT:          SNATPolicy{Addr: a("10.10.1.1")},
		Routes: []Route{
			{Prefix: pfx("fd20:0:0:1::/64"), Peer: "b1", Via: a("172.16.2.11")},
			{Prefix: pfx("fd30::/48"), Group: []NextHop{{Peer: "gw1", Via: a("172.16.3.1")}, {Peer: "gw2", Via: a("172.16.3.2")}}, Site: "c"},
			{Prefix: pfx("fd40::/48"), Peer: "gw1", Via: a("172.16.3.1"), TransitOnly: true},
			{Prefix: pfx("fd50::/48"), Peer: "v6", Via: a("fd00::12")},
			{Prefix: pfx("10.20.1.0/24"), Peer: "b1", Via: a("172.16.2.11")},
		},
	}
	for _, tc := range []struct{ addr, verdict string }{
		{"fd20:0:0:1::7", "into the tunnel by route fd20:0:0:1::/64 to peer b1 (underlay 172.16.2.11)"},
		{"fd30::7", "into the tunnel by route fd30::/48"},
		{"fd40::7", "not carried: route fd40::/48 is for forwarded traffic or the site fabric"},
		{"fd50::7", "not carried: peer v6 is at underlay address fd00::12 and this node at 172.16.1.10, of the other family"},
		{"fd10:0:0:1::5", "a pod on this node"},
		{"10.20.1.7", "into the tunnel by route 10.20.1.0/24"},
	} {
		e := Explain(p, a(tc.addr))
		if !strings.Contains(e.Verdict, tc.verdict) {
			t.Errorf("%s: verdict %q, want it to contain %q", tc.addr, e.Verdict, tc.verdict)
		}
		if v6 := a(tc.addr).Is6(); v6 && (e.SNAT.Translated || !strings.Contains(e.SNAT.Reason, "IPv4 only")) {
			t.Errorf("%s: SNAT %+v, want not translated, saying SNAT is IPv4 only", tc.addr, e.SNAT)
		}
	}
	// The pods' table would take the transit-only route for an IPv4 pod; an IPv6
	// pod's packet is routed by main, where it is not.
	for _, tc := range []struct {
		remote, table, device, route string
	}{
		{"fd40::7", TableMain, DeviceUnderlay, ""},
		{"fd20:0:0:1::7", TableMain, DeviceOverlay, "fd20:0:0:1::/64"},
	} {
		e := ExplainPair(p, a("fd10:0:0:1::5"), a(tc.remote))
		route := ""
		if e.Request.Route != nil {
			route = e.Request.Route.Prefix.String()
		}
		if e.Request.Table != tc.table || e.Request.Device != tc.device || route != tc.route {
			t.Errorf("fd10:0:0:1::5 -> %s: table %s device %s route %q; want %s %s %q", tc.remote, e.Request.Table, e.Request.Device, route, tc.table, tc.device, tc.route)
		}
	}
}
