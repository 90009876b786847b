package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cluster"
)

// TestHostPort: a pod's hostPort works on a node where isthmus is the CNI,
// as it does with every production CNI. A whole cluster (testenv/cluster,
// the default scenario without its leftover rules of another CNI: two
// managed sites of two nodes each, deploy/ installed through the lab's
// overlay, no kube-proxy) runs, on a1, a pod
// whose probe serves port 8080 by TCP and UDP and whose container declares
// hostPort 30080 for both protocols. Nothing on a1 listens on 30080: only a
// DNAT of the CNI's port mapping reaches the pod. The probe answers each
// request with the source address it saw, so each answer proves that the
// hostPort pod answered and says which address reached it. Each case asks
// a1's InternalIP (or 127.0.0.1) on 30080, by TCP (HTTP) and UDP:
//
//   - same-node-pod: a pod on a1; the hostPort pod sees that pod's own
//     address.
//   - hairpin: the hostPort pod itself; the portmap plugin masquerades it
//     (its snat), so the pod sees an address of a1, not its own (the kernel
//     drops a packet whose source is the receiver's own address).
//   - other-node-pod: a pod on a2, the same site; the hostPort pod sees that
//     pod's own address.
//   - node-host: a1's host network namespace; the source is a1's InternalIP.
//   - node-localhost: a1's host network namespace to 127.0.0.1:30080 (TCP
//     only: the conformance case HostPort asks localhost by TCP); masqueraded,
//     so the source is an address of a1.
//   - other-node-host: a2's host network namespace; the source is a2's
//     InternalIP. The request arrives plain on a1's underlay device and
//     the pod's reply goes to a2's underlay address, which a1's pods route
//     into isthmus0: the agent's flow marks answer it on the underlay
//     (docs/agent.md, "Flows to the node's own addresses").
func TestHostPort(t *testing.T) {
	requireSetup(t)
	beside(t, weightCluster)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	// Without the default scenario's leftovers of another CNI: their
	// MASQUERADE of the pod blocks rewrites every pod packet the stack
	// forwards to a local pod unmarked, and hostPort's DNAT makes a
	// connection to the node's address one of those; the sources would
	// then say nothing about portmap.
	sc.Defaults.CNILeftovers = testenv.Leftovers{}
	c := upCluster(ctx, t, cluster.Options{Scenario: sc, Work: tempWork(t, "ishp-")})
	cs := c.Client
	const hostPort, containerPort = 30080, 8080
	a1, a2 := c.Node("a1"), c.Node("a2")
	if a1 == nil || a2 == nil {
		t.Fatal("the default scenario has no a1 or a2")
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeletNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hp := probePod("hostport-a1", "a1")
	hp.Spec.Containers[0].Ports = []corev1.ContainerPort{
		{Name: "tcp", ContainerPort: containerPort, HostPort: hostPort, Protocol: corev1.ProtocolTCP},
		{Name: "udp", ContainerPort: containerPort, HostPort: hostPort, Protocol: corev1.ProtocolUDP},
	}
	pods := []*corev1.Pod{hp, probePod("client-a1", "a1"), probePod("client-a2", "a2")}
	for _, p := range pods {
		if _, err := cs.CoreV1().Pods(kubeletNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type podRef struct {
		node      *cluster.Node
		ip        string
		container string
	}
	refs := map[string]podRef{}
	for _, p := range pods {
		n := c.Node(p.Spec.NodeName)
		obj, err := waitPodRunning(ctx, cs, p.Name, 90*time.Second)
		if err != nil {
			t.Fatalf("%v\n%s", err, c.Diagnose(n.Name))
		}
		sb, err := n.Containerd.ReadyPod(ctx, kubeletNamespace, obj.Name)
		if err != nil {
			t.Fatal(err)
		}
		ctr, err := n.Containerd.Container(ctx, sb, "probe")
		if err != nil {
			t.Fatal(err)
		}
		refs[p.Name] = podRef{node: n, ip: obj.Status.PodIP, container: ctr}
	}
	a1Addrs := nodeAddrs(t, testenv.NSPath(c.Lab.NodeNS("a1")))

	nodeIP := a1.Address.String()
	target := func(host, proto string) string {
		if proto == "tcp" {
			return fmt.Sprintf("http://%s/", net.JoinHostPort(host, fmt.Sprint(hostPort)))
		}
		return net.JoinHostPort(host, fmt.Sprint(hostPort))
	}
	// fromPod asks with the probe in a pod's container, retrying a few
	// seconds (the runtime's port mapping may lag the pod's readiness).
	fromPod := func(name string) func(host, proto string) (string, error) {
		r := refs[name]
		return func(host, proto string) (string, error) {
			argv := []string{"/probe", "get", target(host, proto)}
			if proto == "udp" {
				argv = []string{"/probe", "udp", target(host, proto)}
			}
			var out string
			var err error
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(500 * time.Millisecond) {
				out, err = r.node.Containerd.Exec(ctx, r.container, argv...)
				if err == nil || time.Now().After(deadline) {
					return out, err
				}
			}
		}
	}
	fromHost := func(node string) func(host, proto string) (string, error) {
		return func(host, proto string) (string, error) {
			return askFromHost(testenv.NSPath(c.Lab.NodeNS(node)), proto, net.JoinHostPort(host, fmt.Sprint(hostPort)))
		}
	}
	exactly := func(addr string) func(string) bool { return func(s string) bool { return s == addr } }
	ofA1 := func(s string) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && a1Addrs[a]
	}
	cases := []struct {
		name   string
		ask    func(host, proto string) (string, error)
		host   string
		protos []string
		source func(string) bool
		want   string // what source must be, for the message
	}{
		{"same-node-pod", fromPod("client-a1"), nodeIP, []string{"tcp", "udp"}, exactly(refs["client-a1"].ip), "client-a1's own address " + refs["client-a1"].ip},
		{"hairpin", fromPod("hostport-a1"), nodeIP, []string{"tcp", "udp"}, ofA1, "an address of a1 (portmap's masquerade)"},
		{"other-node-pod", fromPod("client-a2"), nodeIP, []string{"tcp", "udp"}, exactly(refs["client-a2"].ip), "client-a2's own address " + refs["client-a2"].ip},
		{"node-host", fromHost("a1"), nodeIP, []string{"tcp", "udp"}, exactly(nodeIP), "a1's InternalIP " + nodeIP},
		{"node-localhost", fromHost("a1"), "127.0.0.1", []string{"tcp"}, ofA1, "an address of a1 (portmap's masquerade)"},
		{"other-node-host", fromHost("a2"), nodeIP, []string{"tcp", "udp"}, exactly(a2.Address.String()), "a2's InternalIP " + a2.Address.String()},
	}
	a1NS := testenv.NSPath(c.Lab.NodeNS("a1"))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rpf := rpFilterDrops(t, a1NS)
			for _, proto := range tc.protos {
				out, err := tc.ask(tc.host, proto)
				src, ok := strings.CutPrefix(strings.TrimSpace(out), "source ")
				if err != nil || !ok || !tc.source(src) {
					t.Errorf("%s %s: answer %q, %v; want the hostPort pod's answer naming %s", proto, target(tc.host, proto), out, err, tc.want)
				}
			}
			if t.Failed() {
				t.Logf("a1's IPReversePathFilter count went from %d to %d during the case", rpf, rpFilterDrops(t, a1NS))
			}
		})
	}
	if t.Failed() {
		out, _ := c.Lab.Exec(ctx, c.Lab.NodeNS("a1"), "iptables-save", "-t", "nat")
		conf, _ := os.ReadFile(filepath.Join(c.Lab.CNIConfDir("a1"), cniinstall.ConflistName))
		t.Logf("a1's nat table:\n%s\na1's conflist:\n%s", out, conf)
	}
}

