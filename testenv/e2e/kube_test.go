package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/testenv"
)

// TestKubeMatrix runs the default scenario with every agent fed from a real
// kube-apiserver (--kubeconfig, no objects directory): the lab installs the
// CRDs of deploy/crds, creates the Sites, the SitePeering and the Nodes, and
// the agents must reach the same datapath as in file mode: every pod reaches
// every other over ICMP, TCP and UDP with its own source address.
func TestKubeMatrix(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	// The first run on a machine builds kube-apiserver and etcd (minutes).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	l := upLab(ctx, t, sc, testenv.Options{Source: testenv.SourceKube, ReadyTimeout: time.Minute})
	for _, n := range sc.Nodes() {
		args, err := os.ReadFile("/proc/" + agentPid(t, l, n.Name) + "/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		argv := strings.Split(string(args), "\x00")
		if !contains(argv, "--kubeconfig") || contains(argv, "--objects") {
			t.Fatalf("agent on %s runs %q, want --kubeconfig and no --objects", n.Name, argv)
		}
	}
	cs, err := kubernetes.NewForConfig(l.Kube().RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != len(sc.Nodes()) {
		t.Fatalf("%d Nodes in the API server, want %d", len(nodes.Items), len(sc.Nodes()))
	}

	cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer ccancel()
	m, err := l.Check(cctx)
	t.Logf("matrix:\n%s", m)
	if err != nil {
		t.Fatal(err)
	}
	pods := l.Scenario.Pods()
	if want := len(pods) * (len(pods) - 1) * len(testenv.Protos); len(m.Probes) != want {
		t.Fatalf("%d probes, want %d", len(m.Probes), want)
	}
	for _, p := range m.Probes {
		if p.Proto != testenv.ICMP && p.Saw != l.PodAddr(p.Src) {
			t.Errorf("%s -> %s %s: server saw %s, want the pod's own %s", p.Src, p.Dst, p.Proto, p.Saw, l.PodAddr(p.Src))
		}
	}
}

// TestKubeNodeRemoval: the agents follow the API server live. With the
// default scenario up in Kubernetes mode, a1 routes b2's podCIDR into the
// tunnel; once b2's Node is deleted the route goes, and when the Node comes
// back (same podCIDR, addresses written through the status subresource) the
// route returns and a1-p1 reaches b2-p1 again.
func TestKubeNodeRemoval(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	l := upLab(ctx, t, sc, testenv.Options{Source: testenv.SourceKube, ReadyTimeout: time.Minute})
	b2, _ := l.Node("b2")
	block := b2.PodCIDRs[0].String()
	route := func() string {
		out, err := l.Exec(ctx, l.NodeNS("a1"), "ip", "-4", "route", "show", "exact", block)
		if err != nil {
			t.Fatalf("ip route on a1: %v: %s", err, out)
		}
		return strings.TrimSpace(out)
	}
	waitRoute := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := route()
			if (got != "") == want {
				if want && !strings.Contains(got, "isthmus0") {
					t.Fatalf("a1 routes %s as %q, want via isthmus0", block, got)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("a1 route to %s: %q after 30s, want present=%v", block, got, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitRoute(true)

	cs, err := kubernetes.NewForConfig(l.Kube().RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Nodes().Delete(ctx, "b2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoute(false)

	node := testenv.KubeNode(b2)
	status := node.Status
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = status
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoute(true)
	eventuallyPing(t, l, "a1-p1", "b2-p1")
}

// eventuallyPing waits up to 30s until src reaches dst over ICMP (the
// control plane converging), and logs how many attempts and how long it took.
func eventuallyPing(t *testing.T, l *testenv.Lab, src, dst string) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	for attempt := 1; ; attempt++ {
		err := testenv.Ping(l.PodNS(src), l.PodAddr(dst), 2*time.Second)
		if err == nil {
			t.Logf("%s -> %s answered on attempt %d, %s after the first", src, dst, attempt, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s -> %s: %d attempts in %s, the last: %v", src, dst, attempt, time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// agentPid returns the pid (as text) of a node's agent from the lab's state.
func agentPid(t *testing.T, l *testenv.Lab, node string) string {
	t.Helper()
	data, err := os.ReadFile(l.StateDir() + "/" + node + ".pid")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
