package bpf

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Tests of GENEVE inside WireGuard (lib/wireguard.h). A TUN device without packet
// information stands in for WireGuard's: it is the same kind of layer-3 device the
// userspace implementation drives, so what the programs redirect into it is what
// WireGuard would encrypt (read from the TUN's descriptor), and what is written into
// it is what WireGuard hands the kernel after decryption.

// The PEER_F_* flags of bpf/lib/types.h (defines: not in the BTF; maps checks its
// mirrors against the header).
const (
	peerFWireGuard      = 1 << 0
	peerFWireGuardNoKey = 1 << 1
)

var (
	wgPeerTunnel = netip.MustParseAddr("10.9.9.1")      // an encrypted peer, known by its tunnel address
	wgNet        = netip.MustParsePrefix("10.4.0.0/24") // its pods
	wgPodIP      = netip.MustParseAddr("10.4.0.9")
	labTunnelIP  = hostIP // this node's tunnel address, on ist0
)

// wgLab is the real-packet lab with a TUN device wg0 for WireGuard's, wireguard_ingress
// attached to it, config.wg_ifindex and config.tunnel_ip set, and an encrypted peer
// wgPeerTunnel that owns wgNet and may send from it.
type wgLab struct {
	*realLab
	tun   int // wg0's descriptor: reads are what went into "WireGuard", writes what came out
	tunLk netlink.Link
}

func newWGLab(t *testing.T) *wgLab {
	t.Helper()
	w := &wgLab{realLab: newRealLab(t, 1500)}
	var attached link.Link
	err := inNS(w.ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		w.tun = fd
		ifr, err := unix.NewIfreq("wg0")
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("create tun wg0: %w", err)
		}
		if w.tunLk, err = netlink.LinkByName("wg0"); err != nil {
			return fmt.Errorf("find wg0: %w", err)
		}
		if err := netlink.LinkSetMTU(w.tunLk, 1440); err != nil {
			return fmt.Errorf("set wg0 MTU: %w", err)
		}
		// As the agent leaves its WireGuard device: no IPv6 of its own (router
		// solicitations would be read here as sent into WireGuard).
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/wg0/disable_ipv6", []byte("1"), 0); err != nil {
			return fmt.Errorf("disable IPv6 on wg0: %w", err)
		}
		if err := netlink.LinkSetUp(w.tunLk); err != nil {
			return fmt.Errorf("set wg0 up: %w", err)
		}
		attached, err = link.AttachTCX(link.TCXOptions{Interface: w.tunLk.Attrs().Index, Program: w.objs.WireguardIngress, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("attach wireguard_ingress to wg0: %w", err)
		}
		return nil
	})
	if w.tun > 0 {
		t.Cleanup(func() { unix.Close(w.tun) })
	}
	if attached != nil {
		t.Cleanup(func() { attached.Close() })
	}
	if err != nil {
		t.Fatalf("wireguard lab: %v", err)
	}
	var cfg IsthmusDatapathConfig
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("read config", w.objs.Config.Lookup(uint32(0), &cfg))
	cfg.TunnelIp = be32(labTunnelIP)
	cfg.WgIfindex = uint32(w.tunLk.Attrs().Index)
	must("put config", w.objs.Config.Put(uint32(0), cfg))
	w.setPeerFlags(t, wgPeerTunnel, peerFWireGuard)
	must("put peer source", w.objs.PeerSources.Put(IsthmusPeerSourceKey{Prefixlen: 32 + uint32(wgNet.Bits()), Peer: be32(wgPeerTunnel), Src: be32(wgNet.Addr())},
		IsthmusPeerSourceValue{}))
	must("put route", w.objs.Routes.Put(IsthmusRouteKey{Prefixlen: uint32(wgNet.Bits()), Addr: be32(wgNet.Addr())},
		IsthmusRouteValue{Peer: be32(wgPeerTunnel)}))
	return w
}

