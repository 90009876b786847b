package bpf

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Program tests for fabric egress (docs/architecture.md "Fabric egress
// (underlay_egress)", docs/gateways.md "Members of a site whose pods another CNI
// owns"): on a member of a site whose fabric carries its declared pods' replies,
// pod_ingress leaves a declared pod's packet on a ROUTE_F_VIA_FABRIC route to the
// stack, marked; underlay_egress, with CFG_F_FABRIC_EGRESS, encapsulates it as it
// leaves the underlay device, to the gateway the route picks, without a forwarding
// hop; fabric_ingress leaves the answers from such a route's sources to the stack.
// The GENEVE frames underlay_egress sends are decoded with gopacket, which shares no
// code with the programs or with the project's own parsers.

const (
	cfgFabricEgress = 1 << 3 // CFG_F_FABRIC_EGRESS
	routeViaFabric  = 1 << 0 // ROUTE_F_VIA_FABRIC
)

var (
	declaredIP   = netip.MustParseAddr("10.0.2.7")             // a declared pod of this node, in fabricNet, behind pod0h
	declaredMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0x0a, 0x07} // its MAC
	viaFabricNet = netip.MustParsePrefix("10.6.0.0/24")        // a remote site's pods, ViaFabric to peerIP
	viaFabricDst = netip.MustParseAddr("10.6.0.9")
)

// putRoute writes the routes entry for p.
func putRoute(t *testing.T, l *lab, p netip.Prefix, v IsthmusRouteValue) {
	t.Helper()
	if err := l.objs.Routes.Put(IsthmusRouteKey{Prefixlen: uint32(p.Bits()), Addr: be32(p.Addr())}, v); err != nil {
		t.Fatalf("put route %v: %v", p, err)
	}
}

// setConfigFlags rewrites config.flags to flags.
func setConfigFlags(t *testing.T, l *lab, flags uint32) {
	t.Helper()
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	cfg.Flags = flags
	if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatalf("put config: %v", err)
	}
}

// fabricEgressLab is the lab of a member with fabric egress on: the fabric of
// withFabric (fabricNet is the declared block in fabric_prefixes), the declared pod
// declaredIP behind pod0h, CFG_F_FABRIC_EGRESS set, viaFabricNet routed ViaFabric to
// peerIP and groupNet ViaFabric through group 1 over members (round-robin). remoteNet
// keeps its plain route to peerIP.
func fabricEgressLab(t *testing.T) *lab {
	t.Helper()
	l := newLab(t)
	withFabric(t, l)
	err := inNS(l.ns, func() error {
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.pod.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: declaredIP.AsSlice(), HardwareAddr: declaredMAC}); err != nil {
			return err
		}
		// Another CNI's pod: a /32 through its host interface (pod_ingress takes only
		// sources routed back there).
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: declaredIP.AsSlice(), Mask: net.CIDRMask(32, 32)},
			LinkIndex: l.pod.Attrs().Index, Scope: netlink.SCOPE_LINK})
	})
	if err != nil {
		t.Fatalf("add the declared pod: %v", err)
	}
	setConfigFlags(t, l, cfgFabricEgress)
	putRoute(t, l, viaFabricNet, IsthmusRouteValue{Peer: be32(peerIP), Flags: routeViaFabric})
	withGroup(t, l, groupOf(members))
	putRoute(t, l, groupNet, IsthmusRouteValue{Group: 1, Flags: routeViaFabric})
	return l
}

// declaredUDP is a declared pod's UDP datagram to dst as the stack forwarded it
// (TTL ttl), with a correct checksum.
// scapy: IP(src="10.0.2.7", dst=dst, tos=0x10, ttl=ttl, id=0x77, flags="DF")/UDP(sport=40000, dport=5000)/b"query"
func declaredUDP(dst netip.Addr, sport uint16, ttl byte) []byte {
	return ipv4Packet(declaredIP, dst, 17, ipOpts{tos: 0x10, ttl: ttl, id: 0x77, fragOff: 0x4000},
		withCsum(declaredIP, dst, 17, udpDatagram(sport, 5000, []byte("query"))))
}

