package testenv

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// The world (Underlay.World): a namespace behind the router standing for the
// Internet, on a prefix no site uses. The router holds WorldGateway on its port
// WorldPort and routes WorldPrefix there; the world's eth0 holds WorldAddr and
// WorldNoMasqAddr with a default route back through the router. The router has
// no route to any pod prefix (unless the site fabric routes them), so a pod
// packet that reaches the world with its own address gets no reply: only a
// masqueraded one, from a node's underlay address, does.
const (
	// WorldMember names the world's namespace (NSName(lab, WorldMember)).
	WorldMember = "world"
	// WorldPort is the router's interface towards the world.
	WorldPort = "world"
)

var (
	// WorldPrefix is TEST-NET-3 (RFC 5737), outside every scenario's sites.
	WorldPrefix = netip.MustParsePrefix("203.0.113.0/24")
	// WorldGateway is the router's address on WorldPort.
	WorldGateway = netip.MustParseAddr("203.0.113.1")
	// WorldAddr is the world's address for servers reached with masquerade.
	WorldAddr = netip.MustParseAddr("203.0.113.10")
	// WorldNoMasqAddr is a second world address, in 203.0.113.128/25, which a
	// scenario can list in a Site's nonMasqueradeCIDRs.
	WorldNoMasqAddr = netip.MustParseAddr("203.0.113.200")
)

// WorldNS returns the world's namespace.
func (l *Lab) WorldNS() string { return NSName(l.Name, WorldMember) }

// buildWorld creates the world namespace and its link to the router.
func (l *Lab) buildWorld() error {
	ns := l.WorldNS()
	if err := createNS(ns); err != nil {
		return err
	}
	rt, h, port, err := l.linkToRouter(ns, WorldPort)
	if err != nil {
		return err
	}
	defer rt.Close()
	defer h.Close()
	if err := rt.AddrAdd(port, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(WorldGateway, WorldPrefix.Bits()))}); err != nil {
		return fmt.Errorf("add %s to %s: %w", WorldGateway, WorldPort, err)
	}
	if err := linkUp(rt, WorldPort); err != nil {
		return err
	}
	if err := linkUp(h, "lo"); err != nil {
		return err
	}
	eth, err := h.LinkByName(UnderlayDev)
	if err != nil {
		return fmt.Errorf("find world %s: %w", UnderlayDev, err)
	}
	for _, a := range []netip.Addr{WorldAddr, WorldNoMasqAddr} {
		if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, WorldPrefix.Bits()))}); err != nil {
			return fmt.Errorf("add world address %s: %w", a, err)
		}
	}
	if err := linkUp(h, UnderlayDev); err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{Gw: WorldGateway.AsSlice()}); err != nil {
		return fmt.Errorf("add world default route via %s: %w", WorldGateway, err)
	}
	return nil
}