func (w *wgLab) setPeerFlags(t *testing.T, peer netip.Addr, flags uint32) {
	t.Helper()
	if err := w.objs.Peers.Put(be32(peer), IsthmusPeerValue{Flags: flags}); err != nil {
		t.Fatalf("put peer %s: %v", peer, err)
	}
}

// setWGIfindex sets config.wg_ifindex.
func (w *wgLab) setWGIfindex(t *testing.T, ifindex uint32) {
	t.Helper()
	var cfg IsthmusDatapathConfig
	if err := w.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.WgIfindex = ifindex
	if err := w.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
}

// decrypted is the GENEVE packet WireGuard hands the kernel for inner, from src to
// this node's tunnel address: a bare IPv4 packet, no Ethernet header.
func decrypted(src, dst netip.Addr, dport uint16, inner []byte) []byte {
	return ipv4Packet(src, dst, 17, ipOpts{ttl: 64, fragOff: 0x4000},
		udpDatagram(40000, dport, geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, inner)))
}

// writeTun writes pkt into wg0, as WireGuard does with what it decrypted.
func (w *wgLab) writeTun(t *testing.T, pkt []byte) {
	t.Helper()
	if _, err := unix.Write(w.tun, pkt); err != nil {
		t.Fatalf("write into wg0: %v", err)
	}
}

// readTun returns the packets sent into wg0 until it has been quiet for 300 ms.
func (w *wgLab) readTun(t *testing.T) [][]byte {
	t.Helper()
	var out [][]byte
	buf := make([]byte, 65536)
	for {
		fds := []unix.PollFd{{Fd: int32(w.tun), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 300)
		if err != nil || n == 0 {
			return out
		}
		m, err := unix.Read(w.tun, buf)
		if err != nil {
			t.Fatalf("read wg0: %v", err)
		}
		out = append(out, append([]byte{}, buf[:m]...))
	}
}

// TestWireGuardIngress: GENEVE out of the WireGuard device from an encrypted peer to
// this node's tunnel address is decapsulated and delivered to the pod; the same frame
// from a peer this node tunnels to in the clear, and anything that is not GENEVE for
// this node, is dropped with its reason and reaches nobody.
func TestWireGuardIngress(t *testing.T) {
	requireRoot(t)
	w := newWGLab(t)
	raw := rawSocket(t, w.podNS, unix.IPPROTO_UDP)
	inner := ipv4Packet(netip.MustParseAddr("10.4.0.9"), realPodIP, 17, ipOpts{ttl: 64}, udpDatagram(5000, 6000, []byte("through wireguard")))
	hook := IsthmusHookHOOK_WIREGUARD_INGRESS

	before := w.counts(t)
	w.writeTun(t, decrypted(wgPeerTunnel, labTunnelIP, 6081, innerEth(inner)))
	got := received(raw, wgPodIP)
	if len(got) != 1 || !bytes.Contains(got[0], []byte("through wireguard")) {
		t.Fatalf("pod received %d packets from %s, want the one sent through wireguard", len(got), wgPodIP)
	}
	d := delta(before, w.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_DECAP, hook)] != 1 {
		t.Errorf("counters moved %v, want METRIC_DECAP +1 at wireguard_ingress", d)
	}

	cases := []struct {
		name   string
		setup  func()
		pkt    []byte
		reason IsthmusDropReason
	}{
		{"peer not marked encrypted", func() { w.setPeerFlags(t, wgPeerTunnel, 0) },
			decrypted(wgPeerTunnel, labTunnelIP, 6081, innerEth(inner)), IsthmusDropReasonDROP_WIREGUARD_PEER_CLEAR},
		{"not GENEVE", func() { w.setPeerFlags(t, wgPeerTunnel, peerFWireGuard) },
			ipv4Packet(wgPeerTunnel, labTunnelIP, 17, ipOpts{ttl: 64}, udpDatagram(40000, 53, []byte("dns?"))), IsthmusDropReasonDROP_WIREGUARD_NOT_GENEVE},
		{"GENEVE for the underlay address", func() {},
			decrypted(wgPeerTunnel, underlayIP, 6081, innerEth(inner)), IsthmusDropReasonDROP_WIREGUARD_NOT_GENEVE},
		{"unknown peer", func() {},
			decrypted(netip.MustParseAddr("10.9.9.2"), labTunnelIP, 6081, innerEth(inner)), IsthmusDropReasonDROP_UNKNOWN_PEER},
		{"source the peer may not use", func() {},
			decrypted(wgPeerTunnel, labTunnelIP, 6081, innerEth(ipv4Packet(deniedIP, realPodIP, 17, ipOpts{ttl: 64}, udpDatagram(5000, 6000, []byte("spoofed"))))),
			IsthmusDropReasonDROP_INNER_SRC_DENIED},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.setup()
			before := w.counts(t)
			w.writeTun(t, c.pkt)
			if got := received(raw, wgPodIP); len(got) != 0 {
				t.Errorf("pod received %d packets", len(got))
			}
			if got := received(raw, deniedIP); len(got) != 0 {
				t.Errorf("pod received %d packets from %s", len(got), deniedIP)
			}
			d := delta(before, w.counts(t))
			if d[dropKey(c.reason, hook)] != 1 || len(d) != 1 {
				t.Errorf("counters moved %v, want only %v +1", d, c.reason)
			}
		})
	}
}

