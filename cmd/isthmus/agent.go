package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/agent"
	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/health"
)

// newAgentCmd is `isthmus agent`: load, attach and keep the datapath in sync with
// the objects directory until SIGINT or SIGTERM, then exit leaving it in place.
func newAgentCmd() *cobra.Command {
	var (
		cfg      agent.Config
		patterns string
		decap    string
		vni      uint32
		debug    bool
		snat     string
	)
	cmd := &cobra.Command{
		Use:   "agent --node NAME --objects DIR",
		Short: "Run the node agent: load the datapath and keep it in sync with the objects",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.PodPatterns, err = agent.ParsePatterns(patterns); err != nil {
				return err
			}
			if cfg.Decap, err = datapath.ParseDecapMode(decap); err != nil {
				return err
			}
			if vni == 0 || vni > 0xffffff {
				return fmt.Errorf("parse --vni %d: want 1..16777215", vni)
			}
			cfg.VNI = vni
			if cfg.SNATPortMin, cfg.SNATPortMax, err = parsePortRange(snat); err != nil {
				return err
			}
			if cfg.NatEntries < 64 {
				return fmt.Errorf("parse --snat-table-size %d: want at least 64", cfg.NatEntries)
			}
			if cfg.HealthPort < 1 || cfg.HealthPort > 65535 {
				return fmt.Errorf("parse --health-port %d: want 1..65535", cfg.HealthPort)
			}
			if cfg.HealthInterval <= 0 || cfg.HealthMultiplier < 1 {
				return fmt.Errorf("parse --health-interval %v / --health-multiplier %d: want a positive interval and at least 1", cfg.HealthInterval, cfg.HealthMultiplier)
			}
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return agent.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Node, "node", "", "name of this node (required)")
	f.StringVar(&cfg.ObjectsDir, "objects", "", "directory of Site, SitePeering and Node YAML (required)")
	f.StringVar(&cfg.UnderlayDev, "underlay-dev", "", "underlay device (default: the one holding the node's InternalIP)")
	f.StringVar(&cfg.PinDir, "pin-dir", datapath.DefaultPinDir, "bpffs directory for the pinned maps and links")
	f.StringVar(&patterns, "pod-interfaces", "pod-*", "comma-separated shell globs naming pod-facing host interfaces (e.g. 'pod-*,azv*' for another CNI's)")
	f.StringVar(&decap, "decap", "auto", "where to decapsulate on the underlay: auto, tc or xdp")
	f.Uint32Var(&vni, "vni", 1, "GENEVE VNI")
	f.StringVar(&cfg.ReadyFile, "ready-file", "", "file to write after the first full sync")
	f.StringVar(&snat, "snat-ports", fmt.Sprintf("%d-%d", agent.DefaultSNATPortMin, agent.DefaultSNATPortMax),
		"MIN-MAX: ports return-path SNAT picks when a flow's own port is taken (keep it clear of net.ipv4.ip_local_port_range)")
	f.Uint32Var(&cfg.NatEntries, "snat-table-size", datapath.DefaultNatEntries,
		"entries of the SNAT connection table (two per flow); changing it needs isthmus uninstall")
	f.IntVar(&cfg.HealthPort, "health-port", health.DefaultPort, "UDP port of the health-check responder on the tunnel address")
	f.DurationVar(&cfg.HealthInterval, "health-interval", health.DefaultInterval, "interval between health probes to each next-hop group member")
	f.IntVar(&cfg.HealthMultiplier, "health-multiplier", health.DefaultMultiplier, "unanswered probes in a row that mark a member down")
	f.BoolVar(&debug, "debug", false, "log every map write")
	cmd.MarkFlagRequired("node")
	cmd.MarkFlagRequired("objects")
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
