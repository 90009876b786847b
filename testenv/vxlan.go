package testenv

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// VXLANDev is the kernel VXLAN device of DatapathVXLAN.
const VXLANDev = "vxlan0"

// vxlanPort is the IANA VXLAN port.
const vxlanPort = 4789

// vxlanRoutes joins every node with kernel VXLAN the way flannel's vxlan
// backend does: a vxlan0 per node holding the first address of its podCIDR,
// and per peer a route onlink via the peer's vxlan0 address, a permanent
// neighbour for it and an FDB entry pointing its MAC at the peer's underlay
// address. It is the baseline isthmus is measured against.
func (l *Lab) vxlanRoutes() error {
	vni := int(l.Scenario.VNI)
	if vni == 0 {
		vni = 1
	}
	type vtep struct {
		n    NodeRef
		addr netip.Addr
		mac  net.HardwareAddr
	}
	var vteps []vtep
	for _, n := range l.Scenario.Nodes() {
		if len(n.PodCIDRs) == 0 {
			continue // nothing to route to a node without a podCIDR
		}
		h, _, err := handleAt(l.NodeNS(n.Name))
		if err != nil {
			return err
		}
		dev := &netlink.Vxlan{
			LinkAttrs: netlink.LinkAttrs{Name: VXLANDev, MTU: l.Scenario.Underlay.mtu() - GeneveOverhead},
			VxlanId:   vni,
			SrcAddr:   n.Address.AsSlice(),
			Port:      vxlanPort,
			Learning:  false,
		}
		if err := h.LinkAdd(dev); err != nil {
			h.Close()
			return fmt.Errorf("node %s: add %s: %w", n.Name, VXLANDev, err)
		}
		link, err := h.LinkByName(VXLANDev)
		if err != nil {
			h.Close()
			return fmt.Errorf("node %s: find %s: %w", n.Name, VXLANDev, err)
		}
		addr := n.PodCIDRs[0].Masked().Addr()
		if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, 32))}); err != nil {
			h.Close()
			return fmt.Errorf("node %s: address %s: %w", n.Name, VXLANDev, err)
		}
		err = h.LinkSetUp(link)
		h.Close()
		if err != nil {
			return fmt.Errorf("node %s: set %s up: %w", n.Name, VXLANDev, err)
		}
		vteps = append(vteps, vtep{n: n, addr: addr, mac: link.Attrs().HardwareAddr})
		if err := writeSysctls(l.NodeNS(n.Name), map[string]string{"net/ipv4/conf/" + VXLANDev + "/rp_filter": "1"}); err != nil {
			return err
		}
	}
	for _, self := range vteps {
		h, _, err := handleAt(l.NodeNS(self.n.Name))
		if err != nil {
			return err
		}
		link, err := h.LinkByName(VXLANDev)
		if err != nil {
			h.Close()
			return fmt.Errorf("node %s: find %s: %w", self.n.Name, VXLANDev, err)
		}
		idx := link.Attrs().Index
		for _, peer := range vteps {
			if peer.n.Name == self.n.Name {
				continue
			}
			steps := []struct {
				what string
				do   func() error
			}{
				{"neighbour", func() error {
					return h.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
						IP: peer.addr.AsSlice(), HardwareAddr: peer.mac})
				}},
				{"fdb", func() error {
					return h.NeighAppend(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
						Flags: netlink.NTF_SELF, IP: peer.n.Address.AsSlice(), HardwareAddr: peer.mac})
				}},
			}
			for _, c := range peer.n.PodCIDRs {
				steps = append(steps, struct {
					what string
					do   func() error
				}{"route " + c.String(), func() error {
					return h.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: ipNet(c), Gw: peer.addr.AsSlice(), Flags: int(netlink.FLAG_ONLINK)})
				}})
			}
			for _, s := range steps {
				if err := s.do(); err != nil {
					h.Close()
					return fmt.Errorf("node %s: vxlan %s to %s: %w", self.n.Name, s.what, peer.n.Name, err)
				}
			}
		}
		h.Close()
	}
	return nil
}