// TestWireGuardCleartextRefused: GENEVE in the clear on the underlay from a peer of
// an encrypted pair is dropped (forged, or a peer that lost its configuration).
func TestWireGuardCleartextRefused(t *testing.T) {
	requireRoot(t)
	w := newWGLab(t)
	w.setPeerFlags(t, peerIP, peerFWireGuard)
	inner := ipv4Packet(remotePodIP, realPodIP, 17, ipOpts{ttl: 64}, udpDatagram(5000, 6000, []byte("in the clear")))
	for _, prog := range []struct {
		name string
		p    *ebpf.Program
		hook IsthmusHook
		idx  int
	}{
		{"tc", w.objs.UnderlayIngress, IsthmusHookHOOK_UNDERLAY_TC, w.und.Attrs().Index},
		{"xdp", w.objs.UnderlayXdp, IsthmusHookHOOK_UNDERLAY_XDP, 0},
	} {
		before := w.counts(t)
		ret, _ := w.run(t, prog.p, geneveFrame(w.lab, goodOpts(realPodIP), innerEth(inner)), prog.idx)
		if ret == tcActRedirect {
			t.Errorf("%s: verdict redirect, want a drop", prog.name)
		}
		d := delta(before, w.counts(t))
		if d[dropKey(IsthmusDropReasonDROP_CLEARTEXT_FROM_ENCRYPTED, prog.hook)] != 1 || len(d) != 1 {
			t.Errorf("%s: counters moved %v, want only DROP_CLEARTEXT_FROM_ENCRYPTED +1", prog.name, d)
		}
	}
}

