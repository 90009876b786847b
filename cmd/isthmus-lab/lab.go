package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/testenv"
)

// newLabCmd is `isthmus-lab lab up|check|down [SCENARIO]`: the network-namespace lab.
func newLabCmd() *cobra.Command {
	var (
		name     string
		binary   string
		datapath string
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Build, check and remove a network-namespace lab of sites, nodes and pods",
		Long: "SCENARIO is a scenario file or a built-in name (" + strings.Join(testenv.Builtins(), ", ") +
			"); default \"default\". The lab is named after the scenario unless --name says otherwise.\n" +
			"See docs/lab.md.",
	}
	cmd.PersistentFlags().StringVar(&name, "name", "", "lab name (default: the scenario's name)")

	load := func(args []string) (*testenv.Scenario, string, error) {
		arg := "default"
		if len(args) > 0 {
			arg = args[0]
		}
		sc, err := testenv.LoadScenario(arg)
		if err != nil {
			return nil, "", err
		}
		lab := name
		if lab == "" {
			lab = sc.Name
		}
		return sc, lab, nil
	}
	// ctx ends on Ctrl-C, so an interrupted up still removes what it built.
	signalCtx := func() (context.Context, context.CancelFunc) {
		return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	}

	var kubernetes string
	up := &cobra.Command{
		Use:   "up [SCENARIO]",
		Short: "Build the lab and start one agent per node",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, lab, err := load(args)
			if err != nil {
				return err
			}
			ctx, cancel := signalCtx()
			defer cancel()
			opts := testenv.Options{
				Name: lab, Binary: binary, Datapath: testenv.Datapath(datapath),
				ReadyTimeout: timeout, Log: cmd.ErrOrStderr(),
			}
			if kubernetes != "" {
				if kubernetes != string(testenv.ProxyIPTables) && kubernetes != string(testenv.ProxyNFTables) {
					return fmt.Errorf("--kubernetes %q: want iptables or nftables", kubernetes)
				}
				opts.Source = testenv.SourceKube
			}
			l, err := testenv.Up(ctx, sc, opts)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %s is up: state %s, router netns %s\n", l.Name, l.StateDir(), l.RouterNS())
			for _, n := range sc.Nodes() {
				fmt.Fprintf(cmd.OutOrStdout(), "  node %-8s netns %-20s underlay %s\n", n.Name, l.NodeNS(n.Name), n.Address)
			}
			for _, p := range sc.Pods() {
				addr := p.Address.String()
				if p.Address6.IsValid() {
					addr += " " + p.Address6.String()
				}
				fmt.Fprintf(cmd.OutOrStdout(), "  pod  %-8s netns %-20s address  %s (node %s)\n", p.Name, l.PodNS(p.Name), addr, p.Node)
			}
			if kubernetes != "" {
				return serveKubeLab(ctx, cmd, l, testenv.ProxyMode(kubernetes))
			}
			return nil
		},
	}
	up.Flags().StringVar(&binary, "binary", "", "isthmus binary the agents run (default: the isthmus beside this executable)")
	up.Flags().StringVar(&datapath, "datapath", string(testenv.DatapathIsthmus), "isthmus (one agent per node), plain (native routes), vxlan (kernel VXLAN, as flannel) or wireguard (plain WireGuard routing between the sites), the baselines, or none (topology only)")
	up.Flags().DurationVar(&timeout, "ready-timeout", 30*time.Second, "how long to wait for every agent's ready file, and then again for every agent to find every health-checked peer up")
	up.Flags().StringVar(&kubernetes, "kubernetes", "", "iptables or nftables: run a real kube-apiserver, feed the agents from it, and run kube-proxy in that mode on every node; the lab lives until Ctrl-C")

	check := &cobra.Command{
		Use:   "check [SCENARIO]",
		Short: "Probe ICMP, TCP and UDP between every pair of pods (over IPv4, and over IPv6 between pods with an address6), print the matrices and each node's rp_filter drops, then probe every pod policy (docs/lab.md)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, lab, err := load(args)
			if err != nil {
				return err
			}
			ctx, cancel := signalCtx()
			defer cancel()
			l, err := testenv.Attach(sc, lab)
			if err != nil {
				return err
			}
			// In Kubernetes mode the controller's view comes first: every
			// Site's Ready condition.
			conds, kerr := l.SiteConditions(ctx)
			if kerr != nil && !errors.Is(kerr, os.ErrNotExist) {
				return kerr
			}
			for _, c := range conds {
				fmt.Fprintln(cmd.OutOrStdout(), c)
			}
			c, err := l.CheckPaths(ctx)
			if c != nil {
				fmt.Fprint(cmd.OutOrStdout(), c.String())
			}
			return err
		},
	}

	down := &cobra.Command{
		Use:   "down [SCENARIO]",
		Short: "Stop the agents and remove every namespace, pin and state file of the lab",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lab := name
			if lab == "" {
				sc, l, err := load(args)
				if err != nil {
					return err
				}
				_, lab = sc, l
			}
			return testenv.Down(lab, testenv.DownOptions{Binary: binary, Log: cmd.ErrOrStderr()})
		},
	}
	down.Flags().StringVar(&binary, "binary", "", "isthmus binary for uninstall (default: the one up used)")

	capture := &cobra.Command{
		Use:   "capture [SCENARIO]",
		Short: "Ping across sites and decode the GENEVE frames on the underlay with tshark",
		Long: `capture pings from the first pod of the first node to the first pod of a node in
another site while tshark listens on the router port of the first node, and prints
tshark's decode of the request and the reply: outer IPv4/UDP 6081, GENEVE with its
VNI, and the pods' own addresses inside.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, lab, err := load(args)
			if err != nil {
				return err
			}
			src, dst, err := crossSitePods(sc)
			if err != nil {
				return err
			}
			l, err := testenv.Attach(sc, lab)
			if err != nil {
				return err
			}
			ctx, cancel := signalCtx()
			defer cancel()
			fmt.Fprintf(cmd.OutOrStdout(), "ping %s -> %s, captured on the underlay port of node %s:\n\n", src.Name, dst.Name, src.Node)
			out, err := l.CaptureGeneve(ctx, src.Name, dst.Name)
			fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}

	cmd.AddCommand(up, check, down, capture)
	return cmd
}

// crossSitePods returns the first pod of the first node and the first pod of a node
// in another site (or, in a one-site scenario, of another node).
func crossSitePods(sc *testenv.Scenario) (src, dst testenv.PodRef, err error) {
	pods := sc.Pods()
	if len(pods) < 2 {
		return src, dst, fmt.Errorf("scenario %s has fewer than two pods", sc.Name)
	}
	src = pods[0]
	for _, p := range pods[1:] {
		if p.Site != src.Site {
			return src, p, nil
		}
	}
	for _, p := range pods[1:] {
		if p.Node != src.Node {
			return src, p, nil
		}
	}
	return src, dst, fmt.Errorf("scenario %s has no two pods on different nodes", sc.Name)
}

// serveKubeLab starts the isthmus controller and kube-proxy on every node of a lab
// in Kubernetes mode, says where the API server is, and keeps the lab (whose API
// server, forwarders and controller live in this process) until ctx ends (Ctrl-C,
// or `lab down` from another shell), then takes it down.
func serveKubeLab(ctx context.Context, cmd *cobra.Command, l *testenv.Lab, mode testenv.ProxyMode) (err error) {
	defer func() { err = errors.Join(err, l.Down()) }()
	if err := l.RecordServing(); err != nil {
		return err
	}
	if err := l.StartController(ctx); err != nil {
		return err
	}
	if err := l.StartKubeProxy(ctx, mode); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "lab %s is up in Kubernetes mode: KUBECONFIG=%s, isthmus controller (log %s), kube-proxy (%s) on every node; Ctrl-C or `isthmus-lab lab down` takes it down\n",
		l.Name, l.Kubeconfig(), l.ControllerLog(), mode)
	<-ctx.Done()
	return nil
}
