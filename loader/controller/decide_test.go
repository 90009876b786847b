package controller

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func pfxs(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, pfx(s))
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func cidrs(ss ...string) []v1alpha1.CIDR {
	var out []v1alpha1.CIDR
	for _, s := range ss {
		out = append(out, v1alpha1.CIDR(s))
	}
	return out
}

// mkSite builds a Site; manage nil leaves manageCniPlugin unset (true).
func mkSite(name string, nodeCIDRs []string, manage *bool, as ...v1alpha1.PodCIDRAssignment) v1alpha1.Site {
	s := v1alpha1.Site{}
	s.Name = name
	s.Generation = 1
	s.Spec.NodeCIDRs = cidrs(nodeCIDRs...)
	s.Spec.ManageCNIPlugin = manage
	s.Spec.PodCIDRAssignments = as
	return s
}

func assign(blocks ...string) v1alpha1.PodCIDRAssignment {
	return v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs(blocks...)}
}

// mkNode builds a Node with an InternalIP, optional podCIDRs and an optional
// tunnel annotation ("" for none).
func mkNode(name, ip, tunnel string, podCIDRs ...string) corev1.Node {
	n := corev1.Node{}
	n.Name = name
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR = podCIDRs[0]
		n.Spec.PodCIDRs = podCIDRs
	}
	if tunnel != "" {
		n.Annotations = map[string]string{v1alpha1.AnnotationTunnelIPv4: tunnel}
	}
	return n
}

func labeled(n corev1.Node, site string) corev1.Node {
	n.Labels = map[string]string{LabelSite: site}
	return n
}

// seed000 loads the sites of seed 000 (the cluster Site with
// manageCniPlugin false and pool 10.0.2.0/23, flex-site with
// 192.168.20.0/24 carved into /25s) with the nodes of a fresh cluster: no
// podCIDRs, no annotations.
func seed000(t *testing.T, extra ...corev1.Node) ([]v1alpha1.Site, []corev1.Node) {
	t.Helper()
	dir := filepath.Join("..", "objects", "testdata", "seed000")
	set, _, err := objects.LoadDir(dir)
	if err != nil {
		t.Fatalf("load seed 000: %v", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	var nodes []corev1.Node
	for _, n := range set.Nodes {
		n.Annotations = nil
		n.Spec.PodCIDR, n.Spec.PodCIDRs = "", nil
		nodes = append(nodes, n)
	}
	return set.Sites, append(nodes, extra...)
}

func TestFirstFree(t *testing.T) {
	tests := []struct {
		name  string
		pool  string
		bits  int
		taken []string
		want  string // "" for none
	}{
		{"empty pool", "192.168.20.0/24", 25, nil, "192.168.20.0/25"},
		{"first taken", "192.168.20.0/24", 25, []string{"192.168.20.0/25"}, "192.168.20.128/25"},
		{"full", "192.168.20.0/24", 25, []string{"192.168.20.0/25", "192.168.20.128/25"}, ""},
		{"covered by a bigger prefix", "10.0.2.0/23", 24, []string{"10.0.0.0/16"}, ""},
		{"small prefix inside the first block", "10.0.2.0/23", 24, []string{"10.0.2.200/30"}, "10.0.3.0/24"},
		{"host address", "100.64.0.0/16", 32, []string{"100.64.0.0/32", "100.64.0.1/32", "100.64.0.3/32"}, "100.64.0.2/32"},
		{"unsorted and nested", "10.1.0.0/16", 24, []string{"10.1.1.0/24", "10.1.0.0/23", "10.1.0.5/32", "10.1.3.0/24"}, "10.1.2.0/24"},
		{"outside the pool ignored", "10.0.2.0/23", 24, []string{"10.0.12.0/24", "10.0.4.0/22"}, "10.0.2.0/24"},
		{"other family ignored", "10.0.2.0/23", 24, []string{"::/0"}, "10.0.2.0/24"},
		{"block larger than pool", "192.168.20.0/25", 24, nil, ""},
		{"end of the address space", "255.255.255.0/24", 25, []string{"255.255.255.0/25", "255.255.255.128/26"}, ""},
		{"ipv6", "fd00::/48", 64, []string{"fd00::/64", "fd00:0:0:1::/64"}, "fd00:0:0:2::/64"},
		{"ipv6 end of space", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120", 121, []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120"}, ""},
		{"host bits in pool", "10.0.2.7/23", 24, nil, "10.0.2.0/24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := firstFree(pfx(tt.pool), tt.bits, pfxs(tt.taken...))
			gotS := ""
			if ok {
				gotS = got.String()
			}
			if gotS != tt.want {
				t.Errorf("firstFree(%s, /%d, %v) = %q, want %q", tt.pool, tt.bits, tt.taken, gotS, tt.want)
			}
		})
	}
}

