package bpf

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

// Program tests for gateway transit (docs/gateways.md, "Datapath: transit"): the lab
// node is a gateway; memberIP, a node of its site, sends it GENEVE for a remote
// prefix, which underlay_ingress forwards to the prefix's peer (peerIP, or a group)
// with only the outer IPv4 header and the inner TTL changed.

// cfgTransit is CFG_F_TRANSIT of lib/types.h (a #define, not in BTF). A wrong value
// fails every transit test here: the frames would be decapsulated instead.
const cfgTransit uint32 = 1 << 0

var (
	memberIP  = netip.MustParseAddr("192.168.2.5") // a member of the gateway's site, behind underlayGW
	memberNet = netip.MustParsePrefix("10.7.0.0/24")
	memberPod = netip.MustParseAddr("10.7.0.9") // a pod on memberIP
)

// setTransit sets or clears CFG_F_TRANSIT in the lab's config.
func setTransit(t testing.TB, l *lab, on bool) {
	t.Helper()
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	cfg.Flags &^= cfgTransit
	if on {
		cfg.Flags |= cfgTransit
	}
	if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatalf("put config: %v", err)
	}
}

// gatewayLab is the lab as a gateway (CFG_F_TRANSIT) with memberIP a peer that may
// send from memberNet.
func gatewayLab(t testing.TB) *lab {
	t.Helper()
	l := newLab(t)
	addMember(t, l)
	setTransit(t, l, true)
	return l
}

// addMember makes memberIP a peer that may send from memberNet.
func addMember(t testing.TB, l *lab) {
	t.Helper()
	if err := l.objs.Peers.Put(be32(memberIP), IsthmusPeerValue{}); err != nil {
		t.Fatalf("put peer: %v", err)
	}
	k := IsthmusPeerSourceKey{Prefixlen: 32 + uint32(memberNet.Bits()), Peer: be32(memberIP), Src: be32(memberNet.Addr())}
	if err := l.objs.PeerSources.Put(k, IsthmusPeerSourceValue{}); err != nil {
		t.Fatalf("put peer source: %v", err)
	}
}

type transitOpts struct {
	outerSrc  netip.Addr
	innerSrc  netip.Addr
	innerDst  netip.Addr
	innerTTL  byte
	sport     uint16 // inner UDP source port
	udpCsum   bool   // the sender filled in the outer UDP checksum
	gnvOpts   []byte // GENEVE options
	ipOptions []byte // outer IPv4 options, a multiple of 4 bytes
	payload   []byte // inner UDP payload; nil: "transit"
	innerDF   bool   // the inner packet carries DF
}

// memberInner is the inner IPv4 packet of a member pod's flow.
func memberInner(o transitOpts) []byte {
	io := ipOpts{tos: 0x10, ttl: o.innerTTL, id: 0x4242}
	if o.innerDF {
		io.fragOff = 0x4000
	}
	payload := o.payload
	if payload == nil {
		payload = []byte("transit")
	}
	return ipv4Packet(o.innerSrc, o.innerDst, 17, io, udpDatagram(o.sport, 80, payload))
}

// transitFrame is what a member (or a remote gateway) sends this gateway: outer TTL 61
// (it crossed routers), the outer source port from the inner flow as encapsulation
// picks it, and the inner frame as built by memberInner.
// scapy: Ether(dst=<und0 MAC>, src="02:00:00:00:01:fe")/IP(src=outerSrc, dst="192.168.1.1", tos=0x10, id=0x1234, flags="DF", ttl=61, options=ipOptions)/UDP(sport=<flow port>, dport=6081, chksum=<0, or computed when udpCsum>)/GENEVE(vni=0x123456, proto=0x6558, options=gnvOpts)/Ether(dst="02:00:00:00:02:07", src="02:00:00:00:02:07")/IP(src=innerSrc, dst=innerDst, tos=0x10, id=0x4242, ttl=innerTTL)/UDP(sport=sport, dport=80, chksum=0)/b"transit"
func transitFrame(l *lab, o transitOpts) []byte {
	return outerFrame(l.undMAC, gwMAC, o.outerSrc, underlayIP, 61, o, memberInner(o))
}

