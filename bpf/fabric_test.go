package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/vishvananda/netlink"
)

// Program tests for unmanaged-CNI sites (docs/unmanaged-sites.md, "Datapath"):
// next-hop groups on encapsulation, fabric delivery after decapsulation, and fabric
// ingress of plain overlay packets on the underlay.

var (
	groupNet   = netip.MustParsePrefix("10.5.0.0/16") // routed to group 1
	groupDst   = netip.MustParseAddr("10.5.1.9")
	members    = []netip.Addr{peerIP, netip.MustParseAddr("192.168.2.3"), netip.MustParseAddr("192.168.2.4")}
	fabricNet  = netip.MustParsePrefix("10.0.2.0/23")        // this site's declared pod block
	fabricDst  = netip.MustParseAddr("10.0.3.20")            // a pod on another node of the site
	fabricGW   = netip.MustParseAddr("192.168.1.253")        // the fabric router on und0
	fabricMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0x01, 0xfd} // its MAC
	outsideDst = netip.MustParseAddr("10.0.9.20")            // routed to the fabric router, not a fabric prefix
)

// groupOf returns a nexthop_group whose slots go round-robin over ms.
func groupOf(ms []netip.Addr) IsthmusNexthopGroup {
	g := IsthmusNexthopGroup{Live: uint32(len(ms))}
	for i := range g.Slots {
		g.Slots[i] = be32(ms[i%len(ms)])
	}
	return g
}

// withGroup routes groupNet through next-hop group 1 holding g, each member a
// peer (as the agent writes them: a next hop without a peers entry is dropped).
func withGroup(t *testing.T, l *lab, g IsthmusNexthopGroup) {
	t.Helper()
	for _, m := range g.Slots {
		if m == 0 {
			continue
		}
		if err := l.objs.Peers.Update(m, IsthmusPeerValue{}, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			t.Fatalf("put group member as peer: %v", err)
		}
	}
	if err := l.objs.NexthopGroups.Put(uint32(1), g); err != nil {
		t.Fatalf("put group: %v", err)
	}
	k := IsthmusRouteKey{Prefixlen: uint32(groupNet.Bits()), Addr: be32(groupNet.Addr())}
	if err := l.objs.Routes.Put(k, IsthmusRouteValue{Group: 1}); err != nil {
		t.Fatalf("put route: %v", err)
	}
}

// outerDst runs pod_ingress on a pod's TCP segment (podFrame) from sport to groupDst and returns
// the outer destination it was sent to. The flow must be established in conntrack
// (lab.ctEstablished), for pod_ingress to encapsulate it.
func outerDst(t *testing.T, l *lab, sport uint16) netip.Addr {
	t.Helper()
	ret, out := l.run(t, l.objs.PodIngress, podFrame(l, groupDst, sport), l.pod.Attrs().Index)
	if ret != tcActRedirect || len(out) < 34 {
		t.Fatalf("flow %d: verdict %d, %d bytes; want an encapsulated redirect", sport, ret, len(out))
	}
	return netip.AddrFrom4([4]byte(out[30:34]))
}

