package bpf

import (
	"bytes"
	"encoding/binary"
	"maps"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The IPv6 underlay of these tests: this node at underlayIP6 on und0, the peer
// peer6 behind the router gw6 (gwMAC), known to the maps by handle6.
var (
	underlayIP6 = netip.MustParseAddr("fd00:1::1")
	gw6         = netip.MustParseAddr("fd00:1::fe")
	peer6       = netip.MustParseAddr("fd00:2::2")
	handle6     = netip.MustParseAddr("0.0.0.1")
)

// peerFlagUnderlay6 is PEER_F_UNDERLAY6 of lib/types.h.
const peerFlagUnderlay6 = 1 << 2

// underlay6Lab is ipv6Lab on an IPv6 underlay: und0 has underlayIP6 (no DAD) and a
// route to fd00:2::/64 through gw6, config.underlay_ip6 is set, and the peer that
// owns remoteNet and remoteNet6 is peer6, by handle6 (peers with PEER_F_UNDERLAY6
// and its address, peers6 back), in routes, routes6, peer_sources and
// peer_sources6 in place of peerIP.
func underlay6Lab(t *testing.T) *lab {
	t.Helper()
	l := ipv6Lab(t)
	if err := inNS(l.ns, func() error {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: underlayIP6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(l.und, a); err != nil {
			return err
		}
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.und.Attrs().Index, Family: netlink.FAMILY_V6,
			State: netlink.NUD_PERMANENT, IP: gw6.AsSlice(), HardwareAddr: gwMAC}); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("fd00:2::"), Mask: net.CIDRMask(64, 128)},
			Gw: gw6.AsSlice(), LinkIndex: l.und.Attrs().Index}); err != nil {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	var cfg IsthmusDatapathConfig
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("read config", l.objs.Config.Lookup(uint32(0), &cfg))
	cfg.UnderlayIp6 = addr16(underlayIP6)
	must("put config", l.objs.Config.Put(uint32(0), cfg))
	h := be32(handle6)
	must("put peer", l.objs.Peers.Put(h, IsthmusPeerValue{Flags: peerFlagUnderlay6, Underlay6: addr16(peer6)}))
	must("put peers6", l.objs.Peers6.Put(IsthmusPeer6Key{Addr: addr16(peer6)}, IsthmusPeer6Value{Handle: h}))
	must("route", l.objs.Routes.Put(IsthmusRouteKey{Prefixlen: uint32(remoteNet.Bits()), Addr: be32(remoteNet.Addr())}, IsthmusRouteValue{Peer: h}))
	must("route6", l.objs.Routes6.Put(IsthmusRoute6Key{Prefixlen: uint32(remoteNet6.Bits()), Addr: addr16(remoteNet6.Addr())}, IsthmusRouteValue{Peer: h}))
	must("source", l.objs.PeerSources.Put(IsthmusPeerSourceKey{Prefixlen: 32 + uint32(remoteNet.Bits()), Peer: h, Src: be32(remoteNet.Addr())}, IsthmusPeerSourceValue{}))
	must("source6", l.objs.PeerSources6.Put(IsthmusPeerSource6Key{Prefixlen: 32 + uint32(remoteNet6.Bits()), Peer: h, Src: addr16(remoteNet6.Addr())}, IsthmusPeerSourceValue{}))
	return l
}