// fabricEncap decodes out with gopacket and fails unless it is the GENEVE frame
// underlay_egress sends for the frame in to peer: outer Ethernet to the underlay
// gateway from und0, outer IPv4 from config.underlay_ip to peer (DF, TTL 64, in's
// TOS, length and checksum right), UDP to 6081 from the flow's port with no
// checksum, GENEVE version 0 without options, O or C bits, protocol 0x6558 and VNI
// testVNI. Returns the decoded packet and the inner frame (the GENEVE payload).
func fabricEncap(t *testing.T, l *lab, out, in []byte, peer netip.Addr) (gopacket.Packet, []byte) {
	t.Helper()
	pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	if e := pkt.ErrorLayer(); e != nil {
		t.Fatalf("gopacket cannot decode the frame: %v\n%x", e.Error(), out)
	}
	ls := pkt.Layers()
	want := []gopacket.LayerType{layers.LayerTypeEthernet, layers.LayerTypeIPv4, layers.LayerTypeUDP,
		layers.LayerTypeGeneve, layers.LayerTypeEthernet, layers.LayerTypeIPv4}
	if len(ls) < len(want) {
		t.Fatalf("decoded %d layers, want at least %v\n%x", len(ls), want, out)
	}
	for i, lt := range want {
		if ls[i].LayerType() != lt {
			t.Fatalf("layer %d is %v, want %v (layers %v)\n%x", i, ls[i].LayerType(), lt, ls, out)
		}
	}
	eth, oip, udp, gnv := ls[0].(*layers.Ethernet), ls[1].(*layers.IPv4), ls[2].(*layers.UDP), ls[3].(*layers.Geneve)

	if !bytes.Equal(eth.DstMAC, gwMAC) || !bytes.Equal(eth.SrcMAC, l.undMAC) || eth.EthernetType != layers.EthernetTypeIPv4 {
		t.Errorf("outer Ethernet %v -> %v type %v, want %v -> %v IPv4", eth.SrcMAC, eth.DstMAC, eth.EthernetType, l.undMAC, gwMAC)
	}
	if src, _ := netip.AddrFromSlice(oip.SrcIP); src != underlayIP {
		t.Errorf("outer source %v, want config.underlay_ip %v", oip.SrcIP, underlayIP)
	}
	if dst, _ := netip.AddrFromSlice(oip.DstIP); dst != peer {
		t.Errorf("outer destination %v, want %v", oip.DstIP, peer)
	}
	if oip.Version != 4 || oip.IHL != 5 || oip.Flags != layers.IPv4DontFragment || oip.FragOffset != 0 ||
		oip.TTL != 64 || oip.Protocol != layers.IPProtocolUDP || oip.TOS != in[15] {
		t.Errorf("outer IPv4 version %d IHL %d flags %v offset %d TTL %d protocol %v TOS %#x; want 4, 5, DF, 0, 64, UDP, %#x",
			oip.Version, oip.IHL, oip.Flags, oip.FragOffset, oip.TTL, oip.Protocol, oip.TOS, in[15])
	}
	if int(oip.Length) != len(out)-14 {
		t.Errorf("outer total length %d, want %d", oip.Length, len(out)-14)
	}
	if csum16(out[14:34]) != 0 {
		t.Errorf("outer IPv4 header checksum %#04x does not verify", oip.Checksum)
	}
	if udp.DstPort != 6081 || uint16(udp.SrcPort) != flowSport(in[14:]) || udp.SrcPort < 49152 ||
		int(udp.Length) != len(out)-34 || udp.Checksum != 0 {
		t.Errorf("outer UDP %d -> %d length %d checksum %#04x; want %d (the flow's) -> 6081, length %d, checksum 0",
			udp.SrcPort, udp.DstPort, udp.Length, udp.Checksum, flowSport(in[14:]), len(out)-34)
	}
	if gnv.Version != 0 || gnv.OptionsLength != 0 || len(gnv.Options) != 0 || gnv.OAMPacket || gnv.CriticalOption ||
		gnv.Protocol != layers.EthernetTypeTransparentEthernetBridging || gnv.VNI != testVNI {
		t.Errorf("GENEVE version %d options %d (%d) O %v C %v protocol %#04x VNI %#x; want 0, 0, false, false, 0x6558, %#x",
			gnv.Version, gnv.OptionsLength, len(gnv.Options), gnv.OAMPacket, gnv.CriticalOption, uint16(gnv.Protocol), gnv.VNI, testVNI)
	}
	if len(out) != len(in)+50 {
		t.Errorf("frame is %d bytes, want %d (the frame plus 50 bytes of outer headers)", len(out), len(in)+50)
	}
	return pkt, gnv.LayerPayload()
}

// wantCounted fails unless, of the counters, exactly key rose, by one.
func wantCounted(t *testing.T, what string, d map[IsthmusMetricsKey]uint64, key IsthmusMetricsKey) {
	t.Helper()
	if d[key] != 1 || len(d) != 1 {
		t.Errorf("%s: counters moved %v, want only %v +1", what, d, key)
	}
}

