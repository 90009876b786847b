package bpf

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
)

// Program tests for gateway transit of IPv6 pods over the IPv4 underlay: memberIP
// sends the gateway GENEVE whose inner IPv6 destination routes6 sends on to another
// peer; only the outer IPv4 header and the inner hop limit change.

var (
	memberNet6       = netip.MustParsePrefix("fd07::/64") // memberIP's IPv6 pods
	memberPod6       = netip.MustParseAddr("fd07::9")
	transitGroupNet6 = netip.MustParsePrefix("fd05::/64") // routed to group 1
	transitGroupDst6 = netip.MustParseAddr("fd05::9")
)

// gatewayLab6 is gatewayLab with the IPv6 side filled (fillIPv6) and memberIP
// allowed to send from memberNet6.
func gatewayLab6(t *testing.T) *lab {
	t.Helper()
	l := gatewayLab(t)
	l.fillIPv6(t)
	k := IsthmusPeerSource6Key{Prefixlen: 32 + uint32(memberNet6.Bits()), Peer: be32(memberIP), Src: addr16(memberNet6.Addr())}
	if err := l.objs.PeerSources6.Put(k, IsthmusPeerSourceValue{}); err != nil {
		t.Fatalf("put peer source: %v", err)
	}
	return l
}

// putRoute6 routes prefix to v in routes6 until the test ends.
func putRoute6(t *testing.T, l *lab, prefix netip.Prefix, v IsthmusRouteValue) {
	t.Helper()
	k := IsthmusRoute6Key{Prefixlen: uint32(prefix.Bits()), Addr: addr16(prefix.Addr())}
	if err := l.objs.Routes6.Put(k, v); err != nil {
		t.Fatalf("put route %v: %v", prefix, err)
	}
	t.Cleanup(func() { l.objs.Routes6.Delete(k) })
}

// transit6Opts is a frame of transit6Frame.
type transit6Opts struct {
	outerSrc, outerDst netip.Addr
	outerTTL           byte
	innerSrc, innerDst netip.Addr
	hopLimit           byte
	sport              uint16 // inner TCP source port; the outer source port is 50000
	udpCsum            bool   // the sender filled in the outer UDP checksum
	gnvOpts            []byte
	payload            int // inner TCP payload bytes (default 7)
}

// inner6 is the inner IPv6 TCP segment of o, its checksum right.
func (o transit6Opts) inner6() []byte {
	n := o.payload
	if n == 0 {
		n = 7
	}
	seg := tcpWithOptionsSum(func(seg []byte) uint16 { return 0 }, o.sport, 443, 0x10, nil)
	seg = append(seg, bytes.Repeat([]byte{'t'}, n)...)
	seg[16], seg[17] = 0, 0
	binary.BigEndian.PutUint16(seg[16:], tcpChecksum6(o.innerSrc, o.innerDst, seg))
	return ipv6Packet(o.innerSrc, o.innerDst, 6, o.hopLimit, seg)
}

// transit6Frame is GENEVE over IPv4 from o.outerSrc to o.outerDst carrying o's inner
// IPv6 segment, Ethernet from smac to dmac.
// scapy: Ether(dst=dmac, src=smac)/IP(src=outerSrc, dst=outerDst, tos=0x10, id=0x1234, flags="DF", ttl=outerTTL)/UDP(sport=50000, dport=6081, chksum=<0, or computed when udpCsum>)/GENEVE(vni=0x123456, proto=0x6558, options=gnvOpts)/Ether(dst="02:00:00:00:02:07", src="02:00:00:00:02:07")/IPv6(src=innerSrc, dst=innerDst, nh=6, hlim=hopLimit)/TCP(sport=sport, dport=443, flags="A")/(b"t"*7)
func transit6Frame(dmac, smac []byte, o transit6Opts) []byte {
	gnv := geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, options: o.gnvOpts, optWords: -1},
		ethFrame(innerMAC, innerMAC, 0x86dd, o.inner6()))
	udp := udpDatagram(50000, 6081, gnv)
	if o.udpCsum {
		binary.BigEndian.PutUint16(udp[6:], udp4Checksum(o.outerSrc, o.outerDst, udp))
	}
	return ethFrame(dmac, smac, 0x0800, ipv4Packet(o.outerSrc, o.outerDst, 17,
		ipOpts{tos: 0x10, ttl: o.outerTTL, fragOff: 0x4000, id: 0x1234}, udp))
}

