package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/agent"
	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/health"
	"github.com/isthmus-dev/isthmus/loader/metrics"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/source"
	"github.com/isthmus-dev/isthmus/loader/wireguard"
)

// objectSource is where `isthmus agent` reads its objects.
type objectSource struct {
	// dir is set in file mode.
	dir string
	// kube is true in Kubernetes mode; kubeconfig is empty for the in-cluster
	// configuration.
	kube       bool
	kubeconfig string
}

// chooseSource picks the object source from --objects and --kubeconfig: the
// two are exclusive, and with neither the agent runs in-cluster when
// KUBERNETES_SERVICE_HOST is set.
func chooseSource(objectsDir, kubeconfig string, getenv func(string) string) (objectSource, error) {
	switch {
	case objectsDir != "" && kubeconfig != "":
		return objectSource{}, errors.New("choose object source: --objects and --kubeconfig are exclusive: give a directory of YAML or a cluster, not both")
	case objectsDir != "":
		return objectSource{dir: objectsDir}, nil
	case kubeconfig != "":
		return objectSource{kube: true, kubeconfig: kubeconfig}, nil
	case getenv("KUBERNETES_SERVICE_HOST") != "":
		return objectSource{kube: true}, nil
	}
	return objectSource{}, errors.New("choose object source: give --objects DIR or --kubeconfig FILE (in a pod, the in-cluster config needs KUBERNETES_SERVICE_HOST)")
}

