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
// outlives the agent, which adopts it on its next start. In the DaemonSet it
// is a container of its own (--unless-kernel), so that it also outlives the
// agent's container, and the agent runs with --wireguard-spawn=false.
func newWireguardUserspaceCmd() *cobra.Command {
	var (
		name         string
		mtu          int
		debug        bool
		unlessKernel bool
	)
	cmd := &cobra.Command{
		Use:   wireguard.UserspaceCommand + " --name NAME [--mtu N] [--unless-kernel]",
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
			if unlessKernel {
				kernel, err := wireguard.KernelSupported()
				if err != nil {
					return err
				}
				if kernel {
					// A container that exits is restarted: wait instead.
					log.Info("the kernel has wireguard: the agent creates a kernel device; nothing to run here", "device", name)
					<-ctx.Done()
					return nil
				}
			}
			return wireguard.RunUserspace(ctx, name, mtu, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "name of the device, at most 15 bytes; its socket is /var/run/wireguard/NAME.sock (required)")
	f.IntVar(&mtu, "mtu", wireguard.DefaultMTU, "MTU of the device")
	f.BoolVar(&debug, "debug", false, "log handshakes and keepalives")
	f.BoolVar(&unlessKernel, "unless-kernel", false, "run the device only where the kernel has no wireguard module; elsewhere wait for the signal (the DaemonSet's wireguard container)")
	cmd.MarkFlagRequired("name")
	return cmd
}

// DefaultStateDir is the node's state that survives restarts and upgrades (the
// DaemonSet mounts it from the host): the WireGuard private key.
const DefaultStateDir = "/var/lib/isthmus"

// newWireguardKeyCmd is `isthmus wireguard-key`: prints the node's WireGuard public
// key, creating its key pair in the state directory first if it has none, as the
// agent does on its first start. In file mode the operator (or the lab) puts it in
// the Node's annotation isthmus.dev/wireguard-public-key; in Kubernetes mode the
// agent publishes it itself.
//
// With --rotate it replaces the node's key pair first (the old private key kept
// as wireguard.key.previous) and prints the new public key: the running agent
// takes the new key within 5 s and publishes it (in file mode, put it in the
// annotation).
func newWireguardKeyCmd() *cobra.Command {
	var dir string
	var rotate bool
	cmd := &cobra.Command{
		Use:   "wireguard-key [--state-dir DIR] [--rotate]",
		Short: "Print the node's WireGuard public key, creating the key pair if the node has none; --rotate replaces it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			load := wireguard.LoadOrCreateKey
			if rotate {
				load = wireguard.RotateKey
			}
			key, err := load(dir)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), key.PublicKey().String())
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "state-dir", DefaultStateDir, "the agent's --state-dir")
	cmd.Flags().BoolVar(&rotate, "rotate", false, "replace the node's key pair (the running agent takes it within 5 s) and print the new public key")
	return cmd
}
