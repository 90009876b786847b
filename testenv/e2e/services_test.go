package e2e

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/isthmus-dev/isthmus/testenv"
)

// serviceCase is one client reaching one pod through a Service.
type serviceCase struct {
	name string
	// client is a pod, "node:NAME" (a node's host namespace) or "router" (a
	// client outside the cluster, in the underlay's router).
	client  string
	backend string // pod behind the Service
	// nodePort, when set, is the node whose address the client dials on the
	// Service's NodePort; else the client dials the ClusterIP.
	nodePort string
	// saw is the source the backend must see: a pod's address ("pod:NAME"),
	// a fixed address, or "node:NAME" for any address of that node
	// (kube-proxy's MASQUERADE picks one).
	saw string
	// fragNeeded: an ICMP frag-needed about the flow, sent back from the
	// backend's side, must reach the client translated (checkServiceFragNeeded).
	fragNeeded bool
}

// seed000Services is the Service matrix on seed 000 (mesh): an AKS site of
// unmanaged pods (aks-1 holds aks1-p1 and aks1-ext, aks-2 holds aks2-p1) and a
// flex site of managed pods (flex-1 holds flex-p1).
var seed000Services = []serviceCase{
	{name: "ClusterIP same node", client: "aks1-ext", backend: "aks1-p1", saw: "pod:aks1-ext"},
	// The site fabric alone carries this one: the probe's own control.
	{name: "ClusterIP other node of the site", client: "aks2-p1", backend: "aks1-p1", saw: "pod:aks2-p1", fragNeeded: true},
	{name: "ClusterIP managed client to remote site", client: "flex-p1", backend: "aks1-p1", saw: "pod:flex-p1", fragNeeded: true},
	{name: "ClusterIP managed client to remote site, other node", client: "flex-p1", backend: "aks2-p1", saw: "pod:flex-p1"},
	{name: "ClusterIP unmanaged client to remote site", client: "aks1-p1", backend: "flex-p1", saw: "pod:aks1-p1", fragNeeded: true},
	// 10.0.4.10 is outside every declared pool: return-path SNAT gives it
	// aks-1's tunnel address on the way into the tunnel.
	{name: "ClusterIP translated client to remote site", client: "aks1-ext", backend: "flex-p1", saw: "100.64.0.4"},
	{name: "ClusterIP hairpin managed", client: "flex-p1", backend: "flex-p1", saw: "node:flex-1"},
	{name: "ClusterIP hairpin unmanaged", client: "aks1-p1", backend: "aks1-p1", saw: "node:aks-1"},
	{name: "NodePort local backend", client: "aks2-p1", backend: "aks1-p1", nodePort: "aks-1", saw: "node:aks-1"},
	{name: "NodePort remote-site backend", client: "aks1-p1", backend: "flex-p1", nodePort: "aks-2", saw: "node:aks-2"},
}

// TestKubeProxyServices runs seed 000 (mesh) in Kubernetes mode with a real
// kube-proxy on every node, in iptables and then nftables mode, creates a
// Service and EndpointSlice per backend pod, and checks every case of
// seed000Services: the client connects and the backend sees the expected
// source. A datapath that delivers a Service's reply around conntrack leaves
// it un-DNATed, and the client never gets its answer.
func TestKubeProxyServices(t *testing.T) {
	beside(t, weightLab)
	testServices(t, "seed000", seed000Services)
}

