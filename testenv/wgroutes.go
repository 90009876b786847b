package testenv

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/isthmus-dev/isthmus/loader/wireguard"
)

// wireGuardRoutes joins the sites with plain WireGuard routing, the way a user
// encrypts between sites without isthmus (wg-quick, Kilo's full mesh): on every
// node a WireGuard device (the same userspace implementation the agents run
// here), a peer per node of every other site, allowed its IPv4 podCIDRs and sent to
// at its address, and a route for each of those podCIDRs into the device; the
// nodes of one site reach each other's pods by plain routes (plainRoutes). The
// device has the underlay MTU less WireGuard's 60 bytes. It is the baseline of
// encrypted isthmus.
func (l *Lab) wireGuardRoutes() error {
	if err := l.plainRoutes(); err != nil {
		return err
	}
	keys := map[string]wireguard.Peer{}
	for _, n := range l.Scenario.Nodes() {
		key, err := wireguard.LoadOrCreateKey(l.NodeStateDir(n.Name))
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		keys[n.Name] = wireguard.Peer{
			PublicKey:  key.PublicKey(),
			Endpoint:   net.UDPAddrFromAddrPort(netip.AddrPortFrom(n.Address, wireguard.DefaultPort)),
			AllowedIPs: podCIDRs4(n.Node),
		}
	}
	for _, n := range l.Scenario.Nodes() {
		var peers []wireguard.Peer
		var routes []netip.Prefix
		for _, m := range l.Scenario.Nodes() {
			if m.Site.Name != n.Site.Name && len(podCIDRs4(m.Node)) > 0 {
				peers = append(peers, keys[m.Name])
				routes = append(routes, podCIDRs4(m.Node)...)
			}
		}
		if len(peers) == 0 {
			continue
		}
		key, err := wireguard.LoadKey(l.NodeStateDir(n.Name))
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		dev := WireGuardDevice(l.Name, n.Name)
		err = Do(l.NodeNS(n.Name), func() error {
			d, err := wireguard.Ensure(wireguard.Config{
				Name: dev, Mode: wireguard.ModeUserspace, MTU: l.Scenario.Underlay.mtu() - WireGuardOverhead,
				PrivateKey: key, Exe: l.Binary, LogFile: filepath.Join(l.StateDir(), dev+".log"),
			})
			if err != nil {
				return err
			}
			defer d.Close()
			if _, err := d.SyncPeers(peers); err != nil {
				return err
			}
			for _, r := range routes {
				if err := netlink.RouteAdd(&netlink.Route{LinkIndex: d.Ifindex(), Dst: ipNet(r), Src: n.Address.AsSlice()}); err != nil {
					return fmt.Errorf("route %s into %s: %w", r, dev, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node %s: plain WireGuard: %w", n.Name, err)
		}
	}
	return nil
}