// TestFabricEgressEncap: a declared pod's packet leaving the underlay device on a
// ViaFabric route is encapsulated to the route's peer, or the member of its group
// the flow takes, and redirected; the inner packet is the one the stack forwarded,
// byte for byte (this is no forwarding hop: the TTL stays, even at 1), but for the
// MSS of a SYN, clamped to the tunnel.
func TestFabricEgressEncap(t *testing.T) {
	l := fabricEgressLab(t)
	encapKey := metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_UNDERLAY_EGRESS)

	for _, tc := range []struct {
		name string
		ip   []byte
	}{
		{"UDP", declaredUDP(viaFabricDst, 40000, 63)},
		{"TTL 1", declaredUDP(viaFabricDst, 40000, 1)},
		// scapy: IP(src="10.0.2.7", dst="10.6.0.9", ttl=63)/TCP(sport=40000, dport=80, flags="A", window=65535)/b"hello"
		{"TCP ACK", ipv4Packet(declaredIP, viaFabricDst, 6, ipOpts{ttl: 63},
			withCsum(declaredIP, viaFabricDst, 6, tcpSegment(40000, 80, tcpACK, []byte("hello"))))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := leaving(l, tc.ip)
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayEgress, in, l.und.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT\n out %x", ret, out)
			}
			pkt, inner := fabricEncap(t, l, out, in, peerIP)
			if !bytes.Equal(inner, in) {
				t.Fatalf("inner frame differs from the one that left\n got %x\nwant %x", inner, in)
			}
			iip := pkt.Layers()[5].(*layers.IPv4)
			if iip.TTL != tc.ip[8] {
				t.Errorf("inner TTL %d, want %d (not decremented)", iip.TTL, tc.ip[8])
			}
			wantCounted(t, tc.name, delta(before, l.counts(t)), encapKey)
		})
	}

	// A SYN: the MSS is clamped to what fits the tunnel, the checksum follows, the
	// rest of the packet is as it left.
	t.Run("TCP SYN MSS", func(t *testing.T) {
		// scapy: Ether(dst="02:00:00:00:01:fe", src=<und0 MAC>)/IP(src="10.0.2.7", dst="10.6.0.9", ttl=63, flags="DF")/TCP(sport=40000, dport=80, seq=0x01020304, flags="S", window=65535, options=[("MSS", 1460), ("SAckOK", b""), ("Timestamp", (0x1234, 0)), ("NOP", None), ("WScale", 7)])
		seg := tcpWithOptions(declaredIP, viaFabricDst, 40000, 80, tcpSYN, linuxSynOpts(1460))
		in := leaving(l, ipv4Packet(declaredIP, viaFabricDst, 6, ipOpts{ttl: 63, fragOff: 0x4000}, seg))
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayEgress, in, l.und.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
		}
		pkt, inner := fabricEncap(t, l, out, in, peerIP)
		tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if !ok {
			t.Fatalf("no inner TCP layer in %v", pkt.Layers())
		}
		var mss []uint16
		for _, o := range tcp.Options {
			if o.OptionType == layers.TCPOptionKindMSS && len(o.OptionData) == 2 {
				mss = append(mss, binary.BigEndian.Uint16(o.OptionData))
			}
		}
		if len(mss) != 1 || mss[0] != tunnelMTU-40 {
			t.Errorf("MSS options %v, want one of %d (tunnel MTU %d - 40)", mss, tunnelMTU-40, tunnelMTU)
		}
		if !tcp.SYN || tcp.ACK || tcp.Seq != 0x01020304 || tcp.SrcPort != 40000 || tcp.DstPort != 80 {
			t.Errorf("inner TCP %v", tcp)
		}
		if c := tcpChecksum(declaredIP, viaFabricDst, inner[34:]); c != 0 {
			t.Errorf("inner TCP checksum does not verify (residue %#04x)", c)
		}
		want := leaving(l, ipv4Packet(declaredIP, viaFabricDst, 6, ipOpts{ttl: 63, fragOff: 0x4000},
			tcpWithOptions(declaredIP, viaFabricDst, 40000, 80, tcpSYN, linuxSynOpts(tunnelMTU-40))))
		if !bytes.Equal(inner, want) {
			t.Errorf("inner frame differs beyond the MSS\n got %x\nwant %x", inner, want)
		}
		wantCounted(t, "SYN", delta(before, l.counts(t)), encapKey)
	})

	// A group route: each flow goes to the member of its slot, never anywhere else;
	// the flows reach every member.
	t.Run("next-hop group", func(t *testing.T) {
		g := groupOf(members)
		used := map[netip.Addr]int{}
		for sport := uint16(20000); sport < 20064; sport++ {
			ip := declaredUDP(groupDst, sport, 63)
			in := leaving(l, ip)
			slot := flowHash(ip) % 64
			member := netip.AddrFrom4([4]byte(binary.NativeEndian.AppendUint32(nil, g.Slots[slot])))
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayEgress, in, l.und.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("flow %d: verdict %d, want TC_ACT_REDIRECT", sport, ret)
			}
			if _, inner := fabricEncap(t, l, out, in, member); !bytes.Equal(inner, in) {
				t.Fatalf("flow %d: inner frame differs\n got %x\nwant %x", sport, inner, in)
			}
			wantCounted(t, "group flow", delta(before, l.counts(t)), encapKey)
			used[member]++
		}
		if len(used) != len(members) {
			t.Fatalf("64 flows reached only %v of %v: the test proves nothing about the choice", used, members)
		}
	})

	// No live member: nothing goes out, dropped and counted, no ICMP (the stack
	// forwarded the packet; this is no hop).
	t.Run("group without live members", func(t *testing.T) {
		if err := l.objs.NexthopGroups.Put(uint32(2), IsthmusNexthopGroup{}); err != nil {
			t.Fatalf("put group: %v", err)
		}
		dead := netip.MustParsePrefix("10.7.0.0/24")
		putRoute(t, l, dead, IsthmusRouteValue{Group: 2, Flags: routeViaFabric})
		before := l.counts(t)
		if ret, out := l.run(t, l.objs.UnderlayEgress, leaving(l, declaredUDP(netip.MustParseAddr("10.7.0.1"), 40000, 63)), l.und.Attrs().Index); ret != tcActShot {
			t.Fatalf("verdict %d, want TC_ACT_SHOT\n out %x", ret, out)
		}
		wantCounted(t, "no live member", delta(before, l.counts(t)),
			dropKey(IsthmusDropReasonDROP_NO_NEXTHOP, IsthmusHookHOOK_UNDERLAY_EGRESS))
	})

	// Larger than the tunnel (the route's MTU lets none through; one would need
	// fragmenting): dropped and counted, no ICMP from here.
	t.Run("larger than the tunnel MTU", func(t *testing.T) {
		big := ipv4Packet(declaredIP, viaFabricDst, 17, ipOpts{ttl: 63, fragOff: 0x4000},
			udpDatagram(40000, 5000, bytes.Repeat([]byte{0x5a}, int(tunnelMTU)-28+1)))
		before := l.counts(t)
		if ret, _ := l.run(t, l.objs.UnderlayEgress, leaving(l, big), l.und.Attrs().Index); ret != tcActShot {
			t.Fatalf("verdict %d, want TC_ACT_SHOT", ret)
		}
		wantCounted(t, "too big", delta(before, l.counts(t)),
			dropKey(IsthmusDropReasonDROP_FRAG_NEEDED, IsthmusHookHOOK_UNDERLAY_EGRESS))
		// Exactly the tunnel MTU fits.
		fits := leaving(l, ipv4Packet(declaredIP, viaFabricDst, 17, ipOpts{ttl: 63, fragOff: 0x4000},
			udpDatagram(40000, 5000, bytes.Repeat([]byte{0x5a}, int(tunnelMTU)-28))))
		ret, out := l.run(t, l.objs.UnderlayEgress, fits, l.und.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("tunnel MTU: verdict %d, want TC_ACT_REDIRECT", ret)
		}
		if _, inner := fabricEncap(t, l, out, fits, peerIP); !bytes.Equal(inner, fits) {
			t.Fatalf("tunnel MTU: inner frame differs")
		}
	})
}

