package plan

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

func pool(name, typ, label, routed string) string {
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: GatewayPool
metadata: {name: %s}
spec:
  type: %s
  nodeSelector: {matchLabels: {gw: %s}}
  routedCidrs: [%s]
`, name, typ, label, routed)
}

func assignmentDoc(name, sites, pools, extra string) string {
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: SiteGatewayPoolAssignment
metadata: {name: %s}
spec:
  sites: [%s]
  gatewayPools: [%s]
%s`, name, sites, pools, extra)
}

// gw is node with the label gw: label, selected by the pool of that label.
func gw(name, ip, podCIDRs, label string) string {
	return strings.Replace(node(name, ip, podCIDRs), "metadata: {name: "+name+"}",
		fmt.Sprintf("metadata:\n  name: %s\n  labels: {gw: %s}", name, label), 1)
}

// withExternal adds an ExternalIP to a node.
func withExternal(n, ip string) string {
	return n + fmt.Sprintf("    - {type: ExternalIP, address: %q}\n", ip)
}

// seed003 is seed 003's topology: a cloud site with the gateway master-gw
// and two members, an edge site with a gateway and one member, pods from
// 10.16.0.0/12, joined only through gateways. routeNodeCidrs is off to keep
// the tables short (seed 000's case covers node CIDRs); edit changes the
// documents before loading.
func seed003(t *testing.T, edit func(docs []string) []string) *objects.Set {
	t.Helper()
	docs := []string{
		site("cloud", "172.20.0.0/24", "10.16.0.0/21", ""),
		site("edge", "192.168.50.0/24", "10.16.8.0/21", ""),
		pool("cloud", "Internal", "cloud", ""),
		pool("edge", "Internal", "edge", ""),
		assignmentDoc("cloud-edge", "cloud, edge", "cloud, edge", "  routeNodeCidrs: false\n"),
		gw("master-gw", "172.20.0.10", "10.16.1.0/24", "cloud"),
		node("master-02", "172.20.0.11", "10.16.2.0/24"),
		node("master-03", "172.20.0.12", "10.16.3.0/24"),
		gw("edge-gw", "192.168.50.10", "10.16.10.0/24", "edge"),
		node("edge-1", "192.168.50.11", "10.16.11.0/24"),
	}
	if edit != nil {
		docs = edit(docs)
	}
	return load(t, docs...)
}

// replaceDoc returns an edit that replaces the document starting with old's
// first line(s) by new.
func replaceDoc(old, new string) func([]string) []string {
	return func(docs []string) []string {
		out := make([]string, len(docs))
		for i, d := range docs {
			if d == old {
				d = new
			}
			out[i] = d
		}
		return out
	}
}

func seed000Gateway(t *testing.T) *objects.Set {
	t.Helper()
	set, warnings, err := objects.LoadDir("../objects/testdata/seed000-gateway")
	if err != nil || len(warnings) != 0 {
		t.Fatalf("load: %v, warnings %v", err, warnings)
	}
	return set
}

const (
	aks1T   = `Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"]`
	aks2T   = `Node "aks-2" metadata.annotations["isthmus.dev/tunnel-ipv4"]`
	flexNet = `Site "flex-site" spec.nodeCidrs[0]`
	routed  = `GatewayPool "gateways" spec.routedCidrs[0]`
)