// TestFirstFreeLargePool checks the walk jumps over taken prefixes instead of
// stepping block by block: the 65536th /64 of a /48 must come back at once.
func TestFirstFreeLargePool(t *testing.T) {
	taken := []netip.Prefix{pfx("fd00::/49"), pfx("fd00:0:0:8000::/50"), pfx("fd00:0:0:c000::/51")}
	start := time.Now()
	got, ok := firstFree(pfx("fd00::/48"), 64, taken)
	if !ok || got != pfx("fd00:0:0:e000::/64") {
		t.Fatalf("firstFree = %v %v, want fd00:0:0:e000::/64", got, ok)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("firstFree took %v", d)
	}
}

func TestSiteLabels(t *testing.T) {
	sites := []v1alpha1.Site{
		mkSite("a", []string{"10.0.0.0/24"}, nil),
		mkSite("b", []string{"10.1.0.0/24", "10.9.0.0/24"}, nil),
		mkSite("c", []string{"10.9.0.0/25"}, nil), // overlaps b
		mkSite(strings.Repeat("x", 64), []string{"10.2.0.0/24"}, nil),
	}
	nodes := []corev1.Node{
		mkNode("a-1", "10.0.0.1", ""),
		labeled(mkNode("b-1", "10.1.0.1", ""), "a"), // wrong label
		labeled(mkNode("nowhere", "172.16.0.1", ""), "a"),
		mkNode("both", "10.9.0.1", ""),
		mkNode("long", "10.2.0.1", ""),
		{ObjectMeta: metav1.ObjectMeta{Name: "no-ip"}},
	}
	want := map[string]string{"a-1": "a", "b-1": "b", "nowhere": "", "both": "", "long": "", "no-ip": ""}
	if diff := cmp.Diff(want, SiteLabels(sites, nodes)); diff != "" {
		t.Errorf("SiteLabels (-want +got):\n%s", diff)
	}
	d := Decide(Input{Sites: sites, Nodes: nodes, TunnelCIDR: DefaultTunnelCIDR})
	wantChanges := map[string]string{"a-1": "a", "b-1": "b", "nowhere": ""}
	if diff := cmp.Diff(wantChanges, d.Labels); diff != "" {
		t.Errorf("Decide labels (-want +got):\n%s", diff)
	}
}

