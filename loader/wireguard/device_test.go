package wireguard

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestKernelLacksWireguard(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{unix.EOPNOTSUPP, true},
		{fmt.Errorf("%w: Unknown device type", unix.EOPNOTSUPP), true}, // netlink with extack
		{unix.EPERM, false},
		{unix.EEXIST, false},
		{os.NewSyscallError("sendmsg", unix.ENOBUFS), false},
		{errors.New("operation not supported"), false}, // the words alone are no errno
	} {
		if got := kernelLacksWireguard(tt.err); got != tt.want {
			t.Errorf("kernelLacksWireguard(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestConfigDefaultsAndChecks(t *testing.T) {
	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Config{Name: "wg0", PrivateKey: key}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode != ModeAuto || got.Port != DefaultPort || got.MTU != DefaultMTU || got.LogFile != "/var/log/isthmus/wireguard-wg0.log" || got.Log == nil {
		t.Errorf("defaults: mode %q port %d mtu %d log file %q logger %v", got.Mode, got.Port, got.MTU, got.LogFile, got.Log)
	}
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{PrivateKey: key}, "want a name of 1 to 15 bytes"},
		{Config{Name: "wg-name-sixteen!", PrivateKey: key}, "want a name of 1 to 15 bytes"},
		{Config{Name: "wg0", Mode: "kernal", PrivateKey: key}, `parse wireguard mode "kernal"`},
		{Config{Name: "wg0", Port: 70000, PrivateKey: key}, "port 70000"},
		{Config{Name: "wg0", MTU: 100, PrivateKey: key}, "mtu 100"},
		{Config{Name: "wg0"}, "no private key"},
	} {
		if _, err := tt.cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: err = %v, want %q", tt.cfg, err, tt.want)
		}
	}
}
