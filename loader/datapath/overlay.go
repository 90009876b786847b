package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
)

// Overlay device names. isthmus0 is one end of a veth pair because the kernel may
// have no dummy module; isthmus0p, the other end, only exists to keep it up.
const (
	OverlayDev     = "isthmus0"
	OverlayPeerDev = "isthmus0p"
)

// Overlay describes isthmus0 as EnsureOverlay left it.
type Overlay struct {
	Ifindex int
	MAC     net.HardwareAddr
	MTU     int
}

// TunnelMTU is the MTU of isthmus0 and of the pods: planMTU if set, else the
// underlay MTU minus overhead (plan.TunnelOverheadOf: GENEVE's, and WireGuard's
// where the site's tunnels are encrypted).
func TunnelMTU(underlayMTU, planMTU, overhead int) int {
	if planMTU > 0 {
		return planMTU
	}
	return underlayMTU - overhead
}

// EnsureOverlay creates isthmus0 (a veth pair with isthmus0p) if missing, and makes
// it match: both ends up, ARP off on isthmus0 (routes through it then need no
// neighbour resolution; the kernel addresses frames to its own MAC, where the TC
// egress program takes them), the given MTU, tunnelAddr as its only IPv4 address
// (/32; none when tunnelAddr is invalid). Forwarding is turned off on isthmus0p so
// nothing that leaks to it is routed back.
func EnsureOverlay(mtu int, tunnelAddr netip.Addr) (Overlay, error) {
	l, err := netlink.LinkByName(OverlayDev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return Overlay{}, fmt.Errorf("look up %s: %w", OverlayDev, err)
		}
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: OverlayDev, MTU: mtu},
			PeerName:  OverlayPeerDev,
		}
		if err := netlink.LinkAdd(veth); err != nil && !errors.Is(err, os.ErrExist) {
			return Overlay{}, fmt.Errorf("create %s: %w", OverlayDev, err)
		}
		if l, err = netlink.LinkByName(OverlayDev); err != nil {
			return Overlay{}, fmt.Errorf("look up %s: %w", OverlayDev, err)
		}
	}
	peer, err := netlink.LinkByName(OverlayPeerDev)
	if err != nil {
		return Overlay{}, fmt.Errorf("look up %s: %w", OverlayPeerDev, err)
	}
	if l.Attrs().RawFlags&netlinkIFFNoARP == 0 {
		if err := netlink.LinkSetARPOff(l); err != nil {
			return Overlay{}, fmt.Errorf("set arp off on %s: %w", OverlayDev, err)
		}
	}
	for _, x := range []netlink.Link{l, peer} {
		if x.Attrs().MTU != mtu {
			if err := netlink.LinkSetMTU(x, mtu); err != nil {
				return Overlay{}, fmt.Errorf("set mtu %d on %s: %w", mtu, x.Attrs().Name, err)
			}
		}
	}
	// Sysctls before up, so isthmus0p never forwards. isthmus0 carries IPv6 pod
	// traffic (routes into it, as for IPv4) but has no IPv6 address of its own:
	// no link-local one, no duplicate address detection, router solicitation or
	// router advertisement to act on. isthmus0p has no IPv6 at all, so what
	// isthmus0 sends there of its own (MLD) ends.
	for _, s := range []struct{ path, value string }{
		{"net/ipv4/conf/" + OverlayPeerDev + "/forwarding", "0"},
		{"net/ipv6/conf/" + OverlayDev + "/addr_gen_mode", "1"},
		{"net/ipv6/conf/" + OverlayDev + "/accept_ra", "0"},
		{"net/ipv6/conf/" + OverlayDev + "/accept_dad", "0"},
		{"net/ipv6/conf/" + OverlayDev + "/router_solicitations", "0"},
		{"net/ipv6/conf/" + OverlayDev + "/disable_ipv6", "0"},
		{"net/ipv6/conf/" + OverlayPeerDev + "/disable_ipv6", "1"},
	} {
		if err := WriteSysctl(s.path, s.value); err != nil && !errors.Is(err, os.ErrNotExist) {
			return Overlay{}, err
		}
	}
	for _, x := range []netlink.Link{peer, l} {
		if err := netlink.LinkSetUp(x); err != nil {
			return Overlay{}, fmt.Errorf("set %s up: %w", x.Attrs().Name, err)
		}
	}
	if err := syncOverlayAddr(l, tunnelAddr); err != nil {
		return Overlay{}, err
	}
	return Overlay{Ifindex: l.Attrs().Index, MAC: l.Attrs().HardwareAddr, MTU: mtu}, nil
}

// IFF_NOARP; netlink.LinkAttrs.RawFlags carries the kernel's flags.
const netlinkIFFNoARP = 0x80

func syncOverlayAddr(l netlink.Link, tunnelAddr netip.Addr) error {
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", OverlayDev, err)
	}
	want := netip.PrefixFrom(tunnelAddr.Unmap(), 32)
	if tunnelAddr.Unmap().Is4() {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: want.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrReplace(l, a); err != nil {
			return fmt.Errorf("add address %v to %s: %w", want, OverlayDev, err)
		}
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		if netip.PrefixFrom(ip.Unmap(), ones) == want && tunnelAddr.IsValid() {
			continue
		}
		if err := netlink.AddrDel(l, &a); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, errAddrNotAvail) {
			return fmt.Errorf("remove old address %v from %s: %w", a.IPNet, OverlayDev, err)
		}
	}
	return nil
}

// WriteSysctl writes value to /proc/sys/<path> (path with slashes, such as
// "net/ipv4/ip_forward") in the calling thread's network namespace.
func WriteSysctl(path, value string) error {
	p := filepath.Join("/proc/sys", path)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open sysctl %s: %w", path, err)
	}
	defer f.Close()
	if _, err := f.WriteString(value); err != nil {
		return fmt.Errorf("write sysctl %s=%s: %w", path, value, err)
	}
	return nil
}

// EnableForwarding sets net.ipv4.ip_forward=1: bpf_fib_lookup refuses to forward
// (BPF_FIB_LKUP_RET_FWD_DISABLED) without it.
func EnableForwarding() error {
	return WriteSysctl("net/ipv4/ip_forward", "1")
}

// EnableIPv6Forwarding sets net.ipv6.conf.all.forwarding=1, which IPv6 pod
// traffic needs as IPv4's needs ip_forward (bpf_fib_lookup answers FWD_DISABLED
// without it). Forwarding turns off the acceptance of router advertisements on
// every interface whose accept_ra is 1, so each of those (and the default for
// interfaces to come) is first set to 2, which accepts them while forwarding:
// a node that takes its IPv6 address or default route from them keeps both. A
// kernel without IPv6 is no error.
func EnableIPv6Forwarding() error {
	confs, err := filepath.Glob("/proc/sys/net/ipv6/conf/*/accept_ra")
	if err != nil || len(confs) == 0 {
		return nil
	}
	for _, c := range confs {
		dev := filepath.Base(filepath.Dir(c))
		if dev == "all" {
			continue
		}
		b, err := os.ReadFile(c)
		if err != nil {
			continue // an interface that went away
		}
		if strings.TrimSpace(string(b)) == "1" {
			if err := WriteSysctl("net/ipv6/conf/"+dev+"/accept_ra", "2"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return WriteSysctl("net/ipv6/conf/all/forwarding", "1")
}

// DeleteOverlay removes isthmus0 and its peer (and with them every route through
// it). Already gone is success.
func DeleteOverlay() error {
	l, err := netlink.LinkByName(OverlayDev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("look up %s: %w", OverlayDev, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", OverlayDev, err)
	}
	return nil
}
