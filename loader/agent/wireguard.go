package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/loader/wireguard"
)

// DefaultWireGuardDevice is the name of the node's WireGuard device.
const DefaultWireGuardDevice = "isthmus-wg"

// DefaultKeepalive is the persistent keepalive toward every encrypted peer:
// after this long without sending to a peer the device sends it a keepalive, so
// a NAT in front of either end keeps its mapping (NATs forget idle UDP mappings
// after 30 s or more), whichever end is behind it.
const DefaultKeepalive = 25 * time.Second

// WireGuardConfig configures the node's WireGuard device (docs/agent.md,
// "WireGuard"). The device exists only while the plan has an encrypted peer.
type WireGuardConfig struct {
	// Mode picks the implementation: auto (the kernel's, else the userspace
	// one), kernel or userspace. Empty means auto.
	Mode wireguard.Mode
	// Port is the UDP port the device listens on, and the one peers are sent
	// to; every node of a fleet uses the same (0: wireguard.DefaultPort).
	Port int
	// Device is the device's name (empty: DefaultWireGuardDevice).
	Device string
	// StateDir holds the node's private key (wireguard.KeyFile); it must
	// survive restarts and upgrades (the DaemonSet's /var/lib/isthmus).
	StateDir string
	// Exe runs the userspace device (empty: this executable); LogFile takes
	// its output (empty: wireguard.DefaultLogDir/wireguard-<device>.log).
	Exe, LogFile string
	// NoSpawn leaves the userspace device to another process (the DaemonSet's
	// wireguard container): the agent adopts it and never starts one.
	NoSpawn bool
	// Keepalive is the persistent keepalive toward encrypted peers (0:
	// DefaultKeepalive).
	Keepalive time.Duration
	// Publish, if set, publishes the node's public key where peers read it
	// (the Node's annotation isthmus.dev/wireguard-public-key). It is retried
	// at every sync until it succeeds.
	Publish func(ctx context.Context, publicKey string) error
}

func (c *WireGuardConfig) defaults() {
	if c.Mode == "" {
		c.Mode = wireguard.ModeAuto
	}
	if c.Port == 0 {
		c.Port = wireguard.DefaultPort
	}
	if c.Device == "" {
		c.Device = DefaultWireGuardDevice
	}
	if c.Keepalive == 0 {
		c.Keepalive = DefaultKeepalive
	}
}

// wireGuardState is the agent's side of the WireGuard device.
type wireGuardState struct {
	key       wgtypes.Key
	published bool
	// keyWatch reports changes in the state directory, so a rotated key is
	// taken at once; without it (the watch could not start) the heartbeat
	// reads the key file.
	keyWatch *fsnotify.Watcher
	dev      *wireguard.Device // nil until the plan first had an encrypted peer
	ifindex  int               // where wireguard_ingress is attached (0: nowhere)
}

// loadWireGuardKey reads the node's private key, creating it on the first start.
func (a *Agent) loadWireGuardKey() error {
	if a.cfg.WireGuard.StateDir == "" {
		return fmt.Errorf("WireGuard: no state directory for the node's key")
	}
	key, err := wireguard.LoadOrCreateKey(a.cfg.WireGuard.StateDir)
	if err != nil {
		return err
	}
	a.wg.key = key
	a.log.Info("WireGuard key loaded", "public_key", key.PublicKey().String(),
		"file", filepath.Join(a.cfg.WireGuard.StateDir, wireguard.KeyFile))
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(a.cfg.WireGuard.StateDir); err != nil {
			w.Close()
		}
	}
	if err != nil {
		a.log.Warn("WireGuard key directory not watched: a rotated key is taken at the next heartbeat (5 s)", "err", err)
		return nil
	}
	a.wg.keyWatch = w
	go func() { // until Close closes the watch
		for err := range w.Errors {
			a.log.Warn("WireGuard key directory watch", "err", err)
		}
	}()
	return nil
}

// isKeyFile reports whether ev is about the key file.
func (a *Agent) isKeyFile(ev fsnotify.Event) bool {
	return filepath.Base(ev.Name) == wireguard.KeyFile
}

