package objects

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func site(name, nodeCidrs, blocks string) string {
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: %s}
spec:
  nodeCidrs: [%s]
  podCidrAssignments:
    - cidrBlocks: [%s]
`, name, nodeCidrs, blocks)
}

func peering(name, sites string) string {
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: SitePeering
metadata: {name: %s}
spec:
  sites: [%s]
`, name, sites)
}

func node(name, ip, podCIDRs string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Node
metadata: {name: %s}
spec:
  podCIDRs: [%s]
status:
  addresses:
    - {type: InternalIP, address: "%s"}
`, name, podCIDRs, ip)
}

// tunnelNode is node with the tunnel address annotation set to tunnel.
func tunnelNode(name, ip, podCIDRs, tunnel string) string {
	return strings.Replace(node(name, ip, podCIDRs), "metadata: {name: "+name+"}",
		fmt.Sprintf("metadata:\n  name: %s\n  annotations: {isthmus.dev/tunnel-ipv4: %q}", name, tunnel), 1)
}

func docs(d ...string) []byte { return []byte(strings.Join(d, "---\n")) }

// validSites is a correct two-site topology the error cases start from.
var validSites = docs(
	site("a", "10.1.0.0/24", "10.10.0.0/16"),
	site("b", "10.2.0.0/24", "10.20.0.0/16"),
	peering("a-b", "a, b"),
)

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string][]byte
		// want are substrings of the joined error, each naming file, object
		// and field.
		want []string
	}{
		{
			name:  "malformed YAML",
			files: map[string][]byte{"sites.yaml": []byte("kind: Site\nmetadata: {name: a\n")},
			want:  []string{"sites.yaml: document 1 (line 1): parse YAML: "},
		},
		{
			name:  "malformed YAML in a later document names its line",
			files: map[string][]byte{"sites.yaml": docs(site("a", "10.1.0.0/24", "10.10.0.0/16"), "spec: [\n")},
			want:  []string{"sites.yaml: document 2 (line 9): parse YAML: "},
		},
		{
			name:  "duplicate key",
			files: map[string][]byte{"s.yaml": []byte(site("a", "10.1.0.0/24", "10.10.0.0/16") + "  tunnelMTU: 1400\n  tunnelMTU: 1300\n")},
			want:  []string{"s.yaml: document 1 (line 1): parse YAML: ", "tunnelMTU"},
		},
		{
			name:  "missing kind",
			files: map[string][]byte{"x.yaml": []byte("apiVersion: v1\nmetadata: {name: n}\n")},
			want:  []string{`x.yaml: document 1 (line 1): kind: required`},
		},
		{
			name:  "unknown kind",
			files: map[string][]byte{"x.yaml": []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")},
			want:  []string{`x.yaml: Pod "p": kind: unknown kind "Pod"`},
		},
		{
			name:  "missing apiVersion",
			files: map[string][]byte{"x.yaml": []byte("kind: Site\nmetadata: {name: a}\n")},
			want:  []string{`x.yaml: Site "a": apiVersion: required (want isthmus.dev/v1alpha1)`},
		},
		{
			name:  "old apiVersion of the seed",
			files: map[string][]byte{"x.yaml": []byte("apiVersion: unbounded-cloud.io/v1alpha3\nkind: Site\nmetadata: {name: a}\n")},
			want:  []string{`x.yaml: Site "a": apiVersion: unknown apiVersion "unbounded-cloud.io/v1alpha3" for Site (want isthmus.dev/v1alpha1)`},
		},
		{
			name:  "node with a group apiVersion",
			files: map[string][]byte{"x.yaml": []byte("apiVersion: isthmus.dev/v1alpha1\nkind: Node\nmetadata: {name: n}\n")},
			want:  []string{`x.yaml: Node "n": apiVersion: unknown apiVersion "isthmus.dev/v1alpha1" for Node (want v1)`},
		},
		{
			name:  "missing name",
			files: map[string][]byte{"x.yaml": []byte("\n\napiVersion: isthmus.dev/v1alpha1\nkind: Site\nspec: {}\n")},
			want:  []string{`x.yaml: Site document 1 (line 1): metadata.name: required`},
		},
		{
			name:  "unknown field",
			files: map[string][]byte{"x.yaml": []byte("apiVersion: isthmus.dev/v1alpha1\nkind: Site\nmetadata: {name: a}\nspec: {nodeCIDRs: [10.0.0.0/8]}\n")},
			want:  []string{`x.yaml: Site "a": decode: unknown field "spec.nodeCIDRs"`},
		},
		{
			name: "duplicate names per kind",
			files: map[string][]byte{
				"1.yaml": validSites,
				"2.yaml": docs(site("a", "10.3.0.0/24", "10.30.0.0/16"), node("n", "10.1.0.1", ""), node("n", "10.1.0.2", "")),
			},
			want: []string{
				`2.yaml: Site "a": metadata.name: duplicate name, first defined in 1.yaml`,
				`2.yaml: Node "n": metadata.name: duplicate name, first defined in 2.yaml`,
			},
		},
		{
			name: "invalid CIDR in every CIDR field",
			files: map[string][]byte{"sites.yaml": []byte(`apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: flex-site}
