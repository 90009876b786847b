package plan

import (
	"net/netip"
	"slices"
	"testing"

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
