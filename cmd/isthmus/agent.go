package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/agent"
	"github.com/isthmus-dev/isthmus/loader/datapath"
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
	f.StringVar(&patterns, "pod-interfaces", "pod-*", "comma-separated shell globs naming pod-facing host interfaces")
	f.StringVar(&decap, "decap", "auto", "where to decapsulate on the underlay: auto, tc or xdp")
	f.Uint32Var(&vni, "vni", 1, "GENEVE VNI")
	f.StringVar(&cfg.ReadyFile, "ready-file", "", "file to write after the first full sync")
	f.BoolVar(&debug, "debug", false, "log every map write")
	cmd.MarkFlagRequired("node")
	cmd.MarkFlagRequired("objects")
	return cmd
}