// TestFabricEgressUntouched: what is not a declared pod's packet on a ViaFabric
// route, or any packet with CFG_F_FABRIC_EGRESS off, leaves the underlay device as
// it came, uncounted.
func TestFabricEgressUntouched(t *testing.T) {
	l := fabricEgressLab(t)
	encapsulates := leaving(l, declaredUDP(viaFabricDst, 40000, 63))

	run := func(t *testing.T, in []byte) {
		t.Helper()
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayEgress, in, l.und.Attrs().Index)
		if d := delta(before, l.counts(t)); ret != tcActOK || !bytes.Equal(out, in) || len(d) != 0 {
			t.Fatalf("verdict %d, counters %v, frame\n got %x\nwant %x (TC_ACT_OK, untouched, nothing counted)", ret, d, out, in)
		}
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"route without ROUTE_F_VIA_FABRIC", leaving(l, declaredUDP(remotePodIP, 40000, 63))},
		{"source not in fabric_prefixes (a pod of no declared block)",
			leaving(l, ipv4Packet(podIP, viaFabricDst, 17, ipOpts{tos: 0x10, ttl: 63},
				withCsum(podIP, viaFabricDst, 17, udpDatagram(40000, 5000, []byte("query")))))},
		{"source config.underlay_ip (the host's own)",
			leaving(l, ipv4Packet(underlayIP, viaFabricDst, 17, ipOpts{ttl: 64},
				withCsum(underlayIP, viaFabricDst, 17, udpDatagram(40000, 5000, []byte("query")))))},
		{"source not in fabric_prefixes, group route",
			leaving(l, ipv4Packet(podIP, groupDst, 17, ipOpts{ttl: 63},
				withCsum(podIP, groupDst, 17, udpDatagram(40000, 5000, []byte("query")))))},
		{"no route", leaving(l, declaredUDP(netip.MustParseAddr("10.77.0.1"), 40000, 63))},
		{"ARP", ethFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, l.undMAC, 0x0806, make([]byte, 28))},
	} {
		t.Run(tc.name, func(t *testing.T) { run(t, tc.in) })
	}

	// The flag decides: the packet that is encapsulated with it passes without it.
	t.Run("CFG_F_FABRIC_EGRESS off", func(t *testing.T) {
		if ret, _ := l.run(t, l.objs.UnderlayEgress, encapsulates, l.und.Attrs().Index); ret != tcActRedirect {
			t.Fatalf("with the flag: verdict %d, want TC_ACT_REDIRECT (the case proves nothing)", ret)
		}
		setConfigFlags(t, l, 0)
		defer setConfigFlags(t, l, cfgFabricEgress)
		run(t, encapsulates)
		run(t, leaving(l, declaredUDP(groupDst, 40000, 63)))
	})
}