// outerFrame wraps inner (an IPv4 packet) in inner Ethernet, GENEVE, UDP and IPv4 from
// src to dst with the given outer TTL, and Ethernet from smac to dmac.
func outerFrame(dmac, smac []byte, src, dst netip.Addr, ttl byte, o transitOpts, inner []byte) []byte {
	gnv := geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, options: o.gnvOpts, optWords: -1}, innerEth(inner))
	udp := udpDatagram(flowSport(inner), 6081, gnv)
	if o.udpCsum {
		binary.BigEndian.PutUint16(udp[6:], udp4Checksum(src, dst, udp))
	}
	ip := withIPOptions(ipv4Packet(src, dst, 17, ipOpts{tos: 0x10, ttl: ttl, fragOff: 0x4000, id: 0x1234}, udp), o.ipOptions)
	return ethFrame(dmac, smac, 0x0800, ip)
}

// udp4Checksum is the UDP checksum of datagram udp (checksum field zero) from src to
// dst, 0xffff for a computed 0 (RFC 768).
func udp4Checksum(src, dst netip.Addr, udp []byte) uint16 {
	s, d := src.As4(), dst.As4()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 17, byte(len(udp)>>8), byte(len(udp)))
	c := csum16(append(pseudo, udp...))
	if c == 0 {
		c = 0xffff
	}
	return c
}

// withIPOptions inserts opts after the fixed header of IPv4 packet ip and fixes IHL,
// total length and checksum.
func withIPOptions(ip, opts []byte) []byte {
	if len(opts) == 0 {
		return ip
	}
	b := append(append(append([]byte{}, ip[:20]...), opts...), ip[20:]...)
	b[0] = 0x40 | byte((20+len(opts))/4)
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[10], b[11] = 0, 0
	binary.BigEndian.PutUint16(b[10:], csum16(b[:20+len(opts)]))
	return b
}

func TestTransitByteExact(t *testing.T) {
	l := gatewayLab(t)
	base := transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: remotePodIP, innerTTL: 63, sport: 1234}
	for _, tc := range []struct {
		name string
		edit func(*transitOpts)
	}{
		{name: "plain", edit: func(*transitOpts) {}},
		{name: "outer UDP checksum", edit: func(o *transitOpts) { o.udpCsum = true }},
		{name: "GENEVE option", edit: func(o *transitOpts) { o.gnvOpts = []byte{0x01, 0x02, 0x03, 0x01, 0xaa, 0xbb, 0xcc, 0xdd} }},
		{name: "outer IPv4 options", edit: func(o *transitOpts) { o.ipOptions = []byte{0x01, 0x01, 0x01, 0x00}; o.udpCsum = true }},
		{name: "from a remote gateway", edit: func(o *transitOpts) {
			// peerIP's own source to a member's pod: the route to memberNet is memberIP.
			o.outerSrc, o.innerSrc, o.innerDst = peerIP, remotePodIP, memberPod
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.edit(&o)
			next := peerIP
			if o.innerDst == memberPod {
				next = memberIP
				k := IsthmusRouteKey{Prefixlen: uint32(memberNet.Bits()), Addr: be32(memberNet.Addr())}
				if err := l.objs.Routes.Put(k, IsthmusRouteValue{Peer: be32(memberIP)}); err != nil {
					t.Fatalf("put route: %v", err)
				}
				defer l.objs.Routes.Delete(k)
			}
			in := transitFrame(l, o)
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}
			// Expected: the same frame from this node to the next hop, outer TTL 64, inner
			// TTL one less, MACs toward the underlay gateway; nothing else changed.
			fwd := o
			fwd.innerTTL--
			inner := memberInner(fwd)
			want := outerFrame(gwMAC, l.undMAC, underlayIP, next, 64, fwd, inner)
			// The outer source port is the sender's, from the inner flow as it was sent.
			binary.BigEndian.PutUint16(want[14+20+len(o.ipOptions):], flowSport(memberInner(o)))
			if o.udpCsum {
				udp := want[14+20+len(o.ipOptions):]
				binary.BigEndian.PutUint16(udp[6:], 0)
				binary.BigEndian.PutUint16(udp[6:], udp4Checksum(underlayIP, next, udp))
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("forwarded frame differs\n got %s\nwant %s", hex.EncodeToString(out), hex.EncodeToString(want))
			}
			// Independent checks of what the byte comparison implies.
			ohl := 20 + len(o.ipOptions)
			if csum16(out[14:14+ohl]) != 0 {
				t.Errorf("outer IPv4 header checksum does not verify")
			}
			iip := 14 + ohl + 8 + 8 + len(o.gnvOpts) + 14
			if csum16(out[iip:iip+20]) != 0 || out[iip+8] != o.innerTTL-1 {
				t.Errorf("inner IPv4 header: TTL %d (want %d), checksum verifies %v", out[iip+8], o.innerTTL-1, csum16(out[iip:iip+20]) == 0)
			}
			if got, sent := binary.BigEndian.Uint16(out[14+ohl:]), binary.BigEndian.Uint16(in[14+ohl:]); got != sent {
				t.Errorf("outer UDP source port %d, sent with %d", got, sent)
			}
			if o.udpCsum {
				udp := append([]byte{}, out[14+ohl:]...)
				if csum16(append(append(append([]byte{}, out[14+12:14+20]...), 0, 17, byte(len(udp)>>8), byte(len(udp))), udp...)) != 0 {
					t.Errorf("outer UDP checksum does not verify")
				}
			} else if c := binary.BigEndian.Uint16(out[14+ohl+6:]); c != 0 {
				t.Errorf("outer UDP checksum %#x, want zero kept", c)
			}
			d := delta(before, l.counts(t))
			if d[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
				t.Errorf("counters moved %v, want only METRIC_TRANSIT +1", d)
			}
		})
	}
}