// TestEncapUnderlay6: to a peer on the IPv6 underlay, overlay_egress pushes outer
// IPv6 (from config.underlay_ip6 to the peer's address, hop limit 64, the inner
// DSCP and ECN as traffic class, the flow hash as flow label), UDP to 6081 from the
// flow hash's port with a zero checksum, GENEVE with the VNI, and sends it to the
// router's MAC; gopacket decodes it, and the inner frame is byte for byte the one
// that went in, for an IPv4 and an IPv6 inner packet.
func TestEncapUnderlay6(t *testing.T) {
	l := underlay6Lab(t)
	v4 := ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64, tos: 0xb8}, udpDatagram(4000, 5000, []byte("payload4")))
	v6 := ipv6Flow(pod6, remotePod6, 0xb8, 0x12345, 4000)
	for _, tc := range []struct {
		name  string
		inner []byte
		etype uint16
		hash  uint32
	}{
		{"IPv4 inner", v4, 0x0800, flowHash(v4)},
		{"IPv6 inner", v6, 0x86dd, flowHash6(v6)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ethFrame(l.istMAC, l.istMAC, tc.etype, tc.inner)
			before := l.counts(t)
			ret, out := l.run(t, l.objs.OverlayEgress, in, l.ist.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}
			pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
			eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
			ip6, _ := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
			udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
			gnv, _ := pkt.Layer(layers.LayerTypeGeneve).(*layers.Geneve)
			if eth == nil || ip6 == nil || udp == nil || gnv == nil {
				t.Fatalf("want Ethernet/IPv6/UDP/GENEVE, got %v", pkt)
			}
			if !bytes.Equal(eth.DstMAC, gwMAC) || !bytes.Equal(eth.SrcMAC, l.undMAC) || eth.EthernetType != layers.EthernetTypeIPv6 {
				t.Errorf("outer Ethernet %v -> %v type %v", eth.SrcMAC, eth.DstMAC, eth.EthernetType)
			}
			if !ip6.SrcIP.Equal(underlayIP6.AsSlice()) || !ip6.DstIP.Equal(peer6.AsSlice()) || ip6.HopLimit != 64 ||
				ip6.NextHeader != layers.IPProtocolUDP || ip6.TrafficClass != 0xb8 || ip6.FlowLabel != tc.hash&0xfffff ||
				int(ip6.Length) != len(out)-14-40 {
				t.Errorf("outer IPv6 %v -> %v hop %d next %v tclass %#x label %#x len %d; want flow label %#x",
					ip6.SrcIP, ip6.DstIP, ip6.HopLimit, ip6.NextHeader, ip6.TrafficClass, ip6.FlowLabel, ip6.Length, tc.hash&0xfffff)
			}
			if udp.DstPort != 6081 || udp.Checksum != 0 || uint16(udp.SrcPort) != 49152+uint16(tc.hash%16384) || int(udp.Length) != len(out)-14-40 {
				t.Errorf("outer UDP %d -> %d checksum %#x length %d", udp.SrcPort, udp.DstPort, udp.Checksum, udp.Length)
			}
			if gnv.VNI != testVNI || gnv.Protocol != layers.EthernetTypeTransparentEthernetBridging {
				t.Errorf("GENEVE vni %#x proto %v", gnv.VNI, gnv.Protocol)
			}
			if !bytes.Equal(gnv.Payload, in) {
				t.Errorf("inner frame changed\n got %x\nwant %x", gnv.Payload, in)
			}
			if d, want := delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_OVERLAY_EGRESS): 1}; !maps.Equal(d, want) {
				t.Errorf("counters moved %v, want %v", d, want)
			}
		})
	}
}

// geneveFrame6Outer is what peer src sends over the IPv6 underlay: GENEVE in UDP
// (checksum zero) in IPv6 to underlayIP6, around the inner frame, outer traffic
// class tclass.
func geneveFrame6Outer(l *lab, src netip.Addr, tclass byte, innerType uint16, inner []byte) []byte {
	g := udpDatagram(50000, 6081, geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, ethFrame(innerMAC, innerMAC, innerType, inner)))
	ip := ipv6Packet(src, underlayIP6, 17, 64, g)
	binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(tclass)<<20)
	return ethFrame(l.undMAC, gwMAC, 0x86dd, ip)
}

