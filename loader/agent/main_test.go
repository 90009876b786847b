package agent

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/wireguard"
)

// TestMain makes the test binary its own `isthmus wireguard-userspace`, so that
// a test can start a userspace WireGuard device beside an agent, as the
// DaemonSet's wireguard container does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == wireguard.UserspaceCommand {
		os.Exit(runUserspaceCommand(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// runUserspaceCommand is cmd/isthmus' wireguard-userspace, as far as the tests
// need it.
func runUserspaceCommand(args []string) int {
	fs := flag.NewFlagSet(wireguard.UserspaceCommand, flag.ContinueOnError)
	name := fs.String("name", "", "device name")
	mtu := fs.Int("mtu", wireguard.DefaultMTU, "device MTU")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := wireguard.RunUserspace(ctx, *name, *mtu, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, "wireguard-userspace:", err)
		return 1
	}
	return 0
}
