package bpf

import (
	"encoding/binary"
	"fmt"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// virtio_net_hdr_v1_hash_tunnel (Linux 6.17+): the header a tap with IFF_VNET_HDR
// takes in front of each frame when its size is set to 24; it can describe a GSO
// packet inside a UDP tunnel, which the kernel builds as a NIC's or a veth's would
// arrive: GSO, UDP_TUNNEL and skb->encapsulation set.
const (
	vnetHdrTunnelLen   = 24
	vnetFlagNeedsCsum  = 1
	vnetGSOTCPv4       = 1
	vnetGSOUDPTunnelV4 = 0x20
)

// vnetTunnelHdr is that header for a GENEVE frame carrying an IPv4 TCP packet (no IPv4
// or GENEVE options) cut into segments of gsoSize payload bytes (0: not GSO).
func vnetTunnelHdr(gsoSize uint16) []byte {
	const innerIP = 14 + 20 + 8 + 8 + 14 // outer Ethernet, IPv4, UDP, GENEVE, inner Ethernet
	h := make([]byte, vnetHdrTunnelLen)
	if gsoSize == 0 {
		return h
	}
	h[0] = vnetFlagNeedsCsum
	h[1] = vnetGSOTCPv4 | vnetGSOUDPTunnelV4
	binary.LittleEndian.PutUint16(h[2:], innerIP+20+20) // hdr_len
	binary.LittleEndian.PutUint16(h[4:], gsoSize)       // gso_size
	binary.LittleEndian.PutUint16(h[6:], innerIP+20)    // csum_start: the inner TCP header
	binary.LittleEndian.PutUint16(h[8:], 16)            // csum_offset: its checksum
	binary.LittleEndian.PutUint16(h[20:], 14+20)        // outer_th_offset: the outer UDP header
	binary.LittleEndian.PutUint16(h[22:], innerIP)      // inner_nh_offset
	return h
}

// TestTransitICMPForGSOFrame: a gateway answers a transiting frame that is too long for
// its next underlay link with ICMP frag needed written over the frame, shrunk to the
// ICMP message. The kernel will not shrink a GSO frame it marks encapsulated (one that
// came over a veth from the node that encapsulated it, or a virtio NIC's tunnel GSO),
// and such a frame would leave with its GSO state: segmented as TCP, its ICMP message
// rewritten as sequence numbers and checksums, the old payload sent as more segments.
// Here (a veth underlay) the kernel freed it after the redirect, counted as a frag
// needed sent. It is DROP_ICMP_GSO instead, and nothing leaves. The same frame without GSO (which
// the kernel shrinks) gets its frag needed, decoded with gopacket. The frames are
// written into a tap with a virtio net header, so the kernel builds the skbs.
func TestTransitICMPForGSOFrame(t *testing.T) {
	const wanMTU = 1400
	l := gatewayLab(t)
	setTunnelIP(t, l, hostIP)
	var tap int
	var tapLk netlink.Link
	var attached, tracer link.Link // tracer: the kernel's drops of frames the program redirected
	err := inNS(l.ns, func() error {
		if err := netlink.LinkSetMTU(l.und, wanMTU); err != nil {
			return fmt.Errorf("set und0 MTU: %w", err)
		}
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		tap = fd
		ifr, err := unix.NewIfreq("tapv0")
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("create tap: %w", err)
		}
		sz := int32(vnetHdrTunnelLen)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETVNETHDRSZ, uintptr(unsafe.Pointer(&sz))); e != 0 {
			return fmt.Errorf("set vnet header size: %w", e)
		}
		if tapLk, err = netlink.LinkByName("tapv0"); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(tapLk); err != nil {
			return err
		}
		attached, err = link.AttachTCX(link.TCXOptions{Interface: tapLk.Attrs().Index, Program: l.objs.UnderlayIngress, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		tracer, err = link.AttachTracing(link.TracingOptions{Program: l.objs.KfreeSkbAfterRedirect})
		return err
	})
	if tracer != nil {
		t.Cleanup(func() { tracer.Close() })
	}
	if tap > 0 {
		t.Cleanup(func() { unix.Close(tap) })
	}
	if attached != nil {
		t.Cleanup(func() { attached.Close() })
	}
	if err != nil {
		t.Fatalf("tap with virtio net header: %v", err)
	}
	und1, err := func() (netlink.Link, error) {
		var lk netlink.Link
		err := inNS(l.ns, func() (err error) { lk, err = netlink.LinkByName("und1"); return })
		return lk, err
	}()
	if err != nil {
		t.Fatalf("find und1: %v", err)
	}
	wire := packetSocket(t, l.ns, und1.Attrs().Index) // what und0 sends

	// Segments of 1400 payload bytes: 1490-byte frames for a 1400-byte link.
	// scapy: <transitFrame from memberIP>/IP(src="10.7.0.9", dst="10.2.0.7", flags="DF", ttl=63)/TCP(sport=4321, dport=80, flags="A")/(b"\x5a"*2600)
	inner := ipv4Packet(memberPod, remotePodIP, 6, ipOpts{ttl: 63, fragOff: 0x4000, id: 0x4242}, tcpSegment(4321, 80, tcpACK, make([]byte, 2600)))
	frame := outerFrame(tapLk.Attrs().HardwareAddr, gwMAC, memberIP, underlayIP, 61, transitOpts{}, inner)

	sent := func(t *testing.T) []gopacket.Packet {
		var pkts []gopacket.Packet
		buf := make([]byte, 65536)
		for {
			n, err := unix.Read(wire, buf)
			if err != nil {
				return pkts
			}
			p := gopacket.NewPacket(append([]byte{}, buf[:n]...), layers.LayerTypeEthernet, gopacket.Default)
			if udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP); udp != nil && udp.DstPort == 6081 {
				pkts = append(pkts, p)
			}
		}
	}

	t.Run("GSO", func(t *testing.T) {
		before, lost := l.counts(t), perCPUPackets[IsthmusRedirectDropKey](t, l.objs.RedirectDrops)
		if _, err := unix.Write(tap, append(vnetTunnelHdr(1400), frame...)); err != nil {
			t.Fatalf("write GSO frame: %v", err)
		}
		out := sent(t)
		d := delta(before, l.counts(t))
		for k, n := range perCPUPackets[IsthmusRedirectDropKey](t, l.objs.RedirectDrops) {
			if n != lost[k] {
				t.Errorf("the kernel freed %d frames the program had redirected (%+v): it sent them, counted, to their loss", n-lost[k], k)
			}
		}
		if len(out) != 0 {
			for _, p := range out {
				t.Logf("sent %d bytes: %v", len(p.Data()), p)
			}
			t.Errorf("the gateway sent %d frames for a GSO frame it could not shrink, want none (counters %v)", len(out), d)
		}
		if k := dropKey(IsthmusDropReasonDROP_ICMP_GSO, IsthmusHookHOOK_UNDERLAY_TC); d[k] != 1 || len(d) != 1 {
			t.Errorf("counters moved %v, want only %v +1", d, k)
		}
	})
	t.Run("not GSO", func(t *testing.T) {
		small := outerFrame(tapLk.Attrs().HardwareAddr, gwMAC, memberIP, underlayIP, 61, transitOpts{},
			ipv4Packet(memberPod, remotePodIP, 6, ipOpts{ttl: 63, fragOff: 0x4000, id: 0x4242}, tcpSegment(4321, 80, tcpACK, make([]byte, 1400))))
		before := l.counts(t)
		if _, err := unix.Write(tap, append(vnetTunnelHdr(0), small...)); err != nil {
			t.Fatalf("write frame: %v", err)
		}
		out := sent(t)
		if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_FRAG_NEEDED_SENT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
			t.Errorf("counters moved %v, want only METRIC_FRAG_NEEDED_SENT +1", d)
		}
		if len(out) != 1 {
			t.Fatalf("the gateway sent %d frames, want 1 (frag needed)", len(out))
		}
		var ips []*layers.IPv4
		var ic *layers.ICMPv4
		for _, ly := range out[0].Layers() {
			switch ly := ly.(type) {
			case *layers.IPv4:
				ips = append(ips, ly)
			case *layers.ICMPv4:
				ic = ly
			}
		}
		if len(ips) < 2 || ic == nil {
			t.Fatalf("sent %v, want GENEVE carrying ICMP", out[0])
		}
		if !ips[0].DstIP.Equal(memberIP.AsSlice()) || !ips[1].DstIP.Equal(memberPod.AsSlice()) {
			t.Errorf("sent to %v (inner %v), want to %v (inner %v)", ips[0].DstIP, ips[1].DstIP, memberIP, memberPod)
		}
		if ic.TypeCode != layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded) || ic.Seq != wanMTU-50 {
			t.Errorf("ICMP %v MTU %d, want frag needed with %d", ic.TypeCode, ic.Seq, wanMTU-50)
		}
	})
}