// TestDecapUnderlay6: GENEVE over IPv6 with a zero UDP checksum (RFC 6935, the way
// isthmus sends it) from a known peer is popped at TC and XDP and its inner packet
// delivered, IPv4 with the Ethernet type fixed after the pop; an unknown outer
// source is DROP_UNKNOWN_PEER, an inner source the peer may not use
// DROP_INNER_SRC_DENIED; without config.underlay_ip6 the frame is not ours.
func TestDecapUnderlay6(t *testing.T) {
	l := underlay6Lab(t)
	und := l.und.Attrs().Index
	inner := ipv4Packet(remotePodIP, podIP, 17, ipOpts{ttl: 64}, udpDatagram(5000, 4000, []byte("reply")))

	t.Run("tc", func(t *testing.T) {
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, geneveFrame6Outer(l, peer6, 0, 0x0800, inner), und)
		if ret != tcActRedirect {
			t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
		}
		if len(out) < 14 || binary.BigEndian.Uint16(out[12:]) != 0x0800 || !bytes.Equal(out[14:14+len(inner)], inner) {
			t.Fatalf("delivered frame %x, want [eth IPv4] and the inner packet %x", out, inner)
		}
		d := delta(before, l.counts(t))
		if d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)] != 1 {
			t.Errorf("counters moved %v, want decap and deliver_pod", d)
		}
	})
	t.Run("tc, IPv6 inner", func(t *testing.T) {
		in6 := ipv6Flow(remotePod6, pod6, 0, 0x777, 4000)
		ret, out := l.run(t, l.objs.UnderlayIngress, geneveFrame6Outer(l, peer6, 0, 0x86dd, in6), und)
		if ret != tcActRedirect || len(out) < 14 || binary.BigEndian.Uint16(out[12:]) != 0x86dd || !bytes.Equal(out[14:14+len(in6)], in6) {
			t.Fatalf("verdict %d, frame %x; want the inner IPv6 packet delivered", ret, out)
		}
	})
	t.Run("xdp", func(t *testing.T) {
		in := geneveFrame6Outer(l, peer6, 0, 0x0800, inner)
		ret, out := l.run(t, l.objs.UnderlayXdp, in, 0)
		if ret != xdpPass || len(out) < 8 {
			t.Fatalf("verdict %d, %d bytes; want XDP_PASS with metadata", ret, len(out))
		}
		want := append(append(append([]byte{}, in[:12]...), 0x08, 0x00), inner...)
		if !bytes.Equal(out[8:], want) {
			t.Fatalf("popped frame differs\n got %x\nwant %x", out[8:], want)
		}
		if got := binary.NativeEndian.Uint32(out[4:8]); got != be32(handle6) {
			t.Errorf("metadata names peer %#x, want the handle %#x", got, be32(handle6))
		}
	})
	// Nothing answers an expiring TTL before the pop over the IPv6 underlay: a
	// segment of a flow the fast path would take, with TTL 1, goes through the
	// stack (whose forwarding answers it), marked, untouched, and the fast path is
	// not asked (no ct_fast).
	t.Run("tc, TTL 1 on the fast path", func(t *testing.T) {
		l.ctEstablished(t, tuple{podIP, remotePodIP, 33070, 80})
		seg := ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 1}, tcpSegment(80, 33070, 0x10, []byte("late")))
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, geneveFrame6Outer(l, peer6, 0, 0x0800, seg), und)
		if ret != tcActRedirect || l.mark&overlayMark == 0 || len(out) < 14 || !bytes.Equal(out[14:14+len(seg)], seg) {
			t.Fatalf("verdict %d, mark %#x, frame %x; want the segment through isthmus0, marked, untouched", ret, l.mark, out)
		}
		d := delta(before, l.counts(t))
		if d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || d[metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_UNDERLAY_TC)] != 0 {
			t.Errorf("counters moved %v, want deliver_pod and no ct_fast", d)
		}
		if binary.BigEndian.Uint16(out[12:]) != 0x0800 || !bytes.Equal(out[0:6], l.istMAC) {
			t.Errorf("delivered to %x type %#04x, want isthmus0's MAC, IPv4", out[0:6], binary.BigEndian.Uint16(out[12:]))
		}
	})
	t.Run("rejects", func(t *testing.T) {
		wantDrop(t, l, l.objs.UnderlayIngress, und, geneveFrame6Outer(l, netip.MustParseAddr("fd00:2::9"), 0, 0x0800, inner),
			IsthmusDropReasonDROP_UNKNOWN_PEER, IsthmusHookHOOK_UNDERLAY_TC)
		denied := ipv4Packet(deniedIP, podIP, 17, ipOpts{ttl: 64}, udpDatagram(5000, 4000, nil))
		wantDrop(t, l, l.objs.UnderlayIngress, und, geneveFrame6Outer(l, peer6, 0, 0x0800, denied),
			IsthmusDropReasonDROP_INNER_SRC_DENIED, IsthmusHookHOOK_UNDERLAY_TC)
	})
	t.Run("pod sends GENEVE to the peer", func(t *testing.T) {
		f := ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Packet(pod6, peer6, 17, 64, udpDatagram(40000, 6081, []byte("x"))))
		wantDrop(t, l, l.objs.PodIngress, l.pod.Attrs().Index, f, IsthmusDropReasonDROP_POD_GENEVE, IsthmusHookHOOK_POD_INGRESS)
	})
	t.Run("no IPv6 underlay address", func(t *testing.T) {
		var cfg IsthmusDatapathConfig
		if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.UnderlayIp6 = [4]uint32{}
		if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
			t.Fatal(err)
		}
		in := geneveFrame6Outer(l, peer6, 0, 0x0800, inner)
		if ret, out := l.run(t, l.objs.UnderlayIngress, in, und); ret != tcActOK || !bytes.Equal(out[:len(in)], in) {
			t.Errorf("decap: verdict %d, want TC_ACT_OK untouched (not ours)", ret)
		}
		f := ethFrame(l.istMAC, l.istMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64}, udpDatagram(4000, 5000, nil)))
		wantDrop(t, l, l.objs.OverlayEgress, l.ist.Attrs().Index, f, IsthmusDropReasonDROP_NO_UNDERLAY6, IsthmusHookHOOK_OVERLAY_EGRESS)
	})
}
