package kube_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/controller"
	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/loader/source"
	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// churnAgentEnv, when set to a kubeconfig, makes the test binary the agent
// process of BenchmarkNodeChurn (see TestMain): its CPU is measured apart
// from the process that writes the heartbeats.
const churnAgentEnv = "ISTHMUS_CHURN_AGENT_KUBECONFIG"

func TestMain(m *testing.M) {
	if kc := os.Getenv(churnAgentEnv); kc != "" {
		if err := churnAgent(kc, os.Getenv("ISTHMUS_CHURN_AGENT_NODE")); err != nil {
			fmt.Fprintln(os.Stderr, "churn agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// churnAgent is the agent's control loop with the Kubernetes source, without
// a kernel: plan on every Changed, and every resync period only when the
// source's Generation moved (as agent.Agent does). It prints "planned N"
// after every plan and exits on SIGTERM.
func churnAgent(kubeconfig, node string) error {
	rc, err := source.RESTConfig(kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, err := source.NewKubernetes(ctx, source.KubernetesConfig{Client: cs, Dynamic: dyn})
	if err != nil {
		return err
	}
	defer src.Close()
	plans := 0
	var planned uint64
	replan := func() error {
		planned = src.Generation()
		set, _, err := src.Snapshot()
		if err != nil {
			return err
		}
		if _, err := plan.Compute(set, node); err != nil {
			return err
		}
		plans++
		fmt.Printf("planned %d\n", plans)
		return nil
	}
	if err := replan(); err != nil {
		return err
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	resync := time.NewTicker(30 * time.Second)
	defer resync.Stop()
	for {
		select {
		case <-term:
			return nil
		case <-src.Changed():
		case <-resync.C:
			if src.Generation() == planned {
				continue
			}
		}
		if err := replan(); err != nil {
			return err
		}
	}
}

// cpuTicks returns the user and system CPU time of process pid, in clock
// ticks (USER_HZ, 100 per second on Linux), from /proc/pid/stat.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: the fields start after its ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: %q", pid, b)
	}
	return utime + stime, nil
}

// churnFleet is the fleet of BenchmarkNodeChurn: 50 Sites of 100 Nodes, meshed.
var churnFleet = fleet.Shape{Sites: 50, NodesPerSite: 100, Topology: fleet.Mesh}

// BenchmarkNodeChurn measures issue 12's Kubernetes side on the test API
// server: the controller bootstrapping podCIDRs for 5,000 new Nodes (its
// default QPS and burst), and then the CPU of an agent process (Kubernetes
// source and plan, as churnAgent) while every Node's kubelet heartbeat
// (status conditions) is written every 10 s, for 60 s. The heartbeats touch
// nothing the plan reads, so the agent must not plan again, and its CPU is
// the cost of receiving the events. make bench runs it once; it takes some
// 5 minutes. Results: docs/benchmarks.md.
func BenchmarkNodeChurn(b *testing.B) {
	for b.Loop() {
		r := nodeChurn(b, churnFleet, 60*time.Second)
		b.ReportMetric(r.bootstrap.Seconds(), "s-bootstrap")
		b.ReportMetric(100*r.agentCPU, "%core-agent")
		b.ReportMetric(r.heartbeatRate, "heartbeats/s")
		b.ReportMetric(float64(r.replans), "replans")
	}
}

// TestNodeChurnSmall is BenchmarkNodeChurn on 100 Nodes for 15 s, in make
// test: on the real API server, heartbeats make no plan, and the controller
// bootstraps every Node.
func TestNodeChurnSmall(t *testing.T) {
	nodeChurn(t, fleet.Shape{Sites: 2, NodesPerSite: 50, Topology: fleet.Mesh}, 15*time.Second)
}

// churnResult is what nodeChurn measured.
type churnResult struct {
	bootstrap     time.Duration
	agentCPU      float64 // cores
	heartbeatRate float64 // per second
	replans       int64
}

func nodeChurn(b testing.TB, sh fleet.Shape, window time.Duration) churnResult {
	s := startWithCRDs(b)
	rc := s.RESTConfig()
	rc.QPS = -1 // the test's own writes are not rate limited
	cs, dyn := clients(b, rc)
	in, err := fleet.Objects(sh)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i := range in.Sites {
		createTyped(b, dyn.Resource(siteGVR), v1alpha1.KindSite, &in.Sites[i])
	}
	peeringGVR := siteGVR
	peeringGVR.Resource = "sitepeerings"
	for i := range in.SitePeerings {
		createTyped(b, dyn.Resource(peeringGVR), v1alpha1.KindSitePeering, &in.SitePeerings[i])
	}

	// New Nodes: an InternalIP, no podCIDR.
	start := time.Now()
	parallel(b, len(in.Nodes), func(i int) error {
		n := in.Nodes[i]
		created, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status.Addresses = n.Status.Addresses
		created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	})
	b.Logf("created %d Nodes in %v", len(in.Nodes), time.Since(start).Round(time.Second))

	// The controller, with the client configuration of isthmus controller
	// (protobuf, the default QPS and burst), bootstraps them.
	crc, err := source.RESTConfig(s.Kubeconfig())
	if err != nil {
		b.Fatal(err)
	}
	crc.QPS, crc.Burst = controller.DefaultQPS, controller.DefaultBurst
	ccs, cdyn := clients(b, crc)
	cctx, stopController := context.WithCancel(ctx)
	done := make(chan error, 1)
	start = time.Now()
	go func() {
		done <- controller.Run(cctx, controller.Config{Client: ccs, Dynamic: cdyn, Log: testLogger(b, "controller")})
	}()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		// From the API server's watch cache (resourceVersion 0): a list of
		// 5,000 Nodes from etcd every poll would slow what it measures.
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			b.Fatal(err)
		}
		with := 0
		for _, n := range list.Items {
			if len(n.Spec.PodCIDRs) > 0 {
				with++
			}
		}
		if with == len(in.Nodes) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the controller gave %d of %d Nodes a podCIDR in 10 minutes", with, len(in.Nodes))
		}
		time.Sleep(2 * time.Second)
	}
	bootstrap := time.Since(start)
	b.Logf("controller: podCIDRs for %d new Nodes in %v (QPS %d, burst %d)", len(in.Nodes), bootstrap.Round(time.Second),
		controller.DefaultQPS, controller.DefaultBurst)
	stopController()
	if err := <-done; err != nil && ctx.Err() == nil && cctx.Err() == nil {
		b.Fatalf("controller: %v", err)
	}

	// The agent process, for a member of site 1.
	agent, lines := startChurnAgent(b, s, fleet.NodeName(1, fleet.GatewaysPerSite))
	var plans atomic.Int64
	firstPlan := make(chan struct{})
	go func() {
		for l := range lines {
			if n, ok := strings.CutPrefix(l, "planned "); ok {
				v, _ := strconv.ParseInt(n, 10, 64)
				if plans.Swap(v) == 0 {
					close(firstPlan)
				}
			}
		}
	}()
	select {
	case <-firstPlan:
	case <-time.After(2 * time.Minute):
		b.Fatal("the agent did not plan within 2 minutes")
	}
	time.Sleep(5 * time.Second) // the first plan's garbage collected
	plansBefore := plans.Load()

	// Heartbeats: every Node every 10 s, spread evenly.
	period := 10 * time.Second
	hctx, stopHeartbeats := context.WithTimeout(ctx, window)
	defer stopHeartbeats()
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	const writers = 16
	for w := range writers {
		wg.Go(func() {
			mine := len(in.Nodes) / writers
			tick := time.NewTicker(period / time.Duration(mine))
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-hctx.Done():
					return
				case <-tick.C:
				}
				name := in.Nodes[w*mine+i%mine].Name
				patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","lastHeartbeatTime":%q}]}}`,
					time.Now().UTC().Format(time.RFC3339))
				if _, err := cs.CoreV1().Nodes().Patch(hctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
					if hctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				sent.Add(1)
			}
		})
	}
	before, err := cpuTicks(agent.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	wg.Wait()
	after, err := cpuTicks(agent.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	cpu := float64(after-before) / 100 / elapsed.Seconds() // ticks are 1/100 s
	replans := plans.Load() - plansBefore
	rate := float64(sent.Load()) / elapsed.Seconds()
	b.Logf("agent: %.2f%% of a core over %v with %.0f heartbeats/s (%d sent, %d failed), %d plans after the first",
		100*cpu, elapsed.Round(time.Second), rate, sent.Load(), failed.Load(), replans)
	if replans != 0 {
		b.Errorf("heartbeats made the agent plan %d times; they touch nothing the plan reads", replans)
	}
	if cpu > 0.05 {
		b.Errorf("the agent used %.1f%% of a core under heartbeats; want under 5%%", 100*cpu)
	}
	if want := 0.8 * float64(len(in.Nodes)) / period.Seconds(); rate < want {
		b.Errorf("only %.0f heartbeats/s reached the API server, want %.0f: the churn was lighter than asked", rate, want)
	}
	return churnResult{bootstrap: bootstrap, agentCPU: cpu, heartbeatRate: rate, replans: replans}
}

// startChurnAgent runs this test binary as the agent process (churnAgent)
// for node, and returns it and its output lines; it is stopped when the
// benchmark ends.
func startChurnAgent(b testing.TB, s *kube.Server, node string) (*exec.Cmd, <-chan string) {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), churnAgentEnv+"="+s.Kubeconfig(), "ISTHMUS_CHURN_AGENT_NODE="+node)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start the agent process: %v", err)
	}
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
	}()
	return cmd, lines
}

// clients returns the typed and the dynamic client of rc.
func clients(tb testing.TB, rc *rest.Config) (kubernetes.Interface, dynamic.Interface) {
	tb.Helper()
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	return cs, dyn
}

// createTyped creates obj, a typed isthmus object, through ri.
func createTyped(b testing.TB, ri dynamic.ResourceInterface, kind string, obj k8sruntime.Object) {
	b.Helper()
	m, err := k8sruntime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		b.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	u.SetCreationTimestamp(metav1.Time{})
	if _, err := ri.Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		b.Fatalf("create %s %s: %v", kind, u.GetName(), err)
	}
}

// parallel runs f for 0..n-1 on 16 goroutines and fails on the first error.
func parallel(b testing.TB, n int, f func(i int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