spec:
  nodeCidrs: [192.168.10.0/28, 192.168.10.0/33]
  podCidrAssignments:
    - cidrBlocks: [10.0.0.0/8]
    - cidrBlocks: [300.0.0.0/8]
  localCidrs: [10.0.0.0]
  nonMasqueradeCIDRs: [fd00::/129]
---
apiVersion: v1
kind: Node
metadata: {name: n}
spec:
  podCIDR: 10.1.0.0/24x
  podCIDRs: [10.1.0.0/24x]
status:
  addresses:
    - {type: InternalIP, address: 192.168.10.300}
    - {type: InternalIP, address: 192.168.10.3}
    - {type: ExternalIP, address: "1.2.3"}
`)},
			want: []string{
				`sites.yaml: Site "flex-site": spec.nodeCidrs[1]: invalid CIDR "192.168.10.0/33"`,
				`sites.yaml: Site "flex-site": spec.podCidrAssignments[1].cidrBlocks[0]: invalid CIDR "300.0.0.0/8"`,
				`sites.yaml: Site "flex-site": spec.localCidrs[0]: invalid CIDR "10.0.0.0"`,
				`sites.yaml: Site "flex-site": spec.nonMasqueradeCIDRs[0]: invalid CIDR "fd00::/129"`,
				`sites.yaml: Node "n": spec.podCIDR: invalid CIDR "10.1.0.0/24x"`,
				`sites.yaml: Node "n": spec.podCIDRs[0]: invalid CIDR "10.1.0.0/24x"`,
				`sites.yaml: Node "n": status.addresses[0].address: invalid InternalIP "192.168.10.300"`,
				`sites.yaml: Node "n": status.addresses[2].address: invalid ExternalIP "1.2.3"`,
			},
		},
		{
			name:  "peering of an unknown site",
			files: map[string][]byte{"s.yaml": validSites, "p.yaml": docs(peering("a-c", "a, c"))},
			want:  []string{`p.yaml: SitePeering "a-c": spec.sites[1]: unknown Site "c"`},
		},
		{
			name:  "peering of one site",
			files: map[string][]byte{"s.yaml": validSites, "p.yaml": docs(peering("a-a", "a, a"), peering("a", "a"))},
			want: []string{
				`p.yaml: SitePeering "a-a": spec.sites[1]: site "a" is listed twice`,
				`p.yaml: SitePeering "a-a": spec.sites: a peering needs at least two sites, got 1`,
				`p.yaml: SitePeering "a": spec.sites: a peering needs at least two sites, got 1`,
			},
		},
		{
			name:  "tunnel protocol other than GENEVE",
			files: map[string][]byte{"s.yaml": validSites, "p.yaml": []byte(peering("x", "a, b") + "  tunnelProtocol: VXLAN\n")},
			want:  []string{`p.yaml: SitePeering "x": spec.tunnelProtocol: unsupported tunnel protocol "VXLAN" (want GENEVE)`},
		},
		{
			name: "encryption other than None and WireGuard",
			files: map[string][]byte{"s.yaml": validSites, "p.yaml": docs(
				peering("x", "a, b")+"  encryption: IPsec\n",
				peering("y", "a, b")+"  encryption: WireGuard\n",
				peering("z", "a, b")+"  encryption: None\n")},
			want: []string{`p.yaml: SitePeering "x": spec.encryption: unsupported encryption "IPsec" (want None or WireGuard)`},
		},
		{
			name: "node without InternalIP",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": []byte(`apiVersion: v1