func TestAssignPodCIDRs(t *testing.T) {
	f := false
	tr := true
	tests := []struct {
		name      string
		sites     []v1alpha1.Site
		nodes     []corev1.Node
		want      map[string][]netip.Prefix
		exhausted []Exhaustion
	}{{
		name: "unmanaged site assigns nothing by default",
		sites: []v1alpha1.Site{
			mkSite("cluster", []string{"10.0.0.0/27"}, &f, assign("10.0.2.0/23")),
		},
		nodes: []corev1.Node{mkNode("aks-0", "10.0.0.4", "")},
		want:  map[string][]netip.Prefix{},
	}, {
		name: "explicit assignmentEnabled true on an unmanaged site assigns, never outside the pool",
		sites: []v1alpha1.Site{
			mkSite("cluster", []string{"10.0.0.0/27"}, &f, v1alpha1.PodCIDRAssignment{
				CIDRBlocks: cidrs("10.0.2.0/23"), AssignmentEnabled: &tr,
			}),
		},
		nodes: []corev1.Node{
			mkNode("aks-0", "10.0.0.4", "", "10.0.12.0/24"), // the stray block of seed 000
			mkNode("aks-1", "10.0.0.5", "", "10.0.2.0/24"),
			mkNode("aks-2", "10.0.0.6", ""),
			mkNode("aks-3", "10.0.0.7", ""),
		},
		want: map[string][]netip.Prefix{"aks-2": pfxs("10.0.3.0/24")},
		exhausted: []Exhaustion{{Site: "cluster", Node: "aks-3",
			Missing: []string{"IPv4 /24 in spec.podCidrAssignments[0].cidrBlocks (10.0.2.0/23)"}}},
	}, {
		name: "explicit assignmentEnabled false on a managed site assigns nothing",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil, v1alpha1.PodCIDRAssignment{
				CIDRBlocks: cidrs("10.1.0.0/16"), AssignmentEnabled: &f,
			}),
		},
		nodes: []corev1.Node{mkNode("n", "10.0.0.1", "")},
		want:  map[string][]netip.Prefix{},
	}, {
		name: "priority first, then written order, nodeRegex filters",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil,
				assign("10.1.0.0/16"),
				v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs("10.2.0.0/16"), Priority: 10, NodeRegex: "^gpu-"},
				v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs("10.3.0.0/16"), Priority: 5},
				v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs("10.4.0.0/16"), Priority: 5},
			),
		},
		nodes: []corev1.Node{
			mkNode("gpu-1", "10.0.0.1", ""),
			mkNode("cpu-1", "10.0.0.2", ""),
			mkNode("cpu-gpu-1", "10.0.0.3", ""), // unanchored would match "gpu-"; ^ anchors
		},
		want: map[string][]netip.Prefix{
			"gpu-1":     pfxs("10.2.0.0/24"),
			"cpu-1":     pfxs("10.3.0.0/24"),
			"cpu-gpu-1": pfxs("10.3.1.0/24"),
		},
	}, {
		name: "a full high-priority pool falls through to the next",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil,
				v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs("10.1.0.0/24"), Priority: 1},
				assign("10.2.0.0/16"),
			),
		},
		nodes: []corev1.Node{mkNode("a", "10.0.0.1", ""), mkNode("b", "10.0.0.2", "")},
		want:  map[string][]netip.Prefix{"a": pfxs("10.1.0.0/24"), "b": pfxs("10.2.0.0/24")},
	}, {
		name: "unanchored nodeRegex matches anywhere in the name",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil,
				v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs("10.2.0.0/16"), NodeRegex: "edge"},
			),
		},
		nodes: []corev1.Node{mkNode("rack-edge-1", "10.0.0.1", ""), mkNode("core-1", "10.0.0.2", "")},
		want:  map[string][]netip.Prefix{"rack-edge-1": pfxs("10.2.0.0/24")},
	}, {
		name: "invalid nodeRegex matches nothing",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil,
				v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs("10.2.0.0/16"), NodeRegex: "("},
			),
		},
		nodes: []corev1.Node{mkNode("n", "10.0.0.1", "")},
		want:  map[string][]netip.Prefix{},
	}, {
		name: "dual stack with default sizes, and nodeBlockSizes per family",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil,
				v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs("fd00:1::/48", "10.1.0.0/16"), NodeRegex: "^a$"},
				v1alpha1.PodCIDRAssignment{CIDRBlocks: cidrs("10.2.0.0/16", "fd00:2::/48"), NodeRegex: "^b$",
					NodeBlockSizes: &v1alpha1.NodeBlockSizes{IPv4: 26, IPv6: 80}},
			),
		},
		nodes: []corev1.Node{mkNode("a", "10.0.0.1", ""), mkNode("b", "10.0.0.2", "")},
		want: map[string][]netip.Prefix{
			"a": pfxs("10.1.0.0/24", "fd00:1::/64"),
			"b": pfxs("10.2.0.0/26", "fd00:2::/80"),
		},
	}, {
		name: "dual stack with one family full assigns neither",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16", "fd00::/64")),
		},
		nodes: []corev1.Node{mkNode("a", "10.0.0.1", "", "10.1.0.0/24", "fd00::/64"), mkNode("b", "10.0.0.2", "")},
		want:  map[string][]netip.Prefix{},
		exhausted: []Exhaustion{{Site: "s", Node: "b",
			Missing: []string{"IPv6 /64 in spec.podCidrAssignments[0].cidrBlocks (fd00::/64)"}}},
	}, {
		name: "blocks of other nodes count as taken across sites and outside pools",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/22")),
			mkSite("t", []string{"10.9.0.0/24"}, nil),
		},
		nodes: []corev1.Node{
			mkNode("other-site", "10.9.0.1", "", "10.1.0.0/24"),
			mkNode("nowhere", "172.16.0.1", "", "10.1.1.0/25"),
			mkNode("n", "10.0.0.1", ""),
		},
		want: map[string][]netip.Prefix{"n": pfxs("10.1.2.0/24")},
	}, {
		name: "blocks two Sites claim are never handed out",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16", "10.5.0.0/16")),
			mkSite("t", []string{"10.9.0.0/24"}, nil, assign("10.1.128.0/17")),
		},
		nodes: []corev1.Node{mkNode("s-1", "10.0.0.1", ""), mkNode("t-1", "10.9.0.1", "")},
		// t's only block conflicts, so t-1 has no pool at all (not a full
		// one): the Invalid condition says why.
		want: map[string][]netip.Prefix{"s-1": pfxs("10.5.0.0/24")},
	}, {
		name: "a node two Sites claim gets nothing",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16")),
			mkSite("t", []string{"10.0.0.0/25"}, nil, assign("10.2.0.0/16")),
		},
		nodes: []corev1.Node{mkNode("n", "10.0.0.1", "")},
		want:  map[string][]netip.Prefix{},
	}, {
		name: "a node with only a podCIDR of one family is never touched",
		sites: []v1alpha1.Site{
			mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16", "fd00::/48")),
		},
		nodes: []corev1.Node{func() corev1.Node {
			n := mkNode("n", "10.0.0.1", "")
			n.Spec.PodCIDR = "10.1.0.0/24" // podCIDRs empty: an old-style node
			return n
		}()},
		want: map[string][]netip.Prefix{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, exhausted := AssignPodCIDRs(tt.sites, tt.nodes)
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("podCIDRs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.exhausted, exhausted); diff != "" {
				t.Errorf("exhausted (-want +got):\n%s", diff)
			}
			checkInsidePools(t, tt.sites, tt.nodes, got)
		})
	}
}

