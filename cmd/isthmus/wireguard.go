package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/wireguard"
)

// newWireguardUserspaceCmd is `isthmus wireguard-userspace`: one userspace
// WireGuard device (wireguard-go, its TUN without a vnet header) serving its
// UAPI socket until SIGINT or SIGTERM. The agent starts it
// (wireguard.SpawnUserspace) where the kernel has no wireguard module; it
// outlives the agent, which adopts it on its next start.
func newWireguardUserspaceCmd() *cobra.Command {
	var (
		name  string
		mtu   int
		debug bool
	)
	cmd := &cobra.Command{
		Use:   wireguard.UserspaceCommand + " --name NAME [--mtu N]",
		Short: "Run a userspace WireGuard device (the agent starts it where the kernel has no wireguard module)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mtu < 576 || mtu > 65535 {
				return fmt.Errorf("parse --mtu %d: want 576..65535", mtu)
			}
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return wireguard.RunUserspace(ctx, name, mtu, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "name of the device, at most 15 bytes; its socket is /var/run/wireguard/NAME.sock (required)")
	f.IntVar(&mtu, "mtu", wireguard.DefaultMTU, "MTU of the device")
	f.BoolVar(&debug, "debug", false, "log handshakes and keepalives")
	cmd.MarkFlagRequired("name")
	return cmd
}
