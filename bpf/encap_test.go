package bpf

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"maps"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

const (
	tcActOK       = 0
	tcActShot     = 2
	tcActRedirect = 7
	xdpDrop       = 1
	xdpPass       = 2
)

// flowSport is the Go twin of flow_sport in lib/hash.h.
func flowSport(ip []byte) uint16 {
	return 49152 + uint16(flowHash(ip)%16384)
}

// flowHash is the Go twin of flow_hash in lib/hash.h: jhash_3words over the raw
// (little-endian loaded, as on bpfel) source, destination and ports+protocol words.
func flowHash(ip []byte) uint32 {
	const seed = 0x15743b5d
	ihl := int(ip[0]&0x0f) * 4
	proto := ip[9]
	var ports uint32
	frag := binary.BigEndian.Uint16(ip[6:]) & 0x3fff
	if (proto == 6 || proto == 17) && frag == 0 && len(ip) >= ihl+4 {
		ports = binary.LittleEndian.Uint32(ip[ihl:])
	}
	return jhash3(binary.LittleEndian.Uint32(ip[12:]), binary.LittleEndian.Uint32(ip[16:]), ports+uint32(proto), seed)
}

func rol32(x uint32, k uint) uint32 { return x<<k | x>>(32-k) }

func jhash3(a, b, c, initval uint32) uint32 {
	initval += 0xdeadbeef + 3<<2
	a += initval
	b += initval
	c += initval
	c ^= b
	c -= rol32(b, 14)
	a ^= c
	a -= rol32(c, 11)
	b ^= a
	b -= rol32(a, 25)
	c ^= b
	c -= rol32(b, 16)
	a ^= c
	a -= rol32(c, 4)
	b ^= a
	b -= rol32(a, 14)
	c ^= b
	c -= rol32(b, 24)
	return c
}

// podFrame is a pod's TCP segment (ACK) as it arrives on the host veth. pod_ingress
// encapsulates it itself only if conntrack holds its flow as established
// (podFlow, lab.ctEstablished); otherwise it goes through the stack
// (TestPodEgressThroughStack).
// scapy: Ether(dst=<pod0h MAC>, src="02:00:00:00:0a:05")/IP(src="10.1.0.5", dst=dst, tos=0x10, ttl=64)/TCP(sport=sport, dport=80, flags="A", window=65535, chksum=0)/b"hello"
func podFrame(l *lab, dst netip.Addr, sport uint16) []byte {
	return ethFrame(l.podHMAC, podMAC, 0x0800, podPacket(dst, sport, 64))
}

// podFlow is the TCP flow of podFrame(l, dst, sport).
func podFlow(dst netip.Addr, sport uint16) tuple { return tuple{podIP, dst, sport, 80} }

// podPacket is podFrame's IPv4 packet with TTL ttl.
func podPacket(dst netip.Addr, sport uint16, ttl byte) []byte {
	return ipv4Packet(podIP, dst, 6, ipOpts{tos: 0x10, ttl: ttl}, tcpSegment(sport, 80, 0x10, []byte("hello")))
}

// TestEncapByteExact: the GENEVE frame built at pod_ingress (the direct path of an
// established flow) and at overlay_egress (after the stack), byte for byte.
func TestEncapByteExact(t *testing.T) {
	l := newLab(t)
	l.ctEstablished(t, podFlow(remotePodIP, 1234))
	for _, tc := range []struct {
		name      string
		hook      IsthmusHook
		innerTTL  byte
		ifindex   func() int
		programOf func() interface{}
	}{
		{name: "pod_ingress", hook: IsthmusHookHOOK_POD_INGRESS, innerTTL: 63},
		{name: "overlay_egress", hook: IsthmusHookHOOK_OVERLAY_EGRESS, innerTTL: 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog, ifindex := l.objs.PodIngress, l.pod.Attrs().Index
			if tc.hook == IsthmusHookHOOK_OVERLAY_EGRESS {
				prog, ifindex = l.objs.OverlayEgress, l.ist.Attrs().Index
			}
			in := podFrame(l, remotePodIP, 1234)
			before := l.counts(t)
			ret, out := l.run(t, prog, in, ifindex)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}

			innerIP := podPacket(remotePodIP, 1234, tc.innerTTL)
			innerFrame := append(append([]byte{}, in[:14]...), innerIP...)
			sport := flowSport(in[14:])
			gnv := geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, innerFrame)
			udp := udpDatagram(sport, 6081, gnv)
			outerIP := ipv4Packet(underlayIP, peerIP, 17, ipOpts{tos: 0x10, ttl: 64, fragOff: 0x4000}, udp)
			want := ethFrame(gwMAC, l.undMAC, 0x0800, outerIP)
			if !bytes.Equal(out, want) {
				t.Fatalf("encapsulated frame differs\n got %s\nwant %s", hex.EncodeToString(out), hex.EncodeToString(want))
			}
			// Independent checks of what the byte comparison implies.
			if csum16(out[14:34]) != 0 {
				t.Errorf("outer IPv4 header checksum does not verify")
			}
			if csum16(out[64:84]) != 0 {
				t.Errorf("inner IPv4 header checksum does not verify")
			}
			if got := binary.BigEndian.Uint16(out[16:]); int(got) != len(in)-14+50 {
				t.Errorf("outer total length %d, want %d", got, len(in)-14+50)
			}
			if out[22] != 64 || binary.BigEndian.Uint16(out[20:])&0x4000 == 0 {
				t.Errorf("outer TTL %d / DF unset", out[22])
			}
			// pod_ingress took the direct path (counted as ct_fast); overlay_egress
			// runs after the stack and consults no conntrack.
			d := delta(before, l.counts(t))
			counted := map[IsthmusMetricsKey]uint64{metricKey(IsthmusMetricMETRIC_ENCAP, tc.hook): 1}
			if tc.hook == IsthmusHookHOOK_POD_INGRESS {
				counted[metricKey(IsthmusMetricMETRIC_CT_FAST, tc.hook)] = 1
			}
			if !maps.Equal(d, counted) {
				t.Errorf("counters moved %v, want %v", d, counted)
			}
		})
	}
}

