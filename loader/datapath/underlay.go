package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// DecapMode chooses where decapsulation runs on the underlay device.
type DecapMode string

const (
	// DecapAuto uses TC on veth devices (an XDP program on a veth turns off GSO on
	// its peer) and XDP elsewhere, falling back to TC if XDP cannot attach.
	DecapAuto DecapMode = "auto"
	// DecapTC runs decapsulation at tcx ingress only.
	DecapTC DecapMode = "tc"
	// DecapXDP runs it in XDP; failing to attach XDP is an error.
	DecapXDP DecapMode = "xdp"
)

// ParseDecapMode checks a --decap value.
func ParseDecapMode(s string) (DecapMode, error) {
	switch m := DecapMode(s); m {
	case DecapAuto, DecapTC, DecapXDP:
		return m, nil
	}
	return "", fmt.Errorf("parse decap mode %q: want auto, tc or xdp", s)
}

// FindUnderlay returns the device called name, or if name is empty the device that
// holds addr (the node's InternalIP).
func FindUnderlay(name string, addr netip.Addr) (netlink.Link, error) {
	if name != "" {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("look up underlay device %s: %w", name, err)
		}
		return l, nil
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && ip.Unmap() == addr.Unmap() {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("look up underlay device #%d: %w", a.LinkIndex, err)
			}
			return l, nil
		}
	}
	return nil, fmt.Errorf("find underlay device: no interface has the node address %v (set --underlay-dev)", addr)
}

// AttachUnderlay attaches the decapsulation programs to the underlay device l:
// underlay_ingress at tcx ingress always (it also delivers what XDP popped and
// translates replies of masqueraded flows back), underlay_egress at tcx egress
// (egress masquerade), and
// underlay_xdp as mode decides. A pinned XDP link left from an earlier mode is
// removed when XDP is not used. It reports whether XDP is attached.
func AttachUnderlay(d *Datapath, l netlink.Link, mode DecapMode, log *slog.Logger) (xdp bool, err error) {
	name, index := l.Attrs().Name, l.Attrs().Index
	if _, err := Attach(d.PinDir, HookUnderlayIngress, d.Program(HookUnderlayIngress), name, index); err != nil {
		return false, err
	}
	// Egress masquerade; it passes everything on a node whose config does not
	// ask for it (CFG_F_MASQUERADE).
	if _, err := Attach(d.PinDir, HookUnderlayEgress, d.Program(HookUnderlayEgress), name, index); err != nil {
		return false, err
	}
	useXDP := mode == DecapXDP || (mode == DecapAuto && l.Type() != "veth")
	if useXDP {
		_, err := Attach(d.PinDir, HookUnderlayXDP, d.Program(HookUnderlayXDP), name, index)
		if err == nil {
			return true, nil
		}
		if mode == DecapXDP {
			return false, err
		}
		log.Warn("XDP attach failed, decapsulating at TC ingress only", "dev", name, "err", err)
	}
	if err := Detach(d.PinDir, name, HookUnderlayXDP); err != nil && !errors.Is(err, errAddrNotAvail) {
		return false, err
	}
	return false, nil
}