// TestFabricEgressPodIngress: pod_ingress leaves a declared pod's packet on a
// ViaFabric route to the stack, untouched and marked OVERLAY_MARK, even one it
// would otherwise encapsulate itself (a segment of a flow conntrack holds as
// established); without the flag on the route, or from a source outside
// fabric_prefixes, it is encapsulated as before.
func TestFabricEgressPodIngress(t *testing.T) {
	l := fabricEgressLab(t)
	for _, u := range []tuple{{declaredIP, viaFabricDst, 40000, 80}, {declaredIP, groupDst, 40000, 80}, {podIP, viaFabricDst, 40000, 80}} {
		l.ctEstablished(t, u)
	}
	// scapy: Ether(dst=<pod0h MAC>, src="02:00:00:00:0a:07")/IP(src="10.0.2.7", dst=dst, tos=0x10, ttl=64)/TCP(sport=40000, dport=80, flags="A", window=65535)/b"hello"
	ack := func(src, dst netip.Addr, ttl byte) []byte {
		return ipv4Packet(src, dst, 6, ipOpts{tos: 0x10, ttl: ttl}, withCsum(src, dst, 6, tcpSegment(40000, 80, tcpACK, []byte("hello"))))
	}
	fromPodIf := func(mac net.HardwareAddr, ip []byte) []byte { return ethFrame(l.podHMAC, mac, 0x0800, ip) }

	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"TCP ACK, route to a peer", fromPodIf(declaredMAC, ack(declaredIP, viaFabricDst, 64))},
		{"TCP ACK, group route", fromPodIf(declaredMAC, ack(declaredIP, groupDst, 64))},
		// scapy: Ether(dst=<pod0h MAC>, src="02:00:00:00:0a:07")/IP(src="10.0.2.7", dst="10.6.0.9", ttl=64)/UDP(sport=40000, dport=5000)/b"query"
		{"UDP", fromPodIf(declaredMAC, ipv4Packet(declaredIP, viaFabricDst, 17, ipOpts{ttl: 64},
			withCsum(declaredIP, viaFabricDst, 17, udpDatagram(40000, 5000, []byte("query")))))},
		// The stack answers time exceeded: this node is a hop.
		{"TTL 1", fromPodIf(declaredMAC, ack(declaredIP, viaFabricDst, 1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := l.counts(t)
			ret, out := l.run(t, l.objs.PodIngress, tc.in, l.pod.Attrs().Index)
			d := delta(before, l.counts(t))
			if ret != tcActOK || l.mark != overlayMark || !bytes.Equal(out, tc.in) || len(d) != 0 {
				t.Fatalf("verdict %d, mark %#x, changed %v, counters %v; want TC_ACT_OK, mark %#x, untouched, nothing counted\n out %x",
					ret, l.mark, !bytes.Equal(out, tc.in), d, overlayMark, out)
			}
		})
	}

	encapKey := metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_POD_INGRESS)
	fastKey := metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_POD_INGRESS)
	wantEncap := func(t *testing.T, in []byte) {
		t.Helper()
		before := l.counts(t)
		ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("verdict %d (mark %#x), want TC_ACT_REDIRECT (encapsulated at pod_ingress)", ret, l.mark)
		}
		ip := append([]byte{}, in[14:]...)
		ip[8]--
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], csum16(ip[:20]))
		if want := encapsulated(l, in, ip); !bytes.Equal(out, want) {
			t.Fatalf("encapsulated frame differs\n got %x\nwant %x", out, want)
		}
		d := delta(before, l.counts(t))
		if d[encapKey] != 1 || d[fastKey] != 1 || len(d) != 2 {
			t.Errorf("encapsulated: counters moved %v, want only %v and %v +1", d, encapKey, fastKey)
		}
	}
	// The group route with no live member (no gateway reaches the site): as for
	// any pod, dropped as no_nexthop and answered with ICMP net unreachable here,
	// not handed to the stack for underlay_egress to drop without a word.
	t.Run("group without a live member", func(t *testing.T) {
		if err := l.objs.NexthopGroups.Put(uint32(1), IsthmusNexthopGroup{}); err != nil {
			t.Fatalf("put group: %v", err)
		}
		defer func() {
			if err := l.objs.NexthopGroups.Put(uint32(1), groupOf(members)); err != nil {
				t.Fatalf("put group: %v", err)
			}
		}()
		in := fromPodIf(declaredMAC, ack(declaredIP, groupDst, 64))
		before := l.counts(t)
		ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("verdict %d (mark %#x), want TC_ACT_REDIRECT (ICMP net unreachable to the pod)", ret, l.mark)
		}
		if want := ethFrame(declaredMAC, l.podHMAC, 0x0800, icmpUnreachable(in[14:], 0, 0)); !bytes.Equal(out, want) {
			t.Fatalf("reply differs\n got %x\nwant %x", out, want)
		}
		drop := dropKey(IsthmusDropReasonDROP_NO_NEXTHOP, IsthmusHookHOOK_POD_INGRESS)
		sent := metricKey(IsthmusMetricMETRIC_NO_PATH_UNREACH_SENT, IsthmusHookHOOK_POD_INGRESS)
		if d := delta(before, l.counts(t)); d[drop] != 1 || d[sent] != 1 || len(d) != 2 {
			t.Errorf("counters moved %v, want %v and %v +1", d, drop, sent)
		}
	})
	// Same route, a source outside fabric_prefixes: encapsulated here.
	t.Run("source not in fabric_prefixes", func(t *testing.T) {
		wantEncap(t, fromPodIf(podMAC, ack(podIP, viaFabricDst, 64)))
	})
	// The same packet as above once the route loses the flag: encapsulated here.
	t.Run("route without ROUTE_F_VIA_FABRIC", func(t *testing.T) {
		putRoute(t, l, viaFabricNet, IsthmusRouteValue{Peer: be32(peerIP)})
		defer putRoute(t, l, viaFabricNet, IsthmusRouteValue{Peer: be32(peerIP), Flags: routeViaFabric})
		wantEncap(t, fromPodIf(declaredMAC, ack(declaredIP, viaFabricDst, 64)))
	})
}

