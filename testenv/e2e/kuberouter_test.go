package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cluster"
	"github.com/isthmus-dev/isthmus/testenv/cri"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// policyPod is a kubelet Pod of TestKubeRouterPolicy.
type policyPod struct {
	name, node string
	ip         string
	netns      string // the sandbox's network namespace
	container  string // the probe container
	cd         *cri.Containerd
}

// TestKubeRouterPolicy: the site's NetworkPolicy keeps holding for pods
// isthmus connects, enforced by a real engine. The Kubernetes-mode lab
// (default scenario) runs a containerd and a kubelet on a1 (site-a) and b1
// (site-b), and kube-router's network policy controller on every node
// (testenv.Lab.StartKubeRouter, as its DaemonSet runs it beside another CNI).
// Pods: web-a and peer-a on a1, allowed-b and denied-b on b1, each running
// the probe server (TCP and UDP, port 8080). Real packets throughout:
//   - with no policy, every cross-site pair connects both ways (TCP and UDP),
//     each server seeing the client's own address; a bulk TCP flow from
//     denied-b to web-a takes isthmus' conntrack fast path on a1 (ct_fast
//     counts it) and stays open;
//   - a NetworkPolicy selecting web-a and allowing ingress only from the pod
//     allowed-b: allowed-b connects (TCP, UDP); denied-b (site-b) and peer-a
//     (site-a, same node) do not, and web-a's own network namespace sees no
//     packet from either (tshark on its eth0), while the new flows of
//     denied-b are refused even though its older flow to web-a is on the
//     fast path on a1; on a1 the REJECT rule of web-a's kube-router chain
//     counts the refused attempts and the policy's ACCEPT rules the allowed
//     ones;
//   - a NetworkPolicy on allowed-b allowing no egress: its new connections to
//     web-a and peer-a (across) fail, nothing of them reaches web-a or leaves
//     b1 on the underlay (tshark on b1's router port), and the REJECT rule of
//     allowed-b's chain on b1 counts them.
//
// A datapath that delivered new flows around the node's stack (bpf_redirect_peer
// straight into the pod, or encapsulating at the sending pod's interface) would
// never run them through FORWARD, where kube-router's chains sit: the refused
// pods would connect and the REJECT counters would not move.
func TestKubeRouterPolicy(t *testing.T) {
	requireSetup(t)
	beside(t, weightCluster)
	start := time.Now()
	// The first run on a machine builds kube-apiserver, kubelet, crictl and
	// kube-router.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	kubelet, err := kubebin.Kubelet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	routerBin, err := kubebin.KubeRouter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntimeWork(ctx, t, "iskr-")
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	l := upLab(ctx, t, sc, testenv.Options{Source: testenv.SourceKube, ReadyTimeout: time.Minute})
	cs, err := kubernetes.NewForConfig(l.Kube().RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeletNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(kubeletNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runtimes := map[string]*cri.Containerd{}
	for _, name := range []string{"a1", "b1"} {
		n, _ := l.Node(name)
		dir := filepath.Join(rt.dir, name)
		rn := &runtimeNode{name: name, ipam: ipam.Store{Dir: l.IPAMDir(name)}, net: n.PodCIDRs[0], agent: l.AgentLog(name)}
		rn.cd = startNodeRuntime(ctx, t, l, name, cri.Config{Dir: filepath.Join(dir, "ctd"),
			CNIBinDir: l.CNIBinDir(name), CNIConfDir: l.CNIConfDir(name), Crictl: rt.crictl}, rt.pause, rt.probe)
		if err := rn.cd.WaitNetworkReady(ctx, 30*time.Second); err != nil {
			t.Fatalf("%v\nagent log:\n%s", err, tailFile(rn.agent))
		}
		kl, err := cri.StartKubelet(ctx, cri.KubeletConfig{Dir: filepath.Join(dir, "kubelet"), NetNS: testenv.NSPath(l.NodeNS(name)),
			NodeName: name, NodeIP: n.Address, Kubeconfig: l.Kubeconfig(), Runtime: rn.cd, Binary: kubelet})
		if kl != nil {
			t.Cleanup(func() {
				if err := kl.Stop(); err != nil {
					t.Error(err)
				}
			})
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := cluster.WaitNodeReady(ctx, cs, name, 30*time.Second); err != nil {
			t.Fatalf("%v\nkubelet log:\n%s", err, kl.LogTail())
		}
		runtimes[name] = rn.cd
	}
	if err := l.StartKubeRouter(ctx, routerBin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.KubeRouterRunning(); err != nil {
			t.Error(err)
		}
	})

	// Cleanups run last first: the Pods go before the kubelets stop, so each
	// kubelet stops its sandboxes and containerd leaves no container behind.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, name := range []string{"web-a", "peer-a", "allowed-b", "denied-b"} {
			cs.CoreV1().Pods(kubeletNamespace).Delete(ctx, name, metav1.DeleteOptions{})
		}
		for _, name := range []string{"web-a", "peer-a", "allowed-b", "denied-b"} {
			if err := waitPodGone(ctx, cs, name, 45*time.Second); err != nil {
				t.Error(err)
			}
		}
	})
	pods := map[string]*policyPod{}
	for _, p := range []*policyPod{{name: "web-a", node: "a1"}, {name: "peer-a", node: "a1"}, {name: "allowed-b", node: "b1"}, {name: "denied-b", node: "b1"}} {
		pod := probePod(p.name, p.node)
		pod.Labels = map[string]string{"name": p.name}
		if _, err := cs.CoreV1().Pods(kubeletNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[p.name] = p
	}
	for _, p := range pods {
		obj, err := waitPodRunning(ctx, cs, p.name, 90*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		p.cd = runtimes[p.node]
		sb, err := p.cd.ReadyPod(ctx, kubeletNamespace, p.name)
		if err != nil {
			t.Fatal(err)
		}
		p.ip, p.netns = obj.Status.PodIP, sb.NetNS
		if p.container, err = p.cd.Container(ctx, sb, "probe"); err != nil {
			t.Fatal(err)
		}
	}
	web, peer, allowed, denied := pods["web-a"], pods["peer-a"], pods["allowed-b"], pods["denied-b"]
	t.Logf("lab, kubelets, kube-routers and pods up after %s: web-a %s, peer-a %s, allowed-b %s, denied-b %s",
		time.Since(start).Round(time.Second), web.ip, peer.ip, allowed.ip, denied.ip)

	// No policy: every cross-site pair connects, both ways, TCP and UDP.
	for _, pair := range [][2]*policyPod{{allowed, web}, {denied, web}, {denied, peer}, {web, allowed}, {peer, denied}} {
		for _, proto := range []string{"tcp", "udp"} {
			if err := eventuallyConnects(ctx, pair[0], pair[1], proto, 20*time.Second); err != nil {
				t.Errorf("no policy: %v", err)
			}
		}
	}
	if t.Failed() {
		t.Fatalf("pods do not connect without a policy; kube-router logs %s, %s", l.KubeRouterLog("a1"), l.KubeRouterLog("b1"))
	}

	// denied-b's older flow to web-a, on the fast path on a1 before any
	// policy: it must not open the way for denied-b's new flows.
	flow := openFlow(ctx, t, denied.netns, web.netns, netip.AddrPortFrom(netip.MustParseAddr(web.ip), 9000))
	fastBefore := counterPackets(t, l, "a1", "ct_fast", false)
	if err := flow.round(1 << 20); err != nil {
		t.Fatal(err)
	}
	d := counterPackets(t, l, "a1", "ct_fast", false) - fastBefore
	t.Logf("a1: ct_fast counted %d packets of denied-b's bulk flow to web-a", d)
	if d < 10 {
		t.Fatalf("a1: ct_fast counted %d packets of denied-b's bulk flow to web-a, want at least 10: the flow is not on the fast path", d)
	}

	// Ingress to web-a only from the pod allowed-b.
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web-a-ingress", Namespace: kubeletNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": "web-a"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"name": "allowed-b"}}}},
			}},
		},
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(kubeletNamespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitKubeRouterPolicy(ctx, "a1", np.Name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	rejectWeb := `rule to REJECT traffic destined for POD name:web-a namespace: ` + kubeletNamespace
	acceptWeb := `selected by policy name ` + np.Name + ` namespace ` + kubeletNamespace
	rejectBefore, acceptBefore := ruleHits(ctx, t, l, "a1", rejectWeb), ruleHits(ctx, t, l, "a1", acceptWeb)
	seen := podCapture(t, web.netns, 20*time.Second)
	for _, proto := range []string{"tcp", "udp"} {
		if err := eventuallyConnects(ctx, allowed, web, proto, 10*time.Second); err != nil {
			t.Errorf("policy: the allowed pod: %v", err)
		}
		for _, from := range []*policyPod{denied, peer} {
			if out, err := connect(ctx, from, web, proto); err == nil {
				t.Errorf("policy: %s reached web-a over %s: %q; want refused (only allowed-b may)", from.name, proto, out)
			}
		}
	}
	if err := flow.round(64 << 10); err != nil {
		t.Errorf("denied-b's flow to web-a established before the policy: %v (kube-router lets established flows through)", err)
	}
	sources := seen()
	t.Logf("web-a's eth0 saw packets from %v", sources)
	if sources[allowed.ip] == 0 {
		t.Errorf("web-a's eth0 saw no packet from allowed-b (%s): the capture missed the allowed traffic", allowed.ip)
	}
	for _, from := range []*policyPod{denied, peer} {
		// denied-b's older flow is on another port: only new flows are counted.
		if n := sources[from.ip]; n != 0 {
			t.Errorf("web-a's eth0 saw %d packets from %s (%s) to port 8080: the refused flows reached the pod", n, from.name, from.ip)
		}
	}
	// Four refused attempts (two pods, TCP and UDP): each refused at its first
	// packet at least.
	rejected, accepted := ruleHits(ctx, t, l, "a1", rejectWeb)-rejectBefore, ruleHits(ctx, t, l, "a1", acceptWeb)-acceptBefore
	t.Logf("a1: web-a's REJECT rule counted %d packets, the policy's ACCEPT rules %d", rejected, accepted)
	if rejected < 4 {
		t.Errorf("a1: web-a's kube-router REJECT rule counted %d packets for four refused attempts, want at least 4", rejected)
	}
	if accepted < 2 {
		t.Errorf("a1: the policy's ACCEPT rules counted %d packets for allowed-b's TCP and UDP, want at least 2", accepted)
	}
	flow.close()

	// No egress at all for allowed-b: its new connections across fail on b1.
	egress := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allowed-b-egress", Namespace: kubeletNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": "allowed-b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		},
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(kubeletNamespace).Create(ctx, egress, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitKubeRouterPolicy(ctx, "b1", egress.Name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	rejectAllowed := `rule to REJECT traffic destined for POD name:allowed-b namespace: ` + kubeletNamespace
	rejectBefore = ruleHits(ctx, t, l, "b1", rejectAllowed)
	seen = podCapture(t, web.netns, 15*time.Second)
	wire := capture(t, l.RouterNS(), testenv.RouterPort("b1"), 15*time.Second)
	for _, to := range []*policyPod{web, peer} {
		for _, proto := range []string{"tcp", "udp"} {
			if out, err := connect(ctx, allowed, to, proto); err == nil {
				t.Errorf("egress policy: allowed-b reached %s over %s: %q; want refused", to.name, proto, out)
			}
		}
	}
	if n := seen()[allowed.ip]; n != 0 {
		t.Errorf("egress policy: web-a's eth0 saw %d packets from allowed-b", n)
	}
	for _, f := range wire() {
		if len(f.ipSrc) == 2 && f.ipSrc[1] == allowed.ip {
			t.Errorf("egress policy: a GENEVE frame left b1 carrying allowed-b's packet (%s -> %s, %s)", f.ipSrc[1], f.ipDst[1], f.protocols)
		}
	}
	rejected = ruleHits(ctx, t, l, "b1", rejectAllowed) - rejectBefore
	t.Logf("b1: allowed-b's REJECT rule counted %d packets", rejected)
	if rejected < 4 {
		t.Errorf("b1: allowed-b's kube-router REJECT rule counted %d packets for four refused attempts, want at least 4", rejected)
	}
	// The other pods of b1 are not held by allowed-b's policy.
	if err := eventuallyConnects(ctx, denied, peer, "tcp", 10*time.Second); err != nil {
		t.Errorf("egress policy: %v", err)
	}
	t.Logf("TestKubeRouterPolicy took %s", time.Since(start).Round(time.Second))
}

// connect has the probe client in from's container reach the probe server of
// to on port 8080 over proto (tcp: an HTTP GET; udp: a datagram) and returns
// what the server answered.
func connect(ctx context.Context, from, to *policyPod, proto string) (string, error) {
	if proto == "udp" {
		return from.cd.Exec(ctx, from.container, "/probe", "udp", to.ip+":8080")
	}
	return from.cd.Exec(ctx, from.container, "/probe", "get", "http://"+to.ip+":8080/")
}

// eventuallyConnects retries connect for up to timeout until the server
// answers with from's own address.
func eventuallyConnects(ctx context.Context, from, to *policyPod, proto string, timeout time.Duration) error {
	want := "source " + from.ip + "\n"
	var got string
	var err error
	for deadline := time.Now().Add(timeout); ; {
		got, err = connect(ctx, from, to, proto)
		if err == nil && got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s -> %s over %s: %q, %v; want %q", from.name, to.name, proto, got, err, want)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ruleHits sums the packet counters of the filter rules on node whose text
// holds substr (iptables-save -c: the kernel's counters).
func ruleHits(ctx context.Context, t *testing.T, l *testenv.Lab, node, substr string) uint64 {
	t.Helper()
	out, err := l.Exec(ctx, l.NodeNS(node), "iptables-save", "-c", "-t", "filter")
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	var rules int
	counter := regexp.MustCompile(`^\[(\d+):\d+\] -A `)
	for _, line := range strings.Split(out, "\n") {
		m := counter.FindStringSubmatch(line)
		if m == nil || !strings.Contains(line, substr) {
			continue
		}
		rules++
		v, _ := strconv.ParseUint(m[1], 10, 64)
		n += v
	}
	if rules == 0 {
		t.Fatalf("%s: no filter rule holds %q:\n%s", node, substr, out)
	}
	return n
}

// podCapture runs tshark on eth0 in the pod network namespace at path for
// limit, on packets to port 8080 (the probe server's), and returns a function
// that waits for it to end and counts the packets by IPv4 source.
func podCapture(t *testing.T, path string, limit time.Duration) func() map[string]int {
	t.Helper()
	cmd := testenv.CommandAt(context.Background(), path, "tshark", "-n", "-l", "-i", "eth0", "-f", "dst port 8080",
		"-a", fmt.Sprintf("duration:%d", int(limit.Seconds())), "-T", "fields", "-e", "ip.src")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tshark: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	started := make(chan struct{})
	var errText strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			errText.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), "Capturing on") {
				once = true
				close(started)
			}
		}
	}()
	counts := make(chan map[string]int, 1)
	go func() {
		m := map[string]int{}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			m[strings.TrimSpace(sc.Text())]++
		}
		counts <- m
	}()
	select {
	case <-started:
		time.Sleep(time.Second) // tshark says so a moment before dumpcap listens
	case <-time.After(10 * time.Second):
		t.Fatalf("tshark did not start capturing in %s: %s", path, errText.String())
	}
	return func() map[string]int {
		m := <-counts
		cmd.Wait()
		return m
	}
}

