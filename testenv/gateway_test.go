package testenv

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// gwBase is a valid gateway scenario the error cases below break one field at
// a time.
const gwBase = `
name: g
underlay: {firewall: true, crossSite: gateways}
sites:
  - name: s1
    subnet: 192.168.1.0/24
    spec: {nodeCidrs: [192.168.1.0/24], podCidrAssignments: [{cidrBlocks: [10.1.0.0/16]}]}
    nodes:
      - name: g1
        address: 192.168.1.10
        externalAddress: 203.0.113.10
        podCIDR: 10.1.1.0/24
        labels: {gw: "yes"}
        cniLeftovers: {masquerade: "-s 10.0.0.0/8 -j MASQUERADE --random-fully"}
        pods: [{name: p1, address: 10.1.1.5}]
      - name: m1
        address: 192.168.1.11
        podCIDR: 10.1.2.0/24
        pods: [{name: p2, address: 10.1.2.5}]
  - name: s2
    subnet: 192.168.2.0/24
    spec: {nodeCidrs: [192.168.2.0/24], podCidrAssignments: [{cidrBlocks: [10.2.0.0/16]}]}
    nodes:
      - name: g2
        address: 192.168.2.10
        externalAddress: 198.51.100.10
        podCIDR: 10.2.1.0/24
        labels: {gw: "yes"}
        pods: [{name: p3, address: 10.2.1.5}]
  - name: s3
    subnet: 192.168.3.0/24
    spec: {nodeCidrs: [192.168.3.0/24], podCidrAssignments: [{cidrBlocks: [10.3.0.0/16]}]}
    nodes:
      - name: n3
        address: 192.168.3.10
        podCIDR: 10.3.1.0/24
        pods: [{name: p4, address: 10.3.1.5}]
objects: |
  apiVersion: isthmus.dev/v1alpha1
  kind: GatewayPool
  metadata: {name: pool}
  spec:
    type: External
    nodeSelector: {matchExpressions: [{key: gw, operator: In, values: ["yes"]}]}
  ---
  apiVersion: isthmus.dev/v1alpha1
  kind: SiteGatewayPoolAssignment
  metadata: {name: s1-s2}
  spec: {sites: [s1, s2], gatewayPools: [pool]}
`

func TestGatewayScenario(t *testing.T) {
	sc, err := ParseScenario([]byte(gwBase))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"g1", "g2"}, sc.Gateways()); diff != "" {
		t.Errorf("gateways (-want +got):\n%s", diff)
	}
	// s1 and s2 talk through the pool, every pair, sources kept; s3 is joined
	// to nothing.
	var pairs []string
	for _, e := range sc.Expectations() {
		src, _ := sc.Pod(e.Src)
		if e.Saw != src.Address {
			t.Errorf("%s -> %s: expect source %s, want the pod's own %s", e.Src, e.Dst, e.Saw, src.Address)
		}
		pairs = append(pairs, e.Src+">"+e.Dst)
	}
	want := []string{"p1>p2", "p1>p3", "p2>p1", "p2>p3", "p3>p1", "p3>p2"}
	if diff := cmp.Diff(want, pairs); diff != "" {
		t.Errorf("pairs (-want +got):\n%s", diff)
	}

	g1, _ := sc.node("g1")
	if lo := sc.Leftovers(&g1.Node); !lo.On || lo.Masquerade != "-s 10.0.0.0/8 -j MASQUERADE --random-fully" {
		t.Errorf("g1 leftovers = %+v, want on with the given masquerade rule", lo)
	}
	m1, _ := sc.node("m1")
	if lo := sc.Leftovers(&m1.Node); lo.On {
		t.Errorf("m1 leftovers = %+v, want off (the default)", lo)
	}

	files, err := sc.ObjectFiles()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(files["nodes.yaml"]), "- address: 203.0.113.10\n    type: ExternalIP") {
		t.Errorf("nodes.yaml has no ExternalIP 203.0.113.10 for g1:\n%s", files["nodes.yaml"])
	}

	l := &Lab{Name: "t", Scenario: sc, Datapath: DatapathIsthmus}
	rules := l.firewallRules()
	for _, r := range []string{
		"-A FORWARD -s 192.168.1.10/32 -d 192.168.2.10/32 -m comment",
		"-A FORWARD -s 192.168.2.10/32 -d 192.168.1.10/32 -m comment",
	} {
		if !strings.Contains(rules, r) {
			t.Errorf("firewall lacks %q:\n%s", r, rules)
		}
	}
	// No member and no node outside the pools passes between sites.
	for _, a := range []string{"192.168.1.11", "192.168.3.10", "192.168.1.0/24", "192.168.2.0/24"} {
		if strings.Contains(rules, "-s "+a) || strings.Contains(rules, "-d "+a) {
			t.Errorf("firewall lets %s across sites:\n%s", a, rules)
		}
	}
}