// seed003Services is the Service matrix on seed 003 (gateways only): the cloud
// site (master-gw, its gateway, holds mgw-p1; members master-02 holds m02-p1,
// master-03 holds m03-p1; every cloud node carries flannel's
// `-s 10.16.0.0/12 ! -d 224.0.0.0/4 -j MASQUERADE`) reaches the edge site
// (edge-gw holds egw-p1, member edge-01 holds e01-p1) only through the two
// gateways. Backends in the remote site are reached member to gateway to gateway
// to member, and flannel's MASQUERADE must not rewrite the client's address on
// the way.
var seed003Services = []serviceCase{
	{name: "ClusterIP member to remote member through both gateways", client: "m02-p1", backend: "e01-p1", saw: "pod:m02-p1", fragNeeded: true},
	{name: "ClusterIP remote member to member through both gateways", client: "e01-p1", backend: "m03-p1", saw: "pod:e01-p1"},
	{name: "ClusterIP gateway pod to remote member", client: "mgw-p1", backend: "e01-p1", saw: "pod:mgw-p1"},
	{name: "ClusterIP member to remote gateway's pod", client: "m03-p1", backend: "egw-p1", saw: "pod:m03-p1"},
	{name: "ClusterIP remote gateway's pod to member", client: "egw-p1", backend: "m02-p1", saw: "pod:egw-p1"},
	// kube-proxy masquerades NodePort traffic (its 0x4000 mark wins over the
	// exemption): the backend sees the address the node dialled from. A pod
	// reaches another node's address through the tunnel, as that node answers
	// it (docs/architecture.md, "Pods and node addresses"): within a site with
	// nothing masquerading it (the edge site, where strict rp_filter dropped
	// the request before issue 11), within the cloud site, and across the
	// sites through both gateways (the firewall passes only the gateways'
	// own traffic across).
	{name: "NodePort on a member, remote member backend", client: "m03-p1", backend: "e01-p1", nodePort: "master-02", saw: "node:master-02"},
	{name: "NodePort on a member, remote gateway's pod backend", client: "mgw-p1", backend: "egw-p1", nodePort: "master-03", saw: "node:master-03"},
	{name: "NodePort on the site's member from the gateway's pod, local backend", client: "egw-p1", backend: "e01-p1", nodePort: "edge-01", saw: "node:edge-01"},
	{name: "NodePort on the site's gateway from a member's pod, remote backend", client: "e01-p1", backend: "m02-p1", nodePort: "edge-gw", saw: "node:edge-gw"},
	{name: "NodePort on a remote member through both gateways", client: "m02-p1", backend: "egw-p1", nodePort: "edge-01", saw: "node:edge-01"},
	{name: "NodePort from outside the cluster, remote member backend", client: "router", backend: "m02-p1", nodePort: "edge-01", saw: "node:edge-01"},
	// Another node's host dials a NodePort whose backend is local: plain on
	// the underlay, DNATed to a pod whose traffic to that host's address the
	// node routes into isthmus0 (table 201): the flow must be answered, and
	// rp_filter-checked, on the underlay, where it entered.
	{name: "NodePort on the site's member from its gateway's host, local backend", client: "node:edge-gw", backend: "e01-p1", nodePort: "edge-01", saw: "node:edge-01"},
	{name: "NodePort on the site's gateway from a member's host, local backend", client: "node:edge-01", backend: "egw-p1", nodePort: "edge-gw", saw: "node:edge-gw"},
}

// seed000gwServices is the Service matrix on seed 000's gateway topology:
// aks-1 is the AKS site's gateway, aks-2 a member whose declared pods reach
// the flex site through the site's fabric and aks-1 (table 202).
var seed000gwServices = []serviceCase{
	{name: "ClusterIP member's pod to remote site through the gateway", client: "aks2-p1", backend: "flex-p1", saw: "pod:aks2-p1"},
	// A remote pod dials the member's address through the gateway; the member
	// DNATs it to its own pod, whose traffic to the flex site the fabric table
	// sends to the gateway on the underlay: the flow must be answered into
	// isthmus0, where it entered.
	{name: "NodePort on a member from a remote pod through the gateway, local backend", client: "flex-p1", backend: "aks2-p1", nodePort: "aks-2", saw: "node:aks-2"},
}

// TestKubeProxyServicesGatewayMode is TestKubeProxyServices on seed 000's
// gateway topology, where a member's pods leave by the site's fabric, with the
// agents' default decapsulation (the path is the stack's, not the hook's).
func TestKubeProxyServicesGatewayMode(t *testing.T) {
	beside(t, weightLab)
	testServicesDecap(t, "seed000gw", seed000gwServices, "")
}

// TestKubeProxyServicesGateways is TestKubeProxyServices on seed 003, where the
// sites reach each other only through gateway pools: ClusterIP and NodePort
// backends in the remote site, in both kube-proxy modes, and the source each
// backend sees.
func TestKubeProxyServicesGateways(t *testing.T) {
	beside(t, weightLab)
	testServices(t, "seed003", seed003Services)
}

