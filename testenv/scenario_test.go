package testenv

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/isthmus-dev/isthmus/loader/ipam"
)

func TestDefaultScenario(t *testing.T) {
	sc, err := LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	var nodes, pods []string
	for _, n := range sc.Nodes() {
		nodes = append(nodes, n.Site.Name+"/"+n.Name)
		if !sc.Leftovers(&n.Node).On {
			t.Errorf("node %s: CNI leftovers off, want on in the default scenario", n.Name)
		}
	}
	for _, p := range sc.Pods() {
		pods = append(pods, p.Node+"/"+p.Name+"="+p.Address.String())
	}
	if diff := cmp.Diff([]string{"site-a/a1", "site-a/a2", "site-b/b1", "site-b/b2"}, nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	wantPods := []string{
		"a1/a1-p1=10.244.1.10", "a1/a1-p2=10.244.1.11", "a2/a2-p1=10.244.2.10", "a2/a2-p2=10.244.2.11",
		"b1/b1-p1=10.245.1.10", "b1/b1-p2=10.245.1.11", "b2/b2-p1=10.245.2.10", "b2/b2-p2=10.245.2.11",
	}
	if diff := cmp.Diff(wantPods, pods); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
	blocks := sc.PodBlocks()
	if diff := cmp.Diff([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.245.0.0/16")}, blocks, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("pod blocks (-want +got):\n%s", diff)
	}
	if got := sc.Sites[0].Gateway; got != netip.MustParseAddr("172.16.1.1") {
		t.Errorf("site-a gateway = %s, want the subnet's first address 172.16.1.1", got)
	}
}

func TestLoadScenarioUnknown(t *testing.T) {
	_, err := LoadScenario("no-such-scenario")
	if err == nil || !strings.Contains(err.Error(), "default") {
		t.Fatalf("LoadScenario(no-such-scenario) = %v, want an error listing the built-ins", err)
	}
}

// base is a valid scenario the error cases below break one field at a time.
const base = `
name: t
sites:
  - name: s1
    subnet: 192.168.1.0/24
    spec: {nodeCidrs: [192.168.1.0/24], podCidrAssignments: [{cidrBlocks: [10.1.0.0/16]}]}
    nodes:
      - name: n1
        address: 192.168.1.10
        podCIDR: 10.1.1.0/24
        pods: [{name: p1, address: 10.1.1.5}]
  - name: s2
    subnet: 192.168.2.0/24
    objects: |
      apiVersion: isthmus.dev/v1alpha1
      kind: Site
      metadata: {name: s2}
      spec:
        manageCniPlugin: false
        podCidrAssignments: [{cidrBlocks: [10.0.2.0/23]}]
    nodes:
      - name: n2
        address: 192.168.2.10
        pods: [{name: p2, address: 10.0.2.128, unmanaged: true}]
peerings:
  - {name: s1-s2, sites: [s1, s2]}
`

func TestParseScenarioErrors(t *testing.T) {
	if _, err := ParseScenario([]byte(base)); err != nil {
		t.Fatalf("base scenario: %v", err)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"unknown field", "name: t\n", "name: t\nfirewal: {}\n", `unknown field "firewal"`},
		{"missing name", "name: t\n", "", "name: missing"},
		{"long site name", "name: s1\n", "name: site-name-too-long\n", "longer than 12"},
		{"long node name", "name: n1\n", "name: node-name-way-long\n", "longer than 13"},
		{"long pod name", "name: p1,", "name: pod-too-long-x,", "longer than 11"},
		{"bad name", "name: n1\n", "name: N_1\n", "lower-case"},
		{"node outside subnet", "address: 192.168.1.10", "address: 192.168.9.10", "not in site subnet"},
		{"node on gateway", "address: 192.168.1.10", "address: 192.168.1.1", "already used by"},
		{"pod outside podCIDR", "address: 10.1.1.5", "address: 10.1.2.5", "mark the pod unmanaged"},
		{"duplicate pod address", "address: 10.0.2.128", "address: 10.1.1.5", "already used by pod p1"},
		{"pod named like a node", "name: p2,", "name: n1,", `name "n1" already used`},
		{"reserved name", "name: p2,", "name: rt,", "reserved"},
		{"overlapping subnets", "subnet: 192.168.2.0/24", "subnet: 192.168.0.0/16", "overlaps"},
		{"non-canonical subnet", "subnet: 192.168.2.0/24", "subnet: 192.168.2.5/24", "not canonical"},
		{"unknown peered site", "sites: [s1, s2]", "sites: [s1, s3]", `unknown site "s3"`},
		{"site without object", "    spec: {nodeCidrs: [192.168.1.0/24], podCidrAssignments: [{cidrBlocks: [10.1.0.0/16]}]}\n", "", "want spec or objects"},
		{"bad pod block", "cidrBlocks: [10.0.2.0/23]", "cidrBlocks: [10.0.2.0/33]", "cidrBlocks"},
		{"bad decap", "name: t\n", "name: t\ndecap: ebpf\n", `decap "ebpf"`},
		{"bad pod wiring", "name: t\n", "name: t\npodWiring: calico\n", `podWiring "calico"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(base, tt.old) {
				t.Fatalf("test bug: %q not in base", tt.old)
			}
			_, err := ParseScenario([]byte(strings.Replace(base, tt.old, tt.new, 1)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseScenario = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestObjectFiles(t *testing.T) {
	sc, err := ParseScenario([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	files, err := sc.ObjectFiles()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string][]string{}
	for name, data := range files {
		docs, err := splitDocs(string(data))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, d := range docs {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(d.Raw, &head); err != nil {
				t.Fatal(err)
			}
			kinds[name] = append(kinds[name], head.APIVersion+" "+d.Kind+" "+head.Metadata.Name)
		}
	}
	want := map[string][]string{
		"sites.yaml":    {"isthmus.dev/v1alpha1 Site s1", "isthmus.dev/v1alpha1 Site s2"},
		"peerings.yaml": {"isthmus.dev/v1alpha1 SitePeering s1-s2"},
		"nodes.yaml":    {"v1 Node n1", "v1 Node n2"},
	}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("objects (-want +got):\n%s", diff)
	}

	var node struct {
		Spec struct {
			PodCIDR  string   `json:"podCIDR"`
			PodCIDRs []string `json:"podCIDRs"`
		} `json:"spec"`
		Status struct {
			Addresses []map[string]string `json:"addresses"`
		} `json:"status"`
	}
	docs, _ := splitDocs(string(files["nodes.yaml"]))
	if err := yaml.Unmarshal(docs[0].Raw, &node); err != nil {
		t.Fatal(err)
	}
	if node.Spec.PodCIDR != "10.1.1.0/24" || !cmp.Equal(node.Spec.PodCIDRs, []string{"10.1.1.0/24"}) {
		t.Errorf("node n1 spec = %+v, want podCIDR and podCIDRs 10.1.1.0/24", node.Spec)
	}
	if diff := cmp.Diff([]map[string]string{{"type": "InternalIP", "address": "192.168.1.10"}, {"type": "Hostname", "address": "n1"}}, node.Status.Addresses); diff != "" {
		t.Errorf("node n1 addresses (-want +got):\n%s", diff)
	}
	// A node without podCIDRs (unmanaged site) must not carry empty ones.
	if strings.Contains(string(docs[1].Raw), "podCIDR") {
		t.Errorf("node n2 has no podCIDRs but its object mentions them:\n%s", docs[1].Raw)
	}
	// Raw site objects carry over verbatim, and their pod blocks count.
	if !strings.Contains(string(files["sites.yaml"]), "manageCniPlugin: false") {
		t.Errorf("site s2's raw manifest lost:\n%s", files["sites.yaml"])
	}
	var blocks []string
	for _, b := range sc.PodBlocks() {
		blocks = append(blocks, b.String())
	}
	if diff := cmp.Diff([]string{"10.1.0.0/16", "10.0.2.0/23"}, blocks); diff != "" {
		t.Errorf("pod blocks (-want +got):\n%s", diff)
	}
}

func TestNames(t *testing.T) {
	for _, name := range []string{"default", "t1a2b3", "abcdefghijkl"} {
		if err := ValidateLabName(name); err != nil {
			t.Errorf("ValidateLabName(%q) = %v, want nil", name, err)
		}
	}
	// A dash would make isl-<lab>- a prefix of another lab's namespaces.
	for _, name := range []string{"", "a-b", "Lab", "abcdefghijklm"} {
		if err := ValidateLabName(name); err == nil {
			t.Errorf("ValidateLabName(%q) = nil, want an error", name)
		}
	}
	sc, err := LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range sc.Nodes() {
		for _, ifname := range []string{RouterPort(n.Name)} {
			if len(ifname) > 15 {
				t.Errorf("interface name %q longer than 15", ifname)
			}
		}
	}
	l := &Lab{Name: "x1", Scenario: sc}
	for _, p := range sc.Pods() {
		if h := l.HostVeth(p.Name); len(h) > 15 || !strings.HasPrefix(h, "pod-") {
			t.Errorf("host veth %q: want pod-* within 15 characters", h)
		}
	}
	// The plugin names the host side after cnitool's container ID, which
	// hashes the pod's namespace path (here sha256 of
	// "cnitool-<sha512(/run/netns/isl-x1-a1-p1)[:10]>/eth0").
	if got := l.HostVeth("a1-p1"); got != ipam.HostIface(CNIToolContainerID("/run/netns/isl-x1-a1-p1"), "eth0") {
		t.Errorf("HostVeth(a1-p1) = %q, want the plugin's name", got)
	}
	if got := l.NodeNS("a1") + " " + l.PodNS("a1-p1") + " " + l.RouterNS(); got != "isl-x1-a1 isl-x1-a1-p1 isl-x1-rt" {
		t.Errorf("namespaces = %q", got)
	}
	args := strings.Join(l.AgentArgs("a1", nil), " ")
	for _, want := range []string{"agent --node a1", "--underlay-dev eth0", "--pin-dir /sys/fs/bpf/isthmus-lab/x1/a1",
		"--pod-interfaces pod-*", "--ready-file /run/isthmus-lab/x1/a1.ready", "--objects /run/isthmus-lab/x1/objects", "--vni 4242",
		"--ipam-socket /run/isthmus-lab/x1/cni/a1/ipam.sock", "--ipam-dir /run/isthmus-lab/x1/cni/a1/ipam",
		"--cni-bin-dir /run/isthmus-lab/x1/cni/a1/bin", "--cni-conf-dir /run/isthmus-lab/x1/cni/a1/net.d"} {
		if !strings.Contains(args, want) {
			t.Errorf("agent args %q lack %q", args, want)
		}
	}
}

func TestMatrixString(t *testing.T) {
	m := &Matrix{Pods: []string{"p1", "p2"}, Probes: []Probe{
		{Src: "p1", Dst: "p2", Proto: ICMP, OK: true, Attempts: 1},
		{Src: "p1", Dst: "p2", Proto: TCP, OK: false, Err: "connect: timeout", Attempts: 3},
		{Src: "p1", Dst: "p2", Proto: UDP, OK: true, Attempts: 1},
	}}
	got := m.String()
	for _, want := range []string{"p1      -     +x+", "p2      ...   -", "3 probes, 1 failed", "FAIL p1 -> p2 tcp after 3 attempts: connect: timeout"} {
		if !strings.Contains(got, want) {
			t.Errorf("matrix lacks %q:\n%s", want, got)
		}
	}
}

// TestSeed000Scenario: the seed's topology parses, its objects carry the seed's
// manifests and the tunnel annotations, and the expectations derived from it say
// which pairs talk and which source each destination sees.
func TestSeed000Scenario(t *testing.T) {
	sc, err := LoadScenario("seed000")
	if err != nil {
		t.Fatal(err)
	}
	if !sc.Underlay.Firewall {
		t.Error("seed000: firewall off, want on")
	}
	var got []string
	for _, e := range sc.Expectations() {
		got = append(got, e.Src+">"+e.Dst+"="+e.Saw.String())
	}
	want := []string{
		"aks1-p1>aks1-ext=10.0.2.128", "aks1-p1>aks2-p1=10.0.2.128", "aks1-p1>flex-p1=10.0.2.128",
		"aks1-ext>aks1-p1=10.0.4.10", "aks1-ext>aks2-p1=10.0.4.10", "aks1-ext>flex-p1=100.64.0.4",
		"aks2-p1>aks1-p1=10.0.2.200", "aks2-p1>aks1-ext=10.0.2.200", "aks2-p1>flex-p1=10.0.2.200",
		// Nothing routes the undeclared 10.0.4.10 to the flex site: no flex-p1>aks1-ext.
		"flex-p1>aks1-p1=192.168.20.6", "flex-p1>aks2-p1=192.168.20.6",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("expectations (-want +got):\n%s", diff)
	}
	if !sc.translated("aks1-ext") || sc.translated("aks1-p1") || sc.translated("flex-p1") {
		t.Error("translated: want aks1-ext only")
	}
	if got := sc.PodInterfaces(); got != "pod-*,azv*" {
		t.Errorf("PodInterfaces = %q, want pod-*,azv*", got)
	}
	aks1, _ := sc.node("aks-1")
	flex, _ := sc.node("flex-1")
	if got := aks1.TunnelAddr(); got != netip.MustParseAddr("100.64.0.4") {
		t.Errorf("aks-1 tunnel address %s, want the annotation's 100.64.0.4", got)
	}
	if got := flex.TunnelAddr(); got != netip.MustParseAddr("192.168.20.1") {
		t.Errorf("flex-1 tunnel address %s, want the first address of its podCIDR", got)
	}
	if got := (&Lab{Name: "x1", Scenario: sc}).HostVeth("aks1-p1"); got != "azv-aks1-p1" {
		t.Errorf("HostVeth(aks1-p1) = %q, want azv-aks1-p1", got)
	}
	files, err := sc.ObjectFiles()
	if err != nil {
		t.Fatal(err)
	}
	for file, wants := range map[string][]string{
		"sites.yaml": {"kind: Site\nmetadata: {name: cluster}\nspec:\n  manageCniPlugin: false\n  nodeCidrs: [10.0.0.0/27]",
			"localCidrs: [10.0.0.0/16]\n  nonMasqueradeCIDRs: [0.0.0.0/0]", "nodeBlockSizes: {ipv4: 25}"},
		"extra.yaml": {"apiVersion: isthmus.dev/v1alpha1\nkind: SitePeering\nmetadata: {name: cluster-flex}", "tunnelProtocol: GENEVE"},
		"nodes.yaml": {"annotations:\n    isthmus.dev/tunnel-ipv4: 100.64.0.4\n  name: aks-1\n"},
	} {
		for _, w := range wants {
			if !strings.Contains(string(files[file]), w) {
				t.Errorf("%s lacks %q:\n%s", file, w, files[file])
			}
		}
	}
	if strings.Contains(string(files["sites.yaml"]), "unbounded") || strings.Contains(string(files["extra.yaml"]), "unbounded") {
		t.Error("an unbounded apiVersion is left in the objects")
	}
	l := &Lab{Name: "x1", Scenario: sc, Datapath: DatapathIsthmus}
	if args := strings.Join(l.AgentArgs("aks-1", nil), " "); !strings.Contains(args, "--pod-interfaces pod-*,azv*") {
		t.Errorf("agent args %q: want --pod-interfaces pod-*,azv*", args)
	}
	rules := l.firewallRules()
	for _, w := range []string{
		":FORWARD DROP",
		"-A FORWARD -m devgroup --src-group 1 --dst-group 1",
		"-A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
		"-A FORWARD -s 10.0.0.0/27 -d 192.168.10.0/28 -p udp --dport 6081",
		"-A FORWARD -s 192.168.10.0/28 -d 10.0.0.0/27 -p icmp",
		"-A FORWARD -j isl-fw-drop\n-A isl-fw-drop -j DROP",
	} {
		if !strings.Contains(rules, w) {
			t.Errorf("firewall rules lack %q:\n%s", w, rules)
		}
	}
	l.Datapath = DatapathVXLAN
	if !strings.Contains(l.firewallRules(), "--dport 4789") {
		t.Errorf("firewall for the VXLAN baseline does not pass 4789:\n%s", l.firewallRules())
	}
}

// TestExpectationsDefault: in the default scenario every pair talks with its own
// address, as the check always required.
func TestExpectationsDefault(t *testing.T) {
	sc, err := LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	es := sc.Expectations()
	if n := len(sc.Pods()); len(es) != n*(n-1) {
		t.Fatalf("%d expectations, want %d", len(es), n*(n-1))
	}
	for _, e := range es {
		if p, _ := sc.pod(e.Src); e.Saw != p.Address {
			t.Errorf("%s > %s: saw %s, want the pod's own %s", e.Src, e.Dst, e.Saw, p.Address)
		}
	}
	if got := sc.PodInterfaces(); got != "pod-*" {
		t.Errorf("PodInterfaces = %q, want pod-*", got)
	}
}

// TestPolicyYAML: a pod's ingress and egress policies parse into prefixes, and a bad
// prefix is an error.
func TestPolicyYAML(t *testing.T) {
	doc := strings.Replace(base, "pods: [{name: p1, address: 10.1.1.5}]",
		"pods: [{name: p1, address: 10.1.1.5, ingress: {allow: [10.0.2.128/32], deny: [10.0.2.0/23]}, egress: {deny: [192.168.20.0/24]}}]", 1)
	sc, err := ParseScenario([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	got := sc.Sites[0].Nodes[0].Pods[0].Ingress
	want := &Policy{Allow: []netip.Prefix{netip.MustParsePrefix("10.0.2.128/32")}, Deny: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/23")}}
	if got == nil || !slices.Equal(got.Allow, want.Allow) || !slices.Equal(got.Deny, want.Deny) {
		t.Fatalf("ingress = %+v, want %+v", got, want)
	}
	if eg := sc.Sites[0].Nodes[0].Pods[0].Egress; eg == nil || len(eg.Allow) != 0 || !slices.Equal(eg.Deny, []netip.Prefix{netip.MustParsePrefix("192.168.20.0/24")}) {
		t.Fatalf("egress = %+v, want deny 192.168.20.0/24", eg)
	}
	bad := strings.Replace(doc, "deny: [10.0.2.0/23]", "deny: [10.0.2.0/33]", 1)
	if _, err := ParseScenario([]byte(bad)); err == nil {
		t.Fatal("deny 10.0.2.0/33 parsed, want an error")
	}
}

// base6 is a valid dual-stack scenario the address6 error cases below break
// one field at a time: s1's node n1 has an IPv4 and an IPv6 podCIDR, its pod p1
// both addresses, p3 an IPv4 one only; s2 is another CNI's, IPv4 only.
const base6 = `
name: t
sites:
  - name: s1
    subnet: 192.168.1.0/24
    spec: {nodeCidrs: [192.168.1.0/24], podCidrAssignments: [{cidrBlocks: [10.1.0.0/16, "fd00:1::/32"], nodeBlockSizes: {ipv4: 24, ipv6: 64}}]}
    nodes:
      - name: n1
        address: 192.168.1.10
        podCIDRs: [10.1.1.0/24, "fd00:1:1::/64"]
        pods:
          - {name: p1, address: 10.1.1.5, address6: "fd00:1:1::5"}
          - {name: p3, address: 10.1.1.6}
      - name: n3
        address: 192.168.1.11
        podCIDR: 10.1.3.0/24
        pods: [{name: p4, address: 10.1.3.5}]
  - name: s2
    subnet: 192.168.2.0/24
    objects: |
      apiVersion: isthmus.dev/v1alpha1
      kind: Site
      metadata: {name: s2}
      spec:
        manageCniPlugin: false
        podCidrAssignments: [{cidrBlocks: [10.0.2.0/23]}]
    nodes:
      - name: n2
        address: 192.168.2.10
        pods: [{name: p2, address: 10.0.2.128, unmanaged: true}]
peerings:
  - {name: s1-s2, sites: [s1, s2]}
`

func TestParseScenarioAddress6(t *testing.T) {
	sc, err := ParseScenario([]byte(base6))
	if err != nil {
		t.Fatalf("base6 scenario: %v", err)
	}
	p1, _ := sc.Pod("p1")
	if p1.Address6 != netip.MustParseAddr("fd00:1:1::5") {
		t.Errorf("p1 address6 = %s, want fd00:1:1::5", p1.Address6)
	}
	if p3, _ := sc.Pod("p3"); p3.Address6.IsValid() {
		t.Errorf("p3 address6 = %s, want none", p3.Address6)
	}
	var blocks []string
	for _, b := range sc.PodBlocks() {
		blocks = append(blocks, b.String())
	}
	if diff := cmp.Diff([]string{"10.1.0.0/16", "fd00:1::/32", "10.0.2.0/23"}, blocks); diff != "" {
		t.Errorf("pod blocks (-want +got):\n%s", diff)
	}
	blocks = nil
	for _, b := range sc.PodBlocks4() {
		blocks = append(blocks, b.String())
	}
	if diff := cmp.Diff([]string{"10.1.0.0/16", "10.0.2.0/23"}, blocks); diff != "" {
		t.Errorf("IPv4 pod blocks (-want +got):\n%s", diff)
	}
	// The objects carry both podCIDRs, IPv4 first, and the Site's blocks.
	files, err := sc.ObjectFiles()
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"nodes.yaml": "fd00:1:1::/64", "sites.yaml": "fd00:1::/32"} {
		if !strings.Contains(string(files[file]), want) {
			t.Errorf("%s lacks %s:\n%s", file, want, files[file])
		}
	}

	tests := []struct {
		name, old, new, want string
	}{
		{"unmanaged pod with address6", "{name: p2, address: 10.0.2.128, unmanaged: true}",
			`{name: p2, address: 10.0.2.128, address6: "fd00:2::5", unmanaged: true}`, `pods[0] "p2": address6 fd00:2::5: unmanaged pods are IPv4 only`},
		{"IPv4 as address6", `address6: "fd00:1:1::5"`, `address6: 10.1.1.7`, `pods[0] "p1": address6 10.1.1.7: want an IPv6 global unicast address`},
		{"link-local address6", `address6: "fd00:1:1::5"`, `address6: "fe80::5"`, `pods[0] "p1": address6 fe80::5: want an IPv6 global unicast address`},
		{"multicast address6", `address6: "fd00:1:1::5"`, `address6: "ff02::5"`, `pods[0] "p1": address6 ff02::5: want an IPv6 global unicast address`},
		{"IPv4-mapped address6", `address6: "fd00:1:1::5"`, `address6: "::ffff:10.1.1.7"`, `pods[0] "p1": address6 ::ffff:10.1.1.7: want an IPv6 global unicast address`},
		{"zoned address6", `address6: "fd00:1:1::5"`, `address6: "fd00:1:1::5%eth0"`, `address6 fd00:1:1::5%eth0: want an IPv6 global unicast address`},
		{"address6 outside the IPv6 podCIDRs", `address6: "fd00:1:1::5"`, `address6: "fd00:1:2::5"`, `pods[0] "p1": address6 fd00:1:2::5 not in the node's IPv6 podCIDRs [fd00:1:1::/64]`},
		{"address6 on a node without an IPv6 podCIDR", "{name: p4, address: 10.1.3.5}", `{name: p4, address: 10.1.3.5, address6: "fd00:1:3::5"}`,
			`pods[0] "p4": address6 fd00:1:3::5: the node has no IPv6 podCIDR`},
		{"duplicate address6", "{name: p3, address: 10.1.1.6}", `{name: p3, address: 10.1.1.6, address6: "fd00:1:1::5"}`, `pods[1] "p3": pod p3: address fd00:1:1::5 already used by pod p1`},
		{"non-canonical IPv6 podCIDR", `"fd00:1:1::/64"]`, `"fd00:1:1::9/64"]`, `podCIDRs[1] fd00:1:1::9/64 is not canonical (want fd00:1:1::/64)`},
		{"link-local IPv6 podCIDR", `"fd00:1:1::/64"]`, `"fe80::/64"]`, `podCIDRs[1] fe80::/64: want an IPv6 global unicast prefix`},
		{"IPv6-only podCIDRs", `podCIDR: 10.1.3.0/24`, `podCIDRs: ["fd00:1:3::/64"]`, `nodes[1] "n3": podCIDRs [fd00:1:3::/64]: IPv6 only`},
		{"IPv6 site subnet beside an IPv4 one", "subnet: 192.168.2.0/24", `subnet: "fd00:99::/64"`,
			`sites[1] "s2": subnet fd00:99::/64 is IPv6 and site "s1"'s 192.168.1.0/24 is IPv4: every site's subnet must be of one family`},
		{"IPv6 node address", "address: 192.168.2.10", `address: "fd00:99::10"`, "not in site subnet"},
		{"IPv6 pod address", "address: 10.1.1.6}", `address: "fd00:1:1::6"}`, `pods[1] "p3": address: want IPv4`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(base6, tt.old) {
				t.Fatalf("test bug: %q not in base6", tt.old)
			}
			_, err := ParseScenario([]byte(strings.Replace(base6, tt.old, tt.new, 1)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseScenario = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestDualStackScenario: the built-in dualstack scenario loads, every node has
// an IPv4 and an IPv6 podCIDR and every pod an address6 in the IPv6 one, and
// every pair is expected to talk in both families with the pods' own
// addresses.
func TestDualStackScenario(t *testing.T) {
	sc, err := LoadScenario("dualstack")
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Sites) != 2 || len(sc.Nodes()) != 4 {
		t.Fatalf("%d sites, %d nodes; want 2 and 4", len(sc.Sites), len(sc.Nodes()))
	}
	for _, n := range sc.Nodes() {
		var fams []bool
		for _, c := range n.PodCIDRs {
			fams = append(fams, c.Addr().Is6())
		}
		if !slices.Equal(fams, []bool{false, true}) {
			t.Errorf("node %s podCIDRs %v, want an IPv4 and an IPv6 one", n.Name, n.PodCIDRs)
		}
		if len(n.Pods) == 0 {
			t.Errorf("node %s has no pod", n.Name)
		}
		for _, p := range n.Pods {
			if !n.PodCIDRs[1].Contains(p.Address6) {
				t.Errorf("pod %s address6 %s not in %s", p.Name, p.Address6, n.PodCIDRs[1])
			}
		}
	}
	es := sc.Expectations()
	es6, skipped := sc.Expectations6()
	if n := len(sc.Pods()); len(es6) != n*(n-1) || len(es) != len(es6) {
		t.Fatalf("%d IPv6 expectations, %d IPv4; want %d of each", len(es6), len(es), n*(n-1))
	}
	if len(skipped) > 0 {
		t.Errorf("IPv6 pairs left out: %v", skipped)
	}
	for i, e := range es6 {
		p, _ := sc.pod(e.Src)
		if e.Src != es[i].Src || e.Dst != es[i].Dst || e.Saw != p.Address6 {
			t.Errorf("IPv6 expectation %d = %+v, want %s > %s seeing %s", i, e, es[i].Src, es[i].Dst, p.Address6)
		}
	}
	if e, ok := sc.Expect6("a1-p1", "b2-p2"); !ok || e.Saw != netip.MustParseAddr("fd00:a:1::10") {
		t.Errorf("Expect6(a1-p1, b2-p2) = %+v, %v; want fd00:a:1::10", e, ok)
	}
	// Plain WireGuard routing carries IPv4 only: it probes no IPv6 pair and says why.
	l := &Lab{Name: "x1", Scenario: sc, Datapath: DatapathWireGuard}
	es6, skipped = l.Expectations6()
	if len(es6) != 0 || len(skipped) != len(es) || skipped[0].Why != "the wireguard datapath routes IPv4 only" {
		t.Errorf("wireguard lab: %d IPv6 expectations, %d left out (first %+v); want none and %d", len(es6), len(skipped), skipped[0], len(es))
	}
	// isthmus and the plain and VXLAN baselines route IPv6 pods.
	for _, dp := range []Datapath{DatapathIsthmus, DatapathPlain, DatapathVXLAN} {
		l.Datapath = dp
		if es6, _ = l.Expectations6(); len(es6) != len(es) {
			t.Errorf("%s lab: %d IPv6 expectations, want %d", dp, len(es6), len(es))
		}
	}
}

// TestExpectations6Unclear: every scenario feature that makes a pair's IPv6
// expectation unclear leaves the pair out of Expectations6 with its reason,
// while the pair stays in the IPv4 expectations.
func TestExpectations6Unclear(t *testing.T) {
	load := func(t *testing.T, edits ...[2]string) *Scenario {
		t.Helper()
		b, err := builtin.ReadFile("scenarios/dualstack.yaml")
		if err != nil {
			t.Fatal(err)
		}
		doc := string(b)
		for _, e := range edits {
			if !strings.Contains(doc, e[0]) {
				t.Fatalf("test bug: %q not in dualstack.yaml", e[0])
			}
			doc = strings.Replace(doc, e[0], e[1], 1)
		}
		sc, err := ParseScenario([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	const siteA = "      nodeCidrs: [172.16.1.0/24]\n"
	tests := []struct {
		name  string
		edits [][2]string
		// pair is one pair left out, why its reason; probed is one still probed.
		pair, why, probed string
	}{
		{"returnPath SNAT", [][2]string{{siteA, siteA + "      returnPath: SNAT\n"}},
			"a1-p1>a1-p2", "site site-a has returnPath: SNAT", "b1-p1>b2-p1"},
		{"another CNI's site", [][2]string{{siteA, siteA + "      manageCniPlugin: false\n"}},
			"b1-p1>a1-p1", "site site-a has manageCniPlugin: false", "b1-p1>b2-p2"},
		{"behind a NAT", [][2]string{{"    subnet: 172.16.2.0/24          # router holds 172.16.2.1\n", "    subnet: 172.16.2.0/24\n    behindNAT: 198.51.100.2\n"}},
			"a1-p1>b1-p1", "site site-b is behind a NAT", "a1-p1>a2-p2"},
		{"fabric routes", [][2]string{{"    subnet: 172.16.1.0/24          # router holds 172.16.1.1\n", "    subnet: 172.16.1.0/24\n    fabricRoutes: true\n"}},
			"a1-p1>a2-p1", "site site-a has fabricRoutes (the lab's fabric routes IPv4 only)", "b1-p1>b2-p1"},
		{"pod policy", [][2]string{{`{name: b2-p2, address: 10.245.2.11, address6: "fd00:b:2::11"}`, `{name: b2-p2, address: 10.245.2.11, address6: "fd00:b:2::11", ingress: {deny: [10.9.0.0/16]}}`}},
			"a1-p1>b2-p2", "pod b2-p2 has a policy (the lab writes policies for IPv4 only)", "a1-p1>b2-p1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := load(t, tt.edits...)
			es6, skipped := sc.Expectations6()
			probed := map[string]bool{}
			for _, e := range es6 {
				probed[e.Src+">"+e.Dst] = true
			}
			why := map[string]string{}
			for _, u := range skipped {
				why[u.Src+">"+u.Dst] = u.Why
			}
			if got := why[tt.pair]; got != tt.why {
				t.Errorf("%s left out for %q, want %q", tt.pair, got, tt.why)
			}
			if probed[tt.pair] {
				t.Errorf("%s probed over IPv6", tt.pair)
			}
			if !probed[tt.probed] {
				t.Errorf("%s not probed over IPv6 (left out for %q)", tt.probed, why[tt.probed])
			}
			src, dst, _ := strings.Cut(tt.pair, ">")
			if _, ok := sc.Expect(src, dst); !ok {
				t.Errorf("%s lost its IPv4 expectation", tt.pair)
			}
		})
	}
}

// TestExpectations6Gateways: pairs of sites joined through gateways are probed over
// IPv6 as over IPv4 (gateways transit IPv6 with its source kept).
func TestExpectations6Gateways(t *testing.T) {
	sc, err := LoadScenario("dualstackgw")
	if err != nil {
		t.Fatal(err)
	}
	es6, skipped := sc.Expectations6()
	if len(skipped) != 0 {
		t.Errorf("pairs left out: %v", skipped)
	}
	if len(es6) != len(sc.Expectations()) || len(es6) != 30 {
		t.Errorf("%d IPv6 expectations, %d IPv4 ones, want 30 each", len(es6), len(sc.Expectations()))
	}
	if e, ok := sc.Expect6("w1-p1", "e1-p1"); !ok || e.Saw != netip.MustParseAddr("fd00:62:3::10") {
		t.Errorf("w1-p1 -> e1-p1 over IPv6: %+v, %v; want probed, seen from w1-p1's own address6", e, ok)
	}
}

// TestMatrixStringFamilies: a matrix with IPv6 probes prints a grid per
// family, each labelled, and names IPv6 probes icmp6, tcp6, udp6.
func TestMatrixStringFamilies(t *testing.T) {
	m := &Matrix{Pods: []string{"p1", "p2"}, Probes: []Probe{
		{Src: "p1", Dst: "p2", Proto: ICMP, OK: true, Attempts: 1},
		{Src: "p1", Dst: "p2", Proto: TCP, OK: true, Attempts: 1},
		{Src: "p1", Dst: "p2", Proto: UDP, OK: true, Attempts: 1},
		{Src: "p1", Dst: "p2", Proto: ICMP, Family: IPv6, OK: true, Attempts: 1},
		{Src: "p1", Dst: "p2", Proto: TCP, Family: IPv6, OK: false, Err: "connect: timeout", Attempts: 3},
		{Src: "p1", Dst: "p2", Proto: UDP, Family: IPv6, OK: true, Attempts: 2, Errs: []string{"read reply: timeout"}},
	}}
	got := m.String()
	for _, want := range []string{
		"IPv4 (address to address):\nsrc\\dst p1    p2   \np1      -     +++  \n",
		"IPv6 (address6 to address6):\nsrc\\dst p1    p2   \np1      -     +x+  \n",
		"cells: icmp tcp udp (IPv6: icmp6 tcp6 udp6), + ok, x failed, . not probed (no path by design); 6 probes, 1 failed",
		"passed only after a retry: p1->p2 udp6 on attempt 2 (first: read reply: timeout)",
		"FAIL p1 -> p2 tcp6 after 3 attempts: connect: timeout",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("matrix lacks %q:\n%s", want, got)
		}
	}
	if p, ok := m.Get("p1", "p2", TCP); !ok || !p.OK {
		t.Errorf("Get(p1, p2, tcp) = %+v, %v; want the IPv4 probe, passed", p, ok)
	}
	if p, ok := m.GetFamily("p1", "p2", TCP, IPv6); !ok || p.OK {
		t.Errorf("GetFamily(p1, p2, tcp, IPv6) = %+v, %v; want the IPv6 probe, failed", p, ok)
	}
	c := &PathCheck{Matrix: m, Pairs: [][2]string{{"p1", "p2"}}, Pairs6: [][2]string{{"p1", "p2"}},
		Unprobed6: []Unprobed6{{"p2", "p1", "pod p2 has a policy (the lab writes policies for IPv4 only)"}}}
	if diff := cmp.Diff([]string{"p1 -> p2 (tcp6)"}, c.FailedPairs()); diff != "" {
		t.Errorf("failed pairs (-want +got):\n%s", diff)
	}
	s := c.String()
	for _, want := range []string{
		"1 ordered pod pairs probed with icmp, tcp and udp, 0 failed",
		"IPv6: 1 ordered pod pairs probed between their address6 with icmp6, tcp6 and udp6, 1 failed",
		"IPv6 not probed (pod p2 has a policy (the lab writes policies for IPv4 only)): p2->p1",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("path check lacks %q:\n%s", want, s)
		}
	}
}

// base6u is a valid scenario on the IPv6 underlay, which the error cases of
// TestParseScenarioUnderlay6 break one field at a time: two sites on IPv6
// subnets, each node with an IPv6 address and an IPv4 podCIDR (its tunnel
// address), a pod with both addresses.
const base6u = `
name: t
sites:
  - name: s1
    subnet: "fd00:100:1::/64"
    spec: {nodeCidrs: ["fd00:100:1::/64"], podCidrAssignments: [{cidrBlocks: [10.1.0.0/16, "fd00:1::/32"], nodeBlockSizes: {ipv4: 24, ipv6: 64}}]}
    nodes:
      - name: n1
        address: "fd00:100:1::11"
        podCIDRs: [10.1.1.0/24, "fd00:1:1::/64"]
        pods:
          - {name: p1, address: 10.1.1.5, address6: "fd00:1:1::5"}
  - name: s2
    subnet: "fd00:100:2::/64"
    spec: {nodeCidrs: ["fd00:100:2::/64"], podCidrAssignments: [{cidrBlocks: [10.2.0.0/16]}]}
    nodes:
      - name: n2
        address: "fd00:100:2::11"
        podCIDR: 10.2.1.0/24
        pods: [{name: p2, address: 10.2.1.5}]
peerings:
  - {name: s1-s2, sites: [s1, s2]}
`

// TestParseScenarioUnderlay6: sites on IPv6 subnets parse, with the gateway
// defaulting to the subnet's first address and the pods' MTU 70 below the
// underlay's; everything the lab builds for an IPv4 underlay only is refused
// with an error that says so, and so is mixing the families.
func TestParseScenarioUnderlay6(t *testing.T) {
	sc, err := ParseScenario([]byte(base6u))
	if err != nil {
		t.Fatalf("base6u scenario: %v", err)
	}
	if !sc.Underlay6() || !sc.Sites[0].Is6() {
		t.Errorf("Underlay6 %v, site s1 Is6 %v: want both", sc.Underlay6(), sc.Sites[0].Is6())
	}
	if gw := sc.Sites[1].Gateway; gw != netip.MustParseAddr("fd00:100:2::1") {
		t.Errorf("s2 gateway %s, want the subnet's first address fd00:100:2::1", gw)
	}
	p1, _ := sc.Pod("p1")
	if got := sc.PodMTU("s1", p1.Pod); got != 1430 {
		t.Errorf("PodMTU(s1, p1) = %d, want 1430 (1500 less outer IPv6, UDP, GENEVE, inner Ethernet)", got)
	}
	// The IPv4 overhead stays where the underlay is IPv4.
	v4, err := ParseScenario([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := v4.Pod("p1"); v4.Underlay6() || v4.PodMTU("s1", p.Pod) != 1450 {
		t.Errorf("IPv4 underlay: Underlay6 %v, PodMTU %d; want false, 1450", v4.Underlay6(), v4.PodMTU("s1", p.Pod))
	}
	// Encrypted: GENEVE between IPv4 tunnel addresses (50) inside WireGuard over
	// IPv6 (80).
	enc, err := ParseScenario([]byte(strings.Replace(base6u, "sites: [s1, s2]}", "sites: [s1, s2], encryption: WireGuard}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := enc.PodMTU("s1", p1.Pod); got != 1500-50-80 {
		t.Errorf("encrypted over the IPv6 underlay: PodMTU %d, want %d", got, 1500-50-80)
	}
	files, err := sc.ObjectFiles()
	if err != nil {
		t.Fatal(err)
	}
	if want := "address: fd00:100:1::11\n    type: InternalIP"; !strings.Contains(string(files["nodes.yaml"]), want) {
		t.Errorf("nodes.yaml lacks %q:\n%s", want, files["nodes.yaml"])
	}

	pool := `
objects: |
  apiVersion: isthmus.dev/v1alpha1
  kind: GatewayPool
  metadata: {name: gw}
  spec: {type: Internal, nodeSelector: {matchLabels: {isthmus.dev/gateway: "true"}}}
`
	tests := []struct {
		name, old, new, want string
	}{
		{"IPv4 site beside IPv6 ones", `subnet: "fd00:100:2::/64"`, "subnet: 192.168.2.0/24",
			`sites[1] "s2": subnet 192.168.2.0/24 is IPv4 and site "s1"'s fd00:100:1::/64 is IPv6: every site's subnet must be of one family`},
		{"link-local subnet", `subnet: "fd00:100:2::/64"`, `subnet: "fe80::/64"`, "want an IPv4 prefix or an IPv6 global unicast one"},
		{"IPv4-mapped subnet", `subnet: "fd00:100:2::/64"`, `subnet: "::ffff:192.168.2.0/120"`, "want an IPv4 prefix or an IPv6 global unicast one"},
		{"IPv4 node address", `address: "fd00:100:2::11"`, "address: 192.168.2.11", "not in site subnet fd00:100:2::/64"},
		{"Subnet-Router anycast", `address: "fd00:100:2::11"`, `address: "fd00:100:2::"`, "is the subnet's Subnet-Router anycast address"},
		{"node on the gateway", `address: "fd00:100:2::11"`, `address: "fd00:100:2::1"`, "already used by"},
		{"behindNAT", `    subnet: "fd00:100:2::/64"`, "    subnet: \"fd00:100:2::/64\"\n    behindNAT: 203.0.113.50",
			`sites[1] "s2": behindNAT 203.0.113.50: the lab builds it for an IPv4 underlay only, and the subnet fd00:100:2::/64 is IPv6`},
		{"externalAddress", `address: "fd00:100:2::11"`, "address: \"fd00:100:2::11\"\n        externalAddress: 203.0.113.11",
			`node "n2": externalAddress 203.0.113.11 (a 1:1 NAT in the router): the lab builds it for an IPv4 underlay only`},
		{"fabricRoutes", `    subnet: "fd00:100:2::/64"`, "    subnet: \"fd00:100:2::/64\"\n    fabricRoutes: true", "fabricRoutes: the lab builds it for an IPv4 underlay only"},
		{"unmanaged pod", "{name: p2, address: 10.2.1.5}", "{name: p2, address: 10.2.1.5, unmanaged: true}", `pod "p2": unmanaged (routed by the site fabric): the lab builds it for an IPv4 underlay only`},
		{"another CNI's site", "podCidrAssignments: [{cidrBlocks: [10.2.0.0/16]}]}", "manageCniPlugin: false, podCidrAssignments: [{cidrBlocks: [10.2.0.0/16]}]}",
			"manageCniPlugin: false (a site of another CNI, whose pods the fabric routes): the lab builds it for an IPv4 underlay only"},
		{"world", "name: t\n", "name: t\nunderlay: {world: true}\n", "underlay.world: the world and egress masquerade to it are IPv4 only"},
		{"gateway pool", "name: t\n", "name: t\n" + pool, `GatewayPool "gw": gateways over the IPv6 underlay are not carried yet`},
		{"IPv6-only podCIDRs", "podCIDR: 10.2.1.0/24", `podCIDRs: ["fd00:2:1::/64"]`, "IPv6 only (want an IPv4 podCIDR too"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(base6u, tt.old) {
				t.Fatalf("test bug: %q not in base6u", tt.old)
			}
			_, err := ParseScenario([]byte(strings.Replace(base6u, tt.old, tt.new, 1)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseScenario = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestUnderlay6Scenario: the built-in underlay6 scenario is the dualstack one
// on an IPv6 underlay: two sites on fd00:100:1::/64 and fd00:100:2::/64, every
// node with an IPv6 address only and an IPv4 and an IPv6 podCIDR, every pod
// both addresses and the MTU 1430, every pair expected in both families with
// the pods' own addresses; its firewall rules are ip6tables rules.
func TestUnderlay6Scenario(t *testing.T) {
	sc, err := LoadScenario("underlay6")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := LoadScenario("dualstack")
	if err != nil {
		t.Fatal(err)
	}
	if !sc.Underlay6() || len(sc.Sites) != 2 || len(sc.Nodes()) != 4 || len(sc.Pods()) != 8 {
		t.Fatalf("Underlay6 %v, %d sites, %d nodes, %d pods; want an IPv6 underlay, 2, 4, 8", sc.Underlay6(), len(sc.Sites), len(sc.Nodes()), len(sc.Pods()))
	}
	for i, want := range []string{"fd00:100:1::/64", "fd00:100:2::/64"} {
		if got := sc.Sites[i].Subnet.String(); got != want {
			t.Errorf("site %s subnet %s, want %s", sc.Sites[i].Name, got, want)
		}
	}
	dsNodes := ds.Nodes()
	for i, n := range sc.Nodes() {
		if !n.Address.Is6() || !n.Site.Subnet.Contains(n.Address) {
			t.Errorf("node %s address %s: want IPv6 in %s", n.Name, n.Address, n.Site.Subnet)
		}
		if !slices.Equal(n.PodCIDRs, dsNodes[i].PodCIDRs) || n.Name != dsNodes[i].Name {
			t.Errorf("node %s podCIDRs %v, want dualstack's %s %v", n.Name, n.PodCIDRs, dsNodes[i].Name, dsNodes[i].PodCIDRs)
		}
		if a := n.TunnelAddr(); !a.Is4() {
			t.Errorf("node %s tunnel address %s, want the first of its IPv4 podCIDR", n.Name, a)
		}
		for _, p := range n.Pods {
			if !p.Address.Is4() || !p.Address6.Is6() {
				t.Errorf("pod %s addresses %s, %s: want IPv4 and IPv6", p.Name, p.Address, p.Address6)
			}
			if got := sc.PodMTU(n.Site.Name, p); got != 1430 {
				t.Errorf("pod %s MTU %d, want 1430", p.Name, got)
			}
		}
	}
	es := sc.Expectations()
	es6, skipped := sc.Expectations6()
	if len(es) != 56 || len(es6) != 56 || len(skipped) != 0 {
		t.Errorf("%d IPv4 and %d IPv6 expectations, %d IPv6 left out; want 56, 56, 0", len(es), len(es6), len(skipped))
	}
	for _, e := range append(es, es6...) {
		src, _ := sc.Pod(e.Src)
		if e.Saw != src.Address && e.Saw != src.Address6 {
			t.Errorf("%s -> %s sees %s, want the pod's own address", e.Src, e.Dst, e.Saw)
		}
	}
	// With the firewall: the same rules as over IPv4, for ip6tables.
	sc.Underlay.Firewall = true
	rules := (&Lab{Name: "x1", Scenario: sc, Datapath: DatapathIsthmus}).firewallRules()
	for _, want := range []string{
		"-A FORWARD -s fd00:100:1::/64 -d fd00:100:2::/64 -p udp --dport 6081 ",
		"-A FORWARD -s fd00:100:2::/64 -d fd00:100:1::/64 -p ipv6-icmp ",
		"-A FORWARD -m devgroup --src-group 1 --dst-group 1 ",
		"-A isl-fw-drop -j DROP\n",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("firewall rules lack %q:\n%s", want, rules)
		}
	}
	if strings.Contains(rules, "-p icmp ") {
		t.Errorf("firewall rules on an IPv6 underlay match ICMP (v4):\n%s", rules)
	}
}

// TestRPFilterDropCount reads the strict IPv6 rpfilter rule's packets from
// ip6tables -L -v -x -n, and tells a chain without it.
func TestRPFilterDropCount(t *testing.T) {
	list := `Chain PREROUTING (policy ACCEPT 12 packets, 960 bytes)
    pkts      bytes target     prot opt in     out     source               destination         
       7      560 DROP       0    --  *      *       ::/0                 ::/0                 rpfilter invert
`
	if n, ok, err := rpfilterDropCount(list); err != nil || !ok || n != 7 {
		t.Errorf("rpfilterDropCount = %d, %v, %v; want 7, true, nil", n, ok, err)
	}
	empty := "Chain PREROUTING (policy ACCEPT 0 packets, 0 bytes)\n    pkts      bytes target     prot opt in     out     source               destination\n"
	if n, ok, err := rpfilterDropCount(empty); err != nil || ok || n != 0 {
		t.Errorf("without the rule: %d, %v, %v; want 0, false, nil", n, ok, err)
	}
}
