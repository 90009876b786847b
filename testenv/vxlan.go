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
//
// A node with an IPv6 podCIDR carries IPv6 pods in the same vxlan0 (over the
// IPv4 underlay), as flannel's dual-stack vxlan does: vxlan0 also holds the
// first address of that podCIDR (vtepAddr6, /128), IPv6 forwarding is on,
// and per peer with one too there is a route onlink via the peer's vtepAddr6
// for each of its IPv6 podCIDRs and a permanent IPv6 neighbour for that
// address (the FDB entry above already sends the peer's MAC to its underlay
// address).
//
// On an IPv6 underlay (Scenario.Underlay6) vxlan0 is an IPv6 VXLAN device:
// its local address is the node's IPv6 underlay address, the FDB entries
// point at the peers' IPv6 underlay addresses and its MTU is the underlay MTU
// less VXLANOverhead6. It still carries both pod families: the IPv4 routes and
// neighbours above resolve to a peer's MAC, which the FDB sends over IPv6.
func (l *Lab) vxlanRoutes() error {
	vni := int(l.Scenario.VNI)
	if vni == 0 {
		vni = 1
	}
	type vtep struct {
		n     NodeRef
		addr  netip.Addr
		addr6 netip.Addr // the zero Addr without an IPv6 podCIDR
		mac   net.HardwareAddr
	}
	var vteps []vtep
	mtu := l.Scenario.Underlay.mtu() - GeneveOverhead
	if l.Scenario.Underlay6() {
		mtu = l.Scenario.Underlay.mtu() - VXLANOverhead6
	}
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
			LinkAttrs: netlink.LinkAttrs{Name: VXLANDev, MTU: mtu},
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
		addr6 := vtepAddr6(n.Node)
		if addr6.IsValid() {
			if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr6, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
				h.Close()
				return fmt.Errorf("node %s: address %s on %s: %w", n.Name, addr6, VXLANDev, err)
			}
		}
		err = h.LinkSetUp(link)
		h.Close()
		if err != nil {
			return fmt.Errorf("node %s: set %s up: %w", n.Name, VXLANDev, err)
		}
		vteps = append(vteps, vtep{n: n, addr: addr, addr6: addr6, mac: link.Attrs().HardwareAddr})
		sysctls := map[string]string{"net/ipv4/conf/" + VXLANDev + "/rp_filter": "1"}
		if addr6.IsValid() {
			sysctls["net/ipv6/conf/all/forwarding"] = "1"
		}
		if err := writeSysctls(l.NodeNS(n.Name), sysctls); err != nil {
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
			if self.addr6.IsValid() && peer.addr6.IsValid() {
				steps = append(steps, struct {
					what string
					do   func() error
				}{"IPv6 neighbour", func() error {
					return h.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
						IP: peer.addr6.AsSlice(), HardwareAddr: peer.mac})
				}})
				for _, c := range podCIDRs6(peer.n.Node) {
					steps = append(steps, struct {
						what string
						do   func() error
					}{"route " + c.String(), func() error {
						return h.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: ipNet(c), Gw: peer.addr6.AsSlice(), Flags: int(netlink.FLAG_ONLINK)})
					}})
				}
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

// vtepAddr6 returns the IPv6 address of a node's vxlan0: the first address of
// its first IPv6 podCIDR, as vtepAddr takes the IPv4 one; the zero Addr
// without an IPv6 podCIDR.
func vtepAddr6(n Node) netip.Addr {
	if c := podCIDRs6(n); len(c) > 0 {
		return c[0].Masked().Addr()
	}
	return netip.Addr{}
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
