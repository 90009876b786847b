package bpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
)

// IPv6 pods over the IPv4 underlay: the addresses of these tests. remoteNet6 is
// peerIP's, pod6 is the local pod behind pod0h.
var (
	pod6       = netip.MustParseAddr("fd10::5")
	remotePod6 = netip.MustParseAddr("fd20::7")
	remoteNet6 = netip.MustParsePrefix("fd20::/64")
)

// flowHash6 is the Go twin of flow_hash6 in lib/hash.h: jhash_3words over the
// exclusive-or of each address's words (loaded little-endian, as on bpfel), the
// destination's mixed with the raw flow label, and the ports plus next header.
func flowHash6(ip []byte) uint32 {
	const seed = 0x15743b5d
	xor := func(b []byte) uint32 {
		var w uint32
		for i := 0; i < 16; i += 4 {
			w ^= binary.LittleEndian.Uint32(b[i:])
		}
		return w
	}
	label := binary.LittleEndian.Uint32(ip[0:]) & binary.LittleEndian.Uint32([]byte{0, 0x0f, 0xff, 0xff})
	next := ip[6]
	var ports uint32
	if (next == 6 || next == 17) && len(ip) >= 44 {
		ports = binary.LittleEndian.Uint32(ip[40:])
	}
	return jhash3(xor(ip[8:24]), xor(ip[24:40])^label, ports+uint32(next), seed)
}

// ipv6Lab is a lab with the IPv6 side filled (fillIPv6).
func ipv6Lab(t *testing.T) *lab {
	t.Helper()
	l := newLab(t)
	l.fillIPv6(t)
	return l
}

// fillIPv6 fills l's IPv6 side: routes6 to peerIP for remoteNet6, peer_sources6
// letting peerIP send from it, pod6 routed to the pod interface, and IPv6
// forwarding on (the agent turns it on for a node with IPv6 pods).
func (l *lab) fillIPv6(t *testing.T) {
	t.Helper()
	key := IsthmusRoute6Key{Prefixlen: uint32(remoteNet6.Bits()), Addr: addr16(remoteNet6.Addr())}
	if err := l.objs.Routes6.Put(key, IsthmusRouteValue{Peer: be32(peerIP)}); err != nil {
		t.Fatal(err)
	}
	skey := IsthmusPeerSource6Key{Prefixlen: 32 + uint32(remoteNet6.Bits()), Peer: be32(peerIP), Src: addr16(remoteNet6.Addr())}
	if err := l.objs.PeerSources6.Put(skey, IsthmusPeerSourceValue{}); err != nil {
		t.Fatal(err)
	}
	if err := inNS(l.ns, func() error {
		r := &netlink.Route{Dst: &net.IPNet{IP: pod6.AsSlice(), Mask: net.CIDRMask(128, 128)}, LinkIndex: l.pod.Attrs().Index}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("add route %v: %w", pod6, err)
		}
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
}

// addr16 is an IPv6 address as a __be32[4] (network order in memory).
func addr16(a netip.Addr) [4]uint32 {
	b := a.As16()
	var out [4]uint32
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return out
}

// ipv6Flow is an IPv6 UDP datagram with traffic class tclass and flow label label.
func ipv6Flow(src, dst netip.Addr, tclass byte, label uint32, sport uint16) []byte {
	ip := ipv6Packet(src, dst, 17, 64, udpDatagram(sport, 5000, []byte("payload6")))
	binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(tclass)<<20|label&0xfffff)
	return ip
}

