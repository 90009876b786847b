package objects

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func pool(name, typ, selector, routed string) string {
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: GatewayPool
metadata: {name: %s}
spec:
  type: %s
  nodeSelector: %s
  routedCidrs: [%s]
`, name, typ, selector, routed)
}

func assignment(name, sites, pools string) string {
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: SiteGatewayPoolAssignment
metadata: {name: %s}
spec:
  sites: [%s]
  gatewayPools: [%s]
`, name, sites, pools)
}

// labeled is node with labels; external, when set, adds an ExternalIP.
func labeled(name, ip, podCIDRs, labels, external string) string {
	n := strings.Replace(node(name, ip, podCIDRs), "metadata: {name: "+name+"}",
		fmt.Sprintf("metadata:\n  name: %s\n  labels: {%s}", name, labels), 1)
	if external != "" {
		n += fmt.Sprintf("    - {type: ExternalIP, address: %q}\n", external)
	}
	return n
}

// gatewaySites is a valid gateway topology: a1 and b1 are gateways of pool
// gw, a2 is a member.
var gatewaySites = docs(
	site("a", "10.1.0.0/24", "10.10.0.0/16"),
	site("b", "10.2.0.0/24", "10.20.0.0/16"),
	site("c", "10.3.0.0/24", "10.30.0.0/16"),
	labeled("a1", "10.1.0.1", "10.10.1.0/24", "gw: yes", "203.0.113.1"),
	labeled("a2", "10.1.0.2", "10.10.2.0/24", "gw: no", ""),
	labeled("b1", "10.2.0.1", "10.20.1.0/24", "gw: yes, zone: b", ""),
	labeled("c1", "10.3.0.1", "10.30.1.0/24", "edge: yes", ""),
)

func TestLoadGatewayErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string][]byte
		want  []string
	}{
		{
			name: "pool type",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("p", "Public", "{matchLabels: {gw: yes}}", ""),
				strings.Replace(pool("q", "Internal", "{matchLabels: {gw: yes}}", ""), "  type: Internal\n", "", 1),
			)},
			want: []string{
				`g.yaml: GatewayPool "p": spec.type: unknown type "Public" (want Internal or External)`,
				`g.yaml: GatewayPool "q": spec.type: required (want Internal or External)`,
			},
		},
		{
			name: "pool selector",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("bad-op", "Internal", "{matchExpressions: [{key: gw, operator: Near, values: [yes]}]}", ""),
				pool("bad-key", "Internal", `{matchLabels: {"not a key!": yes}}`, ""),
				pool("empty", "Internal", "{}", ""),
				strings.Replace(pool("none", "Internal", "x", ""), "  nodeSelector: x\n", "", 1),
			)},
			want: []string{
				`g.yaml: GatewayPool "bad-op": spec.nodeSelector: invalid selector: "Near" is not a valid label selector operator`,
				`g.yaml: GatewayPool "bad-key": spec.nodeSelector: invalid selector: `,
				`g.yaml: GatewayPool "empty": spec.nodeSelector: empty selector selects every node: give matchLabels or matchExpressions`,
				`g.yaml: GatewayPool "none": spec.nodeSelector: required: it picks the pool's gateway nodes`,
			},
		},
		{
			name: "pool routedCidrs",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("p", "Internal", "{matchLabels: {gw: yes}}", `10.0.2.0/23, "2001:db8::/129"`),
			)},
			want: []string{`g.yaml: GatewayPool "p": spec.routedCidrs[1]: invalid CIDR "2001:db8::/129"`},
		},
		{
			name: "External pool gateway without ExternalIP",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("ext", "External", "{matchLabels: {gw: yes}}", ""),
			)},
			want: []string{`g.yaml: GatewayPool "ext": spec.nodeSelector: selects Node "b1" in s.yaml, which has no ExternalIP: the gateways of an External pool are reached by their ExternalIP (a gateway behind a NAT without one needs every assignment of the pool encrypted: WireGuard learns its endpoint)`},
		},
		{
			name: "External pool gateway without ExternalIP, one assignment in the clear",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("ext", "External", "{matchLabels: {gw: yes}}", ""),
				assignment("ab", "a, b", "ext")+"  encryption: WireGuard\n",
				assignment("ba", "b, a", "ext"),
			)},
			want: []string{`g.yaml: GatewayPool "ext": spec.nodeSelector: selects Node "b1" in s.yaml, which has no ExternalIP: the gateways of an External pool are reached by their ExternalIP (a gateway behind a NAT without one needs every assignment of the pool encrypted: WireGuard learns its endpoint)`},
		},
		{
			name: "assignment names",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("gw", "Internal", "{matchLabels: {gw: yes}}", ""),
				assignment("x", "a, zz, a", "gw, nope, gw"),
				assignment("one", "a", "gw"),
				strings.Replace(assignment("nopools", "a, b", ""), "  gatewayPools: []\n", "", 1),
			)},
			want: []string{
				`g.yaml: SiteGatewayPoolAssignment "x": spec.sites[1]: unknown Site "zz"`,
				`g.yaml: SiteGatewayPoolAssignment "x": spec.sites[2]: site "a" is listed twice`,
				`g.yaml: SiteGatewayPoolAssignment "x": spec.gatewayPools[1]: unknown GatewayPool "nope"`,
				`g.yaml: SiteGatewayPoolAssignment "x": spec.gatewayPools[2]: pool "gw" is listed twice`,
				`g.yaml: SiteGatewayPoolAssignment "one": spec.sites: an assignment needs at least two sites, got 1`,
				`g.yaml: SiteGatewayPoolAssignment "nopools": spec.gatewayPools: required: an assignment joins its sites through at least one GatewayPool`,
			},
		},
		{
			name: "underlay unreachable without routed nodeCidrs",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("gw", "Internal", "{matchLabels: {gw: yes}}", ""),
				assignment("ab", "a, b", "gw")+"  routeNodeCidrs: false\n  underlayReachesNodes: false\n",
				assignment("ok", "a, b", "gw")+"  underlayReachesNodes: false\n",
			)},
			want: []string{
				`g.yaml: SiteGatewayPoolAssignment "ab": spec.underlayReachesNodes: false says host traffic to the other sites' node addresses must go through the gateways, but routeNodeCidrs false routes no nodeCidrs there: set routeNodeCidrs true (or leave it unset), or underlayReachesNodes true if the underlay does reach the nodes`,
			},
		},
		{
			name: "assignment encryption",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("gw", "Internal", "{matchLabels: {gw: yes}}", ""),
				assignment("bad", "a, b", "gw")+"  encryption: wireguard\n",
				assignment("ok", "a, b", "gw")+"  encryption: WireGuard\n",
			)},
			want: []string{
				`g.yaml: SiteGatewayPoolAssignment "bad": spec.encryption: unsupported encryption "wireguard" (want None or WireGuard)`,
			},
		},
		{
			name: "assignments joining the same sites disagree on the underlay",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("gw", "Internal", "{matchLabels: {gw: yes}}", ""),
				assignment("ab", "a, b", "gw"),
				assignment("ba", "b, a", "gw")+"  underlayReachesNodes: false\n",
			)},
			want: []string{
				`g.yaml: SiteGatewayPoolAssignment "ba": spec.underlayReachesNodes: false, but SiteGatewayPoolAssignment "ab" joins Sites "a" and "b" too and says true: give both the same value, since the nodes of two sites reach each other one way`,
			},
		},
		{
			name: "site without gateway",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("gw", "Internal", "{matchLabels: {gw: yes}}", ""),
				pool("edge", "Internal", "{matchExpressions: [{key: edge, operator: Exists}]}", ""),
				assignment("abc", "a, b, c", "gw"),
				assignment("bc", "c, b, a", "edge"),
			)},
			want: []string{
				`g.yaml: SiteGatewayPoolAssignment "abc": spec.sites[2]: Site "c" has no gateway: none of its Nodes is selected by GatewayPool "gw", so the other sites cannot reach it`,
				`g.yaml: SiteGatewayPoolAssignment "bc": spec.sites[1]: Site "b" has no gateway: none of its Nodes is selected by GatewayPool "edge", so the other sites cannot reach it`,
				`g.yaml: SiteGatewayPoolAssignment "bc": spec.sites[2]: Site "a" has no gateway: none of its Nodes is selected by GatewayPool "edge", so the other sites cannot reach it`,
			},
		},
		{
			name: "duplicates and unknown fields",
			files: map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
				pool("gw", "Internal", "{matchLabels: {gw: yes}}", ""),
				pool("gw", "Internal", "{matchLabels: {gw: yes}}", ""),
				assignment("ab", "a, b", "gw")+"  routeNodeCIDRs: false\n",
			)},
			want: []string{
				`g.yaml: GatewayPool "gw": metadata.name: duplicate name, first defined in g.yaml`,
				`g.yaml: SiteGatewayPoolAssignment "ab": decode: unknown field "spec.routeNodeCIDRs"`,
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

// TestLoadGateways loads a valid gateway topology, so the error cases above
// cannot pass by rejecting everything, and checks the helpers.
func TestLoadGateways(t *testing.T) {
	set, warnings, err := Load(map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
		pool("gw", "Internal", "{matchLabels: {gw: yes}}", `10.0.2.5/23, "2001:DB8:0:0::/64"`),
		pool("ext", "External", "{matchExpressions: [{key: gw, operator: In, values: [yes]}, {key: zone, operator: NotIn, values: [b]}]}", ""),
		pool("edge", "Internal", "{matchExpressions: [{key: edge, operator: Exists}]}", ""),
		assignment("ab", "b, a", "gw")+"  routeNodeCidrs: false\n",
		assignment("ac", "a, c", "edge, ext"),
	)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range warnings {
		got = append(got, w.String())
	}
	if diff := cmp.Diff([]string{`g.yaml: GatewayPool "gw": spec.routedCidrs[0]: 10.0.2.5/23 has host bits set; normalized to 10.0.2.0/23`}, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	if got, want := fmt.Sprint(set.GatewayPool("gw").Spec.RoutedCIDRs), "[10.0.2.0/23 2001:db8::/64]"; got != want {
		t.Errorf("normalized routedCidrs = %s, want %s", got, want)
	}
	var names []string
	for _, p := range set.GatewayPools {
		var gws []string
		for _, n := range set.GatewaysOf(&p) {
			gws = append(gws, n.Name)
		}
		names = append(names, fmt.Sprintf("%s %v", p.Name, gws))
	}
	if diff := cmp.Diff([]string{"edge [c1]", "ext [a1]", "gw [a1 b1]"}, names); diff != "" {
		t.Errorf("GatewaysOf (-want +got):\n%s", diff)
	}
	var selecting []string
	for _, n := range set.Nodes {
		selecting = append(selecting, fmt.Sprintf("%s %v", n.Name, set.PoolsSelecting(&n)))
	}
	if diff := cmp.Diff([]string{"a1 [ext gw]", "a2 []", "b1 [gw]", "c1 [edge]"}, selecting); diff != "" {
		t.Errorf("PoolsSelecting (-want +got):\n%s", diff)
	}
	if a := set.SiteGatewayPoolAssignments; len(a) != 2 || a[0].Name != "ab" || a[0].Spec.RoutesNodeCIDRs() || !a[1].Spec.RoutesNodeCIDRs() {
		t.Errorf("assignments = %+v, want ab (routeNodeCidrs false) and ac (default true)", a)
	}
	if set.GatewayPool("nope") != nil {
		t.Errorf("GatewayPool of a missing name returned a pool")
	}
}

// TestGatewayBehindNATAllowed: an External pool may hold a gateway without an
// ExternalIP (one behind a NAT) while every assignment of the pool encrypts:
// WireGuard learns its endpoint (TestLoadGatewayErrors has the refusals).
func TestGatewayBehindNATAllowed(t *testing.T) {
	_, _, err := Load(map[string][]byte{"s.yaml": gatewaySites, "g.yaml": docs(
		pool("ext", "External", "{matchLabels: {gw: yes}}", ""),
		assignment("ab", "a, b", "ext")+"  encryption: WireGuard\n",
	)})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
}
