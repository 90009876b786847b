package plan

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// routesPerSite counts p's routes by the remote site whose nodeCidrs or pod
// blocks hold their prefix: the routes it costs the node to reach that
// site. Routes of no remote site (the node's own site's) are left out.
func routesPerSite(set *objects.Set, p *NodePlan) map[string]int {
	out := map[string]int{}
	for _, r := range p.Routes {
		for _, st := range set.Sites {
			if st.Name == p.Site {
				continue
			}
			var prefixes []netip.Prefix
			for _, c := range st.Spec.NodeCIDRs {
				prefixes = append(prefixes, netip.MustParsePrefix(string(c)))
			}
			prefixes = append(prefixes, blockPrefixes(&st)...)
			if slices.ContainsFunc(prefixes, func(b netip.Prefix) bool { return b.Bits() <= r.Prefix.Bits() && b.Contains(r.Prefix.Addr()) }) {
				out[st.Name]++
				break
			}
		}
	}
	return out
}

// TestHubRoutesPerRemoteSite: on the 50 x 100 hub fleet (every Site joined
// through two gateways, routeNodeCidrs and underlayReachesNodes by
// default), a member reaches each remote site in at most its pod blocks
// plus a constant: the aggregated podCIDRs of its nodes (three prefixes for
// 100 /24s) and its nodeCidrs, whole, transit only (4 routes). Cutting the
// nodeCidrs around every node's address cost 22 routes a site, and left
// the addresses no Node held yet in the main table.
// docs/benchmarks.md, "Routes per remote site".
func TestHubRoutesPerRemoteSite(t *testing.T) {
	const constant = 4
	sh := fleet.Shape{Sites: 50, NodesPerSite: 100, Topology: fleet.Hub}
	set := fleetSet(t, sh)
	for role, node := range map[string]string{"member": fleet.NodeName(1, fleet.GatewaysPerSite), "gateway": fleet.NodeName(1, 0)} {
		p, err := Compute(set, node)
		if err != nil {
			t.Fatal(err)
		}
		perSite := routesPerSite(set, p)
		if len(perSite) != sh.Sites-1 {
			t.Fatalf("%s %s: routes to %d remote sites, want %d", role, node, len(perSite), sh.Sites-1)
		}
		most := 0
		for name, n := range perSite {
			blocks := len(blockPrefixes(set.Site(name)))
			// A gateway routes each remote gateway's own prefixes straight
			// to it (its health probe tests that gateway), and the rest of
			// the podCIDRs around them: measured, not bounded here.
			if role == "member" && n > blocks+constant {
				t.Errorf("%s %s: %d routes to site %s, want at most its %d pod blocks + %d", role, node, n, name, blocks, constant)
			}
			most = max(most, n)
		}
		// A remote node's address, known or not, is reached on the underlay
		// by the host: no route the kernel's main table takes holds it.
		for s := range sh.Sites {
			if s == 1 {
				continue
			}
			for _, a := range []netip.Addr{fleet.InternalIP(s, 5), fleet.InternalIP(s, sh.NodesPerSite+5)} {
				if r, ok := lookup(p, a, false); ok {
					t.Fatalf("%s %s: host traffic to %s takes route %s into the tunnel", role, node, a, r.Prefix)
				}
			}
		}
		t.Logf("%s %s: %d routes, at most %d per remote site", role, node, len(p.Routes), most)
	}
}