// TestEncapIPv6: an IPv6 packet the stack routed into isthmus0 leaves overlay_egress
// in GENEVE over IPv4 to the route's peer, decoded here by gopacket: outer IPv4 from
// the underlay address with the inner traffic class, DF and TTL 64; UDP to 6081 from
// the flow hash's port, checksum zero; GENEVE with the VNI and Ethernet payload; the
// inner frame byte for byte as it was.
func TestEncapIPv6(t *testing.T) {
	l := ipv6Lab(t)
	inner := ipv6Flow(pod6, remotePod6, 0xb8|0x02, 0x12345, 4000) // DSCP EF, ECT(0)
	in := ethFrame(l.istMAC, l.istMAC, 0x86dd, inner)
	before := l.counts(t)
	ret, out := l.run(t, l.objs.OverlayEgress, in, l.ist.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
	}
	pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		t.Fatalf("gopacket: %v", el.Error())
	}
	eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip4, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	gnv, _ := pkt.Layer(layers.LayerTypeGeneve).(*layers.Geneve)
	if eth == nil || ip4 == nil || udp == nil || gnv == nil {
		t.Fatalf("want Ethernet/IPv4/UDP/GENEVE, got %v", pkt)
	}
	if !bytes.Equal(eth.DstMAC, gwMAC) || !bytes.Equal(eth.SrcMAC, l.undMAC) || eth.EthernetType != layers.EthernetTypeIPv4 {
		t.Errorf("outer Ethernet %v -> %v type %v", eth.SrcMAC, eth.DstMAC, eth.EthernetType)
	}
	if ip4.SrcIP.String() != underlayIP.String() || ip4.DstIP.String() != peerIP.String() || ip4.TTL != 64 ||
		ip4.Flags&layers.IPv4DontFragment == 0 || ip4.TOS != 0xba || int(ip4.Length) != len(out)-14 {
		t.Errorf("outer IPv4 %v -> %v ttl %d flags %v tos %#x len %d", ip4.SrcIP, ip4.DstIP, ip4.TTL, ip4.Flags, ip4.TOS, ip4.Length)
	}
	if csum16(out[14:34]) != 0 {
		t.Error("outer IPv4 header checksum does not verify")
	}
	if udp.DstPort != 6081 || udp.Checksum != 0 || uint16(udp.SrcPort) != 49152+uint16(flowHash6(inner)%16384) {
		t.Errorf("outer UDP %d -> %d checksum %#x; want source port %d from the flow hash, checksum 0",
			udp.SrcPort, udp.DstPort, udp.Checksum, 49152+uint16(flowHash6(inner)%16384))
	}
	if gnv.VNI != testVNI || gnv.Protocol != layers.EthernetTypeTransparentEthernetBridging || gnv.OptionsLength != 0 {
		t.Errorf("GENEVE vni %#x proto %v options %d", gnv.VNI, gnv.Protocol, gnv.OptionsLength)
	}
	if !bytes.Equal(gnv.Payload, in) {
		t.Errorf("inner frame changed\n got %x\nwant %x", gnv.Payload, in)
	}
	d := delta(before, l.counts(t))
	if want := map[IsthmusMetricsKey]uint64{metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_OVERLAY_EGRESS): 1}; !maps.Equal(d, want) {
		t.Errorf("counters moved %v, want %v", d, want)
	}

	// The flow label is part of the flow: another label, another hash (these two
	// differ), the same label, the same port.
	if flowHash6(inner) == flowHash6(ipv6Flow(pod6, remotePod6, 0, 0x54321, 4000)) {
		t.Fatal("twin hash ignores the flow label")
	}
	for _, label := range []uint32{0x12345, 0x54321} {
		f := ipv6Flow(pod6, remotePod6, 0, label, 4000)
		_, o := l.run(t, l.objs.OverlayEgress, ethFrame(l.istMAC, l.istMAC, 0x86dd, f), l.ist.Attrs().Index)
		if len(o) < 36 || binary.BigEndian.Uint16(o[34:]) != 49152+uint16(flowHash6(f)%16384) {
			t.Errorf("label %#x: source port differs from the flow hash's", label)
		}
	}

	t.Run("never tunnelled", func(t *testing.T) {
		// Neighbour discovery and MLD of isthmus0 itself: on to isthmus0p, untouched.
		for _, dst := range []string{"fe80::1", "ff02::1", "ff02::16"} {
			f := ethFrame(l.istMAC, l.istMAC, 0x86dd, ipv6Flow(netip.MustParseAddr("fe80::2"), netip.MustParseAddr(dst), 0, 0, 4000))
			before := l.counts(t)
			ret, o := l.run(t, l.objs.OverlayEgress, f, l.ist.Attrs().Index)
			if ret != tcActOK || !bytes.Equal(o, f) || len(delta(before, l.counts(t))) != 0 {
				t.Errorf("%s: verdict %d, changed %v; want TC_ACT_OK, untouched, uncounted", dst, ret, !bytes.Equal(o, f))
			}
		}
	})
	t.Run("no route", func(t *testing.T) {
		f := ethFrame(l.istMAC, l.istMAC, 0x86dd, ipv6Flow(pod6, netip.MustParseAddr("fd99::1"), 0, 0, 4000))
		wantDrop(t, l, l.objs.OverlayEgress, l.ist.Attrs().Index, f, IsthmusDropReasonDROP_NO_OVERLAY_ROUTE, IsthmusHookHOOK_OVERLAY_EGRESS)
	})
}

