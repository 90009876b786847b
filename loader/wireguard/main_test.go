package wireguard

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// TestMain makes the test binary its own `isthmus wireguard-userspace`, so the
// tests spawn userspace devices with SpawnUserspace's default executable.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == UserspaceCommand {
		os.Exit(runUserspaceCommand(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// runUserspaceCommand is cmd/isthmus' wireguard-userspace, as far as the tests
// need it.
func runUserspaceCommand(args []string) int {
	fs := flag.NewFlagSet(UserspaceCommand, flag.ContinueOnError)
	name := fs.String("name", "", "device name")
	mtu := fs.Int("mtu", DefaultMTU, "device MTU")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunUserspace(ctx, *name, *mtu, log); err != nil {
		fmt.Fprintln(os.Stderr, "wireguard-userspace:", err)
		return 1
	}
	return 0
}
