package main

import (
	"io"
	"strings"
	"testing"
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
