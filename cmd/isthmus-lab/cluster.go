package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cluster"
	"github.com/isthmus-dev/isthmus/testenv/conformance"
)

// newClusterCmd is `isthmus-lab cluster up|down [--scenario S]`: a whole
// Kubernetes cluster in the lab (testenv/cluster).
func newClusterCmd() *cobra.Command {
	var scenario, binary, proxy string
	var policy bool
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Bring up or remove a whole Kubernetes cluster in the lab, isthmus installed from deploy/",
		Long: "A Kubernetes-mode lab of the scenario (" + fmt.Sprint(testenv.Builtins()) + ") with kube-apiserver,\n" +
			"kube-controller-manager, kube-scheduler, a containerd and a kubelet on every node, kube-proxy, and isthmus\n" +
			"installed from deploy/ with kubectl apply -k. See docs/conformance.md.",
	}
	cmd.PersistentFlags().StringVar(&scenario, "scenario", "default", "scenario file or built-in name; the lab is named after it")

	up := &cobra.Command{
		Use:   "up",
		Short: "Bring the cluster up, print its kubeconfig, and keep it until Ctrl-C or `cluster down`",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			sc, err := testenv.LoadScenario(scenario)
			if err != nil {
				return err
			}
			mode, err := proxyMode(proxy)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			logf := func(format string, args ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", args...) }
			start := time.Now()
			c, err := cluster.Up(ctx, cluster.Options{Scenario: sc, Binary: binary, KubeProxy: mode,
				ClusterDNS: mode != "", PolicyEngine: policy, Log: logf})
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, c.Down()) }()
			if err := c.Lab.RecordServing(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster %s is up after %s: %d nodes Ready, isthmus installed from deploy/ (image %s)\n",
				c.Lab.Name, time.Since(start).Round(time.Second), len(c.Nodes), c.Image)
			fmt.Fprintf(cmd.OutOrStdout(), "KUBECONFIG=%s\n", c.Kubeconfig())
			fmt.Fprintf(cmd.OutOrStdout(), "kubectl: %s\nCtrl-C or `isthmus-lab cluster down --scenario %s` takes it down\n", c.KubectlPath(), scenario)
			<-ctx.Done()
			return nil
		},
	}
	up.Flags().StringVar(&binary, "binary", "", "isthmus binary the lab's tools run (default: the isthmus beside this executable)")
	up.Flags().StringVar(&proxy, "kube-proxy", string(testenv.ProxyIPTables), "kube-proxy mode on every node: iptables, nftables or none (none: no cluster DNS either)")
	up.Flags().BoolVar(&policy, "policy", true, "run kube-router's network policy controller on every node")

	down := &cobra.Command{
		Use:   "down",
		Short: "Stop the process serving the cluster (it takes everything down) and remove what is left of the lab",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, err := testenv.LoadScenario(scenario)
			if err != nil {
				return err
			}
			return testenv.Down(sc.Name, testenv.DownOptions{Log: cmd.ErrOrStderr()})
		},
	}
	cmd.AddCommand(up, down)
	return cmd
}

// newConformanceCmd is `isthmus-lab conformance [--scenario S] [--focus
// short|full] [--report DIR]`: Kubernetes' network conformance suite against
// a cluster of the lab it brings up and takes down (testenv/conformance), or
// against the cluster of --kubeconfig.
func newConformanceCmd() *cobra.Command {
	var scenario, name, focus, cases, report, binary, kubeconfig string
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Run Kubernetes' network conformance suite (e2e.test) against a lab cluster and summarize its JUnit report",
		Long: "Brings up a whole cluster of the scenario (isthmus-lab cluster up), runs e2e.test of the lab's kube release with the\n" +
			"focus (short: Networking Granular Checks; full: those, the sig-network Services and [Conformance] cases, NetworkPolicy)\n" +
			"minus testenv/conformance/skip.txt, writes the suite's JUnit report to --report, prints one line of passed, failed and\n" +
			"skipped cases, and takes the cluster down. With --kubeconfig it runs against that cluster instead. See docs/conformance.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := conformance.ParseFocus(focus)
			if err != nil {
				return err
			}
			if report, err = filepath.Abs(report); err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			logf := func(format string, args ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", args...) }
			o := conformance.LabOptions{Focus: f, Cases: cases, ReportDir: report, Name: name, Binary: binary, Kubeconfig: kubeconfig, Output: cmd.ErrOrStderr(), Log: logf}
			if kubeconfig == "" {
				if o.Scenario, err = testenv.LoadScenario(scenario); err != nil {
					return err
				}
			}
			s, err := conformance.RunInLab(ctx, o)
			fmt.Fprintln(cmd.OutOrStdout(), s)
			for _, c := range s.FailedCases {
				fmt.Fprintf(cmd.OutOrStdout(), "  FAILED %s\n", c)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "JUnit report: %s\n", conformance.JUnitFile(report))
			if err == nil && s.Failed > 0 {
				err = fmt.Errorf("%d conformance cases failed", s.Failed)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&scenario, "scenario", "default", "scenario file or built-in name of the lab cluster")
	cmd.Flags().StringVar(&name, "name", "", "name of the lab cluster (default: the scenario's), so that it can run beside another lab of the scenario")
	cmd.Flags().StringVar(&focus, "focus", string(conformance.Full), "short (Networking Granular Checks) or full")
	cmd.Flags().StringVar(&cases, "cases", "", "regular expression of the cases to run instead of the focus' (the skip list still applies): to run failed cases again")
	cmd.Flags().StringVar(&report, "report", "conformance-report", "directory for the suite's JUnit report (junit_01.xml) and its output (e2e.log)")
	cmd.Flags().StringVar(&binary, "binary", "", "isthmus binary the lab's tools run (default: the isthmus beside this executable)")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "run against this cluster instead of bringing one up (a real cluster, or `cluster up`'s)")
	return cmd
}

// proxyMode parses --kube-proxy.
func proxyMode(s string) (testenv.ProxyMode, error) {
	switch s {
	case "none", "":
		return "", nil
	case string(testenv.ProxyIPTables), string(testenv.ProxyNFTables):
		return testenv.ProxyMode(s), nil
	}
	return "", fmt.Errorf("--kube-proxy %q: want iptables, nftables or none", s)
}

// signalContext ends on Ctrl-C or SIGTERM (`cluster down` from another
// shell), so an interrupted command still removes what it built.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
