package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/isthmus-dev/isthmus/testenv/cluster"

	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/conformance"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// shortCases is how many cases the short focus runs: the Granular Checks'
// intra-pod and node-pod, each over HTTP and UDP (their SCTP variants are in
// the skip list: this kernel has no SCTP).
const shortCases = 4

// TestConformanceShort: Kubernetes' own network conformance suite (e2e.test
// of the lab's kube release, unmodified), short focus ("Networking Granular
// Checks"), passes on a whole cluster of the gateway topology, seed003cni: a
// managed site joined through gateways to a site whose pods another CNI owns
// (testenv/cluster as conformance.ClusterOptions has it: kube-proxy, CoreDNS
// and kube-router's policy controller, the suite's test images imported,
// isthmus installed from deploy/). The Granular Checks start a pod on every
// node and probe every pair, pod to pod and node to pod, so half the pairs
// cross the sites through the gateways, and the other CNI's nodes' hosts
// reach the managed site's pods. The test fails if any case fails, the suite
// itself fails, or fewer than shortCases cases ran (a focus that matches
// nothing must fail). Then every pod reaches every node's NodePort of a
// Service on every node's pod (checkNodePorts).
func TestConformanceShort(t *testing.T) {
	requireSetup(t)
	beside(t, weightCluster)
	// The first run on a machine builds e2e.test (about 25 minutes) besides
	// the cluster's binaries.
	ctx, cancel := context.WithTimeout(context.Background(), 75*time.Minute)
	defer cancel()
	e2e, err := kubebin.E2ETest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	work := tempWork(t, "iscf-")
	images, err := conformance.SuiteImages(ctx, work, e2e)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := testenv.LoadScenario("seed003cni")
	if err != nil {
		t.Fatal(err)
	}
	opts := conformance.ClusterOptions(sc, images)
	opts.Work = work
	c := upCluster(ctx, t, opts)
	sel, err := conformance.Select(conformance.Short)
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(work, "report")
	start := time.Now()
	s, err := conformance.Run(ctx, conformance.Options{
		E2ETest: e2e, Kubeconfig: c.Kubeconfig(), Kubectl: c.KubectlPath(), ReportDir: report, Selection: sel,
		NetNS: testenv.NSPath(c.Lab.NodeNS(c.Nodes[0].Name)), Timeout: 30 * time.Minute,
	})
	t.Logf("%s, in %s", s, time.Since(start).Round(time.Second))
	if err != nil {
		t.Errorf("%v\ne2e.test output (tail):\n%s", err, tailFile(filepath.Join(report, "e2e.log")))
	}
	for _, name := range s.FailedCases {
		t.Errorf("failed: %s", name)
	}
	for _, name := range s.SkippedCases {
		t.Logf("skipped: %s", name)
	}
	if s.Ran() < shortCases || s.Passed < shortCases {
		t.Errorf("%d cases ran, %d passed; want %d to run and pass (does the focus %q still select the Granular Checks?)",
			s.Ran(), s.Passed, shortCases, sel.Focus)
	}
	checkNodePorts(ctx, t, c)
	if t.Failed() {
		t.Log(c.Diagnose(c.Nodes[0].Name))
	}
}

// nodePortNamespace holds checkNodePorts' pods and Services.
const nodePortNamespace = "nodeport-matrix"

// checkNodePorts: a client pod on every node reaches, through every node's
// address, the NodePort of a Service whose one backend runs on each node in
// turn (on seed003cni, 4 x 4 x 4 paths). kube-proxy masquerades such flows to
// the address of the device it routed them out of before the translation (the
// tunnel address into isthmus0, the InternalIP out of the underlay), so their
// answers come back where the untranslated flow was not routed: the suite's
// session-affinity case found the cloud member's NodePort unreachable from the
// cloud's pods for backends of the other site, twice over (the answer entered
// by the wrong device, and the translated request left the underlay plain).
func checkNodePorts(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	cs := c.Client
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nodePortNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", nodePortNamespace, err)
	}
	pod := func(name, node string, labels map[string]string) *corev1.Pod {
		p := probePod(name, node)
		p.Namespace, p.Labels = nodePortNamespace, labels
		return p
	}
	nodePorts := map[string]int32{} // backend node -> its Service's NodePort
	var names []string
	for _, n := range c.Nodes {
		names = append(names, n.Name)
		for _, p := range []*corev1.Pod{pod("be-"+n.Name, n.Name, map[string]string{"be": n.Name}), pod("cl-"+n.Name, n.Name, nil)} {
			if _, err := cs.CoreV1().Pods(nodePortNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create pod %s: %v", p.Name, err)
			}
		}
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "np-" + n.Name, Namespace: nodePortNamespace},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"be": n.Name},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		got, err := cs.CoreV1().Services(nodePortNamespace).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create service %s: %v", svc.Name, err)
		}
		nodePorts[n.Name] = got.Spec.Ports[0].NodePort
	}
	for _, n := range names {
		for _, p := range []string{"be-" + n, "cl-" + n} {
			err := cluster.Poll(ctx, 2*time.Minute, func() (bool, error) {
				got, err := cs.CoreV1().Pods(nodePortNamespace).Get(ctx, p, metav1.GetOptions{})
				return err == nil && got.Status.Phase == corev1.PodRunning, err
			}, func() string { return fmt.Sprintf("pod %s not Running", p) })
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	var failed []string
	probes := 0
	for _, client := range names {
		for _, backend := range names {
			for _, via := range c.Nodes {
				url := fmt.Sprintf("http://%s:%d/", via.Address, nodePorts[backend])
				probes++
				// The first probes may meet a kube-proxy that has not seen the
				// endpoints yet; a broken path never answers.
				var out string
				err := cluster.Poll(ctx, 30*time.Second, func() (bool, error) {
					var err error
					out, err = c.Kubectl(ctx, "exec", "-n", nodePortNamespace, "cl-"+client, "--", "/probe", "get", url)
					return err == nil && strings.HasPrefix(out, "source "), nil
				}, func() string { return strings.TrimSpace(out) })
				if err != nil {
					failed = append(failed, fmt.Sprintf("pod on %s -> %s (%s) -> backend on %s: %v", client, url, via.Name, backend, err))
				}
			}
		}
	}
	t.Logf("NodePort matrix: %d paths, %d failed", probes, len(failed))
	if len(failed) > 0 {
		t.Error(errors.New("NodePort paths that did not answer:\n" + strings.Join(failed, "\n")))
	}
}
