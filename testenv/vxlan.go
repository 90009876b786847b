package testenv

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// VXLANDev is the kernel VXLAN device of DatapathVXLAN.
const VXLANDev = "vxlan0"

// vxlanPort is the IANA VXLAN port.
const vxlanPort = 4789

// vxlanRoutes joins every node with kernel VXLAN the way flannel's vxlan
// backend does: a vxlan0 per node holding the first address of its podCIDR
// (or its tunnel address when it has none), and per peer a route onlink via
// the peer's vxlan0 address for each of its podCIDRs (and for that address
// itself when no podCIDR holds it), a permanent neighbour for it and an FDB
// entry pointing its MAC at the peer's underlay address. Pods that isthmus
// would translate are masqueraded to vxlan0's address (vxlanMasquerade). It is
// the baseline isthmus is measured against.
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
		addr := vtepAddr(n.Node)
		if !addr.IsValid() {
			continue // nothing to route to a node without a podCIDR or tunnel address
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
			dsts := podCIDRs4(peer.n.Node)
			if !slices.ContainsFunc(dsts, func(c netip.Prefix) bool { return c.Contains(peer.addr) }) {
				dsts = append(slices.Clone(dsts), netip.PrefixFrom(peer.addr, 32))
			}
			for _, c := range dsts {
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
	return l.vxlanMasquerade(context.Background())
}

// vtepAddr returns the address of a node's vxlan0: the first address of its
// podCIDR as flannel has it, else its tunnel address (the annotation), the
// place unbounded0 took in seed 000; the zero Addr when it has neither.
func vtepAddr(n Node) netip.Addr {
	if c := podCIDRs4(n); len(c) > 0 {
		return c[0].Masked().Addr()
	}
	return n.TunnelAddr()
}

// vxlanMasquerade installs, on each node, what a user of kernel VXLAN would add
// for pods the other side cannot route back to (the ones isthmus translates
// with return-path SNAT): `-t nat -A POSTROUTING -s <pod>/32 -o vxlan0 -j
// MASQUERADE`, which rewrites them to vxlan0's address, the tunnel address.
func (l *Lab) vxlanMasquerade(ctx context.Context) error {
	for _, n := range l.Scenario.Nodes() {
		var rules []string
		for _, p := range n.Pods {
			if l.Scenario.translated(p.Name) {
				rules = append(rules, fmt.Sprintf("-A POSTROUTING -s %s/32 -o %s -j MASQUERADE", p.Address, VXLANDev))
			}
		}
		for _, r := range rules {
			argv := append([]string{"iptables", "-w", "-t", "nat"}, strings.Fields(r)...)
			if _, err := l.Exec(ctx, l.NodeNS(n.Name), argv...); err != nil {
				return fmt.Errorf("node %s: add MASQUERADE: %w", n.Name, err)
			}
		}
	}
	return nil
}
