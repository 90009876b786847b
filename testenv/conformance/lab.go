package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cluster"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// LabOptions say what RunInLab runs.
type LabOptions struct {
	// Scenario is the lab cluster's topology; ignored with Kubeconfig.
	Scenario *testenv.Scenario
	// Name and Binary are the lab's (cluster.Options).
	Name, Binary string
	// Kubeconfig, when set, names a running cluster to run against instead
	// of bringing one up.
	Kubeconfig string
	Focus      Focus
	// Cases, when set, is a regular expression that replaces the focus' own
	// (the skip list still applies): to run again the cases a run failed.
	Cases string
	// ReportDir receives the JUnit report and the suite's output.
	ReportDir string
	// Output receives the suite's output as it runs.
	Output io.Writer
	// Log receives the cluster's progress lines.
	Log func(format string, args ...any)
}

// ClusterOptions returns the options of a lab cluster the suite runs
// against, with what a real cluster has: kube-proxy (iptables) on every
// node for the Services cases, a cluster DNS for the DNS cases and the
// suite's lookups of Service names, kube-router's policy controller for the
// NetworkPolicy cases, each node's CNI as its site has it (cluster.Up), and
// the suite's test images (SuiteImages) imported into every node's
// containerd. The sandboxes keep testenv/cri's pause image.
func ClusterOptions(sc *testenv.Scenario, images []string) cluster.Options {
	return cluster.Options{Scenario: sc, Archives: images, KubeProxy: testenv.ProxyIPTables, ClusterDNS: true, PolicyEngine: true}
}

// RunInLab builds the suite (kubebin.E2ETest, cached), brings up a lab
// cluster (ClusterOptions) unless o.Kubeconfig names one, runs the focus
// against it from the first node's network namespace, and takes the cluster
// down.
func RunInLab(ctx context.Context, o LabOptions) (s Summary, err error) {
	sel, err := Select(o.Focus)
	if err != nil {
		return s, err
	}
	if o.Cases != "" {
		if _, err := regexp.Compile(o.Cases); err != nil {
			return s, fmt.Errorf("cases: %w", err)
		}
		sel.Focus = o.Cases
	}
	e2e, err := kubebin.E2ETest(ctx)
	if err != nil {
		return s, err
	}
	kubectl, err := kubebin.Kubectl(ctx)
	if err != nil {
		return s, err
	}
	run := Options{E2ETest: e2e, Kubeconfig: o.Kubeconfig, Kubectl: kubectl, ReportDir: o.ReportDir, Selection: sel, Output: o.Output}
	if o.Focus == Full {
		run.Timeout = 3 * time.Hour
	}
	if o.Kubeconfig == "" {
		if o.Scenario == nil {
			return s, errors.New("run conformance in the lab: no scenario")
		}
		work, err := os.MkdirTemp("", "iscf-")
		if err != nil {
			return s, fmt.Errorf("run conformance in the lab: %w", err)
		}
		defer os.RemoveAll(work)
		images, err := SuiteImages(ctx, work, e2e)
		if err != nil {
			return s, err
		}
		copts := ClusterOptions(o.Scenario, images)
		copts.Name, copts.Binary, copts.Work, copts.Log = o.Name, o.Binary, work, o.Log
		c, err := cluster.Up(ctx, copts)
		if err != nil {
			return s, err
		}
		defer func() { err = errors.Join(err, c.Down()) }()
		run.Kubeconfig = c.Kubeconfig()
		run.NetNS = testenv.NSPath(c.Lab.NodeNS(c.Nodes[0].Name))
	}
	return Run(ctx, run)
}