// TestNexthopGroupSelection: pod_ingress sends a flow of a grouped route to the
// member of its slot, spreads flows over members, moves only the flows of a slot
// that changes owner, and answers net unreachable when no member is live.
func TestNexthopGroupSelection(t *testing.T) {
	l := newLab(t)
	g := groupOf(members)
	withGroup(t, l, g)
	const flows = 256
	l.ctEstablished(t, podFlow(groupDst, 1234))
	for i := range uint16(flows) {
		l.ctEstablished(t, podFlow(groupDst, 20000+i))
	}

	// One flow, byte-exact: the member of its slot, the usual GENEVE frame.
	in := podFrame(l, groupDst, 1234)
	slot := flowHash(in[14:]) % 64
	want0 := netip.AddrFrom4([4]byte(binary.NativeEndian.AppendUint32(nil, g.Slots[slot])))
	before := l.counts(t)
	ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
	}
	innerIP := podPacket(groupDst, 1234, 63)
	gnv := geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, append(append([]byte{}, in[:14]...), innerIP...))
	want := ethFrame(gwMAC, l.undMAC, 0x0800,
		ipv4Packet(underlayIP, want0, 17, ipOpts{tos: 0x10, ttl: 64, fragOff: 0x4000}, udpDatagram(flowSport(in[14:]), 6081, gnv)))
	if !bytes.Equal(out, want) {
		t.Fatalf("grouped flow (slot %d, member %v): frame differs\n got %x\nwant %x", slot, want0, out, want)
	}
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_POD_INGRESS)] != 1 ||
		d[metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_POD_INGRESS)] != 1 || len(d) != 2 {
		t.Errorf("counters moved %v, want only METRIC_ENCAP and METRIC_CT_FAST +1", d)
	}

	// Many flows: each stays on the member of its slot, and every member gets some.
	first := map[uint16]netip.Addr{}
	per := map[netip.Addr]int{}
	for i := range uint16(flows) {
		sport := 20000 + i
		a, b := outerDst(t, l, sport), outerDst(t, l, sport)
		if a != b {
			t.Fatalf("flow %d went to %v, then to %v", sport, a, b)
		}
		s := flowHash(podFrame(l, groupDst, sport)[14:]) % 64
		if a != members[s%uint32(len(members))] {
			t.Fatalf("flow %d (slot %d) went to %v, slot owner is %v", sport, s, a, members[s%3])
		}
		first[sport] = a
		per[a]++
	}
	for _, m := range members {
		if per[m] < flows/len(members)/2 {
			t.Errorf("member %v got %d of %d flows: the slots do not spread flows (%v)", m, per[m], flows, per)
		}
	}

	// One slot changes owner: exactly the flows of that slot move, to the new owner.
	moved := slot
	g.Slots[moved] = be32(members[(int(moved)+1)%len(members)])
	withGroup(t, l, g)
	nMoved := 0
	for sport, was := range first {
		now := outerDst(t, l, sport)
		s := flowHash(podFrame(l, groupDst, sport)[14:]) % 64
		switch {
		case s == moved && now != netip.AddrFrom4([4]byte(binary.NativeEndian.AppendUint32(nil, g.Slots[moved]))):
			t.Errorf("flow %d of the changed slot went to %v, want the new owner", sport, now)
		case s == moved:
			nMoved++
		case now != was:
			t.Errorf("flow %d (slot %d, unchanged) moved from %v to %v", sport, s, was, now)
		}
	}
	if nMoved == 0 {
		t.Fatalf("no flow of %d fell in slot %d: the test proves nothing", flows, moved)
	}

	// No live member (no gateway reaches the site): dropped and counted, and the
	// pod gets ICMP net unreachable, nothing goes to the underlay.
	withGroup(t, l, IsthmusNexthopGroup{})
	before = l.counts(t)
	noPath := podFrame(l, groupDst, 1234)
	ret, out = l.run(t, l.objs.PodIngress, noPath, l.pod.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("live 0: verdict %d, want TC_ACT_REDIRECT (ICMP net unreachable to the pod)", ret)
	}
	if want := ethFrame(podMAC, l.podHMAC, 0x0800, icmpUnreachable(noPath[14:], 0, 0)); !bytes.Equal(out, want) {
		t.Fatalf("live 0: reply differs\n got %x\nwant %x", out, want)
	}
	if out[34] != 3 || out[35] != 0 || csum16(out[34:]) != 0 || !bytes.Equal(out[26:30], noPath[30:34]) {
		t.Errorf("live 0: ICMP type %d code %d from %x (checksum ok %v), want 3/0 from the destination", out[34], out[35], out[26:30], csum16(out[34:]) == 0)
	}
	k := dropKey(IsthmusDropReasonDROP_NO_NEXTHOP, IsthmusHookHOOK_POD_INGRESS)
	sent := metricKey(IsthmusMetricMETRIC_NO_PATH_UNREACH_SENT, IsthmusHookHOOK_POD_INGRESS)
	if d := delta(before, l.counts(t)); d[k] != 1 || d[sent] != 1 || len(d) != 2 {
		t.Errorf("live 0: counters moved %v, want %v and %v +1", d, k, sent)
	}
	// An ICMP error is never answered with one (RFC 1122): dropped, counted.
	// (The pod's port unreachable about a datagram groupDst sent it.)
	unreach := ethFrame(l.podHMAC, podMAC, 0x0800, icmpUnreachable(ipv4Packet(groupDst, podIP, 17, ipOpts{ttl: 64}, udpDatagram(53, 4321, nil)), 3, 0))
	before = l.counts(t)
	if ret, _ := l.run(t, l.objs.PodIngress, unreach, l.pod.Attrs().Index); ret != tcActShot {
		t.Fatalf("live 0, ICMP error: verdict %d, want TC_ACT_SHOT", ret)
	}
	if d := delta(before, l.counts(t)); d[k] != 1 || len(d) != 1 {
		t.Errorf("live 0, ICMP error: counters moved %v, want only %v +1", d, k)
	}
	// Host traffic takes the same path.
	before = l.counts(t)
	if ret, _ := l.run(t, l.objs.OverlayEgress, podFrame(l, groupDst, 1234), l.ist.Attrs().Index); ret != tcActShot {
		t.Fatalf("live 0 on overlay_egress: verdict %d, want TC_ACT_SHOT", ret)
	}
	k = dropKey(IsthmusDropReasonDROP_NO_NEXTHOP, IsthmusHookHOOK_OVERLAY_EGRESS)
	if d := delta(before, l.counts(t)); d[k] != 1 || len(d) != 1 {
		t.Errorf("live 0 on overlay_egress: counters moved %v, want only %v +1", d, k)
	}
}