// testServices brings scenario up in Kubernetes mode and runs cases through
// checkServiceMatrix, once per decapsulation mode (eachDecap).
func testServices(t *testing.T, scenario string, cases []serviceCase) {
	t.Helper()
	eachDecap(t, func(t *testing.T, decap string) { testServicesDecap(t, scenario, cases, decap) })
}

// testServicesDecap is testServices with every agent started with --decap decap.
func testServicesDecap(t *testing.T, scenario string, cases []serviceCase, decap string) {
	t.Helper()
	requireSetup(t)
	sc, err := testenv.LoadScenario(scenario)
	if err != nil {
		t.Fatal(err)
	}
	sc.Decap = decap
	// The first run on a machine builds kube-apiserver, etcd and kube-proxy.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	l := upLab(ctx, t, sc, testenv.Options{Source: testenv.SourceKube, ReadyTimeout: time.Minute})
	checkServiceMatrix(ctx, t, l, cases)
}

// checkServiceMatrix starts an echo server in every backend, creates their
// Services, and runs cases under kube-proxy in each mode.
func checkServiceMatrix(ctx context.Context, t *testing.T, l *testenv.Lab, cases []serviceCase) {
	t.Helper()
	svcs := map[string]testenv.Service{}
	ports := map[string]uint16{}
	for _, c := range cases {
		if _, ok := svcs[c.backend]; ok {
			continue
		}
		srv, err := testenv.StartEchoServer(l.PodNS(c.backend))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		svc, err := l.CreateService(ctx, "echo-"+c.backend, c.backend, srv.TCPPort)
		if err != nil {
			t.Fatal(err)
		}
		svcs[c.backend] = svc
		ports[c.backend] = srv.TCPPort
	}
	for _, mode := range []testenv.ProxyMode{testenv.ProxyIPTables, testenv.ProxyNFTables} {
		t.Run(string(mode), func(t *testing.T) {
			if err := l.StartKubeProxy(ctx, mode); err != nil {
				t.Fatal(err)
			}
			waitProxyRules(ctx, t, l, mode, svcs)
			for _, c := range cases {
				svc := svcs[c.backend]
				to := netip.AddrPortFrom(svc.ClusterIP, svc.Port)
				if c.nodePort != "" {
					n, _ := l.Node(c.nodePort)
					to = netip.AddrPortFrom(n.Address, svc.NodePort)
				}
				ns := l.RouterNS()
				if node, ok := strings.CutPrefix(c.client, "node:"); ok {
					ns = l.NodeNS(node)
				} else if c.client != "router" {
					ns = l.PodNS(c.client)
				}
				saw, err := eventuallyTCPEcho(ns, to)
				if err != nil {
					t.Errorf("%s: %s -> %s (%s): %v", c.name, c.client, to, c.backend, err)
					continue
				}
				if want := expectedSource(ctx, t, l, c.saw); !want(saw) {
					t.Errorf("%s: %s -> %s (%s): backend saw %s, want %s", c.name, c.client, to, c.backend, saw, c.saw)
					continue
				}
				t.Logf("%s: %s -> %s (%s): backend saw %s", c.name, c.client, to, c.backend, saw)
				if c.fragNeeded {
					checkServiceFragNeeded(ctx, t, l, c.client, c.backend, svc, ports[c.backend])
				}
			}
		})
	}
}

// eventuallyTCPEcho tries a TCP echo three times (a first SYN may meet a
// neighbour resolution) and returns the source the server saw.
func eventuallyTCPEcho(ns string, to netip.AddrPort) (netip.Addr, error) {
	var err error
	for range 3 {
		var saw netip.Addr
		if saw, err = testenv.TCPEcho(ns, to, 3*time.Second); err == nil {
			return saw, nil
		}
	}
	return netip.Addr{}, err
}