// asMemberFrame turns what pod_ingress sent (toward a gateway of this lab's group) into
// the frame that gateway receives from memberIP: the member encapsulated it.
func asMemberFrame(l *lab, sent []byte) []byte {
	b := append([]byte{}, sent...)
	copy(b[0:6], l.undMAC)
	copy(b[6:12], gwMAC)
	s, d := memberIP.As4(), underlayIP.As4()
	copy(b[14+12:], s[:])
	copy(b[14+16:], d[:])
	b[14+10], b[14+11] = 0, 0
	binary.BigEndian.PutUint16(b[14+10:], csum16(b[14:34]))
	return b
}

// TestTransitGroup: through a next-hop group, each flow goes to the member the Go twin
// of the flow hash predicts, which is the member encapsulation of the same flow picks.
func TestTransitGroup(t *testing.T) {
	l := gatewayLab(t)
	g := groupOf(members)
	withGroup(t, l, g)
	// This lab's pod_ingress stands in for the member's, so memberPod must be a pod
	// here: pod_ingress takes only sources that route back through the interface.
	if err := inNS(l.ns, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: memberPod.AsSlice(), Mask: net.CIDRMask(32, 32)},
			LinkIndex: l.pod.Attrs().Index, Scope: netlink.SCOPE_LINK})
	}); err != nil {
		t.Fatalf("route memberPod: %v", err)
	}
	per := map[netip.Addr]int{}
	for i := range uint16(64) {
		sport := 30000 + i
		// The member's encapsulation of its pod's packet, from this lab's pod_ingress.
		// A TCP segment of a flow conntrack holds as established: pod_ingress
		// encapsulates it itself.
		l.ctEstablished(t, tuple{memberPod, groupDst, sport, 80})
		pod := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(memberPod, groupDst, 6, ipOpts{ttl: 64}, tcpSegment(sport, 80, 0x10, []byte("hello"))))
		ret, sent := l.run(t, l.objs.PodIngress, pod, l.pod.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("flow %d: pod_ingress verdict %d", sport, ret)
		}
		encapTo := netip.AddrFrom4([4]byte(sent[30:34]))
		in := asMemberFrame(l, sent)
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("flow %d: verdict %d, want TC_ACT_REDIRECT", sport, ret)
		}
		d := delta(before, l.counts(t))
		if d[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
			t.Fatalf("flow %d: counters moved %v, want only METRIC_TRANSIT +1", sport, d)
		}
		to := netip.AddrFrom4([4]byte(out[30:34]))
		twin := netip.AddrFrom4([4]byte(binary.NativeEndian.AppendUint32(nil, g.Slots[flowHash(pod[14:])%64])))
		if to != twin || to != encapTo {
			t.Fatalf("flow %d: transit to %v, Go twin says %v, encapsulation chose %v", sport, to, twin, encapTo)
		}
		// Only the outer addresses, TTL and checksum, and the inner TTL and checksum moved.
		want := append([]byte{}, in...)
		copy(want[0:12], out[0:12])
		copy(want[14+8:14+20], out[14+8:14+20])
		copy(want[64+8:64+12], out[64+8:64+12])
		if !bytes.Equal(out, want) || out[22] != 64 || out[64+8] != in[64+8]-1 {
			t.Fatalf("flow %d: frame differs beyond the outer header and inner TTL\n got %x\n in %x", sport, out, in)
		}
		per[to]++
	}
	if len(per) < 2 {
		t.Fatalf("64 flows all went to %v: the test cannot tell members apart", per)
	}

	// No live member: dropped and counted.
	withGroup(t, l, IsthmusNexthopGroup{})
	in := transitFrame(l, transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: groupDst, innerTTL: 63, sport: 1})
	expectDrop(t, l, in, IsthmusDropReasonDROP_NO_NEXTHOP)
}