// TestWireGuardEncap: host traffic for an encrypted peer's pods is encapsulated from
// the tunnel address to the peer's tunnel address and goes into the WireGuard device
// (the frame as WireGuard reads it, decoded by gopacket); without a key for the peer,
// without a device, or for a next hop that is no peer, nothing leaves, and each is
// counted with its reason.
func TestWireGuardEncap(t *testing.T) {
	requireRoot(t)
	w := newWGLab(t)
	var egress link.Link
	if err := inNS(w.ns, func() error {
		var err error
		egress, err = link.AttachTCX(link.TCXOptions{Interface: w.ist.Attrs().Index, Program: w.objs.OverlayEgress, Attach: ebpf.AttachTCXEgress})
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Dst: prefixNet(wgNet), LinkIndex: w.ist.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Src: labTunnelIP.AsSlice()})
	}); err != nil {
		t.Fatalf("attach overlay_egress, route %s into ist0: %v", wgNet, err)
	}
	t.Cleanup(func() { egress.Close() })
	if err := inNS(w.ns, func() error {
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: w.ist.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: wgPodIP.AsSlice(), HardwareAddr: w.istMAC})
	}); err != nil {
		t.Fatalf("neighbour %s: %v", wgPodIP, err)
	}
	send := func(t *testing.T, payload string) {
		t.Helper()
		err := inNS(w.ns, func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.Sendto(fd, []byte(payload), 0, &unix.SockaddrInet4{Port: 7000, Addr: wgPodIP.As4()})
		})
		if err != nil {
			t.Fatalf("send to %s: %v", wgPodIP, err)
		}
	}
	hook := IsthmusHookHOOK_OVERLAY_EGRESS

	before := w.counts(t)
	send(t, "encrypt me")
	pkts := w.readTun(t)
	if len(pkts) != 1 {
		t.Fatalf("wg0 got %d packets, want 1", len(pkts))
	}
	p := gopacket.NewPacket(pkts[0], layers.LayerTypeIPv4, gopacket.Default)
	ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	gnv, _ := p.Layer(layers.LayerTypeGeneve).(*layers.Geneve)
	if ip == nil || udp == nil || gnv == nil {
		t.Fatalf("wg0 got %v, want IPv4/UDP/GENEVE", p)
	}
	if ip.SrcIP.String() != labTunnelIP.String() || ip.DstIP.String() != wgPeerTunnel.String() || udp.DstPort != 6081 || gnv.VNI != testVNI {
		t.Errorf("outer %s -> %s port %d VNI %#x, want %s -> %s port 6081 VNI %#x", ip.SrcIP, ip.DstIP, udp.DstPort, gnv.VNI, labTunnelIP, wgPeerTunnel, testVNI)
	}
	var innerIP *layers.IPv4
	for _, l := range p.Layers() {
		if v, ok := l.(*layers.IPv4); ok && v != ip {
			innerIP = v
		}
	}
	if innerIP == nil || innerIP.DstIP.String() != wgPodIP.String() || !bytes.Contains(innerIP.Payload, []byte("encrypt me")) {
		t.Errorf("inner packet %v, want the datagram to %s", innerIP, wgPodIP)
	}
	d := delta(before, w.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_ENCAP, hook)] != 1 || d[metricKey(IsthmusMetricMETRIC_WIREGUARD_SENT, hook)] != 1 {
		t.Errorf("counters moved %v, want METRIC_ENCAP and METRIC_WIREGUARD_SENT +1", d)
	}

	cases := []struct {
		name   string
		setup  func()
		reason IsthmusDropReason
	}{
		{"no key", func() { w.setPeerFlags(t, wgPeerTunnel, peerFWireGuard|peerFWireGuardNoKey) }, IsthmusDropReasonDROP_WIREGUARD_NO_KEY},
		{"no device", func() { w.setPeerFlags(t, wgPeerTunnel, peerFWireGuard); w.setWGIfindex(t, 0) }, IsthmusDropReasonDROP_WIREGUARD_NO_DEVICE},
		{"next hop is no peer", func() {
			w.setWGIfindex(t, uint32(w.tunLk.Attrs().Index))
			if err := w.objs.Peers.Delete(be32(wgPeerTunnel)); err != nil {
				t.Fatal(err)
			}
		}, IsthmusDropReasonDROP_NEXTHOP_NOT_PEER},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.setup()
			before := w.counts(t)
			send(t, "must not leave")
			if got := w.readTun(t); len(got) != 0 {
				t.Errorf("wg0 got %d packets", len(got))
			}
			d := delta(before, w.counts(t))
			if d[dropKey(c.reason, hook)] != 1 {
				t.Errorf("counters moved %v, want %v +1", d, c.reason)
			}
			time.Sleep(10 * time.Millisecond)
		})
	}
}

// prefixNet is p as a *net.IPNet, for netlink routes.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