// checkInsidePools fails when a block lies outside its node's Site's
// declared cidrBlocks: seed 000's stray 10.0.12.0/24 must be impossible.
func checkInsidePools(t *testing.T, sites []v1alpha1.Site, nodes []corev1.Node, got map[string][]netip.Prefix) {
	t.Helper()
	m := sitesOf(sites, nodes)
	for node, ps := range got {
		site := m.site(node)
		if site == nil {
			t.Errorf("%s got %v but has no site", node, ps)
			continue
		}
		if !inPools(ps, site) {
			t.Errorf("%s got %v, outside Site %q's cidrBlocks", node, ps, site.Name)
		}
	}
}

func TestAssignTunnelAddrs(t *testing.T) {
	sites := []v1alpha1.Site{
		mkSite("s", []string{"10.0.0.0/24", "100.64.0.8/30"}, nil, assign("100.64.1.0/24")),
	}
	underlay := mkNode("underlay", "100.64.0.9", "") // InternalIP inside the tunnel CIDR
	withExternal := mkNode("ext", "10.0.0.9", "", "10.1.0.0/24")
	withExternal.Status.Addresses = append(withExternal.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "100.64.0.2"})
	nodes := []corev1.Node{
		mkNode("a", "10.0.0.1", ""),
		mkNode("b", "10.0.0.2", "100.64.0.1"), // user's annotation, kept
		mkNode("c", "10.0.0.3", "bogus"),      // invalid, still never overwritten
		mkNode("d", "10.0.0.4", "", "10.1.1.0/24"),
		mkNode("e", "10.0.0.5", "", "fd00::/64"), // IPv6 podCIDR only: still needs one
		mkNode("f", "10.0.0.6", ""),
		mkNode("g", "10.0.0.7", "", "100.64.0.4/30"), // a podCIDR in the tunnel CIDR
		mkNode("outside", "172.16.0.1", ""),
		underlay, withExternal,
	}
	got, pending := AssignTunnelAddrs(DefaultTunnelCIDR, sites, nodes)
	want := map[string]netip.Addr{
		"a":        netip.MustParseAddr("100.64.0.3"),
		"e":        netip.MustParseAddr("100.64.0.12"),
		"f":        netip.MustParseAddr("100.64.0.13"),
		"underlay": netip.MustParseAddr("100.64.0.14"),
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("AssignTunnelAddrs (-want +got):\n%s", diff)
	}
	if len(pending) != 0 {
		t.Errorf("pending = %v, want none", pending)
	}

	// A /30 has two usable addresses: the third node waits.
	got, pending = AssignTunnelAddrs(pfx("100.65.0.0/30"), sites, nodes)
	if len(got) != 2 || got["a"] != netip.MustParseAddr("100.65.0.1") || got["e"] != netip.MustParseAddr("100.65.0.2") {
		t.Errorf("small CIDR: got %v", got)
	}
	if diff := cmp.Diff([]string{"f", "underlay"}, pending); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}
}

// apply returns in with d applied, as the reconciler would leave the
// cluster.
func apply(in Input, d Decision) Input {
	out := in
	out.Nodes = make([]corev1.Node, len(in.Nodes))
	for i := range in.Nodes {
		n := *in.Nodes[i].DeepCopy()
		if v, ok := d.Labels[n.Name]; ok {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			if v == "" {
				delete(n.Labels, LabelSite)
			} else {
				n.Labels[LabelSite] = v
			}
		}
		if ps, ok := d.PodCIDRs[n.Name]; ok {
			n.Spec.PodCIDR = ps[0].String()
			for _, p := range ps {
				n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, p.String())
			}
		}
		if a, ok := d.TunnelAddrs[n.Name]; ok {
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[v1alpha1.AnnotationTunnelIPv4] = a.String()
		}
		out.Nodes[i] = n
	}
	out.Sites = make([]v1alpha1.Site, len(in.Sites))
	for i := range in.Sites {
		s := *in.Sites[i].DeepCopy()
		if st, ok := d.Statuses[s.Name]; ok {
			s.Status = st
		}
		out.Sites[i] = s
	}
	return out
}

