package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/loader/wireguard"
	"github.com/isthmus-dev/isthmus/testenv/syncbuf"
)

// TestWireGuardPeers: each encrypted peer with a valid key becomes a WireGuard
// peer that may send only from its tunnel address, sent to at its underlay
// address and the fleet's port (none when it has no underlay address: learnt
// from its packets), with keepalive; clear peers and peers without a key are
// left out (the datapath drops what is for the latter), a bad key with a warning.
func TestWireGuardPeers(t *testing.T) {
	a := netip.MustParseAddr
	k1, _ := wgtypes.GeneratePrivateKey()
	k2, _ := wgtypes.GeneratePrivateKey()
	p := &plan.NodePlan{Peers: []plan.Peer{
		{Name: "clear", Underlay: a("172.16.1.2"), TunnelAddr: a("10.0.1.1")},
		{Name: "enc", Underlay: a("172.16.2.2"), TunnelAddr: a("10.1.1.1"), Encrypted: true, WireGuardKey: k1.PublicKey().String()},
		{Name: "natted", TunnelAddr: a("10.1.2.1"), Encrypted: true, WireGuardKey: k2.PublicKey().String()},
		{Name: "nokey", Underlay: a("172.16.2.4"), TunnelAddr: a("10.1.3.1"), Encrypted: true},
		{Name: "badkey", Underlay: a("172.16.2.5"), TunnelAddr: a("10.1.4.1"), Encrypted: true, WireGuardKey: "not a key"},
	}}
	got, warns := wireGuardPeers(p, 51999, 25*time.Second)
	if len(warns) != 1 {
		t.Errorf("warnings %q, want one for badkey", warns)
	}
	if len(got) != 2 {
		t.Fatalf("peers %+v, want enc and natted", got)
	}
	enc, natted := got[0], got[1]
	if enc.PublicKey != k1.PublicKey() || enc.Endpoint == nil || enc.Endpoint.String() != "172.16.2.2:51999" ||
		len(enc.AllowedIPs) != 1 || enc.AllowedIPs[0] != netip.MustParsePrefix("10.1.1.1/32") || enc.Keepalive != 25*time.Second {
		t.Errorf("enc: %+v", enc)
	}
	if natted.PublicKey != k2.PublicKey() || natted.Endpoint != nil || natted.AllowedIPs[0] != netip.MustParsePrefix("10.1.2.1/32") {
		t.Errorf("natted: %+v, want no endpoint", natted)
	}
}

// TestWireGuardKeyRotationTaken: a key rotated on disk is taken through the
// key directory's watch (not only the heartbeat) and published; a key file
// that stops loading keeps the key in use, logged once.
func TestWireGuardKeyRotationTaken(t *testing.T) {
	dir := t.TempDir()
	var logs syncbuf.Buffer
	published := make(chan string, 4)
	a := &Agent{
		cfg: Config{WireGuard: WireGuardConfig{StateDir: dir, Publish: func(_ context.Context, k string) error {
			published <- k
			return nil
		}}},
		log: slog.New(slog.NewTextHandler(&logs, nil)), reported: map[string]map[string]bool{},
	}
	if err := a.loadWireGuardKey(); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	first := a.wg.key
	a.publishWireGuardKey()
	if got := <-published; got != first.PublicKey().String() {
		t.Fatalf("published %s, want %s", got, first.PublicKey())
	}
	rotated, err := wireguard.RotateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(2 * time.Second) // well inside the 5 s heartbeat
	for a.wg.key != rotated {
		select {
		case ev := <-a.keyEvents():
			if a.isKeyFile(ev) {
				a.checkWireGuardKey()
			}
		case <-deadline:
			t.Fatal("the key directory's watch did not report the rotation")
		}
	}
	if got := <-published; got != rotated.PublicKey().String() {
		t.Errorf("published %s after the rotation, want %s", got, rotated.PublicKey())
	}
	if !strings.Contains(logs.String(), "WireGuard key rotated") {
		t.Errorf("rotation not logged:\n%s", logs.String())
	}

	if err := os.WriteFile(filepath.Join(dir, wireguard.KeyFile), []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.checkWireGuardKey()
	a.checkWireGuardKey()
	if a.wg.key != rotated {
		t.Error("an unreadable key file replaced the key in use")
	}
	if n := strings.Count(logs.String(), "WireGuard key file unreadable"); n != 1 {
		t.Errorf("unreadable key logged %d times, want once:\n%s", n, logs.String())
	}
	select {
	case k := <-published:
		t.Errorf("published %s for an unreadable key file", k)
	default:
	}
}