// TestEncapSourcePort: the outer UDP source port is the flow hash, stable per flow,
// spread over flows, and the same for every fragment of a datagram.
func TestEncapSourcePort(t *testing.T) {
	l := newLab(t)
	sportOf := func(in []byte) uint16 {
		ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
		if ret != tcActRedirect || len(out) < 36 {
			t.Fatalf("verdict %d, %d bytes", ret, len(out))
		}
		return binary.BigEndian.Uint16(out[34:])
	}
	seen := map[uint16]bool{}
	for i := uint16(0); i < 64; i++ {
		l.ctEstablished(t, podFlow(remotePodIP, 20000+i))
		in := podFrame(l, remotePodIP, 20000+i)
		p1, p2 := sportOf(in), sportOf(podFrame(l, remotePodIP, 20000+i))
		if p1 != p2 {
			t.Fatalf("flow %d: source port changed between runs: %d then %d", i, p1, p2)
		}
		if twin := flowSport(in[14:]); p1 != twin {
			t.Fatalf("flow %d: source port %d, Go twin says %d", i, p1, twin)
		}
		if p1 < 49152 {
			t.Fatalf("flow %d: source port %d below 49152", i, p1)
		}
		seen[p1] = true
	}
	if len(seen) < 48 {
		t.Errorf("64 flows used only %d source ports: the hash does not spread", len(seen))
	}
	// A fragment has no ports: its port depends on addresses and protocol only. It
	// passes the stack (podSend fails the test otherwise) and is encapsulated at
	// overlay_egress.
	fragSport := func(in []byte) uint16 {
		ret, out, _, hook := l.podSend(t, in)
		if ret != tcActRedirect || hook != IsthmusHookHOOK_OVERLAY_EGRESS || len(out) < 36 {
			t.Fatalf("fragment: hook %d, verdict %d, %d bytes; want encapsulated at overlay_egress", hook, ret, len(out))
		}
		return binary.BigEndian.Uint16(out[34:])
	}
	frag := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64, fragOff: 0x2000}, udpDatagram(1, 2, []byte("x"))))
	frag2 := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64, fragOff: 0x2000}, udpDatagram(3, 4, []byte("x"))))
	if a, b := fragSport(frag), fragSport(frag2); a != b || a != flowSport(frag[14:]) {
		t.Errorf("fragments of one datagram got ports %d and %d (twin %d)", a, b, flowSport(frag[14:]))
	}
}

func TestEncapDrops(t *testing.T) {
	l := newLab(t)
	for _, tc := range []struct {
		name   string
		prog   func() (p interface{ String() string })
		in     []byte
		reason IsthmusDropReason
		hook   IsthmusHook
	}{
		{name: "no overlay route", in: podFrame(l, netip.MustParseAddr("10.77.0.1"), 9), reason: IsthmusDropReasonDROP_NO_OVERLAY_ROUTE, hook: IsthmusHookHOOK_OVERLAY_EGRESS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog, ifindex := l.objs.PodIngress, l.pod.Attrs().Index
			if tc.hook == IsthmusHookHOOK_OVERLAY_EGRESS {
				prog, ifindex = l.objs.OverlayEgress, l.ist.Attrs().Index
			}
			before := l.counts(t)
			if ret, _ := l.run(t, prog, tc.in, ifindex); ret != tcActShot {
				t.Fatalf("verdict %d, want TC_ACT_SHOT", ret)
			}
			d := delta(before, l.counts(t))
			if d[dropKey(tc.reason, tc.hook)] != 1 || len(d) != 1 {
				t.Errorf("counters moved %v, want only %v +1", d, dropKey(tc.reason, tc.hook))
			}
		})
	}
}