func condition(t *testing.T, st v1alpha1.SiteStatus, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(st.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, st.Conditions)
	}
	return *c
}

// TestSeed000 is seed 000 on a fresh cluster with two more Flex nodes: the
// AKS nodes of the unmanaged cluster Site get no podCIDR but tunnel
// addresses, flex-1 and flex-2 split 192.168.20.0/24 into /25s, flex-3
// finds the pool exhausted and the condition names it.
func TestSeed000(t *testing.T) {
	sites, nodes := seed000(t,
		mkNode("flex-2", "192.168.10.11", ""),
		mkNode("flex-3", "192.168.10.12", ""),
	)
	now := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	in := Input{Sites: sites, Nodes: nodes, TunnelCIDR: DefaultTunnelCIDR, Now: now}
	d := Decide(in)

	cmpAddr := cmp.Comparer(func(a, b netip.Addr) bool { return a == b })
	cmpPfx := cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })
	if diff := cmp.Diff(map[string]string{
		"aks-nodepool1-0": "cluster", "aks-nodepool1-1": "cluster",
		"flex-1": "flex-site", "flex-2": "flex-site", "flex-3": "flex-site",
	}, d.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string][]netip.Prefix{
		"flex-1": pfxs("192.168.20.0/25"), "flex-2": pfxs("192.168.20.128/25"),
	}, d.PodCIDRs, cmpPfx); diff != "" {
		t.Errorf("podCIDRs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]netip.Addr{
		"aks-nodepool1-0": netip.MustParseAddr("100.64.0.1"),
		"aks-nodepool1-1": netip.MustParseAddr("100.64.0.2"),
		"flex-3":          netip.MustParseAddr("100.64.0.3"),
	}, d.TunnelAddrs, cmpAddr); diff != "" {
		t.Errorf("tunnel addresses (-want +got):\n%s", diff)
	}
	flex := d.Statuses["flex-site"]
	pe := condition(t, flex, v1alpha1.ConditionPoolExhausted)
	wantMsg := "no free IPv4 /25 in spec.podCidrAssignments[0].cidrBlocks (192.168.20.0/24) for node flex-3"
	if pe.Status != metav1.ConditionTrue || pe.Message != wantMsg {
		t.Errorf("flex-site PoolExhausted = %s %q, want True %q", pe.Status, pe.Message, wantMsg)
	}
	if r := condition(t, flex, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != v1alpha1.ReasonPoolExhausted {
		t.Errorf("flex-site Ready = %s %s", r.Status, r.Reason)
	}
	cl := d.Statuses["cluster"]
	if c := condition(t, cl, v1alpha1.ConditionPoolExhausted); c.Status != metav1.ConditionFalse {
		t.Errorf("cluster PoolExhausted = %s %q", c.Status, c.Message)
	}
	if c := condition(t, cl, v1alpha1.ConditionInvalid); c.Status != metav1.ConditionFalse {
		t.Errorf("cluster Invalid = %s %q", c.Status, c.Message)
	}
	r := condition(t, cl, v1alpha1.ConditionReady)
	if r.Status != metav1.ConditionFalse || r.Reason != v1alpha1.ReasonNodesPending ||
		r.Message != "waiting for aks-nodepool1-0 (site label, tunnel address), aks-nodepool1-1 (site label, tunnel address)" {
		t.Errorf("cluster Ready before apply = %s %s %q", r.Status, r.Reason, r.Message)
	}
	if r.LastTransitionTime != now || r.ObservedGeneration != cl.ObservedGeneration {
		t.Errorf("cluster Ready time/generation = %v/%d", r.LastTransitionTime, r.ObservedGeneration)
	}

	// The pass after the patches land: Ready of the cluster Site turns True,
	// the counts catch up, no node changes, and flex-site stays exhausted.
	later := metav1.NewTime(now.Add(time.Minute))
	in2 := apply(in, d)
	in2.Now = later
	d2 := Decide(in2)
	if len(d2.Labels)+len(d2.PodCIDRs)+len(d2.TunnelAddrs) != 0 {
		t.Errorf("second pass changes nodes: %+v", d2)
	}
	if diff := cmp.Diff(flex.Conditions, d2.Statuses["flex-site"].Conditions); diff != "" {
		t.Errorf("flex-site conditions changed on the second pass (-first +second):\n%s", diff)
	}
	if st := d2.Statuses["flex-site"]; st.Nodes != 3 || st.PodCIDRsAssigned != 2 || st.TunnelAddresses != 1 {
		t.Errorf("flex-site counts = %d nodes, %d podCIDRs, %d tunnel", st.Nodes, st.PodCIDRsAssigned, st.TunnelAddresses)
	}
	r = condition(t, d2.Statuses["cluster"], v1alpha1.ConditionReady)
	if r.Status != metav1.ConditionTrue || r.LastTransitionTime != later {
		t.Errorf("cluster Ready after apply = %s at %v: %q", r.Status, r.LastTransitionTime, r.Message)
	}
	if c := condition(t, d2.Statuses["cluster"], v1alpha1.ConditionInvalid); c.LastTransitionTime != now {
		t.Errorf("cluster Invalid moved its transition time to %v", c.LastTransitionTime)
	}
	st := d2.Statuses["cluster"]
	if st.Nodes != 2 || st.TunnelAddresses != 2 || st.PodCIDRsAssigned != 0 {
		t.Errorf("cluster counts = %d nodes, %d tunnel, %d podCIDRs", st.Nodes, st.TunnelAddresses, st.PodCIDRsAssigned)
	}

	// Restart stability: a third pass, as a restarted controller would run
	// it on the cluster it left, changes nothing at all.
	in3 := apply(in2, d2)
	in3.Now = metav1.NewTime(later.Add(time.Hour))
	if d3 := Decide(in3); !d3.Empty() {
		t.Errorf("third pass is not empty: %+v", d3)
	}

	// Deleting flex-2 frees its block: flex-3 gets it, and keeps its
	// tunnel annotation (annotations are never changed; it wins over the
	// podCIDR's first address, see objects.TunnelAddr).
	var rest []corev1.Node
	for _, n := range in3.Nodes {
		if n.Name != "flex-2" {
			rest = append(rest, n)
		}
	}
	in3.Nodes = rest
	d4 := Decide(in3)
	if diff := cmp.Diff(map[string][]netip.Prefix{"flex-3": pfxs("192.168.20.128/25")}, d4.PodCIDRs, cmpPfx); diff != "" {
		t.Errorf("after flex-2 left (-want +got):\n%s", diff)
	}
	if len(d4.TunnelAddrs) != 0 {
		t.Errorf("tunnel addresses changed: %v", d4.TunnelAddrs)
	}
}