// TestPodIngressIPv6Routes: a pod's IPv6 packet for a tunnel route or a local pod
// goes on to the stack marked (to be forwarded into isthmus0, or to the pod),
// anything else unmarked; a link-local or multicast destination never counts as a
// tunnel route's.
func TestPodIngressIPv6Routes(t *testing.T) {
	l := ipv6Lab(t)
	// A route of every length covers ff00::/8 and fe80::/10: they stay unmarked anyway.
	all := IsthmusRoute6Key{Prefixlen: 0}
	if err := l.objs.Routes6.Put(all, IsthmusRouteValue{Peer: be32(peerIP)}); err != nil {
		t.Fatal(err)
	}
	ifindex := l.pod.Attrs().Index
	for _, tc := range []struct {
		dst  string
		mark uint32
	}{
		{remotePod6.String(), overlayMark},
		{"fd99::1", overlayMark}, // ::/0
		{"fe80::1", 0},
		{"ff02::2", 0},
	} {
		in := ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Flow(pod6, netip.MustParseAddr(tc.dst), 0, 0, 4000))
		ret, out := l.run(t, l.objs.PodIngress, in, ifindex)
		if ret != tcActOK || !bytes.Equal(out, in) || l.mark != tc.mark {
			t.Errorf("to %s: verdict %d mark %#x changed %v; want TC_ACT_OK, mark %#x, untouched", tc.dst, ret, l.mark, !bytes.Equal(out, in), tc.mark)
		}
	}
	if err := l.objs.Routes6.Delete(all); err != nil {
		t.Fatal(err)
	}
	in := ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Flow(pod6, netip.MustParseAddr("fd99::1"), 0, 0, 4000))
	before := l.counts(t)
	if ret, _ := l.run(t, l.objs.PodIngress, in, ifindex); ret != tcActOK || l.mark != 0 || len(delta(before, l.counts(t))) != 0 {
		t.Errorf("no route: verdict %d mark %#x; want TC_ACT_OK unmarked, uncounted", ret, l.mark)
	}
	// A pod of this node (the FIB routes it to a pod interface): marked, so no
	// other CNI's IPv6 MASQUERADE rewrites it, and counted.
	in = ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Flow(pod6, pod6, 0, 0, 4000))
	before = l.counts(t)
	if ret, _ := l.run(t, l.objs.PodIngress, in, ifindex); ret != tcActOK || l.mark != overlayMark {
		t.Errorf("to a local pod: verdict %d mark %#x; want TC_ACT_OK marked", ret, l.mark)
	}
	if d, want := delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_POD_INGRESS): 1}; !maps.Equal(d, want) {
		t.Errorf("to a local pod: counters moved %v, want %v", d, want)
	}
}

// geneveFrame6 is what peer src sends: GENEVE over IPv4 with an inner IPv6 frame,
// outer TOS tos.
func geneveFrame6(l *lab, src netip.Addr, tos byte, inner []byte) []byte {
	return ethFrame(l.undMAC, gwMAC, 0x0800,
		ipv4Packet(src, underlayIP, 17, ipOpts{ttl: 64, tos: tos, fragOff: 0x4000},
			udpDatagram(50000, 6081, geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1},
				ethFrame(innerMAC, innerMAC, 0x86dd, inner)))))
}