// withFabric adds the fabric router on und0, routes 10.0.0.0/16 through it (so both
// fabricDst and outsideDst have a FIB next hop there) and 10.0.8.0/24 into ist0, and
// puts fabricNet (and 10.0.8.0/24) in fabric_prefixes.
func withFabric(t *testing.T, l *lab) {
	t.Helper()
	err := inNS(l.ns, func() error {
		n := &netlink.Neigh{LinkIndex: l.und.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: fabricGW.AsSlice(), HardwareAddr: fabricMAC}
		if err := netlink.NeighAdd(n); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4(10, 0, 0, 0), Mask: net.CIDRMask(16, 32)},
			Gw: fabricGW.AsSlice(), LinkIndex: l.und.Attrs().Index}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4(10, 0, 8, 0), Mask: net.CIDRMask(24, 32)},
			LinkIndex: l.ist.Attrs().Index, Scope: netlink.SCOPE_LINK})
	})
	if err != nil {
		t.Fatalf("add fabric routes: %v", err)
	}
	for _, p := range []netip.Prefix{fabricNet, netip.MustParsePrefix("10.0.8.0/24")} {
		k := IsthmusRouteKey{Prefixlen: uint32(p.Bits()), Addr: be32(p.Addr())}
		if err := l.objs.FabricPrefixes.Put(k, IsthmusFabricPrefixValue{}); err != nil {
			t.Fatalf("put fabric prefix: %v", err)
		}
	}
}