kind: Node
metadata: {name: bare}
status:
  addresses: [{type: ExternalIP, address: 1.2.3.4}]
`)},
			want: []string{`n.yaml: Node "bare": status.addresses: no InternalIP`},
		},
		{
			name:  "node in no site",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": docs(node("lost", "10.9.0.1", ""))},
			want:  []string{`n.yaml: Node "lost": status.addresses: InternalIP 10.9.0.1 is in no Site's spec.nodeCidrs`},
		},
		{
			name: "node in two sites",
			files: map[string][]byte{
				"s.yaml": docs(site("a", "10.1.0.0/24", "10.10.0.0/16"), site("b", "10.1.0.128/25", "10.20.0.0/16")),
				"n.yaml": docs(node("twice", "10.1.0.200", "")),
			},
			want: []string{`n.yaml: Node "twice": status.addresses: InternalIP 10.1.0.200 is in more than one Site: Site "a" spec.nodeCidrs[0] 10.1.0.0/24 in s.yaml and Site "b" spec.nodeCidrs[0] 10.1.0.128/25 in s.yaml`},
		},
		{
			name: "overlapping nodeCidrs",
			files: map[string][]byte{"s.yaml": docs(
				site("a", "10.1.0.0/24", "10.10.0.0/16"),
				site("b", "10.2.0.0/24, 10.0.0.0/8", "10.20.0.0/16"),
			)},
			want: []string{`s.yaml: Site "b": spec.nodeCidrs[1]: 10.0.0.0/8 overlaps Site "a" spec.nodeCidrs[0] 10.1.0.0/24 in s.yaml`},
		},
		{
			name: "overlapping cidrBlocks",
			files: map[string][]byte{
				"a.yaml": docs(site("a", "10.1.0.0/24", "10.10.0.0/16")),
				"b.yaml": docs(site("b", "10.2.0.0/24", "10.10.128.0/17")),
			},
			want: []string{`b.yaml: Site "b": spec.podCidrAssignments[0].cidrBlocks[0]: 10.10.128.0/17 overlaps Site "a" spec.podCidrAssignments[0].cidrBlocks[0] 10.10.0.0/16 in a.yaml`},
		},
		{
			name: "overlapping podCIDRs",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": docs(
				node("a1", "10.1.0.1", "10.10.1.0/24"),
				node("b1", "10.2.0.1", "10.10.0.0/16"),
			)},
			want: []string{`n.yaml: Node "b1": spec.podCIDRs[0]: 10.10.0.0/16 overlaps Node "a1" spec.podCIDRs[0] 10.10.1.0/24 in n.yaml`},
		},
		{
			name:  "podCIDR and podCIDRs disagree",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": []byte(strings.Replace(node("a1", "10.1.0.1", "10.10.1.0/24, 10.10.2.0/24"), "spec:\n", "spec:\n  podCIDR: 10.10.3.0/24\n", 1))},
			want: []string{
				`n.yaml: Node "a1": spec.podCIDR: 10.10.3.0/24 differs from spec.podCIDRs[0] 10.10.1.0/24`,
				`n.yaml: Node "a1": spec.podCIDRs[1]: second prefix of one address family (first is spec.podCIDRs[0])`,
			},
		},
		{
			name:  "unknown returnPath",
			files: map[string][]byte{"s.yaml": []byte(site("a", "10.1.0.0/24", "10.10.0.0/16") + "  manageCniPlugin: false\n  returnPath: Masquerade\n")},
			want:  []string{`s.yaml: Site "a": spec.returnPath: unknown return path "Masquerade" (want Fabric or SNAT)`},
		},
		{
			name: "tunnel annotation not an IPv4 address",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": docs(
				tunnelNode("a1", "10.1.0.1", "", "fd00::4"),
				tunnelNode("a2", "10.1.0.2", "", "100.64.0.2/32"),
				tunnelNode("a3", "10.1.0.3", "", "::ffff:100.64.0.3"),
				tunnelNode("a4", "10.1.0.4", "", ""),
			)},
			want: []string{
				`n.yaml: Node "a1": metadata.annotations["isthmus.dev/tunnel-ipv4"]: "fd00::4" is not an IPv4 address`,
				`n.yaml: Node "a2": metadata.annotations["isthmus.dev/tunnel-ipv4"]: "100.64.0.2/32" is not an IPv4 address`,
				`n.yaml: Node "a3": metadata.annotations["isthmus.dev/tunnel-ipv4"]: "::ffff:100.64.0.3" is not an IPv4 address`,
				`n.yaml: Node "a4": metadata.annotations["isthmus.dev/tunnel-ipv4"]: "" is not an IPv4 address`,
			},
		},
		{
			name: "tunnel annotation not unicast",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": docs(
				tunnelNode("a1", "10.1.0.1", "", "0.0.0.0"),
				tunnelNode("a2", "10.1.0.2", "", "127.0.0.2"),
				tunnelNode("a3", "10.1.0.3", "", "224.0.0.3"),
				tunnelNode("a4", "10.1.0.4", "", "169.254.0.4"),
				tunnelNode("a5", "10.1.0.5", "", "255.255.255.255"),
			)},
			want: []string{
				`n.yaml: Node "a1": metadata.annotations["isthmus.dev/tunnel-ipv4"]: 0.0.0.0 is not a unicast address a peer can route to`,
				`n.yaml: Node "a2": metadata.annotations["isthmus.dev/tunnel-ipv4"]: 127.0.0.2 is not a unicast`,
				`n.yaml: Node "a3": metadata.annotations["isthmus.dev/tunnel-ipv4"]: 224.0.0.3 is not a unicast`,
				`n.yaml: Node "a4": metadata.annotations["isthmus.dev/tunnel-ipv4"]: 169.254.0.4 is not a unicast`,
				`n.yaml: Node "a5": metadata.annotations["isthmus.dev/tunnel-ipv4"]: 255.255.255.255 is not a unicast`,
			},
		},
		{
			name: "tunnel address is an underlay address",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": docs(
				tunnelNode("a1", "10.1.0.1", "", "10.2.0.1"),
				tunnelNode("a2", "10.1.0.2", "", "10.1.0.2"),
				node("b1", "10.2.0.1", ""),
				// b2's podCIDR starts at a1's underlay address.
				node("b2", "10.2.0.2", "10.1.0.0/30"),
			)},
			want: []string{
				`n.yaml: Node "a1": metadata.annotations["isthmus.dev/tunnel-ipv4"]: tunnel address 10.2.0.1 is an underlay address: Node "b1" status.addresses[0] 10.2.0.1 in n.yaml`,
				`n.yaml: Node "a2": metadata.annotations["isthmus.dev/tunnel-ipv4"]: tunnel address 10.1.0.2 is an underlay address: Node "a2" status.addresses[0] 10.1.0.2 in n.yaml`,
				`n.yaml: Node "b2": spec.podCIDRs[0]: tunnel address 10.1.0.1 (the first address of spec.podCIDRs[0]) is an underlay address: Node "a1" status.addresses[0] 10.1.0.1 in n.yaml`,
			},
		},
		{
			name: "tunnel address inside a podCIDR or a pod block",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": docs(
				node("b1", "10.2.0.1", "10.20.1.0/24"),
				tunnelNode("a1", "10.1.0.1", "", "10.20.1.9"),
				tunnelNode("a2", "10.1.0.2", "10.10.2.0/24", "10.10.2.7"),
				tunnelNode("a3", "10.1.0.3", "", "10.10.200.1"),
			)},
			want: []string{
				`n.yaml: Node "a1": metadata.annotations["isthmus.dev/tunnel-ipv4"]: tunnel address 10.20.1.9 is inside Node "b1" spec.podCIDRs[0] 10.20.1.0/24 in n.yaml`,
				`n.yaml: Node "a2": metadata.annotations["isthmus.dev/tunnel-ipv4"]: tunnel address 10.10.2.7 is a pod address of the node's own spec.podCIDRs[0] 10.10.2.0/24: use 10.10.2.1 (its first address, the default) or an address outside every pod block`,
				`n.yaml: Node "a3": metadata.annotations["isthmus.dev/tunnel-ipv4"]: tunnel address 10.10.200.1 is inside a pod block, where a pod may get it: Site "a" spec.podCidrAssignments[0].cidrBlocks[0] 10.10.0.0/16 in s.yaml`,
			},
		},
		{
			name: "tunnel addresses not unique",
			files: map[string][]byte{"s.yaml": validSites, "n.yaml": docs(
				node("b1", "10.2.0.1", "10.20.1.0/24"),
				tunnelNode("a1", "10.1.0.1", "", "100.64.0.1"),
				tunnelNode("a2", "10.1.0.2", "", "100.64.0.1"),
			)},
			want: []string{
				`n.yaml: Node "a2": metadata.annotations["isthmus.dev/tunnel-ipv4"]: tunnel address 100.64.0.1 is also the tunnel address of Node "a1" metadata.annotations["isthmus.dev/tunnel-ipv4"] 100.64.0.1 in n.yaml`,
			},
		},
		{
			name: "every error at once",
			files: map[string][]byte{
				"s.yaml": docs(site("a", "10.1.0.0/33", "10.10.0.0/16"), peering("p", "a, zz")),
				"n.yaml": docs(node("lost", "10.9.0.1", ""), "kind: Gadget\napiVersion: v1\n"),
			},
			want: []string{
				`s.yaml: Site "a": spec.nodeCidrs[0]: invalid CIDR "10.1.0.0/33"`,
				`s.yaml: SitePeering "p": spec.sites[1]: unknown Site "zz"`,
				`n.yaml: Node "lost": status.addresses: InternalIP 10.9.0.1 is in no Site's spec.nodeCidrs`,
				`n.yaml: document 2 (line 10): kind: unknown kind "Gadget"`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, _, err := Load(tt.files)
			if err == nil {
				t.Fatalf("Load succeeded, want errors %q", tt.want)
			}
			if set != nil {
				t.Errorf("Load returned a Set along with an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q; got:\n%v", w, err)
				}
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error %v holds no *Error", err)
			}
			checkSharedPath(t, tt.files, err)
			checkSetAside(t, tt.files, err)
		})
	}
}