// decodeTransit6 decodes a forwarded frame with gopacket and checks what transit
// promises, independently of the byte comparison: outer IPv4 from underlayIP to next
// with TTL 64 and a header checksum that verifies, the outer UDP checksum zero or
// verifying, the inner IPv6 hop limit one less than sent, the inner TCP checksum
// still right.
func decodeTransit6(t *testing.T, out []byte, next netip.Addr, sent transit6Opts) {
	t.Helper()
	pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	oip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	iip, _ := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if oip == nil || udp == nil || iip == nil || tcp == nil || pkt.Layer(layers.LayerTypeGeneve) == nil {
		t.Fatalf("gopacket does not find outer IPv4, UDP, GENEVE, inner IPv6 and TCP in %x", out)
	}
	if got := netip.AddrFrom4([4]byte(oip.SrcIP.To4())); got != underlayIP || !bytes.Equal(oip.DstIP.To4(), next.AsSlice()) || oip.TTL != 64 {
		t.Errorf("outer IPv4 %v -> %v TTL %d, want %v -> %v TTL 64", oip.SrcIP, oip.DstIP, oip.TTL, underlayIP, next)
	}
	if csum16(out[14:34]) != 0 {
		t.Errorf("outer IPv4 header checksum does not verify")
	}
	if udp.DstPort != 6081 || udp.SrcPort != 50000 {
		t.Errorf("outer UDP %d -> %d, want 50000 -> 6081 (the sender's port kept)", udp.SrcPort, udp.DstPort)
	}
	if sent.udpCsum {
		if udp4Checksum(underlayIP, next, append(append([]byte{}, out[34:40]...), append([]byte{0, 0}, out[42:]...)...)) != udp.Checksum {
			t.Errorf("outer UDP checksum %#x does not verify", udp.Checksum)
		}
	} else if udp.Checksum != 0 {
		t.Errorf("outer UDP checksum %#x, want zero kept", udp.Checksum)
	}
	if iip.HopLimit != sent.hopLimit-1 || iip.SrcIP.String() != sent.innerSrc.String() || iip.DstIP.String() != sent.innerDst.String() {
		t.Errorf("inner IPv6 %v -> %v hop limit %d, want %v -> %v hop limit %d", iip.SrcIP, iip.DstIP, iip.HopLimit, sent.innerSrc, sent.innerDst, sent.hopLimit-1)
	}
	seg := append(append([]byte{}, tcp.Contents...), tcp.Payload...)
	if tcpChecksum6(sent.innerSrc, sent.innerDst, seg) != 0 {
		t.Errorf("inner TCP checksum does not verify")
	}
}

// TestTransitIPv6: a member's IPv6 pod segment for a remote prefix goes on to the
// route's peer byte for byte, only the outer header and the inner hop limit changed;
// the other way, a remote peer's segment for a member's pod goes to the member.
func TestTransitIPv6(t *testing.T) {
	l := gatewayLab6(t)
	putRoute6(t, l, memberNet6, IsthmusRouteValue{Peer: be32(memberIP)})
	base := transit6Opts{outerSrc: memberIP, outerDst: underlayIP, outerTTL: 61, innerSrc: memberPod6, innerDst: remotePod6, hopLimit: 63, sport: 1234}
	for _, tc := range []struct {
		name string
		edit func(*transit6Opts)
		next netip.Addr
	}{
		{"plain", func(*transit6Opts) {}, peerIP},
		{"outer UDP checksum", func(o *transit6Opts) { o.udpCsum = true }, peerIP},
		{"GENEVE option", func(o *transit6Opts) { o.gnvOpts = []byte{0x01, 0x02, 0x03, 0x01, 0xaa, 0xbb, 0xcc, 0xdd} }, peerIP},
		{"from a remote peer", func(o *transit6Opts) {
			o.outerSrc, o.innerSrc, o.innerDst, o.udpCsum = peerIP, remotePod6, memberPod6, true
		}, memberIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.edit(&o)
			in := transit6Frame(l.undMAC, gwMAC, o)
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}
			fwd := o
			fwd.outerSrc, fwd.outerDst, fwd.outerTTL, fwd.hopLimit = underlayIP, tc.next, 64, o.hopLimit-1
			if want := transit6Frame(gwMAC, l.undMAC, fwd); !bytes.Equal(out, want) {
				t.Fatalf("forwarded frame differs\n got %x\nwant %x", out, want)
			}
			decodeTransit6(t, out, tc.next, o)
			d := delta(before, l.counts(t))
			if d[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
				t.Errorf("counters moved %v, want only METRIC_TRANSIT +1", d)
			}
		})
	}
}

