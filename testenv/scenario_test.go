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