func TestPodIngressLocalDelivery(t *testing.T) {
	l := newLab(t)
	// scapy: Ether(dst=<pod0h MAC>, src="02:00:00:00:0a:09")/IP(src="10.1.0.9", dst="10.1.0.5", ttl=64)/UDP(sport=7, dport=7, chksum=0)/b"hi"
	other := net.HardwareAddr{0x02, 0, 0, 0, 0x0a, 0x09}
	src := netip.MustParseAddr("10.1.0.9")
	// A second pod on pod0h: pod_ingress takes only sources routed back there.
	if err := inNS(l.ns, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: src.AsSlice(), Mask: net.CIDRMask(32, 32)},
			LinkIndex: l.pod.Attrs().Index, Scope: netlink.SCOPE_LINK})
	}); err != nil {
		t.Fatalf("route the second pod: %v", err)
	}
	in := ethFrame(l.podHMAC, other, 0x0800, ipv4Packet(src, podIP, 17, ipOpts{ttl: 64}, udpDatagram(7, 7, []byte("hi"))))
	before := l.counts(t)
	ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
	// The stack forwards it, so conntrack, Service NAT and FORWARD see both halves of
	// a same-node flow; the mark keeps MASQUERADE off it.
	if ret != tcActOK || !bytes.Equal(out, in) {
		t.Fatalf("verdict %d, changed %v; want TC_ACT_OK, unchanged", ret, !bytes.Equal(out, in))
	}
	if l.mark != overlayMark {
		t.Errorf("skb mark %#x, want %#x", l.mark, overlayMark)
	}
	d := delta(before, l.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_POD_INGRESS)] != 1 || len(d) != 1 {
		t.Errorf("counters moved %v, want only METRIC_DELIVER_POD +1", d)
	}

	// Traffic for this host (no route entry, not a pod interface) goes to the stack untouched.
	toHost := ethFrame(l.podHMAC, other, 0x0800, ipv4Packet(src, hostIP, 17, ipOpts{ttl: 64}, udpDatagram(7, 7, nil)))
	ret, out = l.run(t, l.objs.PodIngress, toHost, l.pod.Attrs().Index)
	if ret != tcActOK || !bytes.Equal(out, toHost) || l.mark != 0 {
		t.Errorf("host-bound packet: verdict %d, changed %v, mark %#x; want TC_ACT_OK, unchanged, no mark", ret, !bytes.Equal(out, toHost), l.mark)
	}
	// Non-IPv4 passes untouched.
	arp := ethFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, other, 0x0806, make([]byte, 28))
	if ret, out = l.run(t, l.objs.PodIngress, arp, l.pod.Attrs().Index); ret != tcActOK || !bytes.Equal(out, arp) {
		t.Errorf("ARP: verdict %d; want TC_ACT_OK, unchanged", ret)
	}
}

// TestPodEgressThroughStack: a pod's packet for a remote pod that is not a non-SYN
// segment of a TCP flow conntrack holds as established (a SYN, even of such a flow; a
// segment of a flow conntrack does not hold; UDP; ICMP of either kind) is left to the
// stack, untouched and marked, so that the site's filters judge it and conntrack
// holds the flow after it; the stack forwards it into isthmus0, whose overlay_egress
// encapsulates it. A segment of an established flow is encapsulated at pod_ingress.
func TestPodEgressThroughStack(t *testing.T) {
	l := newLab(t)
	l.ctEstablished(t, podFlow(remotePodIP, 40000))
	for _, tc := range []struct {
		name  string
		proto byte
		l4    []byte
		stack bool
	}{
		{"TCP SYN", 6, tcpSegment(40000, 80, 0x02, nil), true},
		{"UDP", 17, udpDatagram(40000, 53, []byte("q")), true},
		{"ICMP echo request", 1, icmpEcho(8, 0x1234, 1, []byte("ping")), true},
		{"ICMP echo reply", 1, icmpEcho(0, 0x1234, 1, []byte("ping")), true},
		{"TCP ACK, no conntrack entry", 6, tcpSegment(40001, 80, 0x10, nil), true},
		{"TCP ACK, established", 6, tcpSegment(40000, 80, 0x10, nil), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, tc.proto, ipOpts{ttl: 64}, tc.l4))
			before := l.counts(t)
			ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
			if d := delta(before, l.counts(t)); tc.stack && (ret != tcActOK || l.mark&overlayMark == 0 || !bytes.Equal(out, in) || len(d) != 0) {
				t.Fatalf("verdict %d, mark %#x, frame changed %v, counters %v; want TC_ACT_OK, mark %#x, untouched, none counted",
					ret, l.mark, !bytes.Equal(out, in), d, overlayMark)
			}
			if !tc.stack && ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT (encapsulated at pod_ingress)", ret)
			}
			ret, out, fwd, hook := l.podSend(t, in)
			ip := ipv4Packet(podIP, remotePodIP, tc.proto, ipOpts{ttl: 63}, tc.l4)
			if want := encapsulated(l, fwd, ip); ret != tcActRedirect || !bytes.Equal(out, want) {
				t.Fatalf("hook %d: verdict %d, frame\n got %x\nwant %x", hook, ret, out, want)
			}
		})
	}
}