// TestFabricEgressIngress: fabric_ingress leaves a plain packet from the site router
// for a declared pod to the stack, untouched but marked OVERLAY_MARK (no other CNI's
// MASQUERADE rewrites it), when its source's route is ViaFabric (the answer to fabric
// egress: the stack routes that source to the underlay device, so strict rp_filter
// passes there); the same packet from a source on a route without the flag goes into
// isthmus0 as before.
func TestFabricEgressIngress(t *testing.T) {
	l := fabricEgressLab(t)
	fabricKey := metricKey(IsthmusMetricMETRIC_FABRIC_INGRESS, IsthmusHookHOOK_UNDERLAY_TC)
	// scapy: Ether(dst=<und0 MAC>, src="02:00:00:00:01:fe")/IP(src=src, dst="10.0.2.7", ttl=63)/UDP(sport=4000, dport=5000, chksum=0)/b"payload"
	for _, tc := range []struct {
		name  string
		src   netip.Addr
		route netip.Prefix
		value IsthmusRouteValue
	}{
		{"route to a peer", viaFabricDst, viaFabricNet, IsthmusRouteValue{Peer: be32(peerIP)}},
		{"group route", groupDst, groupNet, IsthmusRouteValue{Group: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := plainFrame(l, tc.src, declaredIP, 63)
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			if d := delta(before, l.counts(t)); ret != tcActOK || !bytes.Equal(out, in) || l.mark != overlayMark || len(d) != 0 {
				t.Fatalf("ViaFabric source: verdict %d, mark %#x, counters %v, frame\n got %x\nwant %x (TC_ACT_OK, untouched, marked %#x, nothing counted)",
					ret, l.mark, d, out, in, overlayMark)
			}
			// Without the flag the same packet is fabric ingress: into isthmus0.
			putRoute(t, l, tc.route, tc.value)
			flagged := tc.value
			flagged.Flags = routeViaFabric
			defer putRoute(t, l, tc.route, flagged)
			before = l.counts(t)
			ret, out = l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			want := ethFrame(l.istMAC, gwMAC, 0x0800, in[14:])
			if ret != tcActRedirect || !bytes.Equal(out, want) || l.mark != overlayMark {
				t.Fatalf("route without the flag: verdict %d, mark %#x, frame\n got %x\nwant %x (TC_ACT_REDIRECT into isthmus0, marked %#x)",
					ret, l.mark, out, want, overlayMark)
			}
			wantCounted(t, "without the flag", delta(before, l.counts(t)), fabricKey)
		})
	}

	// A segment of a flow conntrack holds as established (bpf_redirect_peer without
	// the flag): left to the stack too.
	t.Run("TCP ACK of an established flow", func(t *testing.T) {
		l.ctEstablished(t, tuple{declaredIP, viaFabricDst, 33000, 80})
		// scapy: Ether(dst=<und0 MAC>, src="02:00:00:00:01:fe")/IP(src="10.6.0.9", dst="10.0.2.7", ttl=63)/TCP(sport=80, dport=33000, flags="A")
		in := ethFrame(l.undMAC, gwMAC, 0x0800, ipv4Packet(viaFabricDst, declaredIP, 6, ipOpts{ttl: 63},
			withCsum(viaFabricDst, declaredIP, 6, tcpSegment(80, 33000, tcpACK, nil))))
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
		if d := delta(before, l.counts(t)); ret != tcActOK || !bytes.Equal(out, in) || l.mark != overlayMark || len(d) != 0 {
			t.Fatalf("verdict %d, mark %#x, counters %v, changed %v; want TC_ACT_OK, untouched, marked, nothing counted",
				ret, l.mark, d, !bytes.Equal(out, in))
		}
		putRoute(t, l, viaFabricNet, IsthmusRouteValue{Peer: be32(peerIP)})
		defer putRoute(t, l, viaFabricNet, IsthmusRouteValue{Peer: be32(peerIP), Flags: routeViaFabric})
		before = l.counts(t)
		ret, _ = l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
		fast := delta(before, l.counts(t))[metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_UNDERLAY_TC)]
		if ret != tcActRedirect || l.mark&overlayMark != 0 || fast != 1 {
			t.Fatalf("route without the flag: verdict %d, mark %#x, ct_fast +%d; want TC_ACT_REDIRECT to the pod, unmarked, ct_fast +1", ret, l.mark, fast)
		}
	})
}

// TestFabricEgressRedirectLive attaches underlay_egress to und0 and sends a declared
// pod's frame out of it: the GENEVE frame must come out of und0 (seen on its veth
// peer und1), which BPF_PROG_TEST_RUN cannot show (it reports the verdict, not the
// redirect target). The frame passes underlay_egress a second time on its way out
// and must leave as it was made.
func TestFabricEgressRedirectLive(t *testing.T) {
	l := fabricEgressLab(t)
	var (
		lk        link.Link
		tx, rx    int
		und, und1 int
	)
	err := inNS(l.ns, func() error {
		var err error
		und = l.und.Attrs().Index
		lk, err = link.AttachTCX(link.TCXOptions{Interface: und, Program: l.objs.UnderlayEgress, Attach: ebpf.AttachTCXEgress})
		if err != nil {
			return err
		}
		peer, err := netlink.LinkByName("und1")
		if err != nil {
			return err
		}
		und1 = peer.Attrs().Index
		if tx, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0); err != nil {
			return err
		}
		if rx, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))); err != nil {
			return err
		}
		return unix.Bind(rx, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: und1})
	})
	if err != nil {
		t.Fatalf("attach and open packet sockets: %v", err)
	}
	defer lk.Close()
	defer unix.Close(tx)
	defer unix.Close(rx)
	tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
	if err := unix.SetsockoptTimeval(rx, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}

	in := leaving(l, declaredUDP(viaFabricDst, 40000, 63))
	before := l.counts(t)
	if err := unix.Sendto(tx, in, 0, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: und, Halen: 6}); err != nil {
		t.Fatalf("send on und0: %v", err)
	}
	buf := make([]byte, 2048)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(rx, buf, 0)
		if err != nil {
			continue
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		got := append([]byte{}, buf[:n]...)
		if bytes.Equal(got, in) {
			t.Fatalf("und1 got the frame plain: underlay_egress did not encapsulate it")
		}
		if n != len(in)+50 || binary.BigEndian.Uint16(got[12:]) != 0x0800 || got[23] != 17 {
			t.Logf("und1 saw another frame: %x", got)
			continue
		}
		if _, inner := fabricEncap(t, l, got, in, peerIP); !bytes.Equal(inner, in) {
			t.Fatalf("inner frame differs\n got %x\nwant %x", inner, in)
		}
		if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_UNDERLAY_EGRESS)] != 1 {
			t.Errorf("counters moved %v, want METRIC_ENCAP under underlay_egress +1 (once: the second pass leaves the frame)", d)
		}
		return
	}
	t.Fatalf("no GENEVE frame came out of und0; counters moved %v", delta(before, l.counts(t)))
}

