package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/loader/controller"
	"github.com/isthmus-dev/isthmus/loader/source"
)

// newControllerCmd is `isthmus controller`: label nodes with their site,
// assign podCIDRs and tunnel addresses, and write Site status, while holding
// the leader Lease, until SIGINT or SIGTERM.
func newControllerCmd() *cobra.Command {
	var (
		cfg        controller.Config
		kubeconfig string
		tunnelCIDR string
		debug      bool
		qps        float32
		burst      int
	)
	cmd := &cobra.Command{
		Use:   "controller [--kubeconfig FILE]",
		Short: "Run the isthmus controller: site labels, podCIDRs, tunnel addresses and Site status",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := netip.ParsePrefix(tunnelCIDR)
			if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
				return fmt.Errorf("parse --tunnel-cidr %q: want an IPv4 prefix of /30 or larger, such as 100.64.0.0/16", tunnelCIDR)
			}
			cfg.TunnelCIDR = p
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			rc, err := source.RESTConfig(kubeconfig)
			if err != nil {
				return err
			}
			rc.UserAgent = "isthmus-controller"
			rc.QPS, rc.Burst = qps, burst
			if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
				return fmt.Errorf("create kubernetes client: %w", err)
			}
			if cfg.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
				return fmt.Errorf("create dynamic client: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return controller.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster service account)")
	f.StringVar(&cfg.Namespace, "namespace", controller.DefaultNamespace, "namespace of the leader Lease "+controller.LeaseName)
	f.StringVar(&tunnelCIDR, "tunnel-cidr", controller.DefaultTunnelCIDR.String(), "IPv4 prefix tunnel addresses are allocated from, for nodes without an IPv4 podCIDR")
	f.BoolVar(&cfg.LeaderElection, "leader-elect", true, "hold the Lease before acting, so only one replica acts")
	f.StringVar(&cfg.Identity, "identity", "", "name of this replica in the Lease (default: hostname plus a random suffix)")
	f.BoolVar(&debug, "debug", false, "log at debug level")
	f.Float32Var(&qps, "kube-api-qps", controller.DefaultQPS, "requests per second to the API server, sustained")
	f.IntVar(&burst, "kube-api-burst", controller.DefaultBurst, "requests to the API server in a burst")
	f.IntVar(&cfg.PatchWorkers, "patch-workers", controller.DefaultPatchWorkers, "Node patches in flight at once")
	return cmd
}