// TestUnderlayReachesNodesFalse: seed 000's gateway topology with
// underlayReachesNodes false. Host traffic to the other site's node
// addresses goes into the tunnel both ways (flex-1's gateway endpoint
// included on the member aks-2, which aks-1 carries on to flex-1), from
// the nodes' InternalIPs, the two gateways reach each other's InternalIPs on
// the underlay, strict rp_filter passes at every receiver, and a host's
// server bound to no address answers from the address it was asked.
func TestUnderlayReachesNodesFalse(t *testing.T) {
	files := map[string][]byte{}
	for _, f := range []string{"sites.yaml", "nodes.yaml", "gateways.yaml"} {
		files[f] = readFile(t, "../objects/testdata/seed000-gateway/"+f)
	}
	files["gateways.yaml"] = append(files["gateways.yaml"], []byte("  underlayReachesNodes: false\n")...)
	set, _, err := objects.Load(files)
	if err != nil {
		t.Fatal(err)
	}
	if set.SiteGatewayPoolAssignments[0].Spec.ReachesNodesOnUnderlay() {
		t.Fatal("the assignment did not take underlayReachesNodes false")
	}
	plans := map[string]*NodePlan{}
	for _, n := range set.Nodes {
		p, err := Compute(set, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, p)
		plans[n.Name] = p
	}
	a := netip.MustParseAddr
	for _, tc := range []struct {
		node, addr string
		tunnelled  bool
	}{
		{"aks-2", "192.168.10.3", true},   // a flex address no Node holds
		{"aks-2", "192.168.10.10", true},  // flex-1, which aks-1 carries on
		{"flex-1", "10.0.0.5", true},      // aks-2
		{"flex-1", "10.0.0.9", true},      // a cluster address no Node holds
		{"flex-1", "10.0.0.4", false},     // aks-1, its tunnel endpoint
		{"aks-1", "192.168.10.10", false}, // flex-1, its tunnel endpoint
	} {
		if _, ok := lookup(plans[tc.node], a(tc.addr), false); ok != tc.tunnelled {
			t.Errorf("%s: host traffic to %s tunnelled %v, want %v", tc.node, tc.addr, ok, tc.tunnelled)
		}
	}
	if r, ok := lookup(plans["aks-1"], a("192.168.10.10"), true); !ok || r.Peer != "flex-1" {
		t.Errorf("aks-1 forwards 192.168.10.10 by %+v (%v), want straight to flex-1", r, ok)
	}
	for _, x := range set.Nodes {
		for _, y := range set.Nodes {
			xa, _ := objects.InternalIP(&x)
			ya, _ := objects.InternalIP(&y)
			if x.Name == y.Name {
				continue
			}
			if ok, err := rpFilterPasses(plans, x.Name, y.Name, ya, xa); err != nil || !ok {
				t.Errorf("%s -> %s: strict rp_filter at %s drops it (%v)", x.Name, y.Name, y.Name, err)
			}
			// A server bound to no address answers from its route's
			// source: it must be the address the client asked.
			src := hostSource(plans[x.Name], ya)
			if back := hostSource(plans[y.Name], src); back != ya {
				t.Errorf("%s -> %s (%s) from %s: %s answers from %s", x.Name, y.Name, ya, src, y.Name, back)
			}
		}
	}
}

// TestUnknownNodeAddressesRandom: for random fleets, an address of a remote
// site's nodeCidrs that no Node holds (a node that joined before its Node
// object arrived) is routed as the site's known nodes are: the host reaches
// it on the underlay where the underlay reaches the nodes and through the
// tunnel where an assignment says it does not, and the datapath forwards
// to it (pods, transit) through the gateways either way.
func TestUnknownNodeAddressesRandom(t *testing.T) {
	checked := 0
	for seed := range uint64(600) {
		set, plans := randomPlans(t, seed, 14)
		for _, x := range set.Nodes {
			p := plans[x.Name]
			if p == nil {
				continue
			}
			for _, tSite := range set.Sites {
				if tSite.Name == p.Site || meshedPair(set, p.Site, tSite.Name) {
					continue
				}
				routed, underlay, joined := false, true, false
				for _, a := range set.SiteGatewayPoolAssignments {
					if slices.Contains(a.Spec.Sites, p.Site) && slices.Contains(a.Spec.Sites, tSite.Name) {
						joined = true
						routed = routed || a.Spec.RoutesNodeCIDRs()
						underlay = underlay && a.Spec.ReachesNodesOnUnderlay()
					}
				}
				if !joined || !routed {
					continue
				}
				// InternalIPs are 10.<site>.0.<n+1> for at most 4 nodes.
				b := netip.MustParsePrefix(string(tSite.Spec.NodeCIDRs[0])).Addr().As4()
				b[3] = 200
				unknown := netip.AddrFrom4(b)
				if _, host := lookup(p, unknown, false); host == underlay {
					t.Fatalf("seed %d: %s: host traffic to %s (no Node of site %s) tunnelled %v, want %v\nset: %s",
						seed, x.Name, unknown, tSite.Name, host, !underlay, describeSet(set))
				}
				if _, fwd := lookup(p, unknown, true); !fwd {
					t.Fatalf("seed %d: %s: forwarded traffic to %s (no Node of site %s) not routed\nset: %s",
						seed, x.Name, unknown, tSite.Name, describeSet(set))
				}
				checked++
			}
		}
	}
	if checked < 300 {
		t.Fatalf("checked %d (node, remote site) pairs over 600 fleets, want at least 300", checked)
	}
	t.Logf("checked %d (node, remote site) pairs", checked)
}

// meshedPair reports whether a SitePeering with meshNodes joins sites a and b.
func meshedPair(set *objects.Set, a, b string) bool {
	return slices.ContainsFunc(set.SitePeerings, func(sp v1alpha1.SitePeering) bool {
		return sp.Spec.MeshesNodes() && slices.Contains(sp.Spec.Sites, a) && slices.Contains(sp.Spec.Sites, b)
	})
}