// openKubernetes connects to the API server and waits for the informers'
// first full list (until ctx is done).
func openKubernetes(ctx context.Context, kubeconfig string, rules objects.Rules, log *slog.Logger) (*source.Kubernetes, kubernetes.Interface, error) {
	rc, err := source.RESTConfig(kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	rc.UserAgent = "isthmus-agent"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("create kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("create dynamic client: %w", err)
	}
	log.Info("waiting for the API server's objects", "host", rc.Host)
	k, err := source.NewKubernetes(ctx, source.KubernetesConfig{Client: client, Dynamic: dyn, Log: log, Rules: rules})
	return k, client, err
}

// newAgentCmd is `isthmus agent`: load, attach and keep the datapath in sync with
// the objects (a directory, or the Kubernetes API) until SIGINT or SIGTERM, then
// exit leaving it in place.
func newAgentCmd() *cobra.Command {
	var (
		cfg         agent.Config
		patterns    string
		decap       string
		vni         uint32
		debug       bool
		snat        string
		kubeconfig  string
		metricsAddr string
		tunnelCIDR  string
		wgMode      string
		wgSpawn     bool
		cni         cniFlags
	)
	cmd := &cobra.Command{
		Use:   "agent --node NAME (--objects DIR | --kubeconfig FILE | in-cluster)",
		Short: "Run the node agent: load the datapath and keep it in sync with the objects",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			src, err := chooseSource(cfg.ObjectsDir, kubeconfig, os.Getenv)
			if err != nil {
				return err
			}
			if cfg.PodPatterns, err = agent.ParsePatterns(patterns); err != nil {
				return err
			}
			if cfg.Decap, err = datapath.ParseDecapMode(decap); err != nil {
				return err
			}
			if vni == 0 || vni > 0xffffff {
				return fmt.Errorf("parse --vni %d: want 1..16777215", vni)
			}
			if cfg.WireGuard.Mode, err = wireguard.ParseMode(wgMode); err != nil {
				return fmt.Errorf("parse --wireguard: %w", err)
			}
			cfg.WireGuard.NoSpawn = !wgSpawn
			if cfg.WireGuard.Port < 1 || cfg.WireGuard.Port > 65535 {
				return fmt.Errorf("parse --wireguard-port %d: want 1..65535", cfg.WireGuard.Port)
			}
			cfg.VNI = vni
			if tunnelCIDR != "" {
				p, err := netip.ParsePrefix(tunnelCIDR)
				if err != nil || !p.Addr().Is4() {
					return fmt.Errorf("parse --tunnel-cidr %q: want an IPv4 prefix, the controller's --tunnel-cidr (such as 100.64.0.0/16)", tunnelCIDR)
				}
				cfg.Rules.TunnelCIDR = p.Masked()
			}
			if cfg.SNATPortMin, cfg.SNATPortMax, err = parsePortRange(snat); err != nil {
				return err
			}
			if cfg.NatEntries < 64 {
				return fmt.Errorf("parse --snat-table-size %d: want at least 64", cfg.NatEntries)
			}
			if cfg.NatSourceFlows == 0 {
				cfg.NatSourceFlows = datapath.DefaultNatSourceFlows(cfg.NatEntries)
			}
			if cfg.HealthPort < 1 || cfg.HealthPort > 65535 {
				return fmt.Errorf("parse --health-port %d: want 1..65535", cfg.HealthPort)
			}
			if cfg.HealthInterval <= 0 || cfg.HealthMultiplier < 1 || cfg.HealthRise < 1 {
				return fmt.Errorf("parse --health-interval %v / --health-multiplier %d / --health-rise %d: want a positive interval and at least 1",
					cfg.HealthInterval, cfg.HealthMultiplier, cfg.HealthRise)
			}
			if cfg.HealthReachExpiry < 2*cfg.HealthInterval {
				return fmt.Errorf("parse --health-reach-expiry %v: want at least twice --health-interval (%v), or claims expire between refreshes",
					cfg.HealthReachExpiry, cfg.HealthInterval)
			}
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The endpoints answer from the start: /healthz while the agent waits for
			// the API server and loads the datapath, /readyz once it is in sync.
			cfg.Status = agent.NewStatus()
			if metricsAddr != "" {
				reg, syncs := metrics.NewRegistry(metrics.Pinned{Dir: cfg.PinDir}, cfg.Status.Peers)
				cfg.Metrics = syncs
				if cni.socket != "" {
					cni.metrics = metrics.NewCNI(reg)
				}
				served, err := metrics.Serve(ctx, metricsAddr, metrics.Handler(reg, cfg.Status, cfg.Log))
				if err != nil {
					return err
				}
				go func() {
					if err := <-served; err != nil {
						cfg.Log.Error("metrics server stopped", "err", err)
					}
				}()
			}
			if src.kube {
				k, client, err := openKubernetes(ctx, src.kubeconfig, cfg.Rules, cfg.Log)
				if err != nil {
					return err
				}
				defer k.Close()
				cfg.Source = k
				cfg.WireGuard.Publish = source.NodeAnnotationPublisher(client, cfg.Node, v1alpha1.AnnotationWireGuardPublicKey)
			}
			snapshot := func() (*objects.Set, []objects.Warning, error) { return objects.LoadDir(cfg.ObjectsDir) }
			if cfg.Source != nil {
				snapshot = cfg.Source.Snapshot
			}
			if err := cni.start(ctx, cfg.Node, cfg.UnderlayDev, snapshot, cfg.Log); err != nil {
				return err
			}
			if cni.socket != "" {
				cfg.IPAMDir = cni.dataDir // the plugin's pods send only from their reservations
			}
			return agent.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Node, "node", "", "name of this node (required)")
	f.StringVar(&cfg.ObjectsDir, "objects", "", "directory of Site, SitePeering, GatewayPool, SiteGatewayPoolAssignment and Node YAML (file mode; excludes --kubeconfig)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to read Nodes and isthmus objects from (excludes --objects; with neither, the in-cluster config)")
	f.DurationVar(&cfg.Resync, "resync", 30*time.Second, "period of full resyncs: objects read again, kernel state diffed")
	f.StringVar(&cfg.UnderlayDev, "underlay-dev", "", "underlay device (default: the one holding the node's InternalIP)")
	f.StringVar(&cfg.PinDir, "pin-dir", datapath.DefaultPinDir, "bpffs directory for the pinned maps and links")
	f.StringVar(&patterns, "pod-interfaces", "pod-*", "comma-separated shell globs naming pod-facing host interfaces (e.g. 'pod-*,azv*' for another CNI's)")
	f.StringVar(&decap, "decap", "auto", "where to decapsulate on the underlay: auto, tc or xdp")
	f.Uint32Var(&vni, "vni", 1, "GENEVE VNI")
	f.StringVar(&cfg.ReadyFile, "ready-file", "", "file to write after the first full sync")
	f.StringVar(&snat, "snat-ports", fmt.Sprintf("%d-%d", agent.DefaultSNATPortMin, agent.DefaultSNATPortMax),
		"MIN-MAX: ports return-path SNAT picks when a flow's own port is taken (keep it clear of net.ipv4.ip_local_port_range)")
	f.Uint32Var(&cfg.NatEntries, "snat-table-size", datapath.DefaultNatEntries,
		"entries of the SNAT connection table and of the masquerade one (two per flow); a new size migrates them")
	f.Uint32Var(&cfg.NatSourceFlows, "snat-flows-per-source", 0,
		"flows one pod source may hold in each of those tables; beyond it new flows are dropped (nat_source_limit) (0: half a table's flows)")
	f.IntVar(&cfg.HealthPort, "health-port", health.DefaultPort, "UDP port of the health-check responder on the tunnel address")
	f.DurationVar(&cfg.HealthInterval, "health-interval", health.DefaultInterval, "interval between health probes to each next-hop group member")
	f.IntVar(&cfg.HealthMultiplier, "health-multiplier", health.DefaultMultiplier, "unanswered probes in a row that mark a member down")
	f.IntVar(&cfg.HealthRise, "health-rise", health.DefaultRise, "good answers in a row that bring a member that was down back")
	f.DurationVar(&cfg.HealthReachExpiry, "health-reach-expiry", health.DefaultReachExpiry, "how long the datapath answers health probes from this agent's last reach claims once it stops refreshing them (an agent restart shorter than this moves no flow)")
	f.StringVar(&metricsAddr, "metrics-addr", metrics.DefaultAddr, "address to serve /metrics, /healthz and /readyz on (empty: none)")
	f.BoolVar(&debug, "debug", false, "log every map write")
	f.StringVar(&tunnelCIDR, "tunnel-cidr", "", "the controller's --tunnel-cidr: a Node whose isthmus.dev/tunnel-ipv4 annotation is outside it is set aside (empty: not checked)")
	f.StringVar(&cfg.WireGuard.StateDir, "state-dir", DefaultStateDir, "directory of the node's state that survives restarts and upgrades: its WireGuard private key (wireguard.key, mode 0600)")
	f.StringVar(&wgMode, "wireguard", string(wireguard.ModeAuto), "WireGuard implementation for encrypted peers: auto (the kernel's, else the userspace one), kernel or userspace")
	f.IntVar(&cfg.WireGuard.Port, "wireguard-port", wireguard.DefaultPort, "UDP port of the WireGuard device; every node of the fleet must use the same")
	f.StringVar(&cfg.WireGuard.Device, "wireguard-device", agent.DefaultWireGuardDevice, "name of the WireGuard device")
	f.BoolVar(&wgSpawn, "wireguard-spawn", true, "start the userspace WireGuard device where one is needed; false leaves it to another process (the DaemonSet's wireguard container) and waits for it")
	f.StringVar(&cfg.WireGuard.LogFile, "wireguard-log", "", "log of the userspace WireGuard process (default "+wireguard.DefaultLogDir+"/wireguard-DEVICE.log)")
	cni.register(f)
	cmd.MarkFlagRequired("node")
	return cmd
}

// parsePortRange parses "MIN-MAX" (1 <= MIN <= MAX <= 65535).
func parsePortRange(s string) (uint16, uint16, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("parse --snat-ports %q: want MIN-MAX", s)
	}
	min, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	max, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err1 != nil || err2 != nil || min == 0 || min > max {
		return 0, 0, fmt.Errorf("parse --snat-ports %q: want MIN-MAX with 1 <= MIN <= MAX <= 65535", s)
	}
	return uint16(min), uint16(max), nil
}
