package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/isthmus-dev/isthmus/loader/wireguard"
)

// TestWireguardUserspaceFlags checks the flags are checked before any device
// is made.
func TestWireguardUserspaceFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--mtu", "1420"}, `required flag(s) "name" not set`},
		{[]string{"--name", "wg0", "--mtu", "100"}, "parse --mtu 100: want 576..65535"},
		{[]string{"--name", "wg0", "extra"}, "unknown command"},
	} {
		cmd := newWireguardUserspaceCmd()
		cmd.SetArgs(tt.args)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("wireguard-userspace %v: err = %v, want %q", tt.args, err, tt.want)
		}
	}
}

// TestWireguardKeyRotate: wireguard-key prints the same public key until
// --rotate, which prints a new one and keeps the replaced private key as
// wireguard.key.previous; --rotate on a node without a key fails.
func TestWireguardKeyRotate(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		t.Helper()
		cmd := newWireguardKeyCmd()
		var out strings.Builder
		cmd.SetArgs(append([]string{"--state-dir", dir}, args...))
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		return strings.TrimSpace(out.String()), err
	}
	if _, err := run("--rotate"); err == nil {
		t.Fatal("--rotate without a key: no error")
	}
	first, err := run()
	if err != nil {
		t.Fatal(err)
	}
	if again, err := run(); err != nil || again != first {
		t.Fatalf("second read %q (%v), want %q", again, err, first)
	}
	rotated, err := run("--rotate")
	if err != nil {
		t.Fatal(err)
	}
	if rotated == first || len(rotated) != 44 {
		t.Fatalf("rotated key %q, first %q", rotated, first)
	}
	if now, err := run(); err != nil || now != rotated {
		t.Errorf("after rotation %q (%v), want %q", now, err, rotated)
	}
	b, err := os.ReadFile(filepath.Join(dir, wireguard.PreviousKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	prev, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil || prev.PublicKey().String() != first {
		t.Errorf("previous key %v (%v): public %s, want %s", prev, err, prev.PublicKey(), first)
	}
}