// TestDecapIPv6: GENEVE from a peer carrying IPv6 for a local pod is popped and
// handed to the stack through isthmus0, marked; at XDP it is popped with the outer
// Ethernet header saying IPv6. The inner source is checked per family.
func TestDecapIPv6(t *testing.T) {
	l := ipv6Lab(t)
	und := l.und.Attrs().Index
	inner := ipv6Flow(remotePod6, pod6, 0, 0x777, 4000)

	t.Run("tc", func(t *testing.T) {
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, geneveFrame6(l, peerIP, 0, inner), und)
		if ret != tcActRedirect || l.mark != overlayMark {
			t.Fatalf("verdict %d mark %#x, want TC_ACT_REDIRECT marked %#x", ret, l.mark, overlayMark)
		}
		want := ethFrame(l.istMAC, gwMAC, 0x86dd, inner)
		if !bytes.Equal(out, want) {
			t.Fatalf("decapsulated frame differs\n got %x\nwant %x", out, want)
		}
		d := delta(before, l.counts(t))
		if want := map[IsthmusMetricsKey]uint64{metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC): 1,
			metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC): 1}; !maps.Equal(d, want) {
			t.Errorf("counters moved %v, want %v", d, want)
		}
	})
	t.Run("xdp", func(t *testing.T) {
		in := geneveFrame6(l, peerIP, 0, inner)
		ret, out := l.run(t, l.objs.UnderlayXdp, in, 0)
		if ret != xdpPass || len(out) < 8 {
			t.Fatalf("verdict %d, %d bytes; want XDP_PASS with metadata", ret, len(out))
		}
		want := append(append(append([]byte{}, in[:12]...), 0x86, 0xdd), inner...)
		if !bytes.Equal(out[8:], want) {
			t.Fatalf("popped frame differs\n got %x\nwant %x", out[8:], want)
		}
	})
	t.Run("ecn", func(t *testing.T) {
		ect := ipv6Flow(remotePod6, pod6, 0x02, 0, 4000)
		ret, out := l.run(t, l.objs.UnderlayIngress, geneveFrame6(l, peerIP, 0x03, ect), und)
		if ret != tcActRedirect || len(out) < 16 || (binary.BigEndian.Uint32(out[14:])>>20)&3 != 3 {
			t.Errorf("outer CE over ECT(0): verdict %d, want delivered with the inner packet CE", ret)
		}
		notECT := geneveFrame6(l, peerIP, 0x03, ipv6Flow(remotePod6, pod6, 0, 0, 4000))
		wantDrop(t, l, l.objs.UnderlayIngress, und, notECT, IsthmusDropReasonDROP_ECN_NOT_ECT, IsthmusHookHOOK_UNDERLAY_TC)
	})
	t.Run("rejects", func(t *testing.T) {
		a := netip.MustParseAddr
		for _, tc := range []struct {
			src, dst netip.Addr
			reason   IsthmusDropReason
		}{
			{a("fd30::1"), pod6, IsthmusDropReasonDROP_INNER_SRC_DENIED},
			{a("fe80::7"), pod6, IsthmusDropReasonDROP_INNER_MARTIAN},
			{a("::1"), pod6, IsthmusDropReasonDROP_INNER_MARTIAN},
			{a("::"), pod6, IsthmusDropReasonDROP_INNER_MARTIAN},
			{a("::ffff:10.2.0.7"), pod6, IsthmusDropReasonDROP_INNER_MARTIAN},
			{a("ff02::1"), pod6, IsthmusDropReasonDROP_INNER_MARTIAN},
		} {
			in := geneveFrame6(l, peerIP, 0, ipv6Flow(tc.src, tc.dst, 0, 0, 4000))
			wantDrop(t, l, l.objs.UnderlayIngress, und, in, tc.reason, IsthmusHookHOOK_UNDERLAY_TC)
		}
		// Popped, then refused: nothing local routes it.
		before := l.counts(t)
		in := geneveFrame6(l, peerIP, 0, ipv6Flow(remotePod6, a("fd40::1"), 0, 0, 4000))
		if ret, _ := l.run(t, l.objs.UnderlayIngress, in, und); ret != tcActShot {
			t.Errorf("not local: verdict %d, want TC_ACT_SHOT", ret)
		}
		if d, want := delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC): 1,
			dropKey(IsthmusDropReasonDROP_NOT_LOCAL, IsthmusHookHOOK_UNDERLAY_TC): 1}; !maps.Equal(d, want) {
			t.Errorf("not local: counters moved %v, want %v", d, want)
		}
		// An IPv4 source prefix of the peer's allows no IPv6 source, nor the other way.
		in = geneveFrame6(l, peerIP, 0, ipv6Flow(a("::a02:7"), pod6, 0, 0, 4000))
		wantDrop(t, l, l.objs.UnderlayIngress, und, in, IsthmusDropReasonDROP_INNER_SRC_DENIED, IsthmusHookHOOK_UNDERLAY_TC)
	})
}