func TestFabricDelivery(t *testing.T) {
	l := newLab(t)
	withFabric(t, l)

	o := goodOpts(fabricDst)
	in := geneveFrame(l, o, innerEth(innerIPv4(o)))
	before := l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT toward the fabric", ret)
	}
	// The inner packet, TTL 63, addressed to the fabric router from und0.
	want := ethFrame(fabricMAC, l.undMAC, 0x0800,
		ipv4Packet(remotePodIP, fabricDst, 17, ipOpts{ttl: 63}, udpDatagram(4000, 5000, []byte("payload"))))
	if !bytes.Equal(out, want) {
		t.Fatalf("fabric frame differs\n got %x\nwant %x", out, want)
	}
	d := delta(before, l.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 ||
		d[metricKey(IsthmusMetricMETRIC_DELIVER_FABRIC, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 2 {
		t.Errorf("counters moved %v, want METRIC_DECAP and METRIC_DELIVER_FABRIC +1", d)
	}

	for _, tc := range []struct {
		name   string
		dst    netip.Addr
		ttl    byte
		reason IsthmusDropReason
	}{
		// Same FIB next hop, but not a fabric prefix: the map decides, not the route.
		{"outside fabric_prefixes", outsideDst, 64, IsthmusDropReasonDROP_NOT_LOCAL},
		// A fabric prefix whose route leads back into isthmus0 would loop.
		{"fabric prefix routed into isthmus0", netip.MustParseAddr("10.0.8.1"), 64, IsthmusDropReasonDROP_NOT_LOCAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := goodOpts(tc.dst)
			inner := ipv4Packet(o.innerSrc, o.innerDst, 17, ipOpts{ttl: tc.ttl}, udpDatagram(4000, 5000, []byte("payload")))
			before := l.counts(t)
			if ret, _ := l.run(t, l.objs.UnderlayIngress, geneveFrame(l, o, innerEth(inner)), l.und.Attrs().Index); ret != tcActShot {
				t.Fatalf("verdict %d, want TC_ACT_SHOT", ret)
			}
			d := delta(before, l.counts(t))
			if k := dropKey(tc.reason, IsthmusHookHOOK_UNDERLAY_TC); d[k] != 1 ||
				d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 2 {
				t.Errorf("counters moved %v, want METRIC_DECAP and %v +1", d, k)
			}
		})
	}

	// TTL 1 for the fabric: forwarding it is a hop, answered as one (decap_expires).
	t.Run("TTL 1", func(t *testing.T) {
		setTunnelIP(t, l, hostIP)
		o := goodOpts(fabricDst)
		inner := ipv4Packet(o.innerSrc, o.innerDst, 17, ipOpts{ttl: 1}, udpDatagram(4000, 5000, []byte("payload")))
		wantDecapTimeExceeded(t, l, inner, geneveFrame(l, o, innerEth(inner)))
	})
}

// plainFrame is an overlay packet as the site fabric hands it to this node: plain
// IPv4 on the underlay device, from the site router (the neighbour toward the peers,
// the only one fabric ingress takes remote sources from: TestFabricIngressNeighbour).
// scapy: Ether(dst=<und0 MAC>, src="02:00:00:00:01:fe")/IP(src=src, dst=dst, ttl=ttl)/UDP(sport=4000, dport=5000, chksum=0)/b"payload"
func plainFrame(l *lab, src, dst netip.Addr, ttl byte) []byte {
	return ethFrame(l.undMAC, gwMAC, 0x0800,
		ipv4Packet(src, dst, 17, ipOpts{ttl: ttl}, udpDatagram(4000, 5000, []byte("payload"))))
}

func TestFabricIngress(t *testing.T) {
	l := newLab(t)
	withFabric(t, l)
	// The local pod is in this site's declared block.
	k := IsthmusRouteKey{Prefixlen: 16, Addr: be32(netip.MustParseAddr("10.1.0.0"))}
	if err := l.objs.FabricPrefixes.Put(k, IsthmusFabricPrefixValue{}); err != nil {
		t.Fatalf("put fabric prefix: %v", err)
	}

	// A UDP datagram opens a flow: through isthmus0 into the stack, marked, TTL left
	// to the stack.
	before := l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayIngress, plainFrame(l, remotePodIP, podIP, 63), l.und.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT (to isthmus0 ingress)", ret)
	}
	want := ethFrame(l.istMAC, gwMAC, 0x0800,
		ipv4Packet(remotePodIP, podIP, 17, ipOpts{ttl: 63}, udpDatagram(4000, 5000, []byte("payload"))))
	if !bytes.Equal(out, want) || l.mark != overlayMark {
		t.Fatalf("delivered frame differs or mark %#x (want %#x)\n got %x\nwant %x", l.mark, overlayMark, out, want)
	}
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_FABRIC_INGRESS, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
		t.Errorf("counters moved %v, want only METRIC_FABRIC_INGRESS +1", d)
	}

	// A TCP segment from the site router: a SYN-ACK passes the stack like the
	// datagram, even of a flow conntrack holds as established; an ACK of that flow
	// goes by bpf_redirect_peer to the pod, TTL decremented, no mark.
	// scapy: Ether(dst=<und0 MAC>, src="02:00:00:00:01:fe")/IP(src="10.2.0.7", dst="10.1.0.5", ttl=63)/TCP(sport=80, dport=33000, flags=flags)
	l.ctEstablished(t, tuple{podIP, remotePodIP, 33000, 80})
	for _, seg := range []struct {
		name   string
		flags  byte
		direct bool
	}{
		{"SYN-ACK", tcpSYNACK, false},
		{"ACK", tcpACK, true},
	} {
		ip := func(ttl byte) []byte {
			return ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: ttl}, withCsum(remotePodIP, podIP, 6, tcpSegment(80, 33000, seg.flags, nil)))
		}
		before = l.counts(t)
		ret, out = l.run(t, l.objs.UnderlayIngress, ethFrame(l.undMAC, gwMAC, 0x0800, ip(63)), l.und.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("%s: verdict %d, want TC_ACT_REDIRECT", seg.name, ret)
		}
		counted := map[IsthmusMetricsKey]uint64{metricKey(IsthmusMetricMETRIC_FABRIC_INGRESS, IsthmusHookHOOK_UNDERLAY_TC): 1}
		want, mark := ethFrame(l.istMAC, gwMAC, 0x0800, ip(63)), uint32(overlayMark)
		if seg.direct {
			want, mark = ethFrame(podMAC, l.podHMAC, 0x0800, ip(62)), 0
			counted[metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_UNDERLAY_TC)] = 1
		}
		if !bytes.Equal(out, want) || l.mark != mark {
			t.Fatalf("%s: delivered frame differs or mark %#x (want %#x)\n got %x\nwant %x", seg.name, l.mark, mark, out, want)
		}
		if d := delta(before, l.counts(t)); !maps.Equal(d, counted) {
			t.Errorf("%s: counters moved %v, want %v", seg.name, d, counted)
		}
	}

	// A node of this site on the underlay: the overlay map routes its address to it
	// as a peer, but this node routes it out of und0 (192.168.1.0/24), where strict
	// rp_filter accepts its packets. Through isthmus0 they would be dropped.
	siteNode := netip.MustParseAddr("192.168.1.7")
	putRoute(t, l, netip.PrefixFrom(siteNode, 32), IsthmusRouteValue{Peer: be32(siteNode)})

	// Everything else passes untouched and counts nothing.
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"source not an overlay prefix", plainFrame(l, netip.MustParseAddr("192.168.1.50"), podIP, 63)},
		{"source a peer this node routes on the underlay", plainFrame(l, siteNode, podIP, 63)},
		{"source in this site's own block", plainFrame(l, netip.MustParseAddr("10.0.2.7"), podIP, 63)},
		{"destination not a fabric prefix", plainFrame(l, remotePodIP, netip.MustParseAddr("10.7.0.1"), 63)},
		{"destination this node", plainFrame(l, remotePodIP, underlayIP, 63)},
		{"fabric destination not on a pod interface", plainFrame(l, remotePodIP, fabricDst, 63)},
		{"TTL 1 (the stack answers)", plainFrame(l, remotePodIP, podIP, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayIngress, tc.in, l.und.Attrs().Index)
			if d := delta(before, l.counts(t)); ret != tcActOK || !bytes.Equal(out, tc.in) || len(d) != 0 {
				t.Fatalf("verdict %d, changed %v, counters %v; want TC_ACT_OK, untouched, none", ret, !bytes.Equal(out, tc.in), d)
			}
		})
	}
}
