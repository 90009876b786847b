package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// WireGuard is the node's WireGuard device as wgctrl reads it: what `wg show`
// prints, in the same terms.
type WireGuard struct {
	Device     string          `json:"device"`
	Kind       string          `json:"kind"` // "kernel" or "userspace"
	PublicKey  string          `json:"publicKey"`
	ListenPort int             `json:"listenPort"`
	Peers      []WireGuardPeer `json:"peers"`
}

// WireGuardPeer is one peer of the device.
type WireGuardPeer struct {
	PublicKey  string         `json:"publicKey"`
	Endpoint   string         `json:"endpoint,omitempty"`
	AllowedIPs []netip.Prefix `json:"allowedIPs"`
	// LatestHandshake is zero when there was none.
	LatestHandshake time.Time     `json:"latestHandshake,omitzero"`
	ReceiveBytes    int64         `json:"receiveBytes"`
	TransmitBytes   int64         `json:"transmitBytes"`
	Keepalive       time.Duration `json:"keepalive,omitempty"`
}

// ReadWireGuard reads the WireGuard device name (the agent's --wireguard-device),
// kernel or userspace, with its peers sorted by allowed IPs.
func ReadWireGuard(name string) (WireGuard, error) {
	c, err := wgctrl.New()
	if err != nil {
		return WireGuard{}, fmt.Errorf("open wgctrl: %w", err)
	}
	defer c.Close()
	d, err := c.Device(name)
	if err != nil {
		return WireGuard{}, fmt.Errorf("read WireGuard device %s: %w", name, err)
	}
	out := WireGuard{Device: d.Name, PublicKey: d.PublicKey.String(), ListenPort: d.ListenPort, Peers: []WireGuardPeer{}}
	switch d.Type {
	case wgtypes.LinuxKernel:
		out.Kind = "kernel"
	case wgtypes.Userspace:
		out.Kind = "userspace"
	default:
		out.Kind = d.Type.String()
	}
	for _, p := range d.Peers {
		wp := WireGuardPeer{PublicKey: p.PublicKey.String(), LatestHandshake: p.LastHandshakeTime,
			ReceiveBytes: p.ReceiveBytes, TransmitBytes: p.TransmitBytes, Keepalive: p.PersistentKeepaliveInterval,
			AllowedIPs: []netip.Prefix{}}
		if p.Endpoint != nil {
			wp.Endpoint = p.Endpoint.String()
		}
		for _, n := range p.AllowedIPs {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				bits, _ := n.Mask.Size()
				wp.AllowedIPs = append(wp.AllowedIPs, netip.PrefixFrom(a.Unmap(), bits))
			}
		}
		slices.SortFunc(wp.AllowedIPs, comparePrefix)
		out.Peers = append(out.Peers, wp)
	}
	slices.SortFunc(out.Peers, func(a, b WireGuardPeer) int {
		if len(a.AllowedIPs) == 0 || len(b.AllowedIPs) == 0 {
			return len(a.AllowedIPs) - len(b.AllowedIPs)
		}
		return comparePrefix(a.AllowedIPs[0], b.AllowedIPs[0])
	})
	return out, nil
}

// WriteWireGuard prints wg as a table (output "table") or indented JSON.
func WriteWireGuard(w io.Writer, wg WireGuard, output string) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(wg)
	case "table":
	default:
		return fmt.Errorf("parse --output: unknown format %q (want table or json)", output)
	}
	fmt.Fprintf(w, "device %s (%s), public key %s, listening on %d\n", wg.Device, wg.Kind, wg.PublicKey, wg.ListenPort)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ALLOWED IPS\tENDPOINT\tLATEST HANDSHAKE\tRECEIVED\tSENT\tKEEPALIVE\tPUBLIC KEY")
	now := time.Now()
	for _, p := range wg.Peers {
		ips := make([]string, len(p.AllowedIPs))
		for i, a := range p.AllowedIPs {
			ips[i] = a.String()
		}
		hs := "never"
		if !p.LatestHandshake.IsZero() {
			hs = now.Sub(p.LatestHandshake).Round(time.Second).String() + " ago"
		}
		ka := "off"
		if p.Keepalive > 0 {
			ka = p.Keepalive.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", orNone(strings.Join(ips, ",")), orNone(p.Endpoint), hs,
			p.ReceiveBytes, p.TransmitBytes, ka, p.PublicKey)
	}
	return tw.Flush()
}