// expectDrop runs underlay_ingress on in and wants it dropped with reason, counted
// once and nothing else counted.
func expectDrop(t *testing.T, l *lab, in []byte, reason IsthmusDropReason) {
	t.Helper()
	before := l.counts(t)
	if ret, _ := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index); ret != tcActShot {
		t.Fatalf("verdict %d, want TC_ACT_SHOT", ret)
	}
	k := dropKey(reason, IsthmusHookHOOK_UNDERLAY_TC)
	if d := delta(before, l.counts(t)); d[k] != 1 || len(d) != 1 {
		t.Errorf("counters moved %v, want only %v +1", d, k)
	}
}

func TestTransitDrops(t *testing.T) {
	l := gatewayLab(t)
	good := transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: remotePodIP, innerTTL: 63, sport: 1234}
	with := func(f func(*transitOpts)) []byte { o := good; f(&o); return transitFrame(l, o) }
	for _, tc := range []struct {
		name   string
		in     []byte
		reason IsthmusDropReason
	}{
		// peerIP may send from remoteNet, whose route is peerIP itself.
		{"next hop is the sender", with(func(o *transitOpts) { o.outerSrc, o.innerSrc = peerIP, netip.MustParseAddr("10.2.0.9") }), IsthmusDropReasonDROP_TRANSIT_LOOP},
		// Transit weakens none of the checks of decapsulation.
		{"inner source not allowed", with(func(o *transitOpts) { o.innerSrc = deniedIP }), IsthmusDropReasonDROP_INNER_SRC_DENIED},
		{"member's source from another peer", with(func(o *transitOpts) { o.outerSrc = peerIP }), IsthmusDropReasonDROP_INNER_SRC_DENIED},
		{"unknown peer", with(func(o *transitOpts) { o.outerSrc = strangerIP }), IsthmusDropReasonDROP_UNKNOWN_PEER},
	} {
		t.Run(tc.name, func(t *testing.T) { expectDrop(t, l, tc.in, tc.reason) })
	}
	t.Run("wrong VNI", func(t *testing.T) {
		in := transitFrame(l, good)
		in[14+20+8+4]++ // the first VNI byte
		expectDrop(t, l, in, IsthmusDropReasonDROP_GENEVE_VNI)
	})
}