// TestTransitGroupIPv6: through a next-hop group, each IPv6 flow goes to the member
// that overlay_egress, encapsulating the same packet on a member, sent it toward and
// that the Go twin of flow_hash6 predicts, so both legs of a flow keep one gateway.
func TestTransitGroupIPv6(t *testing.T) {
	l := gatewayLab6(t)
	g := groupOf(members)
	withGroup(t, l, g)
	putRoute6(t, l, transitGroupNet6, IsthmusRouteValue{Group: 1})
	per := map[netip.Addr]int{}
	for i := range uint16(64) {
		o := transit6Opts{outerSrc: memberIP, outerDst: underlayIP, outerTTL: 64, innerSrc: memberPod6, innerDst: transitGroupDst6, hopLimit: 63, sport: 30000 + i}
		inner := o.inner6()
		// The member's encapsulation of its pod's packet, from this lab's overlay_egress.
		ret, sent := l.run(t, l.objs.OverlayEgress, ethFrame(l.istMAC, l.istMAC, 0x86dd, inner), l.ist.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("flow %d: overlay_egress verdict %d", o.sport, ret)
		}
		encapTo := netip.AddrFrom4([4]byte(sent[30:34]))
		in := asMemberFrame(l, sent)
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("flow %d: verdict %d, want TC_ACT_REDIRECT", o.sport, ret)
		}
		if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
			t.Fatalf("flow %d: counters moved %v, want only METRIC_TRANSIT +1", o.sport, d)
		}
		to := netip.AddrFrom4([4]byte(out[30:34]))
		twin := netip.AddrFrom4([4]byte(binary.NativeEndian.AppendUint32(nil, g.Slots[flowHash6(inner)%64])))
		if to != twin || to != encapTo {
			t.Fatalf("flow %d: transit to %v, Go twin says %v, encapsulation chose %v", o.sport, to, twin, encapTo)
		}
		// Only the outer addresses, TTL and checksum, and the inner hop limit moved.
		iip := 14 + 20 + 8 + 8 + 14
		want := append([]byte{}, in...)
		copy(want[0:12], out[0:12])
		copy(want[14+8:14+20], out[14+8:14+20])
		want[iip+7]--
		if !bytes.Equal(out, want) || out[22] != 64 {
			t.Fatalf("flow %d: frame differs beyond the outer header and inner hop limit\n got %x\n in %x", o.sport, out, in)
		}
		per[to]++
	}
	if len(per) < 2 {
		t.Fatalf("64 flows all went to %v: the test cannot tell members apart", per)
	}
	withGroup(t, l, IsthmusNexthopGroup{})
	expectDrop(t, l, transit6Frame(l.undMAC, gwMAC, transit6Opts{outerSrc: memberIP, outerDst: underlayIP, outerTTL: 61, innerSrc: memberPod6, innerDst: transitGroupDst6, hopLimit: 63, sport: 1}), IsthmusDropReasonDROP_NO_NEXTHOP)
}

