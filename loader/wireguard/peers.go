package wireguard

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Peer is one desired WireGuard peer: another node.
type Peer struct {
	PublicKey wgtypes.Key
	// Endpoint is where to send to the peer; nil leaves it to the peer: the
	// device learns it from the peer's authenticated packets (a peer behind a
	// NAT can only be reached that way).
	Endpoint *net.UDPAddr
	// AllowedIPs are the destinations routed to the peer and the sources
	// accepted from it (for isthmus, the peer's tunnel address).
	AllowedIPs []netip.Prefix
	// Keepalive is the persistent keepalive interval, whole seconds (finer
	// parts are dropped, as WireGuard does); 0 is off.
	Keepalive time.Duration
}

// rejectAfterTime is WireGuard's REJECT_AFTER_TIME: a session with no
// handshake for this long is dead, and an endpoint learnt in it may be stale.
const rejectAfterTime = 180 * time.Second

// Diff returns the peer changes that take a device whose peers are current to
// the desired peers, for one ConfigureDevice call with ReplacePeers false
// (established sessions survive): nil when there is nothing to change. It is a
// pure function of its arguments; now is the time the current peers were read.
//
//   - A current peer not desired is removed.
//   - A new peer is configured whole: endpoint (when given), allowed IPs,
//     keepalive.
//   - A peer both current and desired gets only what differs, with UpdateOnly
//     set so that a peer removed meanwhile by someone else is not resurrected:
//     its allowed IPs when they differ as a set, its keepalive when it differs,
//     and its endpoint per the rule below.
//
// The endpoint rule: the device learns a peer's endpoint from the peer's
// authenticated packets (roaming). That is how the reachable side of a NAT
// finds a NATed peer: the address it sees is the NAT's, which no desired state
// knows. So a desired endpoint is set only where the device has none, or where
// the device's differs and the last handshake is older than REJECT_AFTER_TIME
// (180 s): the session is gone and the learnt address may be stale. A nil
// desired endpoint never clears a learnt one.
//
// Changes come in the order of desired, removals last (sorted by key), so an
// allowed IP moving from a removed peer to another is routed throughout. A
// public key given twice in desired is configured as its last entry says.
func Diff(current []wgtypes.Peer, desired []Peer, now time.Time) []wgtypes.PeerConfig {
	byKey := make(map[wgtypes.Key]*wgtypes.Peer, len(current))
	for i := range current {
		byKey[current[i].PublicKey] = &current[i]
	}
	last := make(map[wgtypes.Key]int, len(desired))
	for i, p := range desired {
		last[p.PublicKey] = i
	}
	var out []wgtypes.PeerConfig
	for i, p := range desired {
		if last[p.PublicKey] != i {
			continue
		}
		cur, ok := byKey[p.PublicKey]
		if !ok {
			out = append(out, newPeerConfig(p))
			continue
		}
		if pc, changed := updatePeerConfig(cur, p, now); changed {
			out = append(out, pc)
		}
	}
	var gone []wgtypes.Key
	for _, c := range current {
		if _, ok := last[c.PublicKey]; !ok {
			gone = append(gone, c.PublicKey)
		}
	}
	slices.SortFunc(gone, func(a, b wgtypes.Key) int { return bytes.Compare(a[:], b[:]) })
	for _, k := range slices.Compact(gone) {
		out = append(out, wgtypes.PeerConfig{PublicKey: k, Remove: true})
	}
	return out
}

// newPeerConfig configures a peer the device does not have.
func newPeerConfig(p Peer) wgtypes.PeerConfig {
	keepalive := wholeSeconds(p.Keepalive)
	return wgtypes.PeerConfig{
		PublicKey:                   p.PublicKey,
		Endpoint:                    cloneUDPAddr(p.Endpoint),
		PersistentKeepaliveInterval: &keepalive,
		ReplaceAllowedIPs:           true,
		AllowedIPs:                  ipNets(p.AllowedIPs),
	}
}

// updatePeerConfig returns what of want differs from the device's peer cur,
// and whether anything does.
func updatePeerConfig(cur *wgtypes.Peer, want Peer, now time.Time) (wgtypes.PeerConfig, bool) {
	pc := wgtypes.PeerConfig{PublicKey: want.PublicKey, UpdateOnly: true}
	changed := false
	if !slices.Equal(prefixSet(prefixes(cur.AllowedIPs)), prefixSet(want.AllowedIPs)) {
		pc.ReplaceAllowedIPs = true
		pc.AllowedIPs = ipNets(want.AllowedIPs)
		changed = true
	}
	if keepalive := wholeSeconds(want.Keepalive); cur.PersistentKeepaliveInterval != keepalive {
		pc.PersistentKeepaliveInterval = &keepalive
		changed = true
	}
	if endpointDue(cur.Endpoint, cur.LastHandshakeTime, want.Endpoint, now) {
		pc.Endpoint = cloneUDPAddr(want.Endpoint)
		changed = true
	}
	return pc, changed
}