// TestTransitOffOrMiss: without CFG_F_TRANSIT a frame for a remote prefix is
// decapsulated as before and dropped as not local (members never forward); on a
// gateway a frame whose inner destination misses routes is decapsulated and delivered.
func TestTransitOffOrMiss(t *testing.T) {
	l := gatewayLab(t)
	toRemote := transitFrame(l, transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: remotePodIP, innerTTL: 63, sport: 1234})
	toPod := transitFrame(l, transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: podIP, innerTTL: 63, sport: 1234})

	// As the agent does: remote prefixes route into isthmus0 (ist0 here), so the FIB
	// finds no local pod for them.
	err := inNS(l.ns, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: remoteNet.Addr().AsSlice(), Mask: net.CIDRMask(remoteNet.Bits(), 32)},
			LinkIndex: l.ist.Attrs().Index, Scope: netlink.SCOPE_LINK})
	})
	if err != nil {
		t.Fatalf("route %v into ist0: %v", remoteNet, err)
	}

	setTransit(t, l, false)
	before := l.counts(t)
	if ret, _ := l.run(t, l.objs.UnderlayIngress, toRemote, l.und.Attrs().Index); ret != tcActShot {
		t.Fatalf("no CFG_F_TRANSIT: verdict %d, want TC_ACT_SHOT", ret)
	}
	d := delta(before, l.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 ||
		d[dropKey(IsthmusDropReasonDROP_NOT_LOCAL, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 2 {
		t.Errorf("no CFG_F_TRANSIT: counters moved %v, want METRIC_DECAP and DROP_NOT_LOCAL +1", d)
	}

	setTransit(t, l, true)
	before = l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayIngress, toPod, l.und.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("gateway, local pod: verdict %d, want TC_ACT_REDIRECT", ret)
	}
	// A UDP datagram opens a flow: through the stack (isthmus0 ingress, marked, the
	// TTL left to the stack's forwarding).
	want := ethFrame(l.istMAC, gwMAC, 0x0800, memberInner(transitOpts{innerSrc: memberPod, innerDst: podIP, innerTTL: 63, sport: 1234}))
	if !bytes.Equal(out, want) || l.mark != overlayMark {
		t.Fatalf("gateway, local pod: delivered frame differs or mark %#x\n got %x\nwant %x", l.mark, out, want)
	}
	d = delta(before, l.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 ||
		d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 2 {
		t.Errorf("gateway, local pod: counters moved %v, want METRIC_DECAP and METRIC_DELIVER_POD +1", d)
	}
}

// TestTransitXDP: underlay_xdp leaves a frame that will transit whole, without
// metadata and uncounted, so underlay_ingress forwards it; it pops a local one, and
// without CFG_F_TRANSIT pops the remote one too, as before.
func TestTransitXDP(t *testing.T) {
	l := gatewayLab(t)
	toRemote := transitFrame(l, transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: remotePodIP, innerTTL: 63, sport: 1234})
	toPod := transitFrame(l, transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: podIP, innerTTL: 63, sport: 1234})
	xdpDecapKey := metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_XDP)

	before := l.counts(t)
	l.wantXDPPassWhole(t, "transit frame", toRemote)
	ret, _ := l.run(t, l.objs.UnderlayIngress, toRemote, l.und.Attrs().Index)
	if d := delta(before, l.counts(t)); ret != tcActRedirect || d[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
		t.Fatalf("underlay_ingress after XDP: verdict %d, counters %v; want redirect, METRIC_TRANSIT +1", ret, d)
	}

	popped := func(name string, in []byte) {
		t.Helper()
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayXdp, in, 0)
		// Popped: 8 bytes of decap_meta, the outer Ethernet header, the inner IPv4 packet.
		if ret != xdpPass || len(out) != 8+14+len(in)-14-50 || binary.NativeEndian.Uint32(out) != 0x69737468 {
			t.Fatalf("%s: verdict %d, %d bytes out of %d; want XDP_PASS and popped with metadata", name, ret, len(out), len(in))
		}
		if d := delta(before, l.counts(t)); d[xdpDecapKey] != 1 || len(d) != 1 {
			t.Errorf("%s: counters moved %v, want only %v +1", name, d, xdpDecapKey)
		}
	}
	popped("local frame on a gateway", toPod)
	setTransit(t, l, false)
	popped("remote frame without CFG_F_TRANSIT", toRemote)
}

// isTransit reports whether CFG_F_TRANSIT is set in the lab's config.
func (l *lab) isTransit(t testing.TB) bool {
	t.Helper()
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	return cfg.Flags&cfgTransit != 0
}