// expectedSource turns a serviceCase.saw into a predicate.
func expectedSource(ctx context.Context, t *testing.T, l *testenv.Lab, want string) func(netip.Addr) bool {
	t.Helper()
	switch {
	case strings.HasPrefix(want, "pod:"):
		a := l.PodAddr(strings.TrimPrefix(want, "pod:"))
		return func(s netip.Addr) bool { return s == a }
	case strings.HasPrefix(want, "node:"):
		out, err := l.Exec(ctx, l.NodeNS(strings.TrimPrefix(want, "node:")), "ip", "-4", "-o", "addr", "show")
		if err != nil {
			t.Fatal(err)
		}
		return func(s netip.Addr) bool {
			return s.IsValid() && !s.IsLoopback() && strings.Contains(out, " "+s.String()+"/")
		}
	default:
		a := netip.MustParseAddr(want)
		return func(s netip.Addr) bool { return s == a }
	}
}

// waitProxyRules waits until every node's kube-proxy has written rules for
// every Service's ClusterIP.
func waitProxyRules(ctx context.Context, t *testing.T, l *testenv.Lab, mode testenv.ProxyMode, svcs map[string]testenv.Service) {
	t.Helper()
	var list []testenv.Service
	for _, s := range svcs {
		list = append(list, s)
	}
	if err := l.WaitKubeProxyRules(ctx, mode, list, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// TestSitePolicy: seed 000 (mesh) with FORWARD rules of the shape Calico's
// policy-only mode writes for pod interfaces (testenv.Policy: per pod and
// direction, conntrack's ESTABLISHED accepted first). aks1-p1's ingress denies the
// flex site's pod block and its egress allows flex-p1; aks2-p1's ingress allows
// flex-p1 and denies the rest of the block, and its egress denies the block. Across
// isthmus, in both directions (ICMP, TCP, UDP): denied flows stay denied, each
// counted by its own deny rule; allowed flows pass with their sources, the egress
// allow rule counting them; and the UDP flow aks1-p1 opens to flex-p1 gets its
// replies although aks1-p1's ingress denies new flows from that block (aks-1's
// conntrack saw the request first). Before the pod's flow-opening packets went
// through its node's stack, egress rules saw none of them and those UDP replies
// were dropped as new flows.
//
// Then CheckPaths, whose matrix leaves out the pairs a policy denies, and the
// probes it runs for every policy scenario (testenv.CheckPolicy), with the
// conntrack fast path on (the datapath's default; each revoked flow must have moved
// ct_fast on the judging node before it is revoked): from each policy's denied
// source a 100-byte UDP datagram, a 3,000-byte one that flex-p1's kernel fragments
// at its MTU of 1450, an ICMP timestamp and a packet of IP protocol 253 reach
// nothing of the destination pod, while the same packets from an allowed pair all
// arrive; a TCP flow through each policy survives the deletion of its conntrack
// entry while the policy allows it, and is cut by a DROP rule for its sender and
// `conntrack -D` of its entry. Among them, row by row, the table of what the
// remote site sends to aks1-p1, which accepts nothing from it: the small datagram
// denied, the fragmented one denied, the established flow cut.
func TestSitePolicy(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	sc, err := testenv.LoadScenario("seed000")
	if err != nil {
		t.Fatal(err)
	}
	flexBlock := netip.MustParsePrefix("192.168.20.0/24")
	flexP1 := netip.MustParsePrefix("192.168.20.6/32")
	setPolicy(t, sc, "aks1-p1", &testenv.Policy{Deny: []netip.Prefix{flexBlock}}, &testenv.Policy{Allow: []netip.Prefix{flexP1}})
	setPolicy(t, sc, "aks2-p1", &testenv.Policy{Allow: []netip.Prefix{flexP1}, Deny: []netip.Prefix{flexBlock}}, &testenv.Policy{Deny: []netip.Prefix{flexBlock}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l := upLab(ctx, t, sc, testenv.Options{})

	allowBefore := ruleCount(ctx, t, l, "aks-1", "isl-fw-aks1-p1", "ACCEPT", "policy allow")
	allowed := [][2]string{{"aks1-p1", "flex-p1"}, {"flex-p1", "aks2-p1"}, {"aks2-p1", "aks1-p1"}, {"aks1-ext", "aks1-p1"}}
	m, err := l.CheckPairs(ctx, allowed, testenv.CheckOptions{})
	t.Logf("allowed:\n%s", m)
	if err != nil {
		t.Fatal(err)
	}
	checkOwnSources(t, l, m)
	if after := ruleCount(ctx, t, l, "aks-1", "isl-fw-aks1-p1", "ACCEPT", "policy allow"); after < allowBefore+3 {
		t.Errorf("aks1-p1's egress allow rule counted %d packets before its flows to flex-p1 and %d after, want one each for ICMP, TCP and UDP at least: aks-1's filter did not see them", allowBefore, after)
	}

	for _, d := range []struct{ src, dst, node, chain string }{
		{"flex-p1", "aks1-p1", "aks-1", "isl-tw-aks1-p1"}, // ingress
		{"aks2-p1", "flex-p1", "aks-2", "isl-fw-aks2-p1"}, // egress
	} {
		before := ruleCount(ctx, t, l, d.node, d.chain, "DROP", "policy deny")
		m, _ = l.CheckPairs(ctx, [][2]string{{d.src, d.dst}}, testenv.CheckOptions{})
		t.Logf("denied:\n%s", m)
		for _, p := range m.Probes {
			if p.OK {
				t.Errorf("%s -> %s %s passed; %s's policy denies it", d.src, d.dst, p.Proto, d.chain)
			}
		}
		if after := ruleCount(ctx, t, l, d.node, d.chain, "DROP", "policy deny"); after < before+3 {
			t.Errorf("%s's deny rule on %s counted %d packets before the denied probes and %d after, want one each for ICMP, TCP and UDP at least: the site's filter never saw them", d.chain, d.node, before, after)
		}
	}

	if mtu := linkAt(t, l.PodNS("flex-p1"), testenv.UnderlayDev).Attrs().MTU; mtu != 1450 {
		t.Fatalf("flex-p1's eth0 has MTU %d, want the 1450 its CNI gives it", mtu)
	}
	// CheckPaths, the check of every scenario: the matrix of the pairs no policy
	// denies, then CheckPolicy.
	c, err := l.CheckPaths(ctx)
	if c == nil {
		t.Fatal(err)
	}
	t.Logf("paths and policy probes:\n%s", c)
	if err != nil {
		t.Error(err)
	}
	pc := c.Policy
	if pc == nil {
		t.Fatal("CheckPaths ran no policy probes on a scenario with pod policies")
	}
	for _, row := range []struct{ kind, want string }{
		{testenv.ProbeUDP, testenv.WantDenied},
		{testenv.ProbeUDPFragmented, testenv.WantDenied},
		{testenv.ProbeRevoked, testenv.WantCut},
	} {
		p, ok := pc.Get("flex-p1", "aks1-p1", row.kind)
		switch {
		case !ok:
			t.Errorf("flex-p1 -> aks1-p1 %s: not probed", row.kind)
		case p.Want != row.want:
			t.Errorf("flex-p1 -> aks1-p1 %s: probed for %s, want %s", row.kind, p.Want, row.want)
		default:
			t.Logf("flex-p1 -> aks1-p1 %s: want %s, got %s, ok %v", row.kind, p.Want, p.Got, p.OK)
		}
	}
}

// checkOwnSources fails the test for every TCP or UDP probe of m whose server
// saw another source than the sending pod's own address of the probe's family,
// and returns how many of m's probes were IPv6.
func checkOwnSources(t *testing.T, l *testenv.Lab, m *testenv.Matrix) (v6 int) {
	t.Helper()
	for _, p := range m.Probes {
		src, _ := l.Pod(p.Src)
		want := src.Address
		if p.Family == testenv.IPv6 {
			v6++
			want = src.Address6
		}
		if p.Proto != testenv.ICMP && p.Saw != want {
			t.Errorf("%s -> %s %s %v: server saw %s, want the pod's own %s", p.Src, p.Dst, p.Proto, p.Family, p.Saw, want)
		}
	}
	return v6
}

// setPolicy gives a scenario pod its ingress and egress policies (nil: none).
func setPolicy(t *testing.T, sc *testenv.Scenario, pod string, ingress, egress *testenv.Policy) {
	t.Helper()
	for i := range sc.Sites {
		for j := range sc.Sites[i].Nodes {
			for k := range sc.Sites[i].Nodes[j].Pods {
				if p := &sc.Sites[i].Nodes[j].Pods[k]; p.Name == pod {
					p.Ingress, p.Egress = ingress, egress
					return
				}
			}
		}
	}
	t.Fatalf("no pod %s in scenario %s", pod, sc.Name)
}

// ruleCount reads the packet counter of the rule with target and comment in a
// pod's policy chain on its node (iptables -nvxL).
func ruleCount(ctx context.Context, t *testing.T, l *testenv.Lab, node, chain, target, comment string) uint64 {
	t.Helper()
	out, err := l.Exec(ctx, l.NodeNS(node), "iptables", "-w", "-nvxL", chain)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == target && strings.Contains(line, comment) {
			n, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				t.Fatalf("parse counter in %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s rule %q in %s on %s:\n%s", target, comment, chain, node, out)
	return 0
}

// TestLabUpKubernetes: `isthmus-lab lab up --kubernetes iptables` brings seed 000 up
// with a real API server, the isthmus controller, agents fed from the API and
// kube-proxy on every node; `lab check` shows the Sites the controller made
// Ready and a passing matrix; `lab down` from another process stops the serving
// process, which removes all of it.
func TestLabUpKubernetes(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	name := labName()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.LabBinary(binary), "lab", "up", "seed000", "--name", name, "--kubernetes", "iptables", "--ready-timeout", "1m")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		testenv.Down(name, testenv.DownOptions{Binary: binary})
	})
	sc := bufio.NewScanner(stdout)
	up := false
	for !up && sc.Scan() {
		up = strings.Contains(sc.Text(), "is up in Kubernetes mode")
	}
	if !up {
		t.Fatalf("lab up --kubernetes never said it was up:\n%s", stderr.String())
	}
	go io.Copy(io.Discard, stdout)
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(testenv.StateDir(name), "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 3 {
		t.Fatalf("Nodes through the lab's kubeconfig: %v (%v), want aks-1, aks-2, flex-1", nodes, err)
	}
	for _, n := range []string{"aks-1", "aks-2", "flex-1"} {
		deadline := time.Now().Add(time.Minute)
		for {
			out, _ := testenv.Exec(ctx, testenv.NSName(name, n), "iptables-save", "-t", "nat")
			// kube-proxy's chains and its masquerade rule: it synced from the API.
			if strings.Contains(out, "-j KUBE-SERVICES") && strings.Contains(out, "kubernetes service traffic requiring SNAT") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no kube-proxy rules on %s after 1m:\n%s", n, out)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	// The controller runs: it wrote every Site's Ready condition, and `lab
	// check` shows them above a passing matrix.
	var out []byte
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		out, err = exec.CommandContext(ctx, testenv.LabBinary(binary), "lab", "check", "seed000", "--name", name).CombinedOutput()
		if err == nil && strings.Contains(string(out), "site cluster: Ready True") && strings.Contains(string(out), "site flex-site: Ready True") {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(testenv.StateDir(name), "controller.log"))
			t.Fatalf("lab check after 1m: %v, want both Sites Ready True and a passing matrix:\n%s\ncontroller log:\n%s", err, out, log)
		}
	}
	t.Logf("lab check:\n%s", out)
	identity := []byte("--identity\x00lab-" + name + "\x00")
	if controllerPIDs(identity) == nil {
		t.Fatal("no isthmus controller process with identity lab-" + name)
	}
	// `lab down` from another process stops the one serving the lab, which
	// takes it all down: API server, controller, kube-proxy, agents.
	if out, err := exec.CommandContext(ctx, testenv.LabBinary(binary), "lab", "down", "--name", name).CombinedOutput(); err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("lab up --kubernetes after lab down: %v\n%s", err, stderr.String())
	}
	if pids := controllerPIDs(identity); pids != nil {
		t.Errorf("isthmus controller still running after lab down: pids %v", pids)
	}
	assertGone(t, name)
}

// controllerPIDs returns the processes whose command line holds identity.
func controllerPIDs(identity []byte) []string {
	var pids []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, identity) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}