// podFlow is a TCP connection between two pods' network namespaces, the
// server side echoing what it reads.
type podFlow struct {
	c, s net.Conn
	ln   net.Listener
}

// openFlow opens a TCP connection from the pod namespace at src to a
// listener on dst in the pod namespace at dstNS, which echoes.
func openFlow(ctx context.Context, t *testing.T, src, dstNS string, dst netip.AddrPort) *podFlow {
	t.Helper()
	f := &podFlow{}
	if err := doAt(dstNS, func() (err error) {
		f.ln, err = net.Listen("tcp4", dst.String())
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", dstNS, err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := f.ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		go io.Copy(c, c)
		accepted <- c
	}()
	if err := doAt(src, func() (err error) {
		f.c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp4", dst.String())
		return err
	}); err != nil {
		f.ln.Close()
		t.Fatalf("connect from %s to %s: %v", src, dst, err)
	}
	select {
	case f.s = <-accepted:
	case <-time.After(5 * time.Second):
	}
	t.Cleanup(f.close)
	return f
}

// round sends size bytes and reads them back, within 20 s.
func (f *podFlow) round(size int) error {
	f.c.SetDeadline(time.Now().Add(20 * time.Second))
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i)
	}
	errc := make(chan error, 1)
	go func() { _, err := f.c.Write(payload); errc <- err }()
	got := make([]byte, size)
	if _, err := io.ReadFull(f.c, got); err != nil {
		return fmt.Errorf("echo of %d bytes: %w", size, err)
	}
	return <-errc
}

func (f *podFlow) close() {
	if f.c != nil {
		f.c.Close()
	}
	if f.s != nil {
		f.s.Close()
	}
	f.ln.Close()
}
