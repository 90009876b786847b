package plan

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

func site(name, nodeCidrs, blocks, extra string) string {
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: %s}
spec:
  nodeCidrs: [%s]
  podCidrAssignments:
    - cidrBlocks: [%s]
%s`, name, nodeCidrs, blocks, extra)
}

func peering(name, sites, extra string) string {
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: SitePeering
metadata: {name: %s}
spec:
  sites: [%s]
%s`, name, sites, extra)
}

func node(name, ip, podCIDRs string) string {
	pods := ""
	if podCIDRs != "" {
		pods = fmt.Sprintf("spec:\n  podCIDRs: [%s]\n", podCIDRs)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Node
metadata: {name: %s}
%sstatus:
  addresses:
    - {type: InternalIP, address: "%s"}
`, name, pods, ip)
}

func load(t *testing.T, docs ...string) *objects.Set {
	t.Helper()
	set, _, err := objects.Load(map[string][]byte{"objects.yaml": []byte(strings.Join(docs, "---\n"))})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// summary renders a plan one fact per line, so expectations read like the
// plan itself.
func summary(p *NodePlan) []string {
	lines := []string{fmt.Sprintf("node %s site %s underlay %s pods %v tunnel %v mtu %d",
		p.Node, p.Site, p.Underlay, p.PodCIDRs, p.TunnelAddr, p.TunnelMTU)}
	for _, pr := range p.Peers {
		lines = append(lines, fmt.Sprintf("peer %s %s %s %v", pr.Name, pr.Site, pr.Underlay, pr.AllowedSources))
	}
	for _, r := range p.Routes {
		lines = append(lines, fmt.Sprintf("route %s -> %s %s (%s)", r.Prefix, r.Peer, r.Via, r.Origin))
	}
	for _, c := range p.Corrections {
		lines = append(lines, fmt.Sprintf("correction %s - %s = %v (%s)", c.Removed, c.Endpoint, c.Kept, c.Origin))
	}
	for _, w := range p.Warnings {
		lines = append(lines, "warning "+w)
	}
	return lines
}

var twoSites = []string{
	site("a", "10.1.0.0/24", "10.10.0.0/16", "  tunnelMTU: 1400\n"),
	site("b", "10.2.0.0/24", "10.20.0.0/16, fd00:20::/48", ""),
	peering("a-b", "a, b", ""),
	node("b2", "10.2.0.2", `10.20.2.0/24, "fd00:20:2::/64"`),
	node("a2", "10.1.0.2", "10.10.2.0/24"),
	node("b1", "10.2.0.1", "10.20.1.0/24"),
	node("a1", "10.1.0.1", "10.10.1.0/24"),
}

var threeSites = []string{
	site("a", "10.1.0.0/24", "10.10.0.0/16", ""),
	site("b", "10.2.0.0/24", "10.20.0.0/16", ""),
	site("c", "10.3.0.0/24", "10.30.0.0/16", ""),
	peering("a-b", "a, b", ""),
	peering("b-c", "b, c", "  meshNodes: true\n  tunnelProtocol: GENEVE\n"),
	peering("a-c", "a, c", "  meshNodes: false\n"),
	node("a1", "10.1.0.1", "10.10.1.0/24"),
	node("b1", "10.2.0.1", "10.20.1.0/24"),
	node("c1", "10.3.0.1", "10.30.1.0/24"),
}

// endpointInPods has site b's pod block covering site a's nodes, as in seed
// 000's gateway report: b1's podCIDR holds a1's and a2's underlay addresses.
var endpointInPods = []string{
	site("a", "10.1.0.0/24", "10.10.0.0/16", ""),
	site("b", "10.2.0.0/24", "10.1.0.0/16", ""),
	peering("a-b", "a, b", ""),
	node("a1", "10.1.0.1", "10.10.1.0/24"),
	node("a2", "10.1.0.100", "10.10.2.0/24"),
	node("b1", "10.2.0.1", "10.1.0.0/25"),
}

func TestCompute(t *testing.T) {
	seed000, _, err := objects.LoadDir("../objects/testdata/seed000")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		set  *objects.Set
		node string
		want []string
	}{
		{
			name: "two sites, own site and peered site",
			set:  load(t, twoSites...),
			node: "a1",
			want: []string{
				"node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 mtu 1400",
				"peer a2 a 10.1.0.2 [10.10.2.0/24]",
				"peer b1 b 10.2.0.1 [10.20.1.0/24]",
				"peer b2 b 10.2.0.2 [10.20.2.0/24 fd00:20:2::/64]",
				`route 10.10.2.0/24 -> a2 10.1.0.2 (Node "a2" spec.podCIDRs[0])`,
				`route 10.20.1.0/24 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.20.2.0/24 -> b2 10.2.0.2 (Node "b2" spec.podCIDRs[0])`,
				`route fd00:20:2::/64 -> b2 10.2.0.2 (Node "b2" spec.podCIDRs[1])`,
			},
		},
		{
			name: "two sites, dual-stack node",
			set:  load(t, twoSites...),
			node: "b2",
			want: []string{
				"node b2 site b underlay 10.2.0.2 pods [10.20.2.0/24 fd00:20:2::/64] tunnel 10.20.2.1 mtu 0",
				"peer a1 a 10.1.0.1 [10.10.1.0/24]",
				"peer a2 a 10.1.0.2 [10.10.2.0/24]",
				"peer b1 b 10.2.0.1 [10.20.1.0/24]",
				`route 10.10.1.0/24 -> a1 10.1.0.1 (Node "a1" spec.podCIDRs[0])`,
				`route 10.10.2.0/24 -> a2 10.1.0.2 (Node "a2" spec.podCIDRs[0])`,
				`route 10.20.1.0/24 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "three sites, a not meshed with c",
			set:  load(t, threeSites...),
			node: "a1",
			want: []string{
				"node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 mtu 0",
				"peer b1 b 10.2.0.1 [10.20.1.0/24]",
				`route 10.20.1.0/24 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`warning SitePeering "a-c" has meshNodes false: gateway mode is not supported yet, so its sites give no peers`,
			},
		},
		{
			name: "three sites, b in the middle",
			set:  load(t, threeSites...),
			node: "b1",
			want: []string{
				"node b1 site b underlay 10.2.0.1 pods [10.20.1.0/24] tunnel 10.20.1.1 mtu 0",
				"peer a1 a 10.1.0.1 [10.10.1.0/24]",
				"peer c1 c 10.3.0.1 [10.30.1.0/24]",
				`route 10.10.1.0/24 -> a1 10.1.0.1 (Node "a1" spec.podCIDRs[0])`,
				`route 10.30.1.0/24 -> c1 10.3.0.1 (Node "c1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "seed 000, flex node",
			set:  seed000,
			node: "flex-1",
			want: []string{
				"node flex-1 site flex-site underlay 192.168.10.10 pods [192.168.20.0/25] tunnel 192.168.20.1 mtu 0",
				"peer aks-nodepool1-0 cluster 10.0.0.4 []",
				"peer aks-nodepool1-1 cluster 10.0.0.5 []",
				`warning peer Node "aks-nodepool1-0" has no podCIDR yet: no routes to it`,
				`warning peer Node "aks-nodepool1-1" has no podCIDR yet: no routes to it`,
			},
		},
		{
			name: "seed 000, cluster node",
			set:  seed000,
			node: "aks-nodepool1-0",
			want: []string{
				"node aks-nodepool1-0 site cluster underlay 10.0.0.4 pods [] tunnel invalid IP mtu 0",
				"peer aks-nodepool1-1 cluster 10.0.0.5 []",
				"peer flex-1 flex-site 192.168.10.10 [192.168.20.0/25]",
				`route 192.168.20.0/25 -> flex-1 192.168.10.10 (Node "flex-1" spec.podCIDRs[0])`,
				`warning Node "aks-nodepool1-0" has no podCIDR yet: it has no tunnel address, and peers have no route back to its pods`,
				`warning peer Node "aks-nodepool1-1" has no podCIDR yet: no routes to it`,
			},
		},
		{
			name: "peer's podCIDR holds this node's and another peer's underlay",
			set:  load(t, endpointInPods...),
			node: "a1",
			want: []string{
				"node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 mtu 0",
				"peer a2 a 10.1.0.100 [10.10.2.0/24]",
				"peer b1 b 10.2.0.1 [10.1.0.0/25]",
				`route 10.1.0.0/32 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.2/31 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.4/30 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.8/29 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.16/28 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.32/27 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.64/27 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.96/30 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.101/32 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.102/31 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.104/29 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.112/28 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.10.2.0/24 -> a2 10.1.0.100 (Node "a2" spec.podCIDRs[0])`,
				`correction 10.1.0.0/25 - 10.1.0.1 = [10.1.0.0/32 10.1.0.2/31 10.1.0.4/30 10.1.0.8/29 10.1.0.16/28 10.1.0.32/27 10.1.0.64/27 10.1.0.96/30 10.1.0.101/32 10.1.0.102/31 10.1.0.104/29 10.1.0.112/28] (Node "b1" spec.podCIDRs[0])`,
				`correction 10.1.0.0/25 - 10.1.0.100 = [10.1.0.0/32 10.1.0.2/31 10.1.0.4/30 10.1.0.8/29 10.1.0.16/28 10.1.0.32/27 10.1.0.64/27 10.1.0.96/30 10.1.0.101/32 10.1.0.102/31 10.1.0.104/29 10.1.0.112/28] (Node "b1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "the node whose pod block holds the endpoints needs no correction",
			set:  load(t, endpointInPods...),
			node: "b1",
			want: []string{
				"node b1 site b underlay 10.2.0.1 pods [10.1.0.0/25] tunnel 10.1.0.1 mtu 0",
				"peer a1 a 10.1.0.1 [10.10.1.0/24]",
				"peer a2 a 10.1.0.100 [10.10.2.0/24]",
				`route 10.10.1.0/24 -> a1 10.1.0.1 (Node "a1" spec.podCIDRs[0])`,
				`route 10.10.2.0/24 -> a2 10.1.0.100 (Node "a2" spec.podCIDRs[0])`,
			},
		},
		{
			name: "node without podCIDR",
			set:  load(t, append(twoSites, node("a3", "10.1.0.3", ""))...),
			node: "a3",
			want: []string{
				"node a3 site a underlay 10.1.0.3 pods [] tunnel invalid IP mtu 1400",
				"peer a1 a 10.1.0.1 [10.10.1.0/24]",
				"peer a2 a 10.1.0.2 [10.10.2.0/24]",
				"peer b1 b 10.2.0.1 [10.20.1.0/24]",
				"peer b2 b 10.2.0.2 [10.20.2.0/24 fd00:20:2::/64]",
				`route 10.10.1.0/24 -> a1 10.1.0.1 (Node "a1" spec.podCIDRs[0])`,
				`route 10.10.2.0/24 -> a2 10.1.0.2 (Node "a2" spec.podCIDRs[0])`,
				`route 10.20.1.0/24 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.20.2.0/24 -> b2 10.2.0.2 (Node "b2" spec.podCIDRs[0])`,
				`route fd00:20:2::/64 -> b2 10.2.0.2 (Node "b2" spec.podCIDRs[1])`,
				`warning Node "a3" has no podCIDR yet: it has no tunnel address, and peers have no route back to its pods`,
			},
		},
		{
			name: "a lone node has no peers",
			set:  load(t, site("a", "10.1.0.0/24", "10.10.0.0/16", ""), node("a1", "10.1.0.1", "10.10.1.0/31")),
			node: "a1",
			want: []string{"node a1 site a underlay 10.1.0.1 pods [10.10.1.0/31] tunnel 10.10.1.1 mtu 0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compute(tt.set, tt.node)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, summary(p)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			for _, r := range p.Routes {
				for _, e := range append([]netip.Addr{p.Underlay}, peerUnderlays(p)...) {
					if r.Prefix.Contains(e) {
						t.Errorf("route %s holds underlay address %s", r.Prefix, e)
					}
				}
			}
		})
	}
}

func peerUnderlays(p *NodePlan) []netip.Addr {
	var out []netip.Addr
	for _, pr := range p.Peers {
		out = append(out, pr.Underlay)
	}
	return out
}

func TestComputeUnknownNode(t *testing.T) {
	_, err := Compute(load(t, twoSites...), "zz")
	if err == nil || !strings.Contains(err.Error(), `"zz"`) {
		t.Errorf("Compute(zz) error = %v, want one naming zz", err)
	}
}

// TestComputeDeterministic loads the same objects spread over files in
// another order and expects the same plan.
func TestComputeDeterministic(t *testing.T) {
	files := map[string][]byte{}
	for i, d := range twoSites {
		files[fmt.Sprintf("%02d.yaml", len(twoSites)-i)] = []byte(d)
	}
	other, _, err := objects.Load(files)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a1", "a2", "b1", "b2"} {
		want, err := Compute(load(t, twoSites...), n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Compute(other, n)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Equal(want) {
			t.Errorf("node %s: plan depends on file order:\n%s", n, cmp.Diff(summary(want), summary(got)))
		}
	}
}

func TestCloneEqual(t *testing.T) {
	p, err := Compute(load(t, endpointInPods...), "a1")
	if err != nil {
		t.Fatal(err)
	}
	c := p.Clone()
	if !c.Equal(p) {
		t.Fatalf("clone differs: %s", cmp.Diff(summary(p), summary(c)))
	}
	mutations := []func(*NodePlan){
		func(q *NodePlan) { q.Peers[0].AllowedSources[0] = netip.MustParsePrefix("10.99.0.0/16") },
		func(q *NodePlan) { q.Corrections[0].Kept[0] = netip.MustParsePrefix("10.99.0.0/16") },
		func(q *NodePlan) { q.Routes[0].Via = netip.MustParseAddr("10.99.0.1") },
		func(q *NodePlan) { q.PodCIDRs[0] = netip.MustParsePrefix("10.99.0.0/16") },
		func(q *NodePlan) { q.Warnings = append(q.Warnings, "x") },
		func(q *NodePlan) { q.TunnelMTU = 1 },
	}
	orig := p.Clone()
	for i, mutate := range mutations {
		c := p.Clone()
		mutate(c)
		if c.Equal(p) || p.Equal(c) {
			t.Errorf("mutation %d: still equal", i)
		}
		if !p.Equal(orig) {
			t.Errorf("mutation %d changed the original", i)
		}
	}
	var nilPlan *NodePlan
	if !nilPlan.Equal(nil) || nilPlan.Equal(p) || nilPlan.Clone() != nil {
		t.Errorf("nil plan handling wrong")
	}
}