func TestLoadNormalizes(t *testing.T) {
	files := map[string][]byte{"sites.yaml": []byte(`apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: cluster}
spec:
  nodeCidrs: [10.0.0.7/27]
  podCidrAssignments:
    - cidrBlocks: [10.0.2.5/23, "2001:DB8:0::/48"]
  localCidrs: [10.0.0.0/16]
  nonMasqueradeCIDRs: [10.0.0.1/8]
---
apiVersion: v1
kind: Node
metadata: {name: n}
spec:
  podCIDR: 10.0.4.9/24
status:
  addresses: [{type: InternalIP, address: 10.0.0.4}]
`)}
	set, warnings, err := Load(files)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range warnings {
		got = append(got, w.String())
	}
	want := []string{
		`sites.yaml: Site "cluster": spec.nodeCidrs[0]: 10.0.0.7/27 has host bits set; normalized to 10.0.0.0/27`,
		`sites.yaml: Site "cluster": spec.podCidrAssignments[0].cidrBlocks[0]: 10.0.2.5/23 has host bits set; normalized to 10.0.2.0/23`,
		`sites.yaml: Site "cluster": spec.nonMasqueradeCIDRs[0]: 10.0.0.1/8 has host bits set; normalized to 10.0.0.0/8`,
		`sites.yaml: Node "n": spec.podCIDR: 10.0.4.9/24 has host bits set; normalized to 10.0.4.0/24`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	spec := set.Sites[0].Spec
	if got, want := fmt.Sprint(spec.NodeCIDRs, spec.PodCIDRAssignments[0].CIDRBlocks, spec.NonMasqueradeCIDRs), "[10.0.0.0/27] [10.0.2.0/23 2001:db8::/48] [10.0.0.0/8]"; got != want {
		t.Errorf("normalized site CIDRs = %s, want %s", got, want)
	}
	if got, want := set.Nodes[0].Spec.PodCIDR, "10.0.4.0/24"; got != want {
		t.Errorf("normalized podCIDR = %s, want %s", got, want)
	}
}

func TestLoadDirSeed000(t *testing.T) {
	set, warnings, err := LoadDir("testdata/seed000")
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings: %v", warnings)
	}
	var names []string
	for _, n := range set.Nodes {
		names = append(names, n.Name+"@"+set.SiteOf(&n).Name)
	}
	if diff := cmp.Diff([]string{"aks-nodepool1-0@cluster", "aks-nodepool1-1@cluster", "flex-1@flex-site"}, names); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	cluster := set.Site("cluster")
	if cluster == nil || cluster.Spec.ManagesCNIPlugin() {
		t.Errorf("Site cluster = %+v, want manageCniPlugin false", cluster)
	}
	if flex := set.Site("flex-site"); flex == nil || !flex.Spec.ManagesCNIPlugin() || flex.Spec.PodCIDRAssignments[0].NodeBlockSizes.IPv4 != 25 {
		t.Errorf("Site flex-site = %+v, want managed with ipv4 block size 25", flex)
	}
	if p := set.SitePeerings[0]; p.Name != "cluster-flex" || !p.Spec.MeshesNodes() {
		t.Errorf("SitePeering = %+v, want cluster-flex meshing nodes", p)
	}
	if got := len(set.NodesOf("cluster")); got != 2 {
		t.Errorf("NodesOf(cluster) has %d nodes, want 2", got)
	}
	if a, _, ok := TunnelAddr(set.Node("aks-nodepool1-1")); !ok || a != netip.MustParseAddr("100.64.0.5") {
		t.Errorf("tunnel address of aks-nodepool1-1 = %v %v, want 100.64.0.5", a, ok)
	}
}