// TestSeed000AssignmentEnabled: an explicit assignmentEnabled true on the
// unmanaged cluster Site gives the AKS nodes blocks from 10.0.2.0/23 (and
// then no tunnel annotation: the podCIDR's first address serves), never the
// stray 10.0.12.0/24.
func TestSeed000AssignmentEnabled(t *testing.T) {
	sites, nodes := seed000(t)
	tr := true
	sites[0].Spec.PodCIDRAssignments[0].AssignmentEnabled = &tr
	if sites[0].Name != "cluster" {
		t.Fatalf("first site is %q", sites[0].Name)
	}
	d := Decide(Input{Sites: sites, Nodes: nodes, TunnelCIDR: DefaultTunnelCIDR})
	want := map[string][]netip.Prefix{
		"aks-nodepool1-0": pfxs("10.0.2.0/24"),
		"aks-nodepool1-1": pfxs("10.0.3.0/24"),
		"flex-1":          pfxs("192.168.20.0/25"),
	}
	if diff := cmp.Diff(want, d.PodCIDRs, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("podCIDRs (-want +got):\n%s", diff)
	}
	if len(d.TunnelAddrs) != 0 {
		t.Errorf("tunnel addresses = %v, want none", d.TunnelAddrs)
	}
	checkInsidePools(t, sites, nodes, d.PodCIDRs)
}