// endpointDue reports whether the desired endpoint want replaces the device's
// endpoint cur (see Diff for why a learnt endpoint is kept).
func endpointDue(cur *net.UDPAddr, lastHandshake time.Time, want *net.UDPAddr, now time.Time) bool {
	switch {
	case want == nil:
		return false // the peer's to tell: never clear what the device learnt
	case cur == nil:
		return true
	case addrPort(cur) == addrPort(want):
		return false
	}
	// A zero or Unix-epoch handshake time (none yet) is long past too.
	return now.Sub(lastHandshake) > rejectAfterTime
}

// wholeSeconds truncates d to whole seconds, the unit of WireGuard's keepalive,
// so a desired 1.5 s does not differ forever from the device's 1 s.
func wholeSeconds(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	return d.Truncate(time.Second)
}

// addrPort returns a as a comparable value, IPv4-mapped addresses unmapped.
func addrPort(a *net.UDPAddr) netip.AddrPort {
	ap := a.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func cloneUDPAddr(a *net.UDPAddr) *net.UDPAddr {
	if a == nil {
		return nil
	}
	return &net.UDPAddr{IP: slices.Clone(a.IP), Port: a.Port, Zone: a.Zone}
}

// prefixes converts the device's allowed IPs, unmapping IPv4 addresses given
// in 16 bytes.
func prefixes(nets []net.IPNet) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(nets))
	for _, n := range nets {
		addr, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ones, bits := n.Mask.Size()
		if bits == 32 {
			addr = addr.Unmap()
		}
		out = append(out, netip.PrefixFrom(addr, ones))
	}
	return out
}

// prefixSet returns ps masked, sorted and without duplicates.
func prefixSet(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

func ipNets(ps []netip.Prefix) []net.IPNet {
	out := make([]net.IPNet, 0, len(ps))
	for _, p := range prefixSet(ps) {
		out = append(out, net.IPNet{
			IP:   net.IP(p.Addr().AsSlice()),
			Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()),
		})
	}
	return out
}

// SyncPeers reads the device's peers and applies Diff against desired in one
// ConfigureDevice call (ReplacePeers false: established sessions survive). It
// returns the number of peers changed, 0 when nothing differed. After an
// error nothing is known to have changed; the next call diffs again.
func (d *Device) SyncPeers(desired []Peer) (changed int, err error) {
	dev, err := d.wg.Device(d.name)
	if err != nil {
		return 0, fmt.Errorf("read wireguard device %s: %w", d.name, err)
	}
	cfgs := Diff(dev.Peers, desired, time.Now())
	if len(cfgs) == 0 {
		return 0, nil
	}
	if err := d.wg.ConfigureDevice(d.name, wgtypes.Config{Peers: cfgs}); err != nil {
		return 0, fmt.Errorf("configure %d peers of wireguard device %s: %w", len(cfgs), d.name, err)
	}
	return len(cfgs), nil
}

// PeerStatus is what the device says about one peer.
type PeerStatus struct {
	PublicKey wgtypes.Key
	// Endpoint is where the device sends to the peer: configured or learnt;
	// nil when it has none yet.
	Endpoint   *net.UDPAddr
	AllowedIPs []netip.Prefix
	// LastHandshake is the time of the last completed handshake; zero for
	// none.
	LastHandshake time.Time
	ReceiveBytes  int64
	TransmitBytes int64
	Keepalive     time.Duration
}

// Status returns the device's peers, sorted by public key.
func (d *Device) Status() ([]PeerStatus, error) {
	dev, err := d.wg.Device(d.name)
	if err != nil {
		return nil, fmt.Errorf("read wireguard device %s: %w", d.name, err)
	}
	out := make([]PeerStatus, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		hs := p.LastHandshakeTime
		if hs.Unix() == 0 { // the device's "never"
			hs = time.Time{}
		}
		out = append(out, PeerStatus{
			PublicKey:     p.PublicKey,
			Endpoint:      cloneUDPAddr(p.Endpoint),
			AllowedIPs:    prefixSet(prefixes(p.AllowedIPs)),
			LastHandshake: hs,
			ReceiveBytes:  p.ReceiveBytes,
			TransmitBytes: p.TransmitBytes,
			Keepalive:     p.PersistentKeepaliveInterval,
		})
	}
	slices.SortFunc(out, func(a, b PeerStatus) int { return bytes.Compare(a.PublicKey[:], b.PublicKey[:]) })
	return out, nil
}