// nodeAddrs returns the IPv4 addresses of every interface in the network
// namespace at path.
func nodeAddrs(t *testing.T, path string) map[netip.Addr]bool {
	t.Helper()
	out := map[netip.Addr]bool{}
	err := doAt(path, func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
				out[ip] = true
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rpFilterDrops returns the IPReversePathFilter counter (packets strict
// rp_filter dropped) of the network namespace at path.
func rpFilterDrops(t *testing.T, path string) int {
	t.Helper()
	var n int
	err := doAt(path, func() error {
		// thread-self: this thread's namespace, not the process's.
		b, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j := range names {
				if names[j] == "IPReversePathFilter" && j < len(values) {
					n, err = strconv.Atoi(values[j])
					return err
				}
			}
		}
		return fmt.Errorf("no IPReversePathFilter in %s", path)
	})
	if err != nil {
		t.Error(err)
	}
	return n
}

// hostGet is the probe's get, in the calling thread's network namespace:
// the connection is dialled here, on this thread (net/http's Transport
// would dial on another goroutine, in whatever namespace its thread is).
// askFromHost asks the probe's server at addr (host:port) by proto (tcp: an
// HTTP get, udp: a datagram) from the network namespace at nsPath, retrying
// for up to 10 s, and returns its answer.
func askFromHost(nsPath, proto, addr string) (string, error) {
	var out string
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		err = doAt(nsPath, func() error {
			var e error
			if proto == "tcp" {
				out, e = hostGet("http://" + addr + "/")
			} else {
				out, e = hostUDP(addr)
			}
			return e
		})
		if err == nil || time.Now().After(deadline) {
			return out, err
		}
	}
}

func hostGet(url string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	conn, err := net.DialTimeout("tcp", req.URL.Host, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	req.Close = true
	if err := req.Write(conn); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("get %s: %s", url, resp.Status)
	}
	return string(b), err
}

// hostUDP is the probe's udp, in the calling thread's network namespace:
// one datagram, its answer, three tries a second apart.
func hostUDP(addr string) (string, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for try := 0; try < 3; try++ {
		if _, err := c.Write([]byte("probe")); err != nil {
			return "", err
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		if n, err := c.Read(buf); err == nil {
			return string(buf[:n]), nil
		}
	}
	return "", fmt.Errorf("udp %s: no answer to three datagrams", addr)
}
