package plan

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
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
// plan itself. Empty sections give no line.
// routeFlagsSummary is " transit only", " not for pods", " via fabric" as
// r has them.
func routeFlagsSummary(r Route) string {
	out := ""
	if r.TransitOnly {
		out += " transit only"
	}
	if r.NotForPods {
		out += " not for pods"
	}
	if r.ViaFabric {
		out += " via fabric"
	}
	return out
}

func summary(p *NodePlan) []string {
	lines := []string{fmt.Sprintf("node %s site %s underlay %s pods %v tunnel %v (%s) mtu %d",
		p.Node, p.Site, p.Underlay, p.PodCIDRs, p.TunnelAddr, p.TunnelAddrOrigin, p.TunnelMTU)}
	for _, pr := range p.Peers {
		lines = append(lines, fmt.Sprintf("peer %s %s %s %v %v", pr.Name, pr.Site, pr.Underlay, pr.TunnelAddr, pr.AllowedSources))
	}
	for _, r := range p.Routes {
		if r.Underlay {
			lines = append(lines, fmt.Sprintf("route %s -> underlay (%s)", r.Prefix, r.Origin))
			continue
		}
		if r.Group != nil {
			var g []string
			for _, h := range r.Group {
				g = append(g, h.Peer+" "+h.Via.String())
			}
			to := ""
			if r.Site != "" {
				to = " to " + r.Site
			}
			lines = append(lines, fmt.Sprintf("route %s -> group%s [%s]%s (%s)", r.Prefix, to, strings.Join(g, ", "), routeFlagsSummary(r), r.Origin))
			continue
		}
		lines = append(lines, fmt.Sprintf("route %s -> %s %s%s (%s)", r.Prefix, r.Peer, r.Via, routeFlagsSummary(r), r.Origin))
	}
	if len(p.TunnelSources) > 0 {
		lines = append(lines, fmt.Sprintf("tunnel sources %v", p.TunnelSources))
	}
	if len(p.FabricEgress) > 0 {
		lines = append(lines, fmt.Sprintf("fabric egress %v", p.FabricEgress))
	}
	if len(p.LocalPrefixes) > 0 {
		lines = append(lines, fmt.Sprintf("local %v", p.LocalPrefixes))
	}
	if len(p.FabricPrefixes) > 0 {
		lines = append(lines, fmt.Sprintf("fabric %v", p.FabricPrefixes))
	}
	if p.SNAT.Addr.IsValid() {
		var ex []string
		for _, e := range p.SNAT.Exempt {
			ex = append(ex, fmt.Sprintf("%s (%s)", e.Prefix, e.Origin))
		}
		lines = append(lines, fmt.Sprintf("snat %s except %s", p.SNAT.Addr, strings.Join(ex, ", ")))
	} else {
		lines = append(lines, "snat off: "+p.SNAT.Reason)
	}
	for _, c := range p.Corrections {
		cut := c.Endpoint.String()
		if c.Local.IsValid() {
			cut = "local " + c.Local.String()
		}
		lines = append(lines, fmt.Sprintf("correction %s - %s = %v (%s)", c.Removed, cut, c.Kept, c.Origin))
	}
	for _, w := range p.Warnings {
		lines = append(lines, "warning "+w)
	}
	return lines
}

var twoSites = []string{
	site("a", "10.1.0.0/24", "10.10.0.0/16", "  tunnelMTU: 1400\n"),
	site("b", "10.2.0.0/24", "10.20.0.0/16, fd00:20::/32", ""),
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
	node("a1", "10.1.0.10", "10.10.1.0/24"),
	node("a2", "10.1.0.100", "10.10.2.0/24"),
	node("b1", "10.2.0.1", "10.1.0.0/25"),
}