func TestLeftoversYAML(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Leftovers
		err  string
	}{
		{"true", Leftovers{On: true}, ""},
		{"false", Leftovers{}, ""},
		{`{masquerade: "-j MASQUERADE"}`, Leftovers{On: true, Masquerade: "-j MASQUERADE"}, ""},
		{`{masq: x}`, Leftovers{}, `unknown field "masq"`},
		{`yes please`, Leftovers{}, "want true, false or"},
	} {
		doc := strings.Replace(base, "name: t\n", "name: t\ndefaults: {cniLeftovers: "+c.in+"}\n", 1)
		sc, err := ParseScenario([]byte(doc))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("cniLeftovers %s: err %v, want one containing %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("cniLeftovers %s: %v", c.in, err)
			continue
		}
		if sc.Defaults.CNILeftovers != c.want {
			t.Errorf("cniLeftovers %s = %+v, want %+v", c.in, sc.Defaults.CNILeftovers, c.want)
		}
	}
}

func TestGatewayScenarioErrors(t *testing.T) {
	tests := []struct {
		name, old, new, want string
	}{
		{"crossSite without firewall", "{firewall: true, crossSite: gateways}", "{crossSite: gateways}", "needs underlay.firewall"},
		{"bad crossSite", "crossSite: gateways", "crossSite: some", `want all or gateways`},
		{"no gateway selected", `values: ["yes"]`, `values: ["no"]`, "no GatewayPool selects any node"},
		{"bad pool type", "type: External", "type: Public", `type "Public"`},
		{"bad selector", "operator: In", "operator: Near", "nodeSelector"},
		{"unknown pool", "gatewayPools: [pool]", "gatewayPools: [pool2]", `unknown GatewayPool "pool2"`},
		{"unknown site", "sites: [s1, s2], gatewayPools", "sites: [s1, s9], gatewayPools", `unknown site "s9"`},
		{"external without address", "        externalAddress: 198.51.100.10\n", "", `selects node "g2", which has no externalAddress`},
		{"external inside a site", "externalAddress: 198.51.100.10", "externalAddress: 192.168.3.99", "inside site \"s3\""},
		{"external twice", "externalAddress: 198.51.100.10", "externalAddress: 203.0.113.10", "already used by external address of node g1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(gwBase, tt.old) {
				t.Fatalf("test bug: %q not in gwBase", tt.old)
			}
			_, err := ParseScenario([]byte(strings.Replace(gwBase, tt.old, tt.new, 1)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseScenario = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestGatewayBuiltins pins what the gateway scenarios promise: who the
// gateways are, that every pod pair talks with its own source, and seed 003's
// flannel rule on every cloud node and on no edge node.
func TestGatewayBuiltins(t *testing.T) {
	for _, c := range []struct {
		scenario string
		gateways []string
		external bool
	}{
		{"seed003", []string{"master-gw", "edge-gw"}, false},
		{"seed000gw", []string{"aks-1", "flex-1"}, false},
		{"seed001", []string{"u-gw", "r-gw"}, false},
		{"gwfailover", []string{"gw-w1", "gw-w2", "gw-e1", "gw-e2"}, false},
		{"gwexternal", []string{"dc-gw", "cl-gw"}, true},
	} {
		sc, err := LoadScenario(c.scenario)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c.gateways, sc.Gateways()); diff != "" {
			t.Errorf("%s gateways (-want +got):\n%s", c.scenario, diff)
		}
		if sc.Underlay.CrossSite != CrossSiteGateways || !sc.Underlay.Firewall {
			t.Errorf("%s: firewall %v crossSite %q, want the firewall passing gateways only", c.scenario, sc.Underlay.Firewall, sc.Underlay.CrossSite)
		}
		pods := sc.Pods()
		if got, want := len(sc.Expectations()), len(pods)*(len(pods)-1); got != want {
			t.Errorf("%s: %d expected pairs, want every ordered pair (%d)", c.scenario, got, want)
		}
		for _, e := range sc.Expectations() {
			if src, _ := sc.Pod(e.Src); e.Saw != src.Address {
				t.Errorf("%s: %s -> %s expects source %s, want the pod's own %s", c.scenario, e.Src, e.Dst, e.Saw, src.Address)
			}
		}
		for _, n := range sc.Nodes() {
			if want := c.external && sc.IsGateway(n.Name); n.ExternalAddress.IsValid() != want {
				t.Errorf("%s: node %s externalAddress %v, want one: %v", c.scenario, n.Name, n.ExternalAddress, want)
			}
		}
	}
	sc, _ := LoadScenario("seed003")
	const flannel = "-s 10.16.0.0/12 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully"
	for _, n := range sc.Nodes() {
		lo := sc.Leftovers(&n.Node)
		if cloud := n.Site.Name == "cloud"; cloud != (lo.On && lo.Masquerade == flannel) {
			t.Errorf("seed003 node %s (site %s): leftovers %+v", n.Name, n.Site.Name, lo)
		}
	}
	sc, _ = LoadScenario("seed000gw")
	if sc.peered("cluster", "flex-site") {
		t.Error("seed000gw: cluster and flex-site are peered; gateway mode has no SitePeering")
	}
	if !sc.assigned("cluster", "flex-site") {
		t.Error("seed000gw: cluster and flex-site not joined by an assignment")
	}
	if a := netip.MustParseAddr("192.168.10.10"); !slices.ContainsFunc(sc.Nodes(), func(n NodeRef) bool { return n.Address == a && sc.IsGateway(n.Name) }) {
		t.Error("seed000gw: the flex endpoint 192.168.10.10 is not a gateway")
	}
}
