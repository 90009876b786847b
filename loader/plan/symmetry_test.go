package plan

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

// randomTopology writes a random fleet: 2-4 managed Sites of 1-4 nodes
// (InternalIPs in 10.<site>.0.0/24, ExternalIPs in 198.18.<site>.0/24, pods
// in 10.<100+site>.0.0/16), 1-3 GatewayPools of random type selecting random
// nodes by label, random SiteGatewayPoolAssignments (routeNodeCidrs on or
// off, or underlayReachesNodes off) and random SitePeerings (meshNodes on or off). Invalid combinations
// (a site without a gateway, say) are set aside as the agent would.
func randomTopology(r *rand.Rand) *objects.Set {
	var docs []string
	sites := 2 + r.IntN(3)
	pools := 1 + r.IntN(3)
	for s := range sites {
		docs = append(docs, site(fmt.Sprintf("s%d", s), fmt.Sprintf("10.%d.0.0/24", s), fmt.Sprintf("10.%d.0.0/16", 100+s), ""))
		for n := range 1 + r.IntN(4) {
			var labels []string
			for p := range pools {
				if r.IntN(2) == 0 {
					labels = append(labels, fmt.Sprintf("gw%d: y", p))
				}
			}
			docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: s%d-n%d
  labels: {%s}
spec: {podCIDRs: [10.%d.%d.0/24]}
status:
  addresses:
    - {type: InternalIP, address: 10.%d.0.%d}
    - {type: ExternalIP, address: 198.18.%d.%d}
`, s, n, strings.Join(labels, ", "), 100+s, n, s, n+1, s, n+1))
		}
	}
	docs = append(docs, randomJoins(r, sites, pools)...)
	set, _ := objects.LoadSettingAside(map[string][]byte{"fleet.yaml": []byte(strings.Join(docs, "---\n"))})
	return set
}

// randomJoins returns the documents that join a random fleet's sites s0..:
// pools p0.. of random type selecting the nodes labelled gw<pool>: y, 0-2
// SiteGatewayPoolAssignments of random sites and pools (routeNodeCidrs on or
// off, or underlayReachesNodes off) and 0-2 SitePeerings (meshNodes mostly
// on); a third of those joins are encrypted.
func randomJoins(r *rand.Rand, sites, pools int) []string {
	var docs []string
	for p := range pools {
		typ := []string{"Internal", "External"}[r.IntN(2)]
		docs = append(docs, fmt.Sprintf("apiVersion: isthmus.dev/v1alpha1\nkind: GatewayPool\nmetadata: {name: p%d}\nspec:\n  type: %s\n  nodeSelector: {matchLabels: {gw%d: y}}\n", p, typ, p))
	}
	pick := func() string {
		var in []string
		for s := range sites {
			if r.IntN(2) == 0 {
				in = append(in, fmt.Sprintf("s%d", s))
			}
		}
		return strings.Join(in, ", ")
	}
	for a := range r.IntN(3) {
		var ps []string
		for p := range pools {
			if r.IntN(2) == 0 {
				ps = append(ps, fmt.Sprintf("p%d", p))
			}
		}
		extra := "  routeNodeCidrs: false\n"
		switch r.IntN(3) {
		case 0:
			extra = "  routeNodeCidrs: true\n"
		case 1:
			extra = "  underlayReachesNodes: false\n"
		}
		docs = append(docs, assignmentDoc(fmt.Sprintf("a%d", a), pick(), strings.Join(ps, ", "), extra))
	}
	for m := range r.IntN(3) {
		docs = append(docs, peering(fmt.Sprintf("m%d", m), pick(), fmt.Sprintf("  meshNodes: %v\n", r.IntN(3) > 0)))
	}
	// Drawn last, so the fleets of a seed are the same with and without it.
	for i, d := range docs {
		if (strings.Contains(d, "kind: SitePeering") || strings.Contains(d, "kind: SiteGatewayPoolAssignment")) && r.IntN(3) == 0 {
			docs[i] = d + "  encryption: WireGuard\n"
		}
	}
	return docs
}

// lookup is the longest-prefix match of addr in p's routes; host traffic
// (transit false) does not see TransitOnly routes, as the kernel does not,
// and an Underlay exception is a miss, as in the datapath.
func lookup(p *NodePlan, addr netip.Addr, transit bool) (Route, bool) {
	var best Route
	found := false
	for _, r := range p.Routes {
		if r.Prefix.Contains(addr) && (transit || !r.TransitOnly) && (!found || r.Prefix.Bits() > best.Prefix.Bits()) {
			best, found = r, true
		}
	}
	if found && best.Underlay {
		return Route{}, false
	}
	return best, found
}

// path follows a packet from the host of node from to addr, the underlay
// address of node to, through the plans: the first lookup as host traffic,
// then a transit lookup at every node it is tunnelled to, until a node has
// no route (it sends on the underlay) or the tunnel reaches to. It returns the
// next hops it was tunnelled through on the way, each as the sorted names of
// the group that could carry it ("" for none: the underlay all the way), and
// whether it reached to through the tunnel (else on the underlay).
func path(plans map[string]*NodePlan, from, to string, addr netip.Addr) (hops []string, tunnelled bool, err error) {
	return walk(plans, from, to, addr, netip.Addr{})
}

// rpFilterPasses reports whether strict rp_filter on node to accepts what
// from's host sends to addr (to's InternalIP): the source is from's tunnel
// address when from routes addr into the tunnel (the kernel route's src)
// on a route that is not UnderlaySource, else its InternalIP; to accepts a packet that arrived tunnelled only when
// its own route back to that source goes into the tunnel too, and one that
// arrived on the underlay only when its route back does not.
func rpFilterPasses(plans map[string]*NodePlan, from, to string, addr, fromIP netip.Addr) (bool, error) {
	_, tunnelled, err := path(plans, from, to, addr)
	if err != nil {
		return false, err
	}
	src := fromIP
	if r, ok := lookup(plans[from], addr, false); ok && !r.UnderlaySource {
		src = plans[from].TunnelAddr
	}
	_, back := lookup(plans[to], src, false)
	return back == tunnelled, nil
}

// randomPlans returns a random fleet (randomTopology, from seed and stream)
// and the plan of every node. Every node of randomTopology can be planned
// (a managed site, a podCIDR each), so a node without a plan fails t: a
// test that skipped it would pass on a fleet of nothing.
func randomPlans(t *testing.T, seed, stream uint64) (*objects.Set, map[string]*NodePlan) {
	t.Helper()
	set := randomTopology(rand.New(rand.NewPCG(seed, stream)))
	plans := map[string]*NodePlan{}
	for _, n := range set.Nodes {
		p, err := Compute(set, n.Name)
		if err != nil {
			t.Fatalf("seed %d: %v\nset: %s", seed, err, describeSet(set))
		}
		plans[n.Name] = p
	}
	if len(plans) == 0 {
		t.Fatalf("seed %d: no node to plan\nset: %s", seed, describeSet(set))
	}
	return set, plans
}

// TestPathsSymmetric: for random fleets, every pair of nodes reaches each
// other's underlay address the same way in both directions: both on the
// underlay, or both through the same tunnel hops (in reverse order), so
// strict rp_filter and stateful firewalls between sites keep working.
func TestPathsSymmetric(t *testing.T) {
	plansChecked, pairs := 0, 0
	for seed := range uint64(300) {
		set, plans := randomPlans(t, seed, 12)
		plansChecked += len(plans)
		for _, x := range set.Nodes {
			for _, y := range set.Nodes {
				if x.Name >= y.Name {
					continue
				}
				pairs++
				xa, _ := objects.InternalIP(&x)
				ya, _ := objects.InternalIP(&y)
				there, _, err1 := path(plans, x.Name, y.Name, ya)
				back, _, err2 := path(plans, y.Name, x.Name, xa)
				if err1 != nil || err2 != nil {
					t.Fatalf("seed %d: %s <-> %s: %v, %v", seed, x.Name, y.Name, err1, err2)
				}
				slices.Reverse(back)
				if !slices.Equal(there, back) {
					t.Fatalf("seed %d: %s -> %s (%s) goes through %q, the way back (reversed) through %q\nset: %s",
						seed, x.Name, y.Name, ya, there, back, describeSet(set))
				}
				for _, d := range [][2]corev1.Node{{x, y}, {y, x}} {
					fa, _ := objects.InternalIP(&d[0])
					ta, _ := objects.InternalIP(&d[1])
					if ok, err := rpFilterPasses(plans, d[0].Name, d[1].Name, ta, fa); err != nil || !ok {
						t.Fatalf("seed %d: %s -> %s: strict rp_filter on %s drops it (%v): it arrives one way and would go back another\nset: %s",
							seed, d[0].Name, d[1].Name, d[1].Name, err, describeSet(set))
					}
				}
			}
		}
	}
	t.Logf("300 fleets: %d plans checked, %d node pairs walked both ways along every group member", plansChecked, pairs)
}

// TestPathsSymmetricSeeds: the seed topologies, and the case of issue 12 by
// name: on seed 000's gateway topology the member aks-2 and the flex gateway
// flex-1 reach each other on the underlay both ways.
func TestPathsSymmetricSeeds(t *testing.T) {
	for name, set := range map[string]*objects.Set{
		"seed 000 gateway": seed000Gateway(t), "seed 003": seed003(t, nil),
	} {
		plans := map[string]*NodePlan{}
		for _, n := range set.Nodes {
			p, err := Compute(set, n.Name)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			plans[n.Name] = p
		}
		for _, x := range set.Nodes {
			for _, y := range set.Nodes {
				xa, _ := objects.InternalIP(&x)
				ya, _ := objects.InternalIP(&y)
				there, _, err1 := path(plans, x.Name, y.Name, ya)
				back, _, err2 := path(plans, y.Name, x.Name, xa)
				slices.Reverse(back)
				if err1 != nil || err2 != nil || !slices.Equal(there, back) {
					t.Errorf("%s: %s -> %s through %q, back (reversed) through %q (%v, %v)", name, x.Name, y.Name, there, back, err1, err2)
				}
			}
		}
		if name != "seed 000 gateway" {
			continue
		}
		if hops, _, _ := path(plans, "flex-1", "aks-2", netip.MustParseAddr("10.0.0.5")); len(hops) != 0 {
			t.Errorf("flex-1 -> aks-2 goes through %q, want the underlay", hops)
		}
	}
}

func describeSet(s *objects.Set) string {
	var b strings.Builder
	for _, a := range s.SiteGatewayPoolAssignments {
		fmt.Fprintf(&b, "\n assignment %s sites %v pools %v routeNodeCidrs %v underlayReachesNodes %v encryption %s", a.Name, a.Spec.Sites, a.Spec.GatewayPools, a.Spec.RoutesNodeCIDRs(), a.Spec.ReachesNodesOnUnderlay(), a.Spec.EncryptionOrDefault())
	}
	for _, p := range s.SitePeerings {
		fmt.Fprintf(&b, "\n peering %s sites %v mesh %v encryption %s", p.Name, p.Spec.Sites, p.Spec.MeshesNodes(), p.Spec.EncryptionOrDefault())
	}
	for _, p := range s.GatewayPools {
		fmt.Fprintf(&b, "\n pool %s %s", p.Name, p.Spec.Type)
	}
	for _, n := range s.Nodes {
		fmt.Fprintf(&b, "\n node %s %v", n.Name, n.Labels)
	}
	return b.String()
}

// walk is path for a packet from src at node from (a pod's address, or
// invalid for the host's own traffic) to addr, which belongs to node to: the
// first lookup is from's kernel (TransitOnly routes only for a source in
// from's TunnelSources, which its policy rule sends there), and every node
// that receives it tunnelled must accept a valid src from the node that sent
// it (its peer_sources), else an error. It follows every member of every
// group (a flow hashes to any of them): members that lead different ways
// (other hops, or one tunnelled and one not) are an error too.
func walk(plans map[string]*NodePlan, from, to string, addr, src netip.Addr) (hops []string, tunnelled bool, err error) {
	transit := slices.ContainsFunc(plans[from].TunnelSources, func(p netip.Prefix) bool { return p.Contains(src) })
	branches, err := walkFrom(plans, from, to, addr, src, transit, nil)
	if err != nil {
		return nil, false, err
	}
	first := branches[0]
	for _, b := range branches[1:] {
		if b.tunnelled != first.tunnelled || !slices.Equal(b.hops, first.hops) {
			return nil, false, fmt.Errorf("the members of a group lead different ways: through %q (tunnelled %v) and through %q (tunnelled %v)",
				first.hops, first.tunnelled, b.hops, b.tunnelled)
		}
	}
	return first.hops, first.tunnelled, nil
}

// walkBranch is one way a walk ends: the groups it was tunnelled through
// and whether it reached its node through the tunnel.
type walkBranch struct {
	hops      []string
	tunnelled bool
}

// walkFrom is walk from node cur, after hops: the branches of every next
// hop of cur's route for addr.
func walkFrom(plans map[string]*NodePlan, cur, to string, addr, src netip.Addr, transit bool, hops []string) ([]walkBranch, error) {
	if len(hops) >= 8 {
		return nil, fmt.Errorf("loop: %v", hops)
	}
	p := plans[cur]
	if p == nil {
		return nil, fmt.Errorf("tunnelled to %s, which has no plan", cur)
	}
	r, ok := lookup(p, addr, transit)
	if !ok {
		return []walkBranch{{hops: hops}}, nil
	}
	var next []string
	if r.Group == nil {
		next = []string{r.Peer}
	}
	for _, h := range r.Group {
		next = append(next, h.Peer)
	}
	slices.Sort(next)
	label := strings.Join(next, ",")
	var out []walkBranch
	for _, n := range next {
		if src.IsValid() && !accepts(plans[n], cur, src) {
			return nil, fmt.Errorf("%s does not accept source %s from %s (after %q)", n, src, cur, hops)
		}
		if n == to {
			out = append(out, walkBranch{hops: hops, tunnelled: true})
			continue
		}
		b, err := walkFrom(plans, n, to, addr, src, true, append(slices.Clip(hops), label))
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// accepts reports whether p's node decapsulates src from the peer named from.
func accepts(p *NodePlan, from string, src netip.Addr) bool {
	if p == nil {
		return false
	}
	for _, pr := range p.Peers {
		if pr.Name == from {
			return slices.ContainsFunc(pr.AllowedSources, func(s netip.Prefix) bool { return s.Contains(src) })
		}
	}
	return false
}

// TestPodNodePathsSymmetric: for random fleets, every pod (the first host of
// its node's podCIDR but for the tunnel address) and every other node's
// underlay address reach each other the same way both ways: the pod's
// request takes the same tunnel hops as the node's reply (reversed), or both
// stay on the underlay; every hop accepts the source it carries; and strict
// rp_filter passes at both ends (a packet arrives tunnelled exactly where the
// receiver's route back to its source is the tunnel).
func TestPodNodePathsSymmetric(t *testing.T) {
	plansChecked, pairs := 0, 0
	for seed := range uint64(300) {
		set, plans := randomPlans(t, seed, 13)
		plansChecked += len(plans)
		for _, x := range set.Nodes {
			px := plans[x.Name]
			if len(px.PodCIDRs) == 0 {
				continue
			}
			pod := px.PodCIDRs[0].Addr().Next().Next() // .2: .1 is the tunnel address
			for _, y := range set.Nodes {
				if x.Name == y.Name {
					continue
				}
				pairs++
				ya, _ := objects.InternalIP(&y)
				there, in, err1 := walk(plans, x.Name, y.Name, ya, pod)
				back, out, err2 := walk(plans, y.Name, x.Name, pod, ya)
				if err1 != nil || err2 != nil {
					t.Fatalf("seed %d: pod %s of %s <-> %s %s: %v, %v\nset: %s", seed, pod, x.Name, y.Name, ya, err1, err2, describeSet(set))
				}
				slices.Reverse(back)
				if in != out || !slices.Equal(there, back) {
					t.Fatalf("seed %d: pod %s of %s -> %s %s: tunnelled %v through %q, the reply tunnelled %v through %q (reversed)\nset: %s",
						seed, pod, x.Name, y.Name, ya, in, there, out, back, describeSet(set))
				}
				_, yBack := lookup(plans[y.Name], pod, false)
				_, xBack := lookup(px, ya, true)
				if yBack != in || xBack != out {
					t.Fatalf("seed %d: pod %s of %s <-> %s %s: strict rp_filter drops it (request tunnelled %v, %s routes the pod into the tunnel %v; reply tunnelled %v, %s routes %s into the tunnel %v)\nset: %s",
						seed, pod, x.Name, y.Name, ya, in, y.Name, yBack, out, x.Name, ya, xBack, describeSet(set))
				}
			}
		}
	}
	t.Logf("300 fleets: %d plans checked, %d pods and node addresses walked both ways along every group member", plansChecked, pairs)
}