// seedFiles returns the seed 000 fixture, each file passed through edit.
func seedFiles(t *testing.T, edit func(name, data string) string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for _, name := range []string{"sites.yaml", "nodes.yaml"} {
		data, err := os.ReadFile(filepath.Join("../objects/testdata/seed000", name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = []byte(edit(name, string(data)))
	}
	return files
}

func loadFiles(t *testing.T, files map[string][]byte) *objects.Set {
	t.Helper()
	set, _, err := objects.Load(files)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// seedSNAT is seed 000 with returnPath SNAT on the cluster Site.
func seedSNAT(t *testing.T) *objects.Set {
	return loadFiles(t, seedFiles(t, func(name, data string) string {
		return strings.Replace(data, "  manageCniPlugin: false\n", "  manageCniPlugin: false\n  returnPath: SNAT\n", 1)
	}))
}

// seedExtraNodes is seed 000 plus nodes.
func seedExtraNodes(t *testing.T, nodes ...string) *objects.Set {
	files := seedFiles(t, func(_, data string) string { return data })
	files["more.yaml"] = []byte(strings.Join(nodes, "---\n"))
	return loadFiles(t, files)
}

func annotated(name, ip, podCIDRs, tunnel string) string {
	return strings.Replace(node(name, ip, podCIDRs), "metadata: {name: "+name+"}",
		fmt.Sprintf("metadata:\n  name: %s\n  annotations: {isthmus.dev/tunnel-ipv4: %q}", name, tunnel), 1)
}

const (
	aks0Tunnel = `Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"]`
	aks1Tunnel = `Node "aks-nodepool1-1" metadata.annotations["isthmus.dev/tunnel-ipv4"]`
	clusterBlk = `Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]`
	flexPods   = `Node "flex-1" spec.podCIDRs[0]`
)

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
				`node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 (Node "a1" spec.podCIDRs[0]) mtu 1400`,
				"peer a2 a 10.1.0.2 10.10.2.1 [10.1.0.2/32 10.10.2.0/24]",
				"peer b1 b 10.2.0.1 10.20.1.1 [10.2.0.1/32 10.20.1.0/24]",
				"peer b2 b 10.2.0.2 10.20.2.1 [10.2.0.2/32 10.20.2.0/24 fd00:20:2::/64]",
				`route 10.1.0.2/32 -> a2 10.1.0.2 transit only (Node "a2" status.addresses[InternalIP])`,
				`route 10.2.0.1/32 -> b1 10.2.0.1 transit only (Node "b1" status.addresses[InternalIP])`,
				`route 10.2.0.2/32 -> b2 10.2.0.2 transit only (Node "b2" status.addresses[InternalIP])`,
				`route 10.10.2.0/24 -> a2 10.1.0.2 (Node "a2" spec.podCIDRs[0])`,
				`route 10.20.1.0/24 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.20.2.0/24 -> b2 10.2.0.2 (Node "b2" spec.podCIDRs[0])`,
				`route fd00:20:2::/64 -> b2 10.2.0.2 (Node "b2" spec.podCIDRs[1])`,
				"tunnel sources [10.10.1.0/24]",
				`snat 10.10.1.1 except 10.10.1.0/24 (Node "a1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "two sites, dual-stack node",
			set:  load(t, twoSites...),
			node: "b2",
			want: []string{
				`node b2 site b underlay 10.2.0.2 pods [10.20.2.0/24 fd00:20:2::/64] tunnel 10.20.2.1 (Node "b2" spec.podCIDRs[0]) mtu 0`,
				"peer a1 a 10.1.0.1 10.10.1.1 [10.1.0.1/32 10.10.1.0/24]",
				"peer a2 a 10.1.0.2 10.10.2.1 [10.1.0.2/32 10.10.2.0/24]",
				"peer b1 b 10.2.0.1 10.20.1.1 [10.2.0.1/32 10.20.1.0/24]",
				`route 10.1.0.1/32 -> a1 10.1.0.1 transit only (Node "a1" status.addresses[InternalIP])`,
				`route 10.1.0.2/32 -> a2 10.1.0.2 transit only (Node "a2" status.addresses[InternalIP])`,
				`route 10.2.0.1/32 -> b1 10.2.0.1 transit only (Node "b1" status.addresses[InternalIP])`,
				`route 10.10.1.0/24 -> a1 10.1.0.1 (Node "a1" spec.podCIDRs[0])`,
				`route 10.10.2.0/24 -> a2 10.1.0.2 (Node "a2" spec.podCIDRs[0])`,
				`route 10.20.1.0/24 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				"tunnel sources [10.20.2.0/24]",
				`snat 10.20.2.1 except 10.20.2.0/24 (Node "b2" spec.podCIDRs[0])`,
			},
		},
		{
			name: "three sites, a not meshed with c",
			set:  load(t, threeSites...),
			node: "a1",
			want: []string{
				`node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 (Node "a1" spec.podCIDRs[0]) mtu 0`,
				"peer b1 b 10.2.0.1 10.20.1.1 [10.2.0.1/32 10.20.1.0/24]",
				`route 10.2.0.1/32 -> b1 10.2.0.1 transit only (Node "b1" status.addresses[InternalIP])`,
				`route 10.20.1.0/24 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				"tunnel sources [10.10.1.0/24]",
				`snat 10.10.1.1 except 10.10.1.0/24 (Node "a1" spec.podCIDRs[0])`,
				`warning SitePeering "a-c" has meshNodes false, and no SiteGatewayPoolAssignment joins Sites "a" and "c": they are not connected`,
			},
		},
		{
			name: "three sites, b in the middle",
			set:  load(t, threeSites...),
			node: "b1",
			want: []string{
				`node b1 site b underlay 10.2.0.1 pods [10.20.1.0/24] tunnel 10.20.1.1 (Node "b1" spec.podCIDRs[0]) mtu 0`,
				"peer a1 a 10.1.0.1 10.10.1.1 [10.1.0.1/32 10.10.1.0/24]",
				"peer c1 c 10.3.0.1 10.30.1.1 [10.3.0.1/32 10.30.1.0/24]",
				`route 10.1.0.1/32 -> a1 10.1.0.1 transit only (Node "a1" status.addresses[InternalIP])`,
				`route 10.3.0.1/32 -> c1 10.3.0.1 transit only (Node "c1" status.addresses[InternalIP])`,
				`route 10.10.1.0/24 -> a1 10.1.0.1 (Node "a1" spec.podCIDRs[0])`,
				`route 10.30.1.0/24 -> c1 10.3.0.1 (Node "c1" spec.podCIDRs[0])`,
				"tunnel sources [10.20.1.0/24]",
				`snat 10.20.1.1 except 10.20.1.0/24 (Node "b1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "seed 000, flex node: the cluster's pod block goes to a group of its nodes",
			set:  seed000,
			node: "flex-1",
			want: []string{
				`node flex-1 site flex-site underlay 192.168.10.10 pods [192.168.20.0/25] tunnel 192.168.20.1 (Node "flex-1" spec.podCIDRs[0]) mtu 0`,
				"peer aks-nodepool1-0 cluster 10.0.0.4 100.64.0.4 [10.0.0.4/32 10.0.2.0/23 100.64.0.4/32]",
				"peer aks-nodepool1-1 cluster 10.0.0.5 100.64.0.5 [10.0.0.5/32 10.0.2.0/23 100.64.0.5/32]",
				`route 10.0.0.4/32 -> aks-nodepool1-0 10.0.0.4 transit only (Node "aks-nodepool1-0" status.addresses[InternalIP])`,
				`route 10.0.0.5/32 -> aks-nodepool1-1 10.0.0.5 transit only (Node "aks-nodepool1-1" status.addresses[InternalIP])`,
				`route 10.0.2.0/23 -> group [aks-nodepool1-0 10.0.0.4, aks-nodepool1-1 10.0.0.5] (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0])`,
				`route 100.64.0.4/32 -> aks-nodepool1-0 10.0.0.4 (Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 100.64.0.5/32 -> aks-nodepool1-1 10.0.0.5 (Node "aks-nodepool1-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				"tunnel sources [192.168.20.0/25]",
				`snat 192.168.20.1 except 192.168.20.0/25 (Node "flex-1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "seed 000, cluster node: its own blocks stay local, declared sources are kept",
			set:  seed000,
			node: "aks-nodepool1-0",
			want: []string{
				`node aks-nodepool1-0 site cluster underlay 10.0.0.4 pods [] tunnel 100.64.0.4 (Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"]) mtu 0`,
				"peer aks-nodepool1-1 cluster 10.0.0.5 100.64.0.5 [10.0.2.0/23 100.64.0.5/32]",
				"peer flex-1 flex-site 192.168.10.10 192.168.20.1 [192.168.10.10/32 192.168.20.0/25]",
				`route 100.64.0.5/32 -> aks-nodepool1-1 10.0.0.5 (Node "aks-nodepool1-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 192.168.10.10/32 -> flex-1 192.168.10.10 transit only (Node "flex-1" status.addresses[InternalIP])`,
				`route 192.168.20.0/25 -> flex-1 192.168.10.10 (Node "flex-1" spec.podCIDRs[0])`,
				"tunnel sources [10.0.2.0/23]",
				"local [10.0.0.0/16 10.0.2.0/23]",
				"fabric [10.0.2.0/23]",
				`snat 100.64.0.4 except 10.0.2.0/23 (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]), 100.64.0.4/32 (Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
			},
		},
		{
			name: "seed 000 with returnPath SNAT, flex node: no group route, tunnel addresses only",
			set:  seedSNAT(t),
			node: "flex-1",
			want: []string{
				`node flex-1 site flex-site underlay 192.168.10.10 pods [192.168.20.0/25] tunnel 192.168.20.1 (Node "flex-1" spec.podCIDRs[0]) mtu 0`,
				"peer aks-nodepool1-0 cluster 10.0.0.4 100.64.0.4 [10.0.0.4/32 100.64.0.4/32]",
				"peer aks-nodepool1-1 cluster 10.0.0.5 100.64.0.5 [10.0.0.5/32 100.64.0.5/32]",
				`route 10.0.0.4/32 -> aks-nodepool1-0 10.0.0.4 transit only (Node "aks-nodepool1-0" status.addresses[InternalIP])`,
				`route 10.0.0.5/32 -> aks-nodepool1-1 10.0.0.5 transit only (Node "aks-nodepool1-1" status.addresses[InternalIP])`,
				`route 100.64.0.4/32 -> aks-nodepool1-0 10.0.0.4 (Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 100.64.0.5/32 -> aks-nodepool1-1 10.0.0.5 (Node "aks-nodepool1-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				"tunnel sources [192.168.20.0/25]",
				`snat 192.168.20.1 except 192.168.20.0/25 (Node "flex-1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "seed 000 with returnPath SNAT, cluster node: every pod source translated",
			set:  seedSNAT(t),
			node: "aks-nodepool1-0",
			want: []string{
				`node aks-nodepool1-0 site cluster underlay 10.0.0.4 pods [] tunnel 100.64.0.4 (` + aks0Tunnel + `) mtu 0`,
				"peer aks-nodepool1-1 cluster 10.0.0.5 100.64.0.5 [100.64.0.5/32]",
				"peer flex-1 flex-site 192.168.10.10 192.168.20.1 [192.168.20.0/25]",
				`route 100.64.0.5/32 -> aks-nodepool1-1 10.0.0.5 (` + aks1Tunnel + `)`,
				`route 192.168.20.0/25 -> flex-1 192.168.10.10 (` + flexPods + `)`,
				"local [10.0.0.0/16 10.0.2.0/23]",
				`snat 100.64.0.4 except 100.64.0.4/32 (` + aks0Tunnel + `)`,
			},
		},
		{
			name: "seed 000, a cluster node without tunnel address is no peer",
			set:  seedExtraNodes(t, node("aks-nodepool1-2", "10.0.0.6", "")),
			node: "flex-1",
			want: []string{
				`node flex-1 site flex-site underlay 192.168.10.10 pods [192.168.20.0/25] tunnel 192.168.20.1 (Node "flex-1" spec.podCIDRs[0]) mtu 0`,
				"peer aks-nodepool1-0 cluster 10.0.0.4 100.64.0.4 [10.0.0.4/32 10.0.2.0/23 100.64.0.4/32]",
				"peer aks-nodepool1-1 cluster 10.0.0.5 100.64.0.5 [10.0.0.5/32 10.0.2.0/23 100.64.0.5/32]",
				`route 10.0.0.4/32 -> aks-nodepool1-0 10.0.0.4 transit only (Node "aks-nodepool1-0" status.addresses[InternalIP])`,
				`route 10.0.0.5/32 -> aks-nodepool1-1 10.0.0.5 transit only (Node "aks-nodepool1-1" status.addresses[InternalIP])`,
				`route 10.0.2.0/23 -> group [aks-nodepool1-0 10.0.0.4, aks-nodepool1-1 10.0.0.5] (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0])`,
				`route 100.64.0.4/32 -> aks-nodepool1-0 10.0.0.4 (Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 100.64.0.5/32 -> aks-nodepool1-1 10.0.0.5 (Node "aks-nodepool1-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				"tunnel sources [192.168.20.0/25]",
				`snat 192.168.20.1 except 192.168.20.0/25 (Node "flex-1" spec.podCIDRs[0])`,
				`warning peer Node "aks-nodepool1-2" of Site "cluster" has no tunnel address (no IPv4 podCIDR, no annotation isthmus.dev/tunnel-ipv4): it is not a peer until it has one`,
			},
		},
		{
			// The seed's canary got spec.podCIDR 10.0.12.0/24 from the cluster,
			// outside the pod subnet: it is routed to the node from the flex
			// site, and its first address is the node's tunnel address.
			name: "seed 000, stray podCIDR on a cluster node, seen from the flex node",
			set:  seedExtraNodes(t, node("aks-canary", "10.0.0.7", "10.0.12.0/24")),
			node: "flex-1",
			want: []string{
				`node flex-1 site flex-site underlay 192.168.10.10 pods [192.168.20.0/25] tunnel 192.168.20.1 (Node "flex-1" spec.podCIDRs[0]) mtu 0`,
				"peer aks-canary cluster 10.0.0.7 10.0.12.1 [10.0.0.7/32 10.0.2.0/23 10.0.12.0/24]",
				"peer aks-nodepool1-0 cluster 10.0.0.4 100.64.0.4 [10.0.0.4/32 10.0.2.0/23 100.64.0.4/32]",
				"peer aks-nodepool1-1 cluster 10.0.0.5 100.64.0.5 [10.0.0.5/32 10.0.2.0/23 100.64.0.5/32]",
				`route 10.0.0.4/32 -> aks-nodepool1-0 10.0.0.4 transit only (Node "aks-nodepool1-0" status.addresses[InternalIP])`,
				`route 10.0.0.5/32 -> aks-nodepool1-1 10.0.0.5 transit only (Node "aks-nodepool1-1" status.addresses[InternalIP])`,
				`route 10.0.0.7/32 -> aks-canary 10.0.0.7 transit only (Node "aks-canary" status.addresses[InternalIP])`,
				`route 10.0.2.0/23 -> group [aks-canary 10.0.0.7, aks-nodepool1-0 10.0.0.4, aks-nodepool1-1 10.0.0.5] (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0])`,
				`route 10.0.12.0/24 -> aks-canary 10.0.0.7 (Node "aks-canary" spec.podCIDRs[0])`,
				`route 100.64.0.4/32 -> aks-nodepool1-0 10.0.0.4 (Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 100.64.0.5/32 -> aks-nodepool1-1 10.0.0.5 (Node "aks-nodepool1-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				"tunnel sources [192.168.20.0/25]",
				`snat 192.168.20.1 except 192.168.20.0/25 (Node "flex-1" spec.podCIDRs[0])`,
				`warning Node "aks-canary" spec.podCIDRs[0] 10.0.12.0/24 is outside the pod blocks of Site "cluster" (spec.podCidrAssignments[].cidrBlocks [10.0.2.0/23])`,
			},
		},
		{
			name: "seed 000, stray podCIDR on the cluster node itself: localCidrs keep it off the tunnel",
			set:  seedExtraNodes(t, node("aks-canary", "10.0.0.7", "10.0.12.0/24")),
			node: "aks-nodepool1-0",
			want: []string{
				`node aks-nodepool1-0 site cluster underlay 10.0.0.4 pods [] tunnel 100.64.0.4 (Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"]) mtu 0`,
				"peer aks-canary cluster 10.0.0.7 10.0.12.1 [10.0.2.0/23 10.0.12.0/24]",
				"peer aks-nodepool1-1 cluster 10.0.0.5 100.64.0.5 [10.0.2.0/23 100.64.0.5/32]",
				"peer flex-1 flex-site 192.168.10.10 192.168.20.1 [192.168.10.10/32 192.168.20.0/25]",
				`route 100.64.0.5/32 -> aks-nodepool1-1 10.0.0.5 (Node "aks-nodepool1-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 192.168.10.10/32 -> flex-1 192.168.10.10 transit only (Node "flex-1" status.addresses[InternalIP])`,
				`route 192.168.20.0/25 -> flex-1 192.168.10.10 (Node "flex-1" spec.podCIDRs[0])`,
				"tunnel sources [10.0.2.0/23]",
				"local [10.0.0.0/16 10.0.2.0/23]",
				"fabric [10.0.2.0/23]",
				`snat 100.64.0.4 except 10.0.2.0/23 (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]), 100.64.0.4/32 (Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`correction 10.0.12.0/24 - local 10.0.0.0/16 = [] (Node "aks-canary" spec.podCIDRs[0])`,
				`warning Node "aks-canary" spec.podCIDRs[0] 10.0.12.0/24 is outside the pod blocks of Site "cluster" (spec.podCidrAssignments[].cidrBlocks [10.0.2.0/23])`,
			},
		},
		{
			name: "localCidrs overlapping remote podCIDRs split them",
			set: load(t,
				site("a", "10.1.0.0/24", "10.10.0.0/16", "  localCidrs: [10.20.1.128/25, 10.20.2.0/23]\n"),
				site("b", "10.2.0.0/24", "10.20.0.0/16", ""),
				peering("a-b", "a, b", ""),
				node("a1", "10.1.0.1", "10.10.1.0/24"),
				node("b1", "10.2.0.1", "10.20.1.0/24"),
				node("b2", "10.2.0.2", "10.20.2.0/24"),
				node("b3", "10.2.0.3", "10.20.4.0/24"),
			),
			node: "a1",
			want: []string{
				`node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 (Node "a1" spec.podCIDRs[0]) mtu 0`,
				"peer b1 b 10.2.0.1 10.20.1.1 [10.2.0.1/32 10.20.1.0/24]",
				"peer b2 b 10.2.0.2 10.20.2.1 [10.2.0.2/32 10.20.2.0/24]",
				"peer b3 b 10.2.0.3 10.20.4.1 [10.2.0.3/32 10.20.4.0/24]",
				`route 10.2.0.1/32 -> b1 10.2.0.1 transit only (Node "b1" status.addresses[InternalIP])`,
				`route 10.2.0.2/32 -> b2 10.2.0.2 transit only (Node "b2" status.addresses[InternalIP])`,
				`route 10.2.0.3/32 -> b3 10.2.0.3 transit only (Node "b3" status.addresses[InternalIP])`,
				`route 10.20.1.0/25 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.20.4.0/24 -> b3 10.2.0.3 (Node "b3" spec.podCIDRs[0])`,
				"tunnel sources [10.10.1.0/24]",
				"local [10.20.1.128/25 10.20.2.0/23]",
				`snat 10.10.1.1 except 10.10.1.0/24 (Node "a1" spec.podCIDRs[0])`,
				`correction 10.20.1.0/24 - local 10.20.1.128/25 = [10.20.1.0/25] (Node "b1" spec.podCIDRs[0])`,
				`correction 10.20.2.0/24 - local 10.20.2.0/23 = [] (Node "b2" spec.podCIDRs[0])`,
			},
		},
		{
			name: "an unmanaged site without usable nodes gets no group route",
			set: load(t,
				site("a", "10.1.0.0/24", "10.10.0.0/16", ""),
				site("u", "10.2.0.0/24", "10.20.0.0/16", "  manageCniPlugin: false\n"),
				peering("a-u", "a, u", ""),
				node("a1", "10.1.0.1", "10.10.1.0/24"),
			),
			node: "a1",
			want: []string{
				`node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 (Node "a1" spec.podCIDRs[0]) mtu 0`,
				"tunnel sources [10.10.1.0/24]",
				`snat 10.10.1.1 except 10.10.1.0/24 (Node "a1" spec.podCIDRs[0])`,
				`warning Site "u" has no node with a tunnel address to deliver its pod blocks: they are not routed`,
			},
		},
		{
			name: "a managed node with only an annotation is reached at its tunnel address",
			set:  load(t, append(twoSites[:3:3], node("a1", "10.1.0.1", "10.10.1.0/24"), annotated("b1", "10.2.0.1", "", "100.64.0.21"))...),
			node: "a1",
			want: []string{
				`node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 (Node "a1" spec.podCIDRs[0]) mtu 1400`,
				"peer b1 b 10.2.0.1 100.64.0.21 [10.2.0.1/32 100.64.0.21/32]",
				`route 10.2.0.1/32 -> b1 10.2.0.1 transit only (Node "b1" status.addresses[InternalIP])`,
				`route 100.64.0.21/32 -> b1 10.2.0.1 (Node "b1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				"tunnel sources [10.10.1.0/24]",
				`snat 10.10.1.1 except 10.10.1.0/24 (Node "a1" spec.podCIDRs[0])`,
				`warning peer Node "b1" has no podCIDR yet: only its tunnel address is routed to it`,
			},
		},
		{
			name: "peer's podCIDR holds this node's and another peer's underlay",
			set:  load(t, endpointInPods...),
			node: "a1",
			want: []string{
				`node a1 site a underlay 10.1.0.10 pods [10.10.1.0/24] tunnel 10.10.1.1 (Node "a1" spec.podCIDRs[0]) mtu 0`,
				"peer a2 a 10.1.0.100 10.10.2.1 [10.1.0.100/32 10.10.2.0/24]",
				"peer b1 b 10.2.0.1 10.1.0.1 [10.1.0.0/25 10.2.0.1/32]",
				`route 10.1.0.0/29 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.8/31 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.11/32 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.12/30 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.16/28 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.32/27 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.64/27 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.96/30 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.100/32 -> a2 10.1.0.100 transit only (Node "a2" status.addresses[InternalIP])`,
				`route 10.1.0.101/32 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.102/31 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.104/29 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.1.0.112/28 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.2.0.1/32 -> b1 10.2.0.1 transit only (Node "b1" status.addresses[InternalIP])`,
				`route 10.10.2.0/24 -> a2 10.1.0.100 (Node "a2" spec.podCIDRs[0])`,
				"tunnel sources [10.10.1.0/24]",
				`snat 10.10.1.1 except 10.10.1.0/24 (Node "a1" spec.podCIDRs[0])`,
				`correction 10.1.0.0/25 - 10.1.0.10 = [10.1.0.0/29 10.1.0.8/31 10.1.0.11/32 10.1.0.12/30 10.1.0.16/28 10.1.0.32/27 10.1.0.64/27 10.1.0.96/30 10.1.0.101/32 10.1.0.102/31 10.1.0.104/29 10.1.0.112/28] (Node "b1" spec.podCIDRs[0])`,
				`correction 10.1.0.0/25 - 10.1.0.100 = [10.1.0.0/29 10.1.0.8/31 10.1.0.11/32 10.1.0.12/30 10.1.0.16/28 10.1.0.32/27 10.1.0.64/27 10.1.0.96/30 10.1.0.101/32 10.1.0.102/31 10.1.0.104/29 10.1.0.112/28] (Node "b1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "the node whose pod block holds the endpoints needs no correction",
			set:  load(t, endpointInPods...),
			node: "b1",
			want: []string{
				`node b1 site b underlay 10.2.0.1 pods [10.1.0.0/25] tunnel 10.1.0.1 (Node "b1" spec.podCIDRs[0]) mtu 0`,
				"peer a1 a 10.1.0.10 10.10.1.1 [10.1.0.10/32 10.10.1.0/24]",
				"peer a2 a 10.1.0.100 10.10.2.1 [10.1.0.100/32 10.10.2.0/24]",
				`route 10.1.0.10/32 -> a1 10.1.0.10 transit only (Node "a1" status.addresses[InternalIP])`,
				`route 10.1.0.100/32 -> a2 10.1.0.100 transit only (Node "a2" status.addresses[InternalIP])`,
				`route 10.10.1.0/24 -> a1 10.1.0.10 (Node "a1" spec.podCIDRs[0])`,
				`route 10.10.2.0/24 -> a2 10.1.0.100 (Node "a2" spec.podCIDRs[0])`,
				"tunnel sources [10.1.0.0/25]",
				`snat 10.1.0.1 except 10.1.0.0/25 (Node "b1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "node without podCIDR",
			set:  load(t, append(twoSites, node("a3", "10.1.0.3", ""))...),
			node: "a3",
			want: []string{
				"node a3 site a underlay 10.1.0.3 pods [] tunnel invalid IP () mtu 1400",
				"peer a1 a 10.1.0.1 10.10.1.1 [10.10.1.0/24]",
				"peer a2 a 10.1.0.2 10.10.2.1 [10.10.2.0/24]",
				"peer b1 b 10.2.0.1 10.20.1.1 [10.20.1.0/24]",
				"peer b2 b 10.2.0.2 10.20.2.1 [10.20.2.0/24 fd00:20:2::/64]",
				`route 10.10.1.0/24 -> a1 10.1.0.1 (Node "a1" spec.podCIDRs[0])`,
				`route 10.10.2.0/24 -> a2 10.1.0.2 (Node "a2" spec.podCIDRs[0])`,
				`route 10.20.1.0/24 -> b1 10.2.0.1 (Node "b1" spec.podCIDRs[0])`,
				`route 10.20.2.0/24 -> b2 10.2.0.2 (Node "b2" spec.podCIDRs[0])`,
				`route fd00:20:2::/64 -> b2 10.2.0.2 (Node "b2" spec.podCIDRs[1])`,
				`snat off: Node "a3" has no tunnel address to translate to (no IPv4 podCIDR, no annotation isthmus.dev/tunnel-ipv4)`,
				`warning Node "a3" has no podCIDR yet: it has no tunnel address, and peers have no route back to its pods`,
			},
		},
		{
			name: "a lone node has no peers",
			set:  load(t, site("a", "10.1.0.0/24", "10.10.0.0/16", ""), node("a1", "10.1.0.1", "10.10.1.0/31")),
			node: "a1",
			want: []string{
				`node a1 site a underlay 10.1.0.1 pods [10.10.1.0/31] tunnel 10.10.1.1 (Node "a1" spec.podCIDRs[0]) mtu 0`,
				"tunnel sources [10.10.1.0/31]",
				`snat 10.10.1.1 except 10.10.1.0/31 (Node "a1" spec.podCIDRs[0])`,
			},
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
			checkInvariants(t, p)
		})
	}
}

// checkInvariants fails when a route holds an underlay address (but for the
// TransitOnly host route of a peer's own address to that peer) or overlaps a
// LocalPrefix (but for such a route NotForPods), or a group has a member
// that is not a peer.
func checkInvariants(t *testing.T, p *NodePlan) {
	t.Helper()
	peers := map[string]netip.Addr{}
	vias := map[string]netip.Addr{}
	for _, pr := range p.Peers {
		peers[pr.Name] = pr.Underlay
		vias[pr.Name] = pr.Via()
	}
	// longest returns the longest route holding q (a prefix), as the
	// datapath's LPM lookup finds it.
	longest := func(q netip.Prefix) (Route, bool) {
		var best Route
		found := false
		for _, r := range p.Routes {
			if r.Prefix.Bits() <= q.Bits() && r.Prefix.Contains(q.Addr()) && (!found || r.Prefix.Bits() > best.Prefix.Bits()) {
				best, found = r, true
			}
		}
		return best, found
	}
	for _, e := range append([]netip.Addr{p.Underlay}, peerUnderlays(p)...) {
		// The kernel's main table never holds an endpoint, and the
		// datapath's lookup of one finds nothing, an Underlay exception, or
		// the TransitOnly host route to that very peer.
		for _, r := range p.Routes {
			if !r.TransitOnly && r.Prefix.Contains(e) {
				t.Errorf("route %s holds underlay address %s", r.Prefix, e)
			}
		}
		if r, ok := longest(HostPrefix(e)); ok && !r.Underlay && !(r.TransitOnly && r.Prefix == HostPrefix(e) && peers[r.Peer] == e) {
			t.Errorf("route %s holds underlay address %s", r.Prefix, e)
		}
	}
	for _, l := range p.LocalPrefixes {
		for _, r := range p.Routes {
			// A peer's own address, routed to that peer for what the node
			// forwards (addPeerAddrRoutes), may lie in a local prefix: the
			// node's own traffic never takes it.
			peerAddr := r.TransitOnly && r.Peer != "" && r.Prefix.Bits() == r.Prefix.Addr().BitLen()
			if !r.Prefix.Overlaps(l) || r.Underlay || peerAddr {
				continue
			}
			if !r.TransitOnly || r.Prefix.Bits() >= l.Bits() {
				t.Errorf("route %s overlaps local prefix %s", r.Prefix, l)
			} else if u, _ := longest(l); !u.Underlay {
				t.Errorf("route %s holds local prefix %s without an Underlay exception for it", r.Prefix, l)
			}
		}
	}
	for _, r := range p.Routes {
		if r.Underlay {
			if r.Peer != "" || r.Via.IsValid() || r.Group != nil || r.Site != "" || !r.TransitOnly {
				t.Errorf("Underlay route %s has a target (%q %s %v %q) or is not TransitOnly", r.Prefix, r.Peer, r.Via, r.Group, r.Site)
			}
			if c, ok := longest(parentOrSelf(r.Prefix)); !ok || c.Prefix == r.Prefix || !c.TransitOnly {
				t.Errorf("Underlay route %s is no exception inside a TransitOnly route", r.Prefix)
			}
			continue
		}
		if (r.Peer == "") == (len(r.Group) == 0) {
			t.Errorf("route %s has peer %q and group %v: want exactly one", r.Prefix, r.Peer, r.Group)
		}
		for _, h := range r.Group {
			if via, ok := vias[h.Peer]; !ok || via != h.Via {
				t.Errorf("route %s: group member %s %s is not a peer", r.Prefix, h.Peer, h.Via)
			}
		}
	}
}

// parentOrSelf is the prefix one bit shorter than p, p itself for a /0.
func parentOrSelf(p netip.Prefix) netip.Prefix {
	if p.Bits() == 0 {
		return p
	}
	return parent(p)
}

// firstGroup returns the index of p's first group route.
func firstGroup(p *NodePlan) int {
	return slices.IndexFunc(p.Routes, func(r Route) bool { return r.Group != nil })
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
	canary := seedExtraNodes(t, node("aks-canary", "10.0.0.7", "10.0.12.0/24"))
	for _, tc := range []struct {
		set       *objects.Set
		node      string
		mutations []func(*NodePlan)
	}{
		{load(t, endpointInPods...), "a1", []func(*NodePlan){
			func(q *NodePlan) { q.Peers[0].AllowedSources[0] = netip.MustParsePrefix("10.99.0.0/16") },
			func(q *NodePlan) { q.Corrections[0].Kept[0] = netip.MustParsePrefix("10.99.0.0/16") },
			func(q *NodePlan) { q.Corrections[0].Endpoint = netip.MustParseAddr("10.99.0.1") },
			func(q *NodePlan) { q.Routes[0].Via = netip.MustParseAddr("10.99.0.1") },
			func(q *NodePlan) { q.PodCIDRs[0] = netip.MustParsePrefix("10.99.0.0/16") },
			func(q *NodePlan) { q.Warnings = append(q.Warnings, "x") },
			func(q *NodePlan) { q.TunnelMTU = 1 },
			func(q *NodePlan) { q.TunnelAddrOrigin = "x" },
			func(q *NodePlan) { q.Peers[0].TunnelAddr = netip.MustParseAddr("10.99.0.1") },
		}},
		{canary, "flex-1", []func(*NodePlan){
			func(q *NodePlan) { q.Routes[firstGroup(q)].Group[0].Via = netip.MustParseAddr("10.99.0.1") },
			func(q *NodePlan) { q.Routes[firstGroup(q)].Group = q.Routes[firstGroup(q)].Group[:1] },
			func(q *NodePlan) { q.TunnelSources = nil },
			func(q *NodePlan) { q.SNAT.Exempt[0].Origin = "x" },
			func(q *NodePlan) { q.SNAT.Addr = netip.MustParseAddr("10.99.0.1") },
			func(q *NodePlan) { q.SNAT.Reason = "x" },
		}},
		{canary, "aks-nodepool1-0", []func(*NodePlan){
			func(q *NodePlan) { q.Corrections[0].Local = netip.MustParsePrefix("10.99.0.0/16") },
			func(q *NodePlan) { q.LocalPrefixes[0] = netip.MustParsePrefix("10.99.0.0/16") },
			func(q *NodePlan) { q.FabricPrefixes[0] = netip.MustParsePrefix("10.99.0.0/16") },
			func(q *NodePlan) { q.SNAT.Exempt[1].Prefix = netip.MustParsePrefix("10.99.0.1/32") },
		}},
	} {
		p, err := Compute(tc.set, tc.node)
		if err != nil {
			t.Fatal(err)
		}
		if c := p.Clone(); !c.Equal(p) {
			t.Fatalf("%s: clone differs: %s", tc.node, cmp.Diff(summary(p), summary(c)))
		}
		orig := p.Clone()
		for i, mutate := range tc.mutations {
			c := p.Clone()
			mutate(c)
			if c.Equal(p) || p.Equal(c) {
				t.Errorf("%s: mutation %d: still equal", tc.node, i)
			}
			if !p.Equal(orig) {
				t.Errorf("%s: mutation %d changed the original", tc.node, i)
			}
		}
	}
	gwPlan, err := Compute(seed000Gateway(t), "aks-1")
	if err != nil {
		t.Fatal(err)
	}
	for i, mutate := range []func(*NodePlan){
		func(q *NodePlan) { q.GatewayPools[0] = "x" },
		func(q *NodePlan) { q.Gateway = false },
	} {
		c := gwPlan.Clone()
		mutate(c)
		if c.Equal(gwPlan) || gwPlan.GatewayPools[0] != "gateways" {
			t.Errorf("gateway mutation %d: still equal, or changed the original", i)
		}
	}
	var nilPlan *NodePlan
	p, _ := Compute(load(t, twoSites...), "a1")
	if !nilPlan.Equal(nil) || nilPlan.Equal(p) || nilPlan.Clone() != nil {
		t.Errorf("nil plan handling wrong")
	}
}

// TestComputeNoTunnelAddr: a node of an unmanaged site without a tunnel
// address cannot be a peer, so its plan is an error that says how to fix it.
func TestComputeNoTunnelAddr(t *testing.T) {
	set := seedExtraNodes(t, node("aks-nodepool1-2", "10.0.0.6", ""))
	_, err := Compute(set, "aks-nodepool1-2")
	want := `plan node "aks-nodepool1-2": the node has no tunnel address, and as a node of Site "cluster" (manageCniPlugin false) it needs one to be a peer: ` +
		`it has no IPv4 podCIDR, so set the annotation isthmus.dev/tunnel-ipv4 to an IPv4 address outside every pod block and underlay network, ` +
		`e.g. kubectl annotate node aks-nodepool1-2 isthmus.dev/tunnel-ipv4=100.64.0.4`
	if err == nil || err.Error() != want {
		t.Errorf("Compute error = %v\nwant %s", err, want)
	}
}

// TestComputeDuplicatePrefix: a node's podCIDR equal to its unmanaged site's
// block gives one route, to the node.
func TestComputeDuplicatePrefix(t *testing.T) {
	set := load(t,
		site("a", "10.1.0.0/24", "10.10.0.0/16", ""),
		site("u", "10.2.0.0/24", "10.20.0.0/24", "  manageCniPlugin: false\n"),
		peering("a-u", "a, u", ""),
		node("a1", "10.1.0.1", "10.10.1.0/24"),
		node("u1", "10.2.0.1", "10.20.0.0/24"),
	)
	p, err := Compute(set, "a1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`node a1 site a underlay 10.1.0.1 pods [10.10.1.0/24] tunnel 10.10.1.1 (Node "a1" spec.podCIDRs[0]) mtu 0`,
		"peer u1 u 10.2.0.1 10.20.0.1 [10.2.0.1/32 10.20.0.0/24]",
		`route 10.2.0.1/32 -> u1 10.2.0.1 transit only (Node "u1" status.addresses[InternalIP])`,
		`route 10.20.0.0/24 -> u1 10.2.0.1 (Node "u1" spec.podCIDRs[0])`,
		"tunnel sources [10.10.1.0/24]",
		`snat 10.10.1.1 except 10.10.1.0/24 (Node "a1" spec.podCIDRs[0])`,
		`warning route 10.20.0.0/24 from Node "u1" spec.podCIDRs[0] is also claimed by Site "u" spec.podCidrAssignments[0].cidrBlocks[0]: the first is kept`,
	}
	if diff := cmp.Diff(want, summary(p)); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
}