func TestSiteStatusInvalid(t *testing.T) {
	sites := []v1alpha1.Site{
		mkSite("a", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16")),
		mkSite("b", []string{"10.9.0.0/24"}, nil, assign("10.1.128.0/17")),
		mkSite("c", []string{"bogus"}, nil),
		mkSite("d", []string{"10.8.0.0/24"}, nil, assign("10.2.0.0/16")),
	}
	nodes := []corev1.Node{
		mkNode("a-1", "10.0.0.1", "", "10.3.0.0/24"),
		mkNode("d-1", "10.8.0.1", "", "10.3.0.128/25"), // overlaps a-1's podCIDR
	}
	d := Decide(Input{Sites: sites, Nodes: nodes, TunnelCIDR: DefaultTunnelCIDR})
	msg := func(site string) string {
		c := condition(t, d.Statuses[site], v1alpha1.ConditionInvalid)
		if c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonInvalid {
			t.Errorf("%s Invalid = %s %s %q", site, c.Status, c.Reason, c.Message)
		}
		if r := condition(t, d.Statuses[site], v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != v1alpha1.ReasonInvalid {
			t.Errorf("%s Ready = %s %s", site, r.Status, r.Reason)
		}
		return c.Message
	}
	overlap := `Site "b" spec.podCidrAssignments[0].cidrBlocks[0]: 10.1.128.0/17 overlaps Site "a" spec.podCidrAssignments[0].cidrBlocks[0] 10.1.0.0/16`
	for _, s := range []string{"a", "b"} {
		if m := msg(s); !strings.Contains(m, overlap) {
			t.Errorf("Site %s Invalid message %q does not name the overlap %q", s, m, overlap)
		}
	}
	if m := msg("c"); !strings.Contains(m, `Site "c" spec.nodeCidrs[0]: invalid CIDR "bogus"`) {
		t.Errorf("Site c Invalid message %q", m)
	}
	// A node overlap concerns the Sites of both nodes.
	nodes0 := `Node "d-1" spec.podCIDRs[0]: 10.3.0.128/25 overlaps Node "a-1" spec.podCIDRs[0] 10.3.0.0/24`
	for _, s := range []string{"a", "d"} {
		if m := msg(s); !strings.Contains(m, nodes0) {
			t.Errorf("Site %s Invalid message %q does not name the node overlap", s, m)
		}
	}
	if c := condition(t, d.Statuses["b"], v1alpha1.ConditionInvalid); strings.Contains(c.Message, "Node") {
		t.Errorf("Site b reports a problem of other sites' nodes: %q", c.Message)
	}
}

// TestSiteStatusCapsMessages: a thousand bad nodes must not make a Site too
// large to store (a condition message holds at most 32768 bytes).
func TestSiteStatusCapsMessages(t *testing.T) {
	sites := []v1alpha1.Site{mkSite("s", []string{"10.0.0.0/16"}, nil, assign("10.1.0.0/24"))}
	var nodes []corev1.Node
	for i := range 1000 {
		nodes = append(nodes, mkNode(fmt.Sprintf("n%04d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), "bogus"))
	}
	d := Decide(Input{Sites: sites, Nodes: nodes, TunnelCIDR: DefaultTunnelCIDR})
	for _, c := range d.Statuses["s"].Conditions {
		if len(c.Message) > 4096 {
			t.Errorf("%s message is %d bytes", c.Type, len(c.Message))
		}
	}
	inv := condition(t, d.Statuses["s"], v1alpha1.ConditionInvalid)
	if !strings.HasSuffix(inv.Message, "and 990 more problems") {
		t.Errorf("Invalid message ends %q", inv.Message[len(inv.Message)-60:])
	}
	pe := condition(t, d.Statuses["s"], v1alpha1.ConditionPoolExhausted)
	if !strings.HasSuffix(pe.Message, "and 989 more") {
		t.Errorf("PoolExhausted message %q", pe.Message)
	}
}

// TestForeignAddresses: a tunnel annotation outside --tunnel-cidr and, where
// the Site assigns, a podCIDR outside its blocks are reported under the
// node's Site; addresses the controller could have given are not, and nodes
// of an unmanaged Site keep whatever podCIDR the cloud gave them.
func TestForeignAddresses(t *testing.T) {
	unmanaged := false
	sites := []v1alpha1.Site{
		mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16")),
		mkSite("u", []string{"10.9.0.0/24"}, &unmanaged, assign("10.2.0.0/23")),
	}
	nodes := []corev1.Node{
		mkNode("ok", "10.0.0.2", "100.64.0.7", "10.1.1.0/24"),
		mkNode("claims", "10.0.0.3", "192.0.2.7", "10.1.2.0/24"),
		mkNode("kcm", "10.0.0.4", "", "10.244.3.0/24"),
		mkNode("cloud", "10.9.0.4", "", "10.0.12.0/24"),
	}
	got := foreignAddresses(sites, nodes, netip.MustParsePrefix("100.64.0.0/16"))
	if len(got) != 1 || len(got["s"]) != 2 {
		t.Fatalf("problems %v, want two on Site s", got)
	}
	if !strings.Contains(got["s"][0], `Node "claims"`) || !strings.Contains(got["s"][0], "outside the controller's --tunnel-cidr") {
		t.Errorf("first problem %q, want the annotation of claims", got["s"][0])
	}
	if !strings.Contains(got["s"][1], `Node "kcm"`) || !strings.Contains(got["s"][1], "--allocate-node-cidrs") {
		t.Errorf("second problem %q, want the podCIDR of kcm", got["s"][1])
	}
}

// TestObjectStatuses: a pool selecting two nodes is Ready with Gateways 2; a
// pool selecting none is not Ready (NoGateways), and the assignment that
// needs it in a site is Invalid with the agents' reason; a peering naming a
// missing Site is Invalid. Deciding again from the written statuses changes
// nothing.
func TestObjectStatuses(t *testing.T) {
	sites := []v1alpha1.Site{
		mkSite("a", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16")),
		mkSite("b", []string{"10.0.1.0/24"}, nil, assign("10.2.0.0/16")),
	}
	gwA, gwB := mkNode("a1", "10.0.0.2", "", "10.1.1.0/24"), mkNode("b1", "10.0.1.2", "", "10.2.1.0/24")
	gwA.Labels = map[string]string{"gw": "yes"}
	gwB.Labels = map[string]string{"gw": "yes"}
	pool := func(name, label string) v1alpha1.GatewayPool {
		p := v1alpha1.GatewayPool{Spec: v1alpha1.GatewayPoolSpec{Type: v1alpha1.GatewayPoolInternal,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gw": label}}}}
		p.Name, p.Generation = name, 3
		return p
	}
	as := func(name, pool string) v1alpha1.SiteGatewayPoolAssignment {
		a := v1alpha1.SiteGatewayPoolAssignment{Spec: v1alpha1.SiteGatewayPoolAssignmentSpec{Sites: []string{"a", "b"}, GatewayPools: []string{pool}}}
		a.Name = name
		return a
	}
	peering := v1alpha1.SitePeering{Spec: v1alpha1.SitePeeringSpec{Sites: []string{"a", "nowhere"}}}
	peering.Name = "bad"
	in := Input{Sites: sites, Nodes: []corev1.Node{gwA, gwB},
		GatewayPools: []v1alpha1.GatewayPool{pool("good", "yes"), pool("empty", "never")},
		Assignments:  []v1alpha1.SiteGatewayPoolAssignment{as("works", "good"), as("broken", "empty")},
		SitePeerings: []v1alpha1.SitePeering{peering}, Now: metav1.Now()}
	got := ObjectStatuses(in)
	cond := func(k ObjectKey, typ string) *metav1.Condition {
		switch st := got[k].(type) {
		case v1alpha1.GatewayPoolStatus:
			return meta.FindStatusCondition(st.Conditions, typ)
		case v1alpha1.ObjectStatus:
			return meta.FindStatusCondition(st.Conditions, typ)
		}
		t.Fatalf("no status for %v: %v", k, got)
		return nil
	}
	if st := got[ObjectKey{v1alpha1.KindGatewayPool, "good"}].(v1alpha1.GatewayPoolStatus); st.Gateways != 2 || st.ObservedGeneration != 3 ||
		cond(ObjectKey{v1alpha1.KindGatewayPool, "good"}, v1alpha1.ConditionReady).Status != metav1.ConditionTrue {
		t.Errorf("pool good: %+v", st)
	}
	if c := cond(ObjectKey{v1alpha1.KindGatewayPool, "empty"}, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonNoGateways {
		t.Errorf("pool empty Ready = %+v, want False NoGateways", c)
	}
	if c := cond(ObjectKey{v1alpha1.KindSiteGatewayPoolAssignment, "broken"}, v1alpha1.ConditionInvalid); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "has no gateway") {
		t.Errorf("assignment broken Invalid = %+v", c)
	}
	if c := cond(ObjectKey{v1alpha1.KindSiteGatewayPoolAssignment, "works"}, v1alpha1.ConditionReady); c.Status != metav1.ConditionTrue {
		t.Errorf("assignment works Ready = %+v", c)
	}
	if c := cond(ObjectKey{v1alpha1.KindSitePeering, "bad"}, v1alpha1.ConditionInvalid); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, `unknown Site "nowhere"`) {
		t.Errorf("peering bad Invalid = %+v", c)
	}
	// Written back, the same input decides nothing new.
	in.GatewayPools[0].Status = got[ObjectKey{v1alpha1.KindGatewayPool, "good"}].(v1alpha1.GatewayPoolStatus)
	in.GatewayPools[1].Status = got[ObjectKey{v1alpha1.KindGatewayPool, "empty"}].(v1alpha1.GatewayPoolStatus)
	in.Assignments[0].Status = got[ObjectKey{v1alpha1.KindSiteGatewayPoolAssignment, "works"}].(v1alpha1.ObjectStatus)
	in.Assignments[1].Status = got[ObjectKey{v1alpha1.KindSiteGatewayPoolAssignment, "broken"}].(v1alpha1.ObjectStatus)
	in.SitePeerings[0].Status = got[ObjectKey{v1alpha1.KindSitePeering, "bad"}].(v1alpha1.ObjectStatus)
	if again := ObjectStatuses(in); len(again) != 0 {
		t.Errorf("second pass changes %v", again)
	}
}