// keyEvents returns the channel of the key directory's events (nil, which
// never fires, without a watch).
func (a *Agent) keyEvents() <-chan fsnotify.Event {
	if a.wg.keyWatch == nil {
		return nil
	}
	return a.wg.keyWatch.Events
}

// checkWireGuardKey takes up a key rotated on disk (`isthmus wireguard-key
// --rotate` wrote a new wireguard.key): the device gets the new private key
// first, then the public key is published. In that order the peers' handshakes
// under the new key succeed as soon as they read it: a peer that learns a new key
// replaces the WireGuard peer, whose persistent keepalive starts a handshake at
// once, and the node's own packets wait in the device (up to its queue) until
// then. Flows lose at most what one handshake takes. A key file that does not
// load is logged and the key in use kept.
func (a *Agent) checkWireGuardKey() {
	if a.cfg.WireGuard.StateDir == "" || a.wg.key == (wgtypes.Key{}) {
		return
	}
	key, err := wireguard.LoadKey(a.cfg.WireGuard.StateDir)
	if err != nil {
		a.reportChanged("wireguard-key", []string{err.Error()}, func(line string) {
			a.log.Error("WireGuard key file unreadable; the key in use stays", "err", line)
		})
		return
	}
	a.reportChanged("wireguard-key", nil, nil)
	if key == a.wg.key {
		return
	}
	if a.wg.dev != nil {
		if err := a.wg.dev.SetPrivateKey(key); err != nil {
			a.log.Error("WireGuard key rotation: the device keeps the old key; retrying", "err", err)
			return
		}
	}
	a.log.Info("WireGuard key rotated", "public_key", key.PublicKey().String(), "previous", a.wg.key.PublicKey().String())
	a.wg.key, a.wg.published = key, false
	a.publishWireGuardKey()
}

// publishWireGuardKey publishes the public key once (Publish), logging a
// failure and trying again at the next sync.
func (a *Agent) publishWireGuardKey() {
	if a.wg.published || a.cfg.WireGuard.Publish == nil || a.wg.key == (wgtypes.Key{}) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.cfg.WireGuard.Publish(ctx, a.wg.key.PublicKey().String()); err != nil {
		a.log.Error("publish the WireGuard public key; peers drop what they would send this node until it is", "err", err)
		return
	}
	a.wg.published = true
}

// ensureWireGuard makes the WireGuard device match the plan: while the plan
// has an encrypted peer, the device exists (adopted if it does: its sessions
// survive an agent restart), wireguard_ingress is attached to it, and its peers
// are the plan's encrypted peers, changed by difference. Without one, the
// device keeps no peer (config.wg_ifindex is 0 then, so nothing is sent into
// it).
func (a *Agent) ensureWireGuard() error {
	wc := &a.cfg.WireGuard
	if !a.plan.Encrypted {
		if a.wg.dev != nil {
			if n, err := a.wg.dev.SyncPeers(nil); err != nil {
				return fmt.Errorf("WireGuard: remove peers: %w", err)
			} else if n > 0 {
				a.log.Info("WireGuard peers removed: no encrypted peer left", "removed", n)
			}
		}
		return nil
	}
	if a.wg.key == (wgtypes.Key{}) {
		return fmt.Errorf("WireGuard: the plan has encrypted peers, and the agent has no key: give it a state directory (--state-dir)")
	}
	if a.wg.dev == nil || !linkExists(a.wg.dev.Ifindex(), wc.Device) {
		dev, err := wireguard.Ensure(wireguard.Config{
			Name: wc.Device, Mode: wc.Mode, Port: wc.Port,
			MTU:        a.underlay.Attrs().MTU - plan.WireGuardOverhead,
			PrivateKey: a.wg.key, Exe: wc.Exe, LogFile: wc.LogFile, NoSpawn: wc.NoSpawn, Log: a.log,
		})
		if err != nil {
			return fmt.Errorf("WireGuard device: %w", err)
		}
		a.wg.dev = dev
		a.cfg.Metrics.WireGuardDevice(string(dev.Kind()))
		if dev.Kind() == wireguard.KindUserspace {
			a.log.Warn("WireGuard runs in userspace: this kernel has no wireguard module (or --wireguard=userspace); it costs more CPU per packet than the kernel's",
				"device", dev.Name(), "adopted", dev.Adopted())
		} else {
			a.log.Info("WireGuard device ready", "device", dev.Name(), "kind", dev.Kind(), "adopted", dev.Adopted())
		}
	}
	if ifindex := a.wg.dev.Ifindex(); ifindex != a.wg.ifindex {
		if err := disableIPv6(wc.Device); err != nil {
			return err
		}
		if _, err := datapath.Attach(a.cfg.PinDir, datapath.HookWireGuard, a.dp.Program(datapath.HookWireGuard), wc.Device, ifindex); err != nil {
			return err
		}
		a.wg.ifindex = ifindex
	}
	peers, warns := wireGuardPeers(a.plan, wc.Port, wc.Keepalive)
	a.logWarnings("wireguard", warns)
	n, err := a.wg.dev.SyncPeers(peers)
	if err != nil {
		return fmt.Errorf("WireGuard: configure peers: %w", err)
	}
	if n > 0 {
		a.log.Info("WireGuard peers configured", "changed", n, "peers", len(peers))
	}
	return nil
}