func TestComputeGateways(t *testing.T) {
	tests := []struct {
		name string
		set  *objects.Set
		node string
		role string // "gateway [pools]" or "member"
		want []string
	}{
		{
			// The seed's failure: the gateway routed 192.168.10.0/28, and so
			// the tunnel endpoint 192.168.10.10, into the tunnel. The flex
			// site's nodeCidrs are transit only (the host reaches them on the
			// underlay) and whole, with an exception for the endpoint. The
			// pool's routedCidrs are the cluster's own pod subnet: local here,
			// cut.
			name: "seed 000 gateway mode, the AKS canary (gateway)",
			set:  seed000Gateway(t),
			node: "aks-1",
			role: "gateway [gateways]",
			want: []string{
				`node aks-1 site cluster underlay 10.0.0.4 pods [] tunnel 100.64.0.4 (Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"]) mtu 0`,
				"peer aks-2 cluster 10.0.0.5 100.64.0.5 [10.0.0.5/32 10.0.2.0/23 100.64.0.5/32]",
				"peer flex-1 flex-site 192.168.10.10 192.168.20.1 [192.168.10.0/28 192.168.20.0/25]",
				`route 10.0.0.5/32 -> aks-2 10.0.0.5 transit only not for pods (Node "aks-2" status.addresses[InternalIP])`,
				`route 100.64.0.5/32 -> aks-2 10.0.0.5 (Node "aks-2" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 192.168.10.0/28 -> group to flex-site [flex-1 192.168.10.10] transit only (Site "flex-site" spec.nodeCidrs[0])`,
				`route 192.168.10.10/32 -> flex-1 192.168.10.10 transit only (Node "flex-1" status.addresses[InternalIP])`,
				`route 192.168.20.0/25 -> flex-1 192.168.10.10 (Node "flex-1" spec.podCIDRs[0])`,
				"tunnel sources [10.0.2.0/23]",
				"local [10.0.0.0/16 10.0.2.0/23]",
				"fabric [10.0.0.0/27 10.0.2.0/23]",
				`snat 100.64.0.4 except 10.0.2.0/23 (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]), 100.64.0.4/32 (Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`correction 10.0.2.0/23 - local 10.0.0.0/16 = [] (GatewayPool "gateways" spec.routedCidrs[0])`,
				`correction 10.0.2.0/23 - local 10.0.2.0/23 = [] (GatewayPool "gateways" spec.routedCidrs[0])`,
			},
		},
		{
			// A member reaches the flex site through aks-1 only. It too keeps
			// 192.168.10.10 out (an exception): aks-1 would not carry it.
			name: "seed 000 gateway mode, the AKS member",
			set:  seed000Gateway(t),
			node: "aks-2",
			role: "member",
			want: []string{
				`node aks-2 site cluster underlay 10.0.0.5 pods [] tunnel 100.64.0.5 (Node "aks-2" metadata.annotations["isthmus.dev/tunnel-ipv4"]) mtu 0`,
				"peer aks-1 cluster 10.0.0.4 100.64.0.4 [10.0.2.0/23 100.64.0.4/32 192.168.10.0/28 192.168.20.0/25]",
				`route 100.64.0.4/32 -> aks-1 10.0.0.4 (Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 192.168.10.0/28 -> group to flex-site [aks-1 10.0.0.4] transit only via fabric (Site "flex-site" spec.nodeCidrs[0] and 1 more)`,
				`route 192.168.20.0/25 -> group to flex-site [aks-1 10.0.0.4] via fabric (Node "flex-1" spec.podCIDRs[0])`,
				"tunnel sources [10.0.2.0/23]",
				"fabric egress [10.0.2.0/23]",
				"local [10.0.0.0/16 10.0.2.0/23]",
				"fabric [10.0.2.0/23]",
				`snat 100.64.0.5 except 10.0.2.0/23 (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]), 100.64.0.5/32 (Node "aks-2" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`correction 10.0.2.0/23 - local 10.0.0.0/16 = [] (GatewayPool "gateways" spec.routedCidrs[0])`,
				`correction 10.0.2.0/23 - local 10.0.2.0/23 = [] (GatewayPool "gateways" spec.routedCidrs[0])`,
			},
		},
		{
			// 10.0.2.0/23 goes to aks-1 whole: nothing of the flex site cuts
			// it, although the pool has a gateway here too. The member aks-2
			// (10.0.0.5) reaches flex-1 on the underlay (flex-1 is a tunnel
			// endpoint), so flex-1's own traffic reaches aks-2 and every other
			// address of the cluster's nodeCidrs there too (transit only: the
			// kernel gets no route; aks-2's own /32 is folded into the /27).
			// aks-1's address goes straight to aks-1 for the pods.
			name: "seed 000 gateway mode, the Flex node (gateway)",
			set:  seed000Gateway(t),
			node: "flex-1",
			role: "gateway [gateways]",
			want: []string{
				`node flex-1 site flex-site underlay 192.168.10.10 pods [192.168.20.0/25] tunnel 192.168.20.1 (Node "flex-1" spec.podCIDRs[0]) mtu 0`,
				"peer aks-1 cluster 10.0.0.4 100.64.0.4 [10.0.0.0/27 10.0.2.0/23 100.64.0.4/31]",
				`route 10.0.0.0/27 -> group to cluster [aks-1 10.0.0.4] transit only (Site "cluster" spec.nodeCidrs[0] and 1 more)`,
				`route 10.0.0.4/32 -> aks-1 10.0.0.4 transit only (Node "aks-1" status.addresses[InternalIP])`,
				`route 10.0.2.0/23 -> group to cluster [aks-1 10.0.0.4] (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0])`,
				`route 100.64.0.4/32 -> aks-1 10.0.0.4 (Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 100.64.0.5/32 -> group to cluster [aks-1 10.0.0.4] (Node "aks-2" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				"tunnel sources [192.168.20.0/25]",
				"fabric [192.168.10.0/28]",
				`snat 192.168.20.1 except 192.168.20.0/25 (Node "flex-1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "seed 003, the cloud gateway",
			set:  seed003(t, nil),
			node: "master-gw",
			role: "gateway [cloud]",
			want: []string{
				`node master-gw site cloud underlay 172.20.0.10 pods [10.16.1.0/24] tunnel 10.16.1.1 (Node "master-gw" spec.podCIDRs[0]) mtu 0`,
				"peer edge-gw edge 192.168.50.10 10.16.10.1 [10.16.10.0/23 192.168.50.10/31]",
				"peer master-02 cloud 172.20.0.11 10.16.2.1 [10.16.2.0/24 172.20.0.11/32]",
				"peer master-03 cloud 172.20.0.12 10.16.3.1 [10.16.3.0/24 172.20.0.12/32]",
				`route 10.16.2.0/24 -> master-02 172.20.0.11 (Node "master-02" spec.podCIDRs[0])`,
				`route 10.16.3.0/24 -> master-03 172.20.0.12 (Node "master-03" spec.podCIDRs[0])`,
				`route 10.16.10.0/24 -> edge-gw 192.168.50.10 (Node "edge-gw" spec.podCIDRs[0])`,
				`route 10.16.11.0/24 -> group to edge [edge-gw 192.168.50.10] (Node "edge-1" spec.podCIDRs[0])`,
				`route 172.20.0.11/32 -> master-02 172.20.0.11 transit only (Node "master-02" status.addresses[InternalIP])`,
				`route 172.20.0.12/32 -> master-03 172.20.0.12 transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 192.168.50.10/32 -> edge-gw 192.168.50.10 transit only (Node "edge-gw" status.addresses[InternalIP])`,
				`route 192.168.50.11/32 -> group to edge [edge-gw 192.168.50.10] transit only (Node "edge-1" status.addresses[InternalIP])`,
				"tunnel sources [10.16.1.0/24]",
				`snat 10.16.1.1 except 10.16.1.0/24 (Node "master-gw" spec.podCIDRs[0])`,
			},
		},
		{
			name: "seed 003, a cloud member",
			set:  seed003(t, nil),
			node: "master-02",
			role: "member",
			want: []string{
				`node master-02 site cloud underlay 172.20.0.11 pods [10.16.2.0/24] tunnel 10.16.2.1 (Node "master-02" spec.podCIDRs[0]) mtu 0`,
				"peer master-03 cloud 172.20.0.12 10.16.3.1 [10.16.3.0/24 172.20.0.12/32]",
				"peer master-gw cloud 172.20.0.10 10.16.1.1 [10.16.1.0/24 10.16.10.0/23 172.20.0.10/32 192.168.50.10/31]",
				`route 10.16.1.0/24 -> master-gw 172.20.0.10 (Node "master-gw" spec.podCIDRs[0])`,
				`route 10.16.3.0/24 -> master-03 172.20.0.12 (Node "master-03" spec.podCIDRs[0])`,
				`route 10.16.10.0/23 -> group to edge [master-gw 172.20.0.10] (Node "edge-gw" spec.podCIDRs[0] and 1 more)`,
				`route 172.20.0.10/32 -> master-gw 172.20.0.10 transit only (Node "master-gw" status.addresses[InternalIP])`,
				`route 172.20.0.12/32 -> master-03 172.20.0.12 transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 192.168.50.10/31 -> group to edge [master-gw 172.20.0.10] transit only (Node "edge-gw" status.addresses[InternalIP] and 1 more)`,
				"tunnel sources [10.16.2.0/24]",
				`snat 10.16.2.1 except 10.16.2.0/24 (Node "master-02" spec.podCIDRs[0])`,
			},
		},
		{
			name: "seed 003, the edge gateway",
			set:  seed003(t, nil),
			node: "edge-gw",
			role: "gateway [edge]",
			want: []string{
				`node edge-gw site edge underlay 192.168.50.10 pods [10.16.10.0/24] tunnel 10.16.10.1 (Node "edge-gw" spec.podCIDRs[0]) mtu 0`,
				"peer edge-1 edge 192.168.50.11 10.16.11.1 [10.16.11.0/24 192.168.50.11/32]",
				"peer master-gw cloud 172.20.0.10 10.16.1.1 [10.16.1.0/24 10.16.2.0/23 172.20.0.10/31 172.20.0.12/32]",
				`route 10.16.1.0/24 -> master-gw 172.20.0.10 (Node "master-gw" spec.podCIDRs[0])`,
				`route 10.16.2.0/23 -> group to cloud [master-gw 172.20.0.10] (Node "master-02" spec.podCIDRs[0] and 1 more)`,
				`route 10.16.11.0/24 -> edge-1 192.168.50.11 (Node "edge-1" spec.podCIDRs[0])`,
				`route 172.20.0.10/32 -> master-gw 172.20.0.10 transit only (Node "master-gw" status.addresses[InternalIP])`,
				`route 172.20.0.11/32 -> group to cloud [master-gw 172.20.0.10] transit only (Node "master-02" status.addresses[InternalIP])`,
				`route 172.20.0.12/32 -> group to cloud [master-gw 172.20.0.10] transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 192.168.50.11/32 -> edge-1 192.168.50.11 transit only (Node "edge-1" status.addresses[InternalIP])`,
				"tunnel sources [10.16.10.0/24]",
				`snat 10.16.10.1 except 10.16.10.0/24 (Node "edge-gw" spec.podCIDRs[0])`,
			},
		},
		{
			name: "seed 003, the edge member",
			set:  seed003(t, nil),
			node: "edge-1",
			role: "member",
			want: []string{
				`node edge-1 site edge underlay 192.168.50.11 pods [10.16.11.0/24] tunnel 10.16.11.1 (Node "edge-1" spec.podCIDRs[0]) mtu 0`,
				"peer edge-gw edge 192.168.50.10 10.16.10.1 [10.16.1.0/24 10.16.2.0/23 10.16.10.0/24 172.20.0.10/31 172.20.0.12/32 192.168.50.10/32]",
				`route 10.16.1.0/24 -> group to cloud [edge-gw 192.168.50.10] (Node "master-gw" spec.podCIDRs[0])`,
				`route 10.16.2.0/23 -> group to cloud [edge-gw 192.168.50.10] (Node "master-02" spec.podCIDRs[0] and 1 more)`,
				`route 10.16.10.0/24 -> edge-gw 192.168.50.10 (Node "edge-gw" spec.podCIDRs[0])`,
				`route 172.20.0.10/31 -> group to cloud [edge-gw 192.168.50.10] transit only (Node "master-gw" status.addresses[InternalIP] and 1 more)`,
				`route 172.20.0.12/32 -> group to cloud [edge-gw 192.168.50.10] transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 192.168.50.10/32 -> edge-gw 192.168.50.10 transit only (Node "edge-gw" status.addresses[InternalIP])`,
				"tunnel sources [10.16.11.0/24]",
				`snat 10.16.11.1 except 10.16.11.0/24 (Node "edge-1" spec.podCIDRs[0])`,
			},
		},
		{
			name: "two gateways in the cloud, seen from the edge gateway: a group of two",
			set: seed003(t, func(d []string) []string {
				return append(d, gw("master-gw2", "172.20.0.13", "10.16.4.0/24", "cloud"))
			}),
			node: "edge-gw",
			role: "gateway [edge]",
			want: []string{
				`node edge-gw site edge underlay 192.168.50.10 pods [10.16.10.0/24] tunnel 10.16.10.1 (Node "edge-gw" spec.podCIDRs[0]) mtu 0`,
				"peer edge-1 edge 192.168.50.11 10.16.11.1 [10.16.11.0/24 192.168.50.11/32]",
				"peer master-gw cloud 172.20.0.10 10.16.1.1 [10.16.1.0/24 10.16.2.0/23 10.16.4.0/24 172.20.0.10/31 172.20.0.12/31]",
				"peer master-gw2 cloud 172.20.0.13 10.16.4.1 [10.16.1.0/24 10.16.2.0/23 10.16.4.0/24 172.20.0.10/31 172.20.0.12/31]",
				`route 10.16.1.0/24 -> master-gw 172.20.0.10 (Node "master-gw" spec.podCIDRs[0])`,
				`route 10.16.2.0/23 -> group to cloud [master-gw 172.20.0.10, master-gw2 172.20.0.13] (Node "master-02" spec.podCIDRs[0] and 1 more)`,
				`route 10.16.4.0/24 -> master-gw2 172.20.0.13 (Node "master-gw2" spec.podCIDRs[0])`,
				`route 10.16.11.0/24 -> edge-1 192.168.50.11 (Node "edge-1" spec.podCIDRs[0])`,
				`route 172.20.0.10/32 -> master-gw 172.20.0.10 transit only (Node "master-gw" status.addresses[InternalIP])`,
				`route 172.20.0.11/32 -> group to cloud [master-gw 172.20.0.10, master-gw2 172.20.0.13] transit only (Node "master-02" status.addresses[InternalIP])`,
				`route 172.20.0.12/32 -> group to cloud [master-gw 172.20.0.10, master-gw2 172.20.0.13] transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 172.20.0.13/32 -> master-gw2 172.20.0.13 transit only (Node "master-gw2" status.addresses[InternalIP])`,
				`route 192.168.50.11/32 -> edge-1 192.168.50.11 transit only (Node "edge-1" status.addresses[InternalIP])`,
				"tunnel sources [10.16.10.0/24]",
				`snat 10.16.10.1 except 10.16.10.0/24 (Node "edge-gw" spec.podCIDRs[0])`,
			},
		},
		{
			name: "two gateways in the cloud, seen from a cloud member",
			set: seed003(t, func(d []string) []string {
				return append(d, gw("master-gw2", "172.20.0.13", "10.16.4.0/24", "cloud"))
			}),
			node: "master-03",
			role: "member",
			want: []string{
				`node master-03 site cloud underlay 172.20.0.12 pods [10.16.3.0/24] tunnel 10.16.3.1 (Node "master-03" spec.podCIDRs[0]) mtu 0`,
				"peer master-02 cloud 172.20.0.11 10.16.2.1 [10.16.2.0/24 172.20.0.11/32]",
				"peer master-gw cloud 172.20.0.10 10.16.1.1 [10.16.1.0/24 10.16.10.0/23 172.20.0.10/32 192.168.50.10/31]",
				"peer master-gw2 cloud 172.20.0.13 10.16.4.1 [10.16.4.0/24 10.16.10.0/23 172.20.0.13/32 192.168.50.10/31]",
				`route 10.16.1.0/24 -> master-gw 172.20.0.10 (Node "master-gw" spec.podCIDRs[0])`,
				`route 10.16.2.0/24 -> master-02 172.20.0.11 (Node "master-02" spec.podCIDRs[0])`,
				`route 10.16.4.0/24 -> master-gw2 172.20.0.13 (Node "master-gw2" spec.podCIDRs[0])`,
				`route 10.16.10.0/23 -> group to edge [master-gw 172.20.0.10, master-gw2 172.20.0.13] (Node "edge-gw" spec.podCIDRs[0] and 1 more)`,
				`route 172.20.0.10/32 -> master-gw 172.20.0.10 transit only (Node "master-gw" status.addresses[InternalIP])`,
				`route 172.20.0.11/32 -> master-02 172.20.0.11 transit only (Node "master-02" status.addresses[InternalIP])`,
				`route 172.20.0.13/32 -> master-gw2 172.20.0.13 transit only (Node "master-gw2" status.addresses[InternalIP])`,
				`route 192.168.50.10/31 -> group to edge [master-gw 172.20.0.10, master-gw2 172.20.0.13] transit only (Node "edge-gw" status.addresses[InternalIP] and 1 more)`,
				"tunnel sources [10.16.3.0/24]",
				`snat 10.16.3.1 except 10.16.3.0/24 (Node "master-03" spec.podCIDRs[0])`,
			},
		},
		{
			// The edge is behind NAT: the cloud gateway tunnels to the edge
			// gateway's ExternalIP; the edge member still reaches its own
			// gateway at the InternalIP, and the edge gateway reaches the
			// cloud's Internal pool at its InternalIP.
			name: "External pool, seen from the cloud gateway",
			set: seed003(t, func(d []string) []string {
				d = replaceDoc(pool("edge", "Internal", "edge", ""), pool("edge", "External", "edge", ""))(d)
				return replaceDoc(gw("edge-gw", "192.168.50.10", "10.16.10.0/24", "edge"),
					withExternal(gw("edge-gw", "192.168.50.10", "10.16.10.0/24", "edge"), "203.0.113.10"))(d)
			}),
			node: "master-gw",
			role: "gateway [cloud]",
			want: []string{
				`node master-gw site cloud underlay 172.20.0.10 pods [10.16.1.0/24] tunnel 10.16.1.1 (Node "master-gw" spec.podCIDRs[0]) mtu 0`,
				"peer edge-gw edge 203.0.113.10 10.16.10.1 [10.16.10.0/23 192.168.50.10/31]",
				"peer master-02 cloud 172.20.0.11 10.16.2.1 [10.16.2.0/24 172.20.0.11/32]",
				"peer master-03 cloud 172.20.0.12 10.16.3.1 [10.16.3.0/24 172.20.0.12/32]",
				`route 10.16.2.0/24 -> master-02 172.20.0.11 (Node "master-02" spec.podCIDRs[0])`,
				`route 10.16.3.0/24 -> master-03 172.20.0.12 (Node "master-03" spec.podCIDRs[0])`,
				`route 10.16.10.0/24 -> edge-gw 203.0.113.10 (Node "edge-gw" spec.podCIDRs[0])`,
				`route 10.16.11.0/24 -> group to edge [edge-gw 203.0.113.10] (Node "edge-1" spec.podCIDRs[0])`,
				`route 172.20.0.11/32 -> master-02 172.20.0.11 transit only (Node "master-02" status.addresses[InternalIP])`,
				`route 172.20.0.12/32 -> master-03 172.20.0.12 transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 192.168.50.10/31 -> group to edge [edge-gw 203.0.113.10] transit only (Node "edge-gw" status.addresses[InternalIP] and 1 more)`,
				"tunnel sources [10.16.1.0/24]",
				`snat 10.16.1.1 except 10.16.1.0/24 (Node "master-gw" spec.podCIDRs[0])`,
			},
		},
		{
			name: "External pool, seen from the edge member",
			set: seed003(t, func(d []string) []string {
				d = replaceDoc(pool("edge", "Internal", "edge", ""), pool("edge", "External", "edge", ""))(d)
				return replaceDoc(gw("edge-gw", "192.168.50.10", "10.16.10.0/24", "edge"),
					withExternal(gw("edge-gw", "192.168.50.10", "10.16.10.0/24", "edge"), "203.0.113.10"))(d)
			}),
			node: "edge-1",
			role: "member",
			want: []string{
				`node edge-1 site edge underlay 192.168.50.11 pods [10.16.11.0/24] tunnel 10.16.11.1 (Node "edge-1" spec.podCIDRs[0]) mtu 0`,
				"peer edge-gw edge 192.168.50.10 10.16.10.1 [10.16.1.0/24 10.16.2.0/23 10.16.10.0/24 172.20.0.10/31 172.20.0.12/32 192.168.50.10/32]",
				`route 10.16.1.0/24 -> group to cloud [edge-gw 192.168.50.10] (Node "master-gw" spec.podCIDRs[0])`,
				`route 10.16.2.0/23 -> group to cloud [edge-gw 192.168.50.10] (Node "master-02" spec.podCIDRs[0] and 1 more)`,
				`route 10.16.10.0/24 -> edge-gw 192.168.50.10 (Node "edge-gw" spec.podCIDRs[0])`,
				`route 172.20.0.10/31 -> group to cloud [edge-gw 192.168.50.10] transit only (Node "master-gw" status.addresses[InternalIP] and 1 more)`,
				`route 172.20.0.12/32 -> group to cloud [edge-gw 192.168.50.10] transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 192.168.50.10/32 -> edge-gw 192.168.50.10 transit only (Node "edge-gw" status.addresses[InternalIP])`,
				"tunnel sources [10.16.11.0/24]",
				`snat 10.16.11.1 except 10.16.11.0/24 (Node "edge-1" spec.podCIDRs[0])`,
			},
		},
		{
			// Seed 001: an unmanaged edge site whose new gateway has neither
			// podCIDR nor tunnel address. It is still a peer, and its pool's
			// routedCidrs and its site's pod blocks are routed to it.
			name: "a gateway without podCIDR gets its routedCidrs routed",
			set:  seed003(t, edgeUnmanagedNoPodCIDR),
			node: "master-gw",
			role: "gateway [cloud]",
			want: []string{
				`node master-gw site cloud underlay 172.20.0.10 pods [10.16.1.0/24] tunnel 10.16.1.1 (Node "master-gw" spec.podCIDRs[0]) mtu 0`,
				"peer edge-gw edge 192.168.50.10 invalid IP [10.16.8.0/21 100.64.0.11/32 172.30.0.0/16 192.168.50.10/31]",
				"peer master-02 cloud 172.20.0.11 10.16.2.1 [10.16.2.0/24 172.20.0.11/32]",
				"peer master-03 cloud 172.20.0.12 10.16.3.1 [10.16.3.0/24 172.20.0.12/32]",
				`route 10.16.2.0/24 -> master-02 172.20.0.11 (Node "master-02" spec.podCIDRs[0])`,
				`route 10.16.3.0/24 -> master-03 172.20.0.12 (Node "master-03" spec.podCIDRs[0])`,
				`route 10.16.8.0/21 -> group to edge [edge-gw 192.168.50.10] (Site "edge" spec.podCidrAssignments[0].cidrBlocks[0])`,
				`route 100.64.0.11/32 -> group to edge [edge-gw 192.168.50.10] (Node "edge-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 172.20.0.11/32 -> master-02 172.20.0.11 transit only (Node "master-02" status.addresses[InternalIP])`,
				`route 172.20.0.12/32 -> master-03 172.20.0.12 transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 172.30.0.0/16 -> group to edge [edge-gw 192.168.50.10] (GatewayPool "edge" spec.routedCidrs[0])`,
				`route 192.168.50.10/32 -> edge-gw 192.168.50.10 transit only (Node "edge-gw" status.addresses[InternalIP])`,
				`route 192.168.50.11/32 -> group to edge [edge-gw 192.168.50.10] transit only (Node "edge-1" status.addresses[InternalIP])`,
				"tunnel sources [10.16.1.0/24]",
				`snat 10.16.1.1 except 10.16.1.0/24 (Node "master-gw" spec.podCIDRs[0])`,
				`warning gateway Node "edge-gw" has no tunnel address: it cannot be health-checked, so it is always up`,
				`warning gateway Node "edge-gw" has no tunnel address: it cannot be health-checked, so it is always up`,
			},
		},
		{
			name: "the gateway without podCIDR or tunnel address gets a plan",
			set:  seed003(t, edgeUnmanagedNoPodCIDR),
			node: "edge-gw",
			role: "gateway [edge]",
			want: []string{
				"node edge-gw site edge underlay 192.168.50.10 pods [] tunnel invalid IP () mtu 0",
				"peer edge-1 edge 192.168.50.11 100.64.0.11 [10.16.8.0/21 100.64.0.11/32 192.168.50.11/32]",
				"peer master-gw cloud 172.20.0.10 10.16.1.1 [10.16.1.0/24 10.16.2.0/23 172.20.0.10/31 172.20.0.12/32]",
				`route 10.16.1.0/24 -> master-gw 172.20.0.10 (Node "master-gw" spec.podCIDRs[0])`,
				`route 10.16.2.0/23 -> group to cloud [master-gw 172.20.0.10] (Node "master-02" spec.podCIDRs[0] and 1 more)`,
				`route 100.64.0.11/32 -> edge-1 192.168.50.11 (Node "edge-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 172.20.0.10/32 -> master-gw 172.20.0.10 transit only (Node "master-gw" status.addresses[InternalIP])`,
				`route 172.20.0.11/32 -> group to cloud [master-gw 172.20.0.10] transit only (Node "master-02" status.addresses[InternalIP])`,
				`route 172.20.0.12/32 -> group to cloud [master-gw 172.20.0.10] transit only (Node "master-03" status.addresses[InternalIP])`,
				`route 192.168.50.11/32 -> edge-1 192.168.50.11 transit only not for pods (Node "edge-1" status.addresses[InternalIP])`,
				"tunnel sources [10.16.8.0/21]",
				"local [10.16.8.0/21]",
				"fabric [10.16.8.0/21 172.30.0.0/16]",
				`snat off: Node "edge-gw" has no tunnel address to translate to (no IPv4 podCIDR, no annotation isthmus.dev/tunnel-ipv4)`,
				`warning gateway Node "edge-gw" has no tunnel address: it forwards, but peers cannot health-check it and its host traffic cannot use the tunnel`,
			},
		},
		{
			name: "a mesh wins over an assignment for the same sites",
			set: loadFiles(t, func() map[string][]byte {
				files := map[string][]byte{}
				for _, f := range []string{"sites.yaml", "nodes.yaml", "gateways.yaml"} {
					files[f] = readFile(t, "../objects/testdata/seed000-gateway/"+f)
				}
				files["peering.yaml"] = []byte(peering("cluster-flex", "cluster, flex-site", ""))
				return files
			}()),
			node: "flex-1",
			role: "gateway [gateways]",
			want: []string{
				`node flex-1 site flex-site underlay 192.168.10.10 pods [192.168.20.0/25] tunnel 192.168.20.1 (Node "flex-1" spec.podCIDRs[0]) mtu 0`,
				"peer aks-1 cluster 10.0.0.4 100.64.0.4 [10.0.0.4/32 10.0.2.0/23 100.64.0.4/32]",
				"peer aks-2 cluster 10.0.0.5 100.64.0.5 [10.0.0.5/32 10.0.2.0/23 100.64.0.5/32]",
				`route 10.0.0.4/32 -> aks-1 10.0.0.4 transit only (Node "aks-1" status.addresses[InternalIP])`,
				`route 10.0.0.5/32 -> aks-2 10.0.0.5 transit only (Node "aks-2" status.addresses[InternalIP])`,
				`route 10.0.2.0/23 -> group [aks-1 10.0.0.4, aks-2 10.0.0.5] (Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0])`,
				`route 100.64.0.4/32 -> aks-1 10.0.0.4 (Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				`route 100.64.0.5/32 -> aks-2 10.0.0.5 (Node "aks-2" metadata.annotations["isthmus.dev/tunnel-ipv4"])`,
				"tunnel sources [192.168.20.0/25]",
				"fabric [192.168.10.0/28]",
				`snat 192.168.20.1 except 192.168.20.0/25 (Node "flex-1" spec.podCIDRs[0])`,
				`warning Sites "flex-site" and "cluster" are joined both by SitePeering "cluster-flex" (meshNodes) and by SiteGatewayPoolAssignment "cluster-flex": they mesh, and the assignment is not used between them`,
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
			role := "member"
			if p.Gateway {
				role = fmt.Sprintf("gateway %v", p.GatewayPools)
			}
			if role != tt.role {
				t.Errorf("role = %s, want %s", role, tt.role)
			}
			checkInvariants(t, p)
		})
	}
}

// edgeUnmanagedNoPodCIDR makes seed 003's edge site unmanaged (seed 001's
// Calico site), its gateway a new node without podCIDR or tunnel address,
// its member a node with only the annotation, and gives the edge pool a
// routed prefix.
func edgeUnmanagedNoPodCIDR(d []string) []string {
	d = replaceDoc(site("edge", "192.168.50.0/24", "10.16.8.0/21", ""), site("edge", "192.168.50.0/24", "10.16.8.0/21", "  manageCniPlugin: false\n"))(d)
	d = replaceDoc(pool("edge", "Internal", "edge", ""), pool("edge", "Internal", "edge", "172.30.0.0/16"))(d)
	d = replaceDoc(gw("edge-gw", "192.168.50.10", "10.16.10.0/24", "edge"), gw("edge-gw", "192.168.50.10", "", "edge"))(d)
	return replaceDoc(node("edge-1", "192.168.50.11", "10.16.11.0/24"), annotated("edge-1", "192.168.50.11", "", "100.64.0.11"))(d)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestComputeGatewaySplitsEquivalentSpellings: routed prefixes are split
// around every tunnel endpoint, IPv4 and IPv6 (transit-only ones get an
// exception instead), and spelling a prefix another
// way (host bits set, upper case, zeros written out) changes nothing: not the
// routes, not the corrections, and a prefix listed twice in two spellings
// gives one route.
func TestComputeGatewaySplitsEquivalentSpellings(t *testing.T) {
	objs := func(nodeCidr6, routed4, routed6 string) *objects.Set {
		return load(t,
			site("a", "10.1.0.0/24", "10.10.0.0/16", ""),
			site("b", `10.2.0.0/24, "`+nodeCidr6+`"`, "10.20.0.0/16", ""),
			pool("pa", "Internal", "a", ""),
			pool("pb", "Internal", "b", `"`+routed4+`", "`+routed6+`"`),
			assignmentDoc("ab", "a, b", "pa, pb", ""),
			gw("a1", "10.1.0.1", "10.10.1.0/24", "a"),
			node("a2", "10.1.0.2", "10.10.2.0/24"),
			gw("b1", "10.2.0.10", "10.20.1.0/24", "b"),
			gw("b2", "2001:db8::20", "10.20.2.0/24", "b"),
		)
	}
	spellings := []*objects.Set{
		objs("2001:db8:0:0::/64", "10.0.0.1/8", "2001:DB8::/64"),
		objs("2001:DB8::/64", "10.0.0.0/8", "2001:db8:0:0:0:0:0:0/64"),
	}
	pb4, pb6 := `GatewayPool "pb" spec.routedCidrs[0]`, `GatewayPool "pb" spec.routedCidrs[1]`
	v6 := netip.MustParsePrefix("2001:db8::/64")
	want := map[string][]string{
		// The gateway tunnels to its own site and to b's gateways.
		"a1": {
			"10.0.0.0/8 - 10.1.0.1 (" + pb4 + ")",
			"10.0.0.0/8 - 10.1.0.2 (" + pb4 + ")",
			"10.0.0.0/8 - 10.2.0.10 (" + pb4 + ")",
			"2001:db8::/64 - 2001:db8::20 (" + pb6 + ")",
		},
		// The member tunnels to its own site only, and keeps out what its
		// gateway tunnels to.
		"a2": {
			"10.0.0.0/8 - 10.1.0.1 (" + pb4 + ")",
			"10.0.0.0/8 - 10.1.0.2 (" + pb4 + ")",
			"10.0.0.0/8 - 10.2.0.10 (" + pb4 + ")",
			"2001:db8::/64 - 2001:db8::20 (" + pb6 + ")",
		},
	}
	for _, name := range []string{"a1", "a2"} {
		var plans []*NodePlan
		for _, set := range spellings {
			p, err := Compute(set, name)
			if err != nil {
				t.Fatal(err)
			}
			plans = append(plans, p)
		}
		p := plans[0]
		var cuts []string
		for _, c := range p.Corrections {
			cuts = append(cuts, fmt.Sprintf("%s - %s (%s)", c.Removed, c.Endpoint, c.Origin))
		}
		if diff := cmp.Diff(want[name], cuts); diff != "" {
			t.Errorf("%s: corrections (-want +got):\n%s", name, diff)
		}
		if !slices.EqualFunc(p.Routes, plans[1].Routes, Route.Equal) || !slices.EqualFunc(p.Corrections, plans[1].Corrections, Correction.Equal) {
			t.Errorf("%s: the spelling changed the plan:\n%s", name, cmp.Diff(summary(p), summary(plans[1])))
		}
		if len(p.Warnings) != 0 {
			t.Errorf("%s: warnings %v (a prefix in two spellings is one route, no tie)", name, p.Warnings)
		}
		checkInvariants(t, p)
		// Every address of the cut prefixes but the endpoints is still
		// routed: the kept IPv6 pieces are exactly the /64 minus b2. b's
		// nodeCidrs are transit only, whole, with an exception for b1.
		var kept6 []netip.Prefix
		for _, e := range []string{"10.1.0.1", "10.1.0.2", "10.2.0.10", "2001:db8::20"} {
			var best Route
			for _, r := range p.Routes {
				// The node's own traffic never takes a TransitOnly route.
				if r.Prefix.Contains(netip.MustParseAddr(e)) && !r.TransitOnly {
					t.Errorf("%s: route %s holds the endpoint %s", name, r.Prefix, e)
				}
				if r.Prefix.Contains(netip.MustParseAddr(e)) && r.Prefix.Bits() > best.Prefix.Bits() {
					best = r
				}
			}
			// The datapath's lookup finds an exception, or a route only the
			// pods and forwarded traffic take (a2's pods reach b1 through
			// a1, which routes its peer b1's address straight to it).
			if best.Prefix.IsValid() && !best.Underlay && !best.TransitOnly {
				t.Errorf("%s: the endpoint %s is tunnelled by route %s", name, e, best.Prefix)
			}
		}
		for _, r := range p.Routes {
			if v6.Contains(r.Prefix.Addr()) {
				kept6 = append(kept6, r.Prefix)
			}
		}
		if wantKept := Subtract(v6, netip.MustParsePrefix("2001:db8::20/128")); !slices.Equal(kept6, wantKept) || len(kept6) != 64 {
			t.Errorf("%s: IPv6 routes %v, want the 64 prefixes of %v", name, kept6, wantKept)
		}
	}
}
