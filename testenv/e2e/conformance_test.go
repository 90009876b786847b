package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

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
// nothing must fail).
func TestConformanceShort(t *testing.T) {
	requireSetup(t)
	t.Parallel() // a whole cluster: beside the others, after the package's sequential tests
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
	if t.Failed() {
		t.Log(c.Diagnose(c.Nodes[0].Name))
	}
}