// TestFabricIngressTranslatedHostReply: on a member of a site whose fabric carries
// its declared pods' replies, with its tunnel address in the declared block (a
// bridge CNI's gateway address), the answer the fabric hands over for a flow the host
// translated to its tunnel address (kube-proxy's MASQUERADE of a NodePort flow it
// forwarded into isthmus0) enters through isthmus0, where the untranslated client's
// route to the answer's source leads, so strict rp_filter accepts it; the answer to
// the host's own untranslated flow from that address, and one conntrack does not
// know, stay on the underlay as before.
func TestFabricIngressTranslatedHostReply(t *testing.T) {
	l := fabricEgressLab(t)
	tunnel := netip.MustParseAddr("10.0.2.1") // in fabricNet, the declared block
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.TunnelIp = be32(tunnel)
	if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
	// The agent's main-table route of the remote site into isthmus0.
	if err := inNS(l.ns, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: viaFabricNet.Addr().AsSlice(), Mask: net.CIDRMask(viaFabricNet.Bits(), 32)},
			LinkIndex: l.ist.Attrs().Index, Scope: netlink.SCOPE_LINK})
	}); err != nil {
		t.Fatalf("route %s into ist0: %v", viaFabricNet, err)
	}
	client := netip.MustParseAddr("192.168.1.77") // dialled the NodePort on the underlay
	answer := func(sport, dport uint16) []byte {
		return ethFrame(l.undMAC, fabricMAC, 0x0800, ipv4Packet(viaFabricDst, tunnel, 6, ipOpts{ttl: 63},
			tcpSegment(sport, dport, 0x12, nil)))
	}
	hostKey := metricKey(IsthmusMetricMETRIC_DELIVER_HOST, IsthmusHookHOOK_UNDERLAY_TC)

	// The NodePort flow: client -> node:30950, DNATed to the remote backend and
	// masqueraded to the tunnel address.
	l.ctInsert(t, tuple{client, underlayIP, 40000, 30950}, tuple{viaFabricDst, tunnel, 9376, 40001}, "SYN_RECV", "")
	before := l.counts(t)
	if ret, _ := l.run(t, l.objs.UnderlayIngress, answer(9376, 40001), l.und.Attrs().Index); ret != tcActRedirect {
		t.Errorf("answer of a translated flow: verdict %d, want TC_ACT_REDIRECT into isthmus0", ret)
	}
	if d := delta(before, l.counts(t)); d[hostKey] != 1 || len(d) != 1 {
		t.Errorf("counters moved %v, want only METRIC_DELIVER_HOST +1", d)
	}

	// The host's own flow from its tunnel address, untranslated, and a flow
	// conntrack does not know: the stack takes them on the underlay.
	l.ctEstablished(t, tuple{tunnel, viaFabricDst, 40002, 9376})
	for _, c := range []struct {
		name         string
		sport, dport uint16
	}{{"untranslated", 9376, 40002}, {"unknown", 9376, 40003}} {
		before := l.counts(t)
		if ret, _ := l.run(t, l.objs.UnderlayIngress, answer(c.sport, c.dport), l.und.Attrs().Index); ret != 0 {
			t.Errorf("%s: verdict %d, want TC_ACT_OK (the stack, on the underlay)", c.name, ret)
		}
		if d := delta(before, l.counts(t)); len(d) != 0 {
			t.Errorf("%s: counters moved %v, want none", c.name, d)
		}
	}
}