// wireGuardPeers returns the WireGuard peers of p's encrypted peers that have a
// key: each allowed only its tunnel address (the outer address of GENEVE inside
// WireGuard, the address the datapath knows it by), sent to at its underlay
// address and port when it has one, else left to be learnt from its
// authenticated packets, with keepalive. A peer without a key gets none (the
// datapath drops what is for it: DROP_WIREGUARD_NO_KEY); an invalid key is a
// warning. It is a pure function.
func wireGuardPeers(p *plan.NodePlan, port int, keepalive time.Duration) ([]wireguard.Peer, []string) {
	var out []wireguard.Peer
	var warns []string
	for _, pr := range p.Peers {
		if !pr.Encrypted || pr.WireGuardKey == "" || !pr.TunnelAddr.IsValid() {
			continue
		}
		key, err := wgtypes.ParseKey(pr.WireGuardKey)
		if err != nil {
			warns = append(warns, fmt.Sprintf("peer %s: WireGuard key %q: %v", pr.Name, pr.WireGuardKey, err))
			continue
		}
		wp := wireguard.Peer{
			PublicKey:  key,
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(pr.TunnelAddr, pr.TunnelAddr.BitLen())},
			Keepalive:  keepalive,
		}
		if pr.Underlay.IsValid() {
			wp.Endpoint = net.UDPAddrFromAddrPort(netip.AddrPortFrom(pr.Underlay, uint16(port)))
		}
		out = append(out, wp)
	}
	return out, warns
}

// waitingForWireGuard reports whether err says the userspace device another
// process runs is not up yet (WireGuardConfig.NoSpawn).
func waitingForWireGuard(err error) bool {
	return errors.Is(err, wireguard.ErrUserspaceNotRunning)
}

// reportWireGuardWaiting logs, once while it lasts, that ensureWireGuard's err
// says the device is not up yet, and returns nil then; any other err it
// returns as it is.
func (a *Agent) reportWireGuardWaiting(err error) error {
	var waiting []string
	if waitingForWireGuard(err) {
		waiting, err = []string{err.Error()}, nil
	}
	a.reportChanged("wireguard-device", waiting, func(line string) {
		a.log.Warn("WireGuard device not up yet; what is for encrypted peers is dropped until it is", "err", line)
	})
	return err
}

// isWireGuardLink reports whether u is about the WireGuard device's link (it
// appeared, or went): the device must be adopted again.
func (a *Agent) isWireGuardLink(u netlink.LinkUpdate) bool {
	return a.plan != nil && a.plan.Encrypted && u.Attrs().Name == a.cfg.WireGuard.Device
}

// linkExists reports whether the device ifindex still exists under name.
func linkExists(ifindex int, name string) bool {
	i, err := net.InterfaceByIndex(ifindex)
	return err == nil && i.Name == name
}

// disableIPv6 turns IPv6 off on the WireGuard device: it carries GENEVE between
// tunnel addresses only, and an IPv6 link-local address would have the kernel
// send router solicitations into it.
func disableIPv6(dev string) error {
	err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", dev, "disable_ipv6"), []byte("1"), 0)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("disable IPv6 on %s: %w", dev, err)
	}
	return nil
}