// TestLoadTunnelAddrValid loads tunnel addresses every rule accepts, so the
// error cases above cannot pass by rejecting everything.
func TestLoadTunnelAddrValid(t *testing.T) {
	_, warnings, err := Load(map[string][]byte{"s.yaml": validSites, "n.yaml": docs(
		tunnelNode("a1", "10.1.0.1", "10.10.1.0/24", "10.10.1.1"),
		tunnelNode("a2", "10.1.0.2", "10.10.2.0/24", "100.64.0.2"),
		tunnelNode("a3", "10.1.0.3", "", "100.64.0.3"),
		node("b1", "10.2.0.1", "10.20.1.0/24"),
	)})
	if err != nil || len(warnings) != 0 {
		t.Errorf("Load: %v, warnings %v", err, warnings)
	}
}

func TestTunnelAddr(t *testing.T) {
	set, _, err := Load(map[string][]byte{"s.yaml": validSites, "n.yaml": docs(
		node("a1", "10.1.0.1", "10.10.1.0/24"),
		tunnelNode("a2", "10.1.0.2", "10.10.2.0/24", "100.64.0.2"),
		tunnelNode("a3", "10.1.0.3", "", "100.64.0.3"),
		node("a4", "10.1.0.4", `"fd00:10:4::/64"`),
		node("a5", "10.1.0.5", ""),
		node("a6", "10.1.0.6", "10.10.6.0/32"),
	)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range set.Nodes {
		a, origin, ok := TunnelAddr(&n)
		got = append(got, fmt.Sprintf("%s %v %s %v", n.Name, a, origin, ok))
	}
	want := []string{
		`a1 10.10.1.1 Node "a1" spec.podCIDRs[0] true`,
		`a2 100.64.0.2 Node "a2" metadata.annotations["isthmus.dev/tunnel-ipv4"] true`,
		`a3 100.64.0.3 Node "a3" metadata.annotations["isthmus.dev/tunnel-ipv4"] true`,
		`a4 invalid IP  false`,
		`a5 invalid IP  false`,
		`a6 invalid IP  false`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("TunnelAddr (-want +got):\n%s", diff)
	}
}

func TestLoadReturnPath(t *testing.T) {
	set, warnings, err := Load(map[string][]byte{"s.yaml": docs(
		site("a", "10.1.0.0/24", "10.10.0.0/16")+"  manageCniPlugin: false\n  returnPath: SNAT\n",
		site("b", "10.2.0.0/24", "10.20.0.0/16")+"  returnPath: SNAT\n",
		site("c", "10.3.0.0/24", "10.30.0.0/16")+"  manageCniPlugin: false\n  returnPath: Fabric\n",
	)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range warnings {
		got = append(got, w.String())
	}
	want := []string{`s.yaml: Site "b": spec.returnPath: SNAT has no effect while manageCniPlugin is true: every pod source is in a node's podCIDR, which peers route back`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	if a, c := set.Site("a").Spec.ReturnPathOrDefault(), set.Site("c").Spec.ReturnPathOrDefault(); a != "SNAT" || c != "Fabric" {
		t.Errorf("returnPath a, c = %s, %s, want SNAT, Fabric", a, c)
	}
}

func TestLoadDocumentsAndLists(t *testing.T) {
	files := map[string][]byte{
		"a.yaml": []byte("# comments only\n---\n" + site("a", "10.1.0.0/24", "10.10.0.0/16") + "--- # next\n" +
			site("b", "10.2.0.0/24", "10.20.0.0/16") + "---\n---\n"),
		"nodes.yml": []byte(`apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Node
    metadata: {name: b1}
    status: {addresses: [{type: InternalIP, address: 10.2.0.1}]}
  - apiVersion: v1
    kind: Node
    metadata: {name: a1}
    status: {addresses: [{type: InternalIP, address: 10.1.0.1}]}
`),
	}
	set, _, err := Load(files)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%d %s %s", len(set.Sites), set.Nodes[0].Name, set.Nodes[1].Name); got != "2 a1 b1" {
		t.Errorf("sites, nodes = %s, want 2 a1 b1", got)
	}
}

func TestNodeHelpers(t *testing.T) {
	set, _, err := Load(map[string][]byte{"x.yaml": docs(site("a", "10.1.0.0/24, fd00:1::/64", "10.10.0.0/16"), `apiVersion: v1
kind: Node
metadata: {name: dual}
spec:
  podCIDR: fd00:10::/64
  podCIDRs: ["fd00:10::/64", 10.10.1.0/24]
status:
  addresses:
    - {type: InternalIP, address: "fd00:1::5"}
    - {type: ExternalIP, address: "2001:db8::1"}
    - {type: InternalIP, address: 10.1.0.5}
    - {type: ExternalIP, address: 203.0.113.5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	n := set.Node("dual")
	if ip, ok := InternalIP(n); !ok || ip != netip.MustParseAddr("10.1.0.5") {
		t.Errorf("InternalIP = %v %v, want 10.1.0.5", ip, ok)
	}
	if ip, ok := ExternalIP(n); !ok || ip != netip.MustParseAddr("203.0.113.5") {
		t.Errorf("ExternalIP = %v %v, want 203.0.113.5", ip, ok)
	}
	want := []FieldPrefix{
		{netip.MustParsePrefix("10.10.1.0/24"), "spec.podCIDRs[1]"},
		{netip.MustParsePrefix("fd00:10::/64"), "spec.podCIDRs[0]"},
	}
	if diff := cmp.Diff(want, PodCIDRFields(n), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("PodCIDRFields (-want +got):\n%s", diff)
	}
	if set.Node("none") != nil || set.Site("none") != nil {
		t.Errorf("lookup of a missing name returned an object")
	}
}

// TestNodeFieldQuotes: the shortcut for plain names gives what
// strconv.Quote gives, and names that need escaping still get it.
func TestNodeFieldQuotes(t *testing.T) {
	for _, name := range []string{"site-001-node-002", "a.b", "", `we"ird`, `back\slash`, "tab\there", "ünï", "\x7f"} {
		if got, want := NodeField(name, "f"), "Node "+strconv.Quote(name)+" f"; got != want {
			t.Errorf("NodeField(%q) = %s, want %s", name, got, want)
		}
	}
}