// TestDecapHostAnswerDevice: a decapsulated packet for this host enters its stack on
// the device the host routes the answer out of, looked up from the address conntrack
// gives the packet before routing, as strict rp_filter does: the answer to a flow the
// host translated to its underlay address (kube-proxy's MASQUERADE of a NodePort flow
// from a declared pod, routed out of the underlay by the pod's fabric rule) on the
// underlay device, addressed to it; the host's own untranslated flow, and a packet
// conntrack does not know, through isthmus0 as before.
func TestDecapHostAnswerDevice(t *testing.T) {
	l := ctLab(t)
	withFabric(t, l)
	// The declared pods' rule: their traffic to the remote pods leaves by the
	// underlay (the agent's fabric table); the host's own goes into isthmus0.
	if err := inNS(l.ns, func() error {
		tab := &netlink.Route{Dst: &net.IPNet{IP: remoteNet.Addr().AsSlice(), Mask: net.CIDRMask(remoteNet.Bits(), 32)},
			Gw: underlayGW.AsSlice(), LinkIndex: l.und.Attrs().Index, Table: 202}
		if err := netlink.RouteAdd(tab); err != nil {
			return err
		}
		rule := netlink.NewRule()
		rule.Src = &net.IPNet{IP: fabricNet.Addr().AsSlice(), Mask: net.CIDRMask(fabricNet.Bits(), 32)}
		rule.Table, rule.Priority = 202, 200
		if err := netlink.RuleAdd(rule); err != nil {
			return err
		}
		return netlink.RouteReplace(&netlink.Route{Dst: &net.IPNet{IP: remoteNet.Addr().AsSlice(), Mask: net.CIDRMask(remoteNet.Bits(), 32)},
			LinkIndex: l.ist.Attrs().Index, Scope: netlink.SCOPE_LINK})
	}); err != nil {
		t.Fatalf("fabric rule and routes: %v", err)
	}
	answer := func(dport uint16) []byte {
		inner := ipv4Packet(remotePodIP, underlayIP, 6, ipOpts{ttl: 63}, tcpSegment(9376, dport, 0x12, nil))
		o := goodOpts(underlayIP)
		return geneveFrame(l, o, innerEth(inner))
	}
	hostKey := metricKey(IsthmusMetricMETRIC_DELIVER_HOST, IsthmusHookHOOK_UNDERLAY_TC)
	// A declared pod dialled this node's NodePort; kube-proxy sent it to the remote
	// backend, masqueraded to the underlay address.
	l.ctInsert(t, tuple{declaredIP, underlayIP, 40000, 30950}, tuple{remotePodIP, underlayIP, 9376, 40001}, "SYN_RECV", "")
	l.ctEstablished(t, tuple{underlayIP, remotePodIP, 40002, 9376})
	for _, c := range []struct {
		name  string
		dport uint16
		mac   net.HardwareAddr
	}{{"translated", 40001, l.undMAC}, {"untranslated", 40002, l.istMAC}, {"unknown", 40003, l.istMAC}} {
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, answer(c.dport), l.und.Attrs().Index)
		if ret != tcActRedirect || len(out) < 14 {
			t.Errorf("%s: verdict %d, want TC_ACT_REDIRECT", c.name, ret)
			continue
		}
		if !bytes.Equal(out[0:6], c.mac) {
			t.Errorf("%s: delivered to %s, want %s", c.name, net.HardwareAddr(out[0:6]), c.mac)
		}
		if d := delta(before, l.counts(t)); d[hostKey] != 1 {
			t.Errorf("%s: counters moved %v, want METRIC_DELIVER_HOST +1", c.name, d)
		}
	}
}

// TestFabricEgressForwardedTranslated: a declared pod's packet the stack forwarded
// out of the underlay by the pod's fabric rule and then translated to the underlay
// address (kube-proxy's MASQUERADE of a NodePort flow the pod opened) is still
// encapsulated to the route's gateway, since a routed fabric would drop it plain;
// the same packet from the host itself, and this node's own GENEVE frames on their
// way out (forwarded ones included), are untouched.
func TestFabricEgressForwardedTranslated(t *testing.T) {
	l := fabricEgressLab(t)
	masq := leaving(l, ipv4Packet(underlayIP, viaFabricDst, 6, ipOpts{ttl: 63},
		withCsum(underlayIP, viaFabricDst, 6, tcpSegment(43384, 9376, 0x02, nil))))
	forwarded := skbCtx{Ifindex: uint32(l.und.Attrs().Index), IngressIfindex: uint32(l.pod.Attrs().Index)}
	encapKey := metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_UNDERLAY_EGRESS)

	before := l.counts(t)
	ret, out := l.runCtx(t, l.objs.UnderlayEgress, masq, forwarded)
	if ret != tcActRedirect {
		t.Fatalf("forwarded, translated: verdict %d, want TC_ACT_REDIRECT (encapsulated)", ret)
	}
	if _, inner := fabricEncap(t, l, out, masq, peerIP); !bytes.Equal(inner, masq) {
		t.Errorf("inner frame\n got %x\nwant %x", inner, masq)
	}
	if d := delta(before, l.counts(t)); d[encapKey] != 1 {
		t.Errorf("counters moved %v, want METRIC_ENCAP +1", d)
	}

	geneve := leaving(l, ipv4Packet(underlayIP, peerIP, 17, ipOpts{ttl: 64},
		udpDatagram(50000, 6081, geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, innerEth(declaredUDP(viaFabricDst, 40000, 63))))))
	for _, c := range []struct {
		name string
		in   []byte
		ctx  skbCtx
	}{
		{"the host's own", masq, skbCtx{Ifindex: uint32(l.und.Attrs().Index)}},
		{"a forwarded GENEVE frame of this node", geneve, forwarded},
	} {
		before := l.counts(t)
		ret, out := l.runCtx(t, l.objs.UnderlayEgress, c.in, c.ctx)
		if d := delta(before, l.counts(t)); ret != tcActOK || !bytes.Equal(out, c.in) || len(d) != 0 {
			t.Errorf("%s: verdict %d, counters %v; want TC_ACT_OK, untouched, nothing counted", c.name, ret, d)
		}
	}
}