// tcpChecksum6 is tcpChecksum with the IPv6 pseudo-header: 0 when seg's checksum
// is right.
func tcpChecksum6(src, dst netip.Addr, seg []byte) uint16 {
	s, d := src.As16(), dst.As16()
	ph := append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, byte(len(seg)>>8), byte(len(seg)), 0, 0, 0, 6)
	return csum16(append(ph, seg...))
}

// tcp6WithOptions is tcpWithOptions for src -> dst over IPv6.
func tcp6WithOptions(src, dst netip.Addr, sport, dport uint16, flags byte, options []byte) []byte {
	return tcpWithOptionsSum(func(seg []byte) uint16 { return tcpChecksum6(src, dst, seg) }, sport, dport, flags, options)
}

// TestMSSClampIPv6: the MSS of an IPv6 SYN or SYN-ACK entering the tunnel at
// overlay_egress, or leaving it at underlay_ingress, is clamped to the tunnel MTU
// less 60 bytes (IPv6 and TCP headers), the TCP checksum fixed; a smaller MSS and a
// segment without SYN are untouched.
func TestMSSClampIPv6(t *testing.T) {
	l := ipv6Lab(t)
	clamped := tunnelMTU - 60
	for _, tc := range []struct {
		name         string
		flags        byte
		mss, wantMSS uint16
	}{
		{"SYN MSS 1440", tcpSYN, 1440, clamped},
		{"SYN-ACK MSS 1440", tcpSYNACK, 1440, clamped},
		{"SYN MSS one too many", tcpSYN, clamped + 1, clamped},
		{"SYN MSS 1200 untouched", tcpSYN, 1200, 1200},
		{"ACK untouched", tcpACK, 1440, 1440},
	} {
		t.Run(tc.name+" encap", func(t *testing.T) {
			seg := tcp6WithOptions(pod6, remotePod6, 40000, 80, tc.flags, linuxSynOpts(tc.mss))
			in := ethFrame(l.istMAC, l.istMAC, 0x86dd, ipv6Packet(pod6, remotePod6, 6, 64, seg))
			ret, out := l.run(t, l.objs.OverlayEgress, in, l.ist.Attrs().Index)
			if ret != tcActRedirect || len(out) != len(in)+50 {
				t.Fatalf("verdict %d, %d bytes; want TC_ACT_REDIRECT, %d bytes", ret, len(out), len(in)+50)
			}
			gotSeg := out[len(out)-len(seg):]
			if c := tcpChecksum6(pod6, remotePod6, gotSeg); c != 0 {
				t.Errorf("inner TCP checksum does not verify (residue %#04x)", c)
			}
			if want := tcp6WithOptions(pod6, remotePod6, 40000, 80, tc.flags, linuxSynOpts(tc.wantMSS)); !bytes.Equal(gotSeg, want) {
				t.Errorf("segment\n got %x\nwant %x", gotSeg, want)
			}
		})
		t.Run(tc.name+" decap", func(t *testing.T) {
			seg := tcp6WithOptions(remotePod6, pod6, 80, 40000, tc.flags, linuxSynOpts(tc.mss))
			ret, out := l.run(t, l.objs.UnderlayIngress, geneveFrame6(l, peerIP, 0, ipv6Packet(remotePod6, pod6, 6, 64, seg)), l.und.Attrs().Index)
			if ret != tcActRedirect || len(out) != 14+40+len(seg) {
				t.Fatalf("verdict %d, %d bytes; want TC_ACT_REDIRECT, %d bytes", ret, len(out), 14+40+len(seg))
			}
			gotSeg := out[54:]
			if c := tcpChecksum6(remotePod6, pod6, gotSeg); c != 0 {
				t.Errorf("TCP checksum does not verify (residue %#04x)", c)
			}
			if want := tcp6WithOptions(remotePod6, pod6, 80, 40000, tc.flags, linuxSynOpts(tc.wantMSS)); !bytes.Equal(gotSeg, want) {
				t.Errorf("segment\n got %x\nwant %x", gotSeg, want)
			}
		})
	}
}
