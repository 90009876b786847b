package agent

import (
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/isthmus-dev/isthmus/loader/plan"
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