// TestTransitIPv6Drops: what transit refuses for IPv6, each counted by its reason; the
// checks of decapsulation still come first.
func TestTransitIPv6Drops(t *testing.T) {
	l := gatewayLab6(t)
	good := transit6Opts{outerSrc: memberIP, outerDst: underlayIP, outerTTL: 61, innerSrc: memberPod6, innerDst: remotePod6, hopLimit: 63, sport: 1234}
	with := func(f func(*transit6Opts)) []byte { o := good; f(&o); return transit6Frame(l.undMAC, gwMAC, o) }
	for _, tc := range []struct {
		name   string
		in     []byte
		reason IsthmusDropReason
	}{
		// No ICMPv6 answer: the node has no IPv6 address to send it from.
		{"hop limit 1", with(func(o *transit6Opts) { o.hopLimit = 1 }), IsthmusDropReasonDROP_TTL_EXCEEDED},
		{"hop limit 0", with(func(o *transit6Opts) { o.hopLimit = 0 }), IsthmusDropReasonDROP_TTL_EXCEEDED},
		// peerIP may send from remoteNet6, whose route is peerIP itself.
		{"next hop is the sender", with(func(o *transit6Opts) { o.outerSrc, o.innerSrc = peerIP, netip.MustParseAddr("fd20::9") }), IsthmusDropReasonDROP_TRANSIT_LOOP},
		{"inner source not allowed", with(func(o *transit6Opts) { o.innerSrc = netip.MustParseAddr("fd99::1") }), IsthmusDropReasonDROP_INNER_SRC_DENIED},
		{"member's source from another peer", with(func(o *transit6Opts) { o.outerSrc = peerIP }), IsthmusDropReasonDROP_INNER_SRC_DENIED},
		{"link-local inner source", with(func(o *transit6Opts) { o.innerSrc = netip.MustParseAddr("fe80::9") }), IsthmusDropReasonDROP_INNER_MARTIAN},
	} {
		t.Run(tc.name, func(t *testing.T) { expectDrop(t, l, tc.in, tc.reason) })
	}
	// The next link is smaller than the frame: no Packet Too Big from here either.
	t.Run("longer than the next link", func(t *testing.T) {
		if err := inNS(l.ns, func() error {
			return netlink.RouteReplace(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4(192, 168, 2, 0), Mask: net.CIDRMask(24, 32)},
				Gw: underlayGW.AsSlice(), LinkIndex: l.und.Attrs().Index, MTU: 1400, MTULock: true})
		}); err != nil {
			t.Fatalf("set the route MTU: %v", err)
		}
		// 1400 on the wire fits; one byte more does not (20 + 8 + 8 + 14 + 40 + 20 + payload).
		fits := good
		fits.payload = 1400 - 110
		if ret, _ := l.run(t, l.objs.UnderlayIngress, transit6Frame(l.undMAC, gwMAC, fits), l.und.Attrs().Index); ret != tcActRedirect {
			t.Fatalf("a frame of exactly the next link's MTU: verdict %d, want TC_ACT_REDIRECT", ret)
		}
		over := fits
		over.payload++
		expectDrop(t, l, transit6Frame(l.undMAC, gwMAC, over), IsthmusDropReasonDROP_UNDERLAY_MTU)
	})
}

// TestTransitXDPIPv6: underlay_xdp leaves an IPv6 frame that will transit whole and
// uncounted, for underlay_ingress to forward; without CFG_F_TRANSIT it pops it.
func TestTransitXDPIPv6(t *testing.T) {
	l := gatewayLab6(t)
	in := transit6Frame(l.undMAC, gwMAC, transit6Opts{outerSrc: memberIP, outerDst: underlayIP, outerTTL: 61, innerSrc: memberPod6, innerDst: remotePod6, hopLimit: 63, sport: 1234})
	before := l.counts(t)
	l.wantXDPPassWhole(t, "IPv6 transit frame", in)
	ret, _ := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
	if d := delta(before, l.counts(t)); ret != tcActRedirect || d[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
		t.Fatalf("underlay_ingress after XDP: verdict %d, counters %v; want redirect, METRIC_TRANSIT +1", ret, d)
	}
	setTransit(t, l, false)
	before = l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayXdp, in, 0)
	if ret != xdpPass || len(out) != 8+14+len(in)-14-50 || binary.NativeEndian.Uint32(out) != 0x69737468 {
		t.Fatalf("without CFG_F_TRANSIT: verdict %d, %d bytes out of %d; want XDP_PASS, popped with metadata", ret, len(out), len(in))
	}
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_XDP)] != 1 || len(d) != 1 {
		t.Errorf("without CFG_F_TRANSIT: counters moved %v, want only XDP METRIC_DECAP +1", d)
	}
}
