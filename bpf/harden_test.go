package bpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// Tests of issue 10's hardening: frames shaped by an attacker, each built here byte by
// byte (or by scapy, the line beside each builder), and the verdicts the datapath
// must give them.

var forgedIP = netip.MustParseAddr("6.6.6.6")

// outerOptions is 40 bytes of outer IPv4 options: NOPs and an end-of-options byte,
// which every IPv4 stack accepts (RFC 791).
func outerOptions() []byte {
	o := bytes.Repeat([]byte{0x01}, 40)
	o[39] = 0x00
	return o
}

// smugglingOption is one non-critical GENEVE option of 40 data bytes whose data hold,
// from byte 14 on, a forged IPv4 header from 6.6.6.6 to dst and the start of a UDP
// header: where a pop that ignores 40 bytes of outer options would put the frame.
func smugglingOption(dst netip.Addr) []byte {
	forged := ipv4Packet(forgedIP, dst, 17, ipOpts{ttl: 64}, udpDatagram(6666, 5000, []byte("forged")))
	data := make([]byte, 40)
	copy(data[0:14], innerEth(nil)[:14])
	copy(data[14:], forged[:26])
	return append([]byte{0x01, 0x02, 0x03, 10}, data...) // class 0x0102, type 3, 10 words
}

// smugglingFrame is the frame of issue 10: a GENEVE frame from the peer whose outer
// IPv4 header carries 40 bytes of options and whose GENEVE option hides a forged
// header, followed by an ordinary inner frame with an allowed source.
// scapy: Ether(dst=<und0>, src="02:00:00:00:01:fe")/IP(src="192.168.2.2", dst="192.168.1.1", flags="DF", options=[IPOption(b"\x01"*39+b"\x00")])/UDP(sport=50000, dport=6081, chksum=0)/GENEVE(vni=0x123456, proto=0x6558, options=<smugglingOption>)/Ether()/IP(src="10.2.0.7", dst=dst)/UDP(sport=4000, dport=5000, chksum=0)/b"payload"
func smugglingFrame(l *lab, dst netip.Addr) ([]byte, []byte) {
	o := goodOpts(dst)
	o.gnv.options = smugglingOption(dst)
	inner := innerIPv4(o)
	outer := ipv4Packet(o.outerSrc, o.outerDst, 17, ipOpts{ttl: 64, fragOff: 0x4000},
		udpDatagram(50000, o.dport, geneveHeader(o.gnv, innerEth(inner))))
	return ethFrame(l.undMAC, gwMAC, 0x0800, withIPOptions(outer, outerOptions())), inner
}

// TestDecapOuterOptions: the pop must remove the real outer header, options and all,
// in TC and in XDP: what is left is the validated inner packet, never the forged one.
func TestDecapOuterOptions(t *testing.T) {
	l := newLab(t)
	in, inner := smugglingFrame(l, podIP)

	t.Run("tc", func(t *testing.T) {
		ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
		}
		// A UDP datagram opens a flow: it reaches the pod through the stack (isthmus0
		// ingress, TTL left to the stack's forwarding, the outer source MAC kept),
		// as TestDecapTC's "to pod".
		want := ethFrame(l.istMAC, gwMAC, 0x0800, inner)
		if !bytes.Equal(out, want) || l.mark != overlayMark {
			t.Fatalf("delivered packet is not the validated inner one, or mark %#x (want %#x)\n got %x\nwant %x", l.mark, overlayMark, out, want)
		}
	})
	t.Run("xdp", func(t *testing.T) {
		ret, out := l.run(t, l.objs.UnderlayXdp, in, 0)
		if ret != xdpPass {
			t.Fatalf("verdict %d, want XDP_PASS", ret)
		}
		if len(out) < 8+14 || !bytes.Equal(out[8+14:], inner) {
			t.Fatalf("popped packet is not the validated inner one\n got %x\nwant %x", out, inner)
		}
	})
}

// wantDrop runs prog on in and fails unless it is dropped with reason at hook and
// nothing else is counted.
func wantDrop(t *testing.T, l *lab, prog *ebpf.Program, ifindex int, in []byte, reason IsthmusDropReason, hook IsthmusHook) {
	t.Helper()
	before := l.counts(t)
	ret, _ := l.run(t, prog, in, ifindex)
	var shot uint32 = tcActShot
	if hook == IsthmusHookHOOK_UNDERLAY_XDP {
		shot = xdpDrop
	}
	if ret != shot {
		t.Fatalf("verdict %d, want a drop (%d)", ret, shot)
	}
	if d := delta(before, l.counts(t)); d[dropKey(reason, hook)] != 1 || len(d) != 1 {
		t.Fatalf("counters moved %v, want only %v +1", d, dropKey(reason, hook))
	}
}

// TestPodSourceSpoofed: a pod may send only from addresses that route back through
// its own interface (strict reverse path). A neighbour's address (behind another
// interface), an unrouted one and this host's own are dropped and counted, in every
// direction pod_ingress could take them: into the tunnel, to a local pod, to the host.
func TestPodSourceSpoofed(t *testing.T) {
	l := newLab(t)
	for _, tc := range []struct {
		name     string
		src, dst netip.Addr
	}{
		{"remote pod's source into the tunnel", remotePodIP, remotePodIP},
		{"unrouted source into the tunnel", netip.MustParseAddr("10.1.0.77"), remotePodIP},
		{"forged source into the tunnel", forgedIP, remotePodIP},
		{"host address as source", hostIP, remotePodIP},
		{"unrouted source to a local pod", netip.MustParseAddr("10.1.0.77"), podIP},
		{"unrouted source to the host", netip.MustParseAddr("10.1.0.77"), hostIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(tc.src, tc.dst, 17, ipOpts{ttl: 64}, udpDatagram(4000, 5000, []byte("spoof"))))
			wantDrop(t, l, l.objs.PodIngress, l.pod.Attrs().Index, in, IsthmusDropReasonDROP_POD_SRC_SPOOFED, IsthmusHookHOOK_POD_INGRESS)
		})
	}
	// The pod's own source still goes into the tunnel (a segment of an established
	// flow: encapsulated at pod_ingress).
	l.ctEstablished(t, podFlow(remotePodIP, 1234))
	if ret, _ := l.run(t, l.objs.PodIngress, podFrame(l, remotePodIP, 1234), l.pod.Attrs().Index); ret != tcActRedirect {
		t.Fatalf("own source: verdict %d, want TC_ACT_REDIRECT", ret)
	}
}

// TestPodGeneveToPeer: UDP from a pod to port 6081 of a peer's underlay address is
// dropped (a masquerading node would make it a tunnel frame from itself); the same to
// another port, or to port 6081 of an address that is no peer, is not.
func TestPodGeneveToPeer(t *testing.T) {
	l := newLab(t)
	frame := func(dst netip.Addr, dport uint16) []byte {
		gnv := geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1},
			innerEth(ipv4Packet(forgedIP, podIP, 17, ipOpts{ttl: 64}, udpDatagram(1, 2, nil))))
		return ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, dst, 17, ipOpts{ttl: 64}, udpDatagram(50000, dport, gnv)))
	}
	wantDrop(t, l, l.objs.PodIngress, l.pod.Attrs().Index, frame(peerIP, 6081), IsthmusDropReasonDROP_POD_GENEVE, IsthmusHookHOOK_POD_INGRESS)
	for _, in := range [][]byte{frame(peerIP, 6082), frame(strangerIP, 6081)} {
		before := l.counts(t)
		if ret, _ := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index); ret != tcActOK {
			t.Errorf("verdict %d, want TC_ACT_OK (left to the stack)", ret)
		}
		if d := delta(before, l.counts(t)); len(d) != 0 {
			t.Errorf("counters moved %v, want none", d)
		}
	}
}

// geneveFrameWith is geneveFrame with the outer IPv4 options o (tos, fragment bits) and
// GENEVE header bytes changed by edit (nil: none).
func geneveFrameWith(l *lab, fo frameOpts, o ipOpts, inner []byte, edit func(gnv []byte)) []byte {
	gnv := geneveHeader(fo.gnv, inner)
	if edit != nil {
		edit(gnv)
	}
	return ethFrame(l.undMAC, gwMAC, 0x0800, ipv4Packet(fo.outerSrc, fo.outerDst, 17, o, udpDatagram(50000, fo.dport, gnv)))
}

// bothHooks runs fn for underlay_ingress (TC) and underlay_xdp.
func bothHooks(t *testing.T, l *lab, fn func(t *testing.T, prog *ebpf.Program, ifindex int, hook IsthmusHook)) {
	t.Run("tc", func(t *testing.T) { fn(t, l.objs.UnderlayIngress, l.und.Attrs().Index, IsthmusHookHOOK_UNDERLAY_TC) })
	t.Run("xdp", func(t *testing.T) { fn(t, l.objs.UnderlayXdp, 0, IsthmusHookHOOK_UNDERLAY_XDP) })
}

// TestGeneveControlFrame: a frame with the O bit is a control message for the tunnel
// endpoint (RFC 8926 3.4), never data for a pod: dropped and counted, in TC and XDP.
func TestGeneveControlFrame(t *testing.T) {
	l := newLab(t)
	o := goodOpts(podIP)
	in := geneveFrameWith(l, o, ipOpts{ttl: 64, fragOff: 0x4000}, innerEth(innerIPv4(o)), func(g []byte) { g[1] |= 0x80 })
	bothHooks(t, l, func(t *testing.T, prog *ebpf.Program, ifindex int, hook IsthmusHook) {
		wantDrop(t, l, prog, ifindex, in, IsthmusDropReasonDROP_GENEVE_OAM, hook)
	})
}

// TestOuterFragment: the first fragment of a GENEVE datagram to this node is counted
// and dropped (the stack would reassemble it for a port nobody listens on, and lose
// it uncounted); a later fragment (no ports to tell) is left to the stack.
func TestOuterFragment(t *testing.T) {
	l := newLab(t)
	o := goodOpts(podIP)
	first := geneveFrameWith(l, o, ipOpts{ttl: 64, fragOff: 0x2000}, innerEth(innerIPv4(o)), nil)
	bothHooks(t, l, func(t *testing.T, prog *ebpf.Program, ifindex int, hook IsthmusHook) {
		wantDrop(t, l, prog, ifindex, first, IsthmusDropReasonDROP_OUTER_FRAGMENT, hook)
	})
	later := ethFrame(l.undMAC, gwMAC, 0x0800, ipv4Packet(peerIP, underlayIP, 17, ipOpts{ttl: 64, fragOff: 185}, bytes.Repeat([]byte{0xab}, 64)))
	if ret, out := l.run(t, l.objs.UnderlayIngress, later, l.und.Attrs().Index); ret != tcActOK || !bytes.Equal(out, later) {
		t.Errorf("later fragment: verdict %d, changed %v; want TC_ACT_OK, untouched", ret, !bytes.Equal(out, later))
	}
}

// setTunnelIP writes addr as the node's tunnel address (the overlay address host
// delivery accepts) into the lab's config.
func setTunnelIP(t *testing.T, l *lab, addr netip.Addr) {
	t.Helper()
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	cfg.TunnelIp = be32(addr)
	if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatalf("write config: %v", err)
	}
}

// TestDecapHostDelivery: a decapsulated packet reaches this host's stack only when it
// is for the node's tunnel address or its underlay address (a peer's pods reach that
// through the tunnel, as this node answers them: issue 11); loopback and broadcasts
// are local too, but a peer has no business sending there through the tunnel.
func TestDecapHostDelivery(t *testing.T) {
	l := newLab(t)
	setTunnelIP(t, l, hostIP)
	for _, tc := range []struct {
		name string
		dst  netip.Addr
		drop bool
	}{
		{"tunnel address", hostIP, false},
		{"loopback", netip.MustParseAddr("127.0.0.1"), true},
		{"limited broadcast", netip.MustParseAddr("255.255.255.255"), true},
		{"underlay address", underlayIP, false},
		{"underlay subnet broadcast", netip.MustParseAddr("192.168.1.255"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := goodOpts(tc.dst)
			in := geneveFrame(l, o, innerEth(innerIPv4(o)))
			if !tc.drop {
				if ret, _ := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index); ret != tcActRedirect {
					t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
				}
				return
			}
			before := l.counts(t)
			if ret, _ := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index); ret != tcActShot {
				t.Fatalf("verdict %d, want TC_ACT_SHOT", ret)
			}
			d := delta(before, l.counts(t))
			if d[dropKey(IsthmusDropReasonDROP_NOT_LOCAL, IsthmusHookHOOK_UNDERLAY_TC)] != 1 {
				t.Fatalf("counters moved %v, want DROP_NOT_LOCAL +1", d)
			}
		})
	}
}

// TestDecapECN: RFC 6040 normal mode. Outer CE on an ECN-capable inner packet becomes
// inner CE (header checksum still right); outer CE on a Not-ECT inner packet is
// dropped, as Linux tunnels do; other outer codepoints leave the inner one alone.
func TestDecapECN(t *testing.T) {
	l := newLab(t)
	for _, tc := range []struct {
		name               string
		outerTOS, innerTOS byte
		wantTOS            byte
		drop               bool
	}{
		{"CE onto ECT(0)", 0x03, 0x02, 0x03, false},
		{"CE onto ECT(1) with DSCP", 0xb8 | 0x03, 0x28 | 0x01, 0x28 | 0x03, false},
		{"ECT(0) outer leaves inner", 0x02, 0x01, 0x01, false},
		{"CE onto Not-ECT", 0x03, 0x00, 0, true},
	} {
		o := goodOpts(podIP)
		innerIP := ipv4Packet(o.innerSrc, o.innerDst, 17, ipOpts{ttl: 64, tos: tc.innerTOS}, udpDatagram(4000, 5000, []byte("payload")))
		in := geneveFrameWith(l, o, ipOpts{ttl: 64, fragOff: 0x4000, tos: tc.outerTOS}, innerEth(innerIP), nil)
		t.Run(tc.name, func(t *testing.T) {
			bothHooks(t, l, func(t *testing.T, prog *ebpf.Program, ifindex int, hook IsthmusHook) {
				if tc.drop {
					wantDrop(t, l, prog, ifindex, in, IsthmusDropReasonDROP_ECN_NOT_ECT, hook)
					return
				}
				_, out := l.run(t, prog, in, ifindex)
				ip := out[len(out)-len(innerIP):]
				if ip[1] != tc.wantTOS {
					t.Errorf("inner TOS %#02x, want %#02x", ip[1], tc.wantTOS)
				}
				if c := csum16(ip[:20]); c != 0 {
					t.Errorf("inner IPv4 header checksum does not verify (residue %#04x)", c)
				}
			})
		})
	}
}

// TestMSSClampOddOffset: an MSS option after a single NOP sits at an odd offset in
// the segment; its 16-bit value straddles two checksum words, and the clamp must
// still leave a checksum that verifies.
func TestMSSClampOddOffset(t *testing.T) {
	l := newLab(t)
	opts := []byte{1, 2, 4, 0x05, 0xb4, 1, 1, 0} // NOP, MSS 1460, NOP, NOP, EOL
	seg := tcpWithOptions(podIP, remotePodIP, 40000, 80, tcpSYN, opts)
	in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 6, ipOpts{ttl: 64, fragOff: 0x4000}, seg))
	ret, out, _, _ := l.podSend(t, in)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
	}
	gotSeg := out[len(out)-len(seg):]
	if mss := binary.BigEndian.Uint16(gotSeg[23:]); mss != tunnelMTU-40 {
		t.Errorf("MSS %d, want %d", mss, tunnelMTU-40)
	}
	if c := tcpChecksum(podIP, remotePodIP, gotSeg); c != 0 {
		t.Errorf("inner TCP checksum does not verify after the clamp (residue %#04x)", c)
	}
}

// runGSO runs prog on in as a GSO skb with gso_size (BPF_PROG_TEST_RUN takes it from
// struct __sk_buff: ifindex at byte 40, gso_segs at 164, gso_size at 176, 192 bytes).
func (l *lab) runGSO(t *testing.T, prog *ebpf.Program, in []byte, ifindex int, gsoSize, gsoSegs uint32) (uint32, []byte) {
	t.Helper()
	ctx := make([]byte, 192)
	binary.NativeEndian.PutUint32(ctx[40:], uint32(ifindex))
	binary.NativeEndian.PutUint32(ctx[164:], gsoSegs)
	binary.NativeEndian.PutUint32(ctx[176:], gsoSize)
	return l.runCtx(t, prog, in, ctx)
}

// TestGSOTunnelMTU: a pod's TCP GSO packet whose segments (40 bytes of headers plus
// gso_size) would not fit the tunnel gets ICMP frag needed, like a plain packet of
// that size; one whose segments fit is encapsulated (its flow is established: the
// direct path).
func TestGSOTunnelMTU(t *testing.T) {
	l := newLab(t)
	l.ctEstablished(t, tuple{podIP, remotePodIP, 40000, 80})
	// scapy: Ether(dst=<pod0h MAC>, src="02:00:00:00:0a:05")/IP(src="10.1.0.5", dst="10.2.0.7", ttl=64, flags="DF")/TCP(sport=40000, dport=80, flags="A")/(b"\x00"*2896)
	seg := tcpSegment(40000, 80, tcpACK, make([]byte, 2896))
	in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 6, ipOpts{ttl: 64, fragOff: 0x4000}, seg))
	fits := uint32(tunnelMTU) - 40

	before := l.counts(t)
	ret, out := l.runGSO(t, l.objs.PodIngress, in, l.pod.Attrs().Index, fits+38, 2)
	if ret != tcActRedirect {
		t.Fatalf("too big: verdict %d, want TC_ACT_REDIRECT (ICMP back to the pod)", ret)
	}
	want := icmpFragNeeded(in[14:], tunnelMTU)
	if len(out) < 14 || !bytes.Equal(out[14:], want) {
		t.Fatalf("too big: reply is not ICMP frag needed\n got %x\nwant %x", out, want)
	}
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_FRAG_NEEDED_SENT, IsthmusHookHOOK_POD_INGRESS)] != 1 || len(d) != 1 {
		t.Fatalf("too big: counters moved %v, want only METRIC_FRAG_NEEDED_SENT +1", d)
	}

	// Segments that fit pass the check. A test run cannot set gso_type (TCPv4), and
	// bpf_skb_adjust_room refuses to grow a GSO skb without it, so encapsulation itself
	// fails here (DROP_ENCAP_FAILED); the lab's bulk TCP tests cover the real thing.
	before = l.counts(t)
	l.runGSO(t, l.objs.PodIngress, in, l.pod.Attrs().Index, fits, 3)
	d := delta(before, l.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_FRAG_NEEDED_SENT, IsthmusHookHOOK_POD_INGRESS)] != 0 ||
		d[dropKey(IsthmusDropReasonDROP_FRAG_NEEDED, IsthmusHookHOOK_POD_INGRESS)] != 0 ||
		d[metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_POD_INGRESS)]+d[dropKey(IsthmusDropReasonDROP_ENCAP_FAILED, IsthmusHookHOOK_POD_INGRESS)] != 1 {
		t.Fatalf("fits: counters moved %v; want it past the MTU check, at encapsulation", d)
	}
}

// TestSNATHalfClosed: after the pod's FIN the remote side may go on sending for as
// long as it likes (a half-closed connection, RFC 9293 3.6.1): the translation keeps
// the established timeout until both sides have sent FIN, and only then closes.
func TestSNATHalfClosed(t *testing.T) {
	l := natLab(t, 40000, 40009, nil)
	tcp := func(src, dst netip.Addr, sport, dport uint16, flags byte) []byte {
		return withCsum(src, dst, 6, tcpSegment(sport, dport, flags, nil))
	}
	out := func(flags byte) {
		in := fromPod(l, podMAC, podIP, remotePodIP, 6, tcp(podIP, remotePodIP, 33000, 80, flags))
		sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 6, ipOpts{ttl: 63}, tcp(tunnelIP, remotePodIP, 33000, 80, flags)))
	}
	// back delivers the remote side's segment, translated back: a SYN-ACK through the
	// stack, the segments of the established flow straight to the pod.
	back := func(flags byte) {
		want := toPod(l, podMAC, ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 63}, tcp(remotePodIP, podIP, 80, 33000, flags)))
		if flags&tcpSYN != 0 {
			want = toStack(l, ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 64}, tcp(remotePodIP, podIP, 80, 33000, flags)))
		}
		sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, 6, ipOpts{ttl: 64}, tcp(remotePodIP, tunnelIP, 80, 33000, flags))), want)
	}
	fk := natKey(podIP, remotePodIP, 33000, 80, 6)
	rk := natKey(remotePodIP, tunnelIP, 80, 33000, 6)
	out(0x02)  // SYN
	back(0x12) // SYN-ACK
	// The kernel's conntrack holds the flow (untranslated) as established.
	l.ctEstablished(t, tuple{podIP, remotePodIP, 33000, 80})
	out(0x11) // FIN-ACK: the pod is done sending
	// A minute of silence from the remote side (longer than the 10 s of a closed flow).
	aged := monoNow(t) - uint64(time.Minute)
	for _, k := range []IsthmusNatKey{fk, rk} {
		v, ok := natEntry(t, l, k)
		if !ok {
			t.Fatalf("entry %+v missing after the pod's FIN", k)
		}
		v.LastSeen = aged
		if err := l.objs.Nat.Put(k, v); err != nil {
			t.Fatalf("age entry: %v", err)
		}
	}
	back(0x18) // the remote side's data still reaches the pod
	back(0x11) // and its FIN
	for _, k := range []IsthmusNatKey{fk, rk} {
		if v, _ := natEntry(t, l, k); v.State != natClosing {
			t.Errorf("entry %+v state %d after both FINs, want closing (%d)", k, v.State, natClosing)
		}
	}
}

// icmpTimeExceeded is the reply the datapath must build for the IPv4 packet orig
// expiring at a node whose overlay address is from: type 11 code 0, quoting orig's
// header and 8 bytes, TOS precedence "internetwork control", TTL 64.
func icmpTimeExceeded(orig []byte, from netip.Addr) []byte {
	hl := int(orig[0]&0x0f) * 4
	icmp := make([]byte, 8, 8+hl+8)
	icmp[0] = 11
	icmp = append(icmp, orig[:hl+8]...)
	binary.BigEndian.PutUint16(icmp[2:], csum16(icmp))
	dst := netip.AddrFrom4([4]byte(orig[12:16]))
	return ipv4Packet(from, dst, 1, ipOpts{tos: 0xc0 | orig[1]&0x1e, ttl: 64}, icmp)
}

// TestEncapTimeExceeded: a pod's packet whose TTL expires at this hop is answered
// with ICMP time exceeded from the node's tunnel address, back out the pod's
// interface, so traceroute shows the node as the first hop.
func TestEncapTimeExceeded(t *testing.T) {
	l := newLab(t)
	setTunnelIP(t, l, hostIP)
	// scapy: Ether(dst=<pod0h MAC>, src="02:00:00:00:0a:05")/IP(src="10.1.0.5", dst="10.2.0.7", ttl=1)/UDP(sport=33434, dport=33435, chksum=0)/b"traceroute"
	in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 1}, udpDatagram(33434, 33435, []byte("traceroute"))))
	before := l.counts(t)
	ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT (ICMP back to the pod)", ret)
	}
	want := ethFrame(podMAC, l.podHMAC, 0x0800, icmpTimeExceeded(in[14:], hostIP))
	if !bytes.Equal(out, want) {
		t.Fatalf("reply differs\n got %x\nwant %x", out, want)
	}
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_TIME_EXCEEDED_SENT, IsthmusHookHOOK_POD_INGRESS)] != 1 || len(d) != 1 {
		t.Fatalf("counters moved %v, want only METRIC_TIME_EXCEEDED_SENT +1", d)
	}
}

// TestSNATHostStack: a pod behind an interface isthmus does not own reaches isthmus0
// through the host stack, with its own source. overlay_egress translates it exactly as
// pod_ingress would (a peer could not route the reply to that source), and the reply,
// translated back, goes to the host stack through isthmus0, which forwards it to the
// pod's interface.
func TestSNATHostStack(t *testing.T) {
	l := natLab(t, 40000, 40009, nil)
	hidden := netip.MustParseAddr("10.1.7.7") // a pod of another CNI, routed via und0 here
	err := inNS(l.ns, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: hidden.AsSlice(), Mask: net.CIDRMask(32, 32)},
			Gw: underlayGW.AsSlice(), LinkIndex: l.und.Attrs().Index})
	})
	if err != nil {
		t.Fatalf("route the hidden pod: %v", err)
	}
	udp := func(sport, dport uint16) []byte { return udpDatagram(sport, dport, []byte("host stack")) }
	// scapy: Ether(dst=<ist0 MAC>, src=<ist0 MAC>)/IP(src="10.1.7.7", dst="10.2.0.7", ttl=63)/UDP(sport=6000, dport=53, chksum=0)/b"host stack"
	in := ethFrame(l.istMAC, l.istMAC, 0x0800, ipv4Packet(hidden, remotePodIP, 17, ipOpts{ttl: 63}, udp(6000, 53)))
	ret, out := l.run(t, l.objs.OverlayEgress, in, l.ist.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("overlay_egress verdict %d, want TC_ACT_REDIRECT", ret)
	}
	want := encapsulated(l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udp(6000, 53)))
	if !bytes.Equal(out, want) {
		t.Fatalf("encapsulated frame differs (want the source translated to %s)\n got %x\nwant %x", tunnelIP, out, want)
	}
	wantEntry(t, l, natKey(remotePodIP, tunnelIP, 53, 6000, 17), hidden, 6000, natNew, natReply)

	reply := ipv4Packet(remotePodIP, tunnelIP, 17, ipOpts{ttl: 64}, udp(53, 6000))
	before := l.counts(t)
	ret, out = l.run(t, l.objs.UnderlayIngress, fromRemote(l, reply), l.und.Attrs().Index)
	wantIP := ipv4Packet(remotePodIP, hidden, 17, ipOpts{ttl: 64}, udp(53, 6000))
	if wantFrame := ethFrame(l.istMAC, gwMAC, 0x0800, wantIP); ret != tcActRedirect || !bytes.Equal(out, wantFrame) {
		t.Fatalf("reply: verdict %d\n got %x\nwant %x", ret, out, wantFrame)
	}
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_DECAP, underlayTC): 1, metricKey(IsthmusMetricMETRIC_SNAT_REVERSE, underlayTC): 1,
		metricKey(IsthmusMetricMETRIC_DELIVER_HOST, underlayTC): 1})
}

// TestFabricIngressNeighbour: a plain overlay packet on the underlay, from a remote
// site's source to a local pod, is taken straight to the pod only when it comes from
// the site router, the neighbour this node itself reaches that source's site through.
// From any other L2 neighbour (here the fabric router at .253, or an unknown MAC) it is
// left to the kernel untouched, whose rp_filter and filters judge it.
func TestFabricIngressNeighbour(t *testing.T) {
	l := newLab(t)
	withFabric(t, l)
	k := IsthmusRouteKey{Prefixlen: 16, Addr: be32(netip.MustParseAddr("10.1.0.0"))}
	if err := l.objs.FabricPrefixes.Put(k, IsthmusFabricPrefixValue{}); err != nil {
		t.Fatalf("put fabric prefix: %v", err)
	}
	from := func(mac net.HardwareAddr) []byte {
		// scapy: Ether(dst=<und0 MAC>, src=mac)/IP(src="10.2.0.7", dst="10.1.0.5", ttl=63)/UDP(sport=4000, dport=5000, chksum=0)/b"payload"
		return ethFrame(l.undMAC, mac, 0x0800, ipv4Packet(remotePodIP, podIP, 17, ipOpts{ttl: 63}, udpDatagram(4000, 5000, []byte("payload"))))
	}
	if ret, _ := l.run(t, l.objs.UnderlayIngress, from(gwMAC), l.und.Attrs().Index); ret != tcActRedirect {
		t.Fatalf("from the site router: verdict %d, want TC_ACT_REDIRECT", ret)
	}
	for _, mac := range []net.HardwareAddr{fabricMAC, {0x02, 0x66, 0x66, 0x66, 0x66, 0x66}} {
		in := from(mac)
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
		if d := delta(before, l.counts(t)); ret != tcActOK || !bytes.Equal(out, in) || len(d) != 0 {
			t.Errorf("from %s: verdict %d, changed %v, counters %v; want TC_ACT_OK, untouched, none", mac, ret, !bytes.Equal(out, in), d)
		}
	}
}

// TestTransitTimeExceeded: a transiting frame whose inner TTL expires at the gateway
// goes back to the hop that sent it, as GENEVE, carrying ICMP time exceeded from the
// gateway's tunnel address to the inner source, so traceroute across sites shows the
// gateway as a hop.
func TestTransitTimeExceeded(t *testing.T) {
	l := gatewayLab(t)
	setTunnelIP(t, l, hostIP)
	o := transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: remotePodIP, innerTTL: 1, sport: 33434,
		gnvOpts: []byte{0x01, 0x02, 0x03, 0x01, 0xaa, 0xbb, 0xcc, 0xdd}}
	in := transitFrame(l, o)
	before := l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT (time exceeded back to the member)", ret)
	}
	wantTransitReply(t, l, o, in, out, icmpTimeExceeded(memberInner(o), hostIP))
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_TIME_EXCEEDED_SENT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
		t.Errorf("counters moved %v, want only METRIC_TIME_EXCEEDED_SENT +1", d)
	}
}

// wantTransitReply checks out, what the gateway sent for the transiting frame in
// (built from o): the ICMP error icmp as the inner packet, back to the member as
// GENEVE (outer source this node, TTL 64, checksums right, UDP checksum 0), GENEVE and
// inner Ethernet as they came.
func wantTransitReply(t *testing.T, l *lab, o transitOpts, in, out, icmp []byte) {
	t.Helper()
	ohl, iip := 20, 14+20+8+8+len(o.gnvOpts)+14
	if len(out) != iip+len(icmp) || !bytes.Equal(out[iip:], icmp) {
		t.Fatalf("inner packet is not the ICMP error\n got %x\nwant %x", out, icmp)
	}
	if !bytes.Equal(out[:12], append(append([]byte{}, gwMAC...), l.undMAC...)) {
		t.Errorf("outer MACs %x, want toward the underlay gateway", out[:12])
	}
	if src, dst := netip.AddrFrom4([4]byte(out[14+12:14+16])), netip.AddrFrom4([4]byte(out[14+16:14+20])); src != underlayIP || dst != o.outerSrc {
		t.Errorf("outer %s -> %s, want %s -> %s", src, dst, underlayIP, o.outerSrc)
	}
	if csum16(out[14:14+ohl]) != 0 || int(binary.BigEndian.Uint16(out[14+2:])) != len(out)-14 || out[14+8] != 64 {
		t.Errorf("outer IPv4 header: checksum ok %v, total length %d (frame %d), TTL %d",
			csum16(out[14:14+ohl]) == 0, binary.BigEndian.Uint16(out[14+2:]), len(out)-14, out[14+8])
	}
	udp := out[14+ohl:]
	if binary.BigEndian.Uint16(udp[2:]) != 6081 || int(binary.BigEndian.Uint16(udp[4:])) != len(udp) || binary.BigEndian.Uint16(udp[6:]) != 0 {
		t.Errorf("outer UDP %x: want port 6081, length %d, checksum 0", udp[:8], len(udp))
	}
	if !bytes.Equal(out[14+ohl+8:iip], in[14+ohl+8:iip]) {
		t.Errorf("GENEVE header or inner Ethernet changed\n got %x\nwant %x", out[14+ohl+8:iip], in[14+ohl+8:iip])
	}
}

// icmpFragNeededFrom is icmpFragNeeded sent by a router whose address is from.
func icmpFragNeededFrom(orig []byte, mtu uint16, from netip.Addr) []byte {
	b := icmpFragNeeded(orig, mtu)
	f := from.As4()
	copy(b[12:16], f[:])
	b[10], b[11] = 0, 0
	binary.BigEndian.PutUint16(b[10:], csum16(b[:20]))
	return b
}

// TestTransitUnderlayMTU: the path from the gateway to the next hop has an MTU of 1400
// (a smaller WAN link): the device's own MTU, or a route's locked MTU ("mtu lock", the
// one a forwarding host obeys; an unlocked route MTU is ignored when forwarding, as by
// ip_forward). A transiting frame longer than that, whose inner packet has DF, goes
// back to the member as GENEVE carrying ICMP frag needed from the gateway's tunnel
// address with the largest inner packet that fits (1400 less the encapsulation in
// front of the inner header: 50 bytes, 58 with a GENEVE option); one without DF is
// DROP_UNDERLAY_MTU; one that fits exactly transits. A GSO frame is judged by its
// segments.
func TestTransitUnderlayMTU(t *testing.T) {
	const wanMTU = 1400
	t.Run("device MTU", func(t *testing.T) {
		l := gatewayLab(t)
		if err := inNS(l.ns, func() error { return netlink.LinkSetMTU(l.und, wanMTU) }); err != nil {
			t.Fatalf("set the device MTU: %v", err)
		}
		transitUnderlayMTU(t, l, wanMTU)
	})
	t.Run("locked route MTU", func(t *testing.T) {
		l := gatewayLab(t)
		if err := inNS(l.ns, func() error {
			return netlink.RouteReplace(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4(192, 168, 2, 0), Mask: net.CIDRMask(24, 32)},
				Gw: underlayGW.AsSlice(), LinkIndex: l.und.Attrs().Index, MTU: wanMTU, MTULock: true})
		}); err != nil {
			t.Fatalf("set the route MTU: %v", err)
		}
		transitUnderlayMTU(t, l, wanMTU)
	})
}

// transitUnderlayMTU is TestTransitUnderlayMTU on gateway lab l whose path to peerIP
// has MTU wanMTU.
func transitUnderlayMTU(t *testing.T, l *lab, wanMTU int) {
	setTunnelIP(t, l, hostIP)
	frame := func(innerLen int, df bool, gnvOpts []byte) (transitOpts, []byte) {
		o := transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: remotePodIP, innerTTL: 63, sport: 4321,
			payload: bytes.Repeat([]byte{0x5a}, innerLen-28), innerDF: df, gnvOpts: gnvOpts}
		return o, transitFrame(l, o)
	}
	opt := []byte{0x01, 0x02, 0x03, 0x01, 0xaa, 0xbb, 0xcc, 0xdd}
	for _, tc := range []struct {
		name     string
		innerLen int
		gnvOpts  []byte
		mtu      int
	}{
		{"one byte over", wanMTU - 50 + 1, nil, wanMTU - 50},
		{"full size", 1450, nil, wanMTU - 50},
		{"GENEVE option", wanMTU - 58 + 1, opt, wanMTU - 58},
	} {
		t.Run(tc.name+" DF", func(t *testing.T) {
			o, in := frame(tc.innerLen, true, tc.gnvOpts)
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT (frag needed back to the member)", ret)
			}
			icmp := icmpFragNeededFrom(memberInner(o), uint16(tc.mtu), hostIP)
			wantTransitReply(t, l, o, in, out, icmp)
			if m := int(binary.BigEndian.Uint16(icmp[20+6:])); m != tc.mtu {
				t.Errorf("announced MTU %d, want %d", m, tc.mtu)
			}
			if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_FRAG_NEEDED_SENT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
				t.Errorf("counters moved %v, want only METRIC_FRAG_NEEDED_SENT +1", d)
			}
		})
		t.Run(tc.name+" no DF", func(t *testing.T) {
			_, in := frame(tc.innerLen, false, tc.gnvOpts)
			wantDrop(t, l, l.objs.UnderlayIngress, l.und.Attrs().Index, in, IsthmusDropReasonDROP_UNDERLAY_MTU, IsthmusHookHOOK_UNDERLAY_TC)
		})
	}
	for _, tc := range []struct {
		name     string
		innerLen int
		gnvOpts  []byte
	}{
		{"exactly the MTU", wanMTU - 50, nil},
		{"exactly the MTU with a GENEVE option", wanMTU - 58, opt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, in := frame(tc.innerLen, true, tc.gnvOpts)
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			d := delta(before, l.counts(t))
			if ret != tcActRedirect || len(out) != len(in) || d[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
				t.Errorf("verdict %d, %d bytes out of %d, counters %v; want forwarded whole, METRIC_TRANSIT +1", ret, len(out), len(in), d)
			}
		})
	}

	// GSO: a short frame whose segments (inner IPv4 and UDP headers plus gso_size)
	// would not fit is refused like a long one; with segments that fit it transits.
	o, in := frame(600, true, nil)
	before := l.counts(t)
	ret, out := l.runGSO(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index, uint32(wanMTU-50-28+1), 2)
	if ret != tcActRedirect {
		t.Fatalf("GSO too big: verdict %d, want TC_ACT_REDIRECT", ret)
	}
	wantTransitReply(t, l, o, in, out, icmpFragNeededFrom(memberInner(o), uint16(wanMTU-50), hostIP))
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_FRAG_NEEDED_SENT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
		t.Errorf("GSO too big: counters moved %v, want only METRIC_FRAG_NEEDED_SENT +1", d)
	}
	before = l.counts(t)
	ret, _ = l.runGSO(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index, uint32(wanMTU-50-28), 2)
	if d := delta(before, l.counts(t)); ret != tcActRedirect || d[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
		t.Errorf("GSO fits: verdict %d, counters %v; want forwarded, METRIC_TRANSIT +1", ret, d)
	}
}

// TestDecapTimeExceeded: a peer's frame whose inner packet would expire delivering it
// to a local pod (TTL 1: this node is a routing hop) is answered like a transiting
// one, with ICMP time exceeded from this node's tunnel address back through the tunnel
// to that peer, so traceroute across sites shows the receiving node. XDP leaves such
// a frame whole to TC. A packet for the tunnel address itself is no hop: delivered to
// the host with TTL 1.
func TestDecapTimeExceeded(t *testing.T) {
	l := newLab(t)
	setTunnelIP(t, l, hostIP)
	frame := func(dst netip.Addr) ([]byte, []byte) {
		o := goodOpts(dst)
		inner := ipv4Packet(o.innerSrc, o.innerDst, 17, ipOpts{ttl: 1}, udpDatagram(33434, 33435, []byte("traceroute")))
		return inner, geneveFrame(l, o, innerEth(inner))
	}
	inner, in := frame(podIP)
	t.Run("tc", func(t *testing.T) { wantDecapTimeExceeded(t, l, inner, in) })
	t.Run("xdp", func(t *testing.T) {
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayXdp, in, 0)
		if d := delta(before, l.counts(t)); ret != xdpPass || !bytes.Equal(out, in) || len(d) != 0 {
			t.Errorf("verdict %d, changed %v, counters %v; want XDP_PASS, whole, none", ret, !bytes.Equal(out, in), d)
		}
	})
	t.Run("tunnel address", func(t *testing.T) {
		_, in := frame(hostIP)
		before := l.counts(t)
		ret, _ := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
		d := delta(before, l.counts(t))
		if ret != tcActRedirect || d[metricKey(IsthmusMetricMETRIC_DELIVER_HOST, IsthmusHookHOOK_UNDERLAY_TC)] != 1 {
			t.Errorf("verdict %d, counters %v; want delivered to the host", ret, d)
		}
	})
}

// wantDecapTimeExceeded runs underlay_ingress on in, a frame from peerIP whose inner
// packet inner expires here, and wants it answered: ICMP time exceeded from hostIP
// (the lab's tunnel address) back to peerIP, and only METRIC_TIME_EXCEEDED_SENT +1.
func wantDecapTimeExceeded(t *testing.T, l *lab, inner, in []byte) {
	t.Helper()
	before := l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT (time exceeded back to the peer)", ret)
	}
	wantTransitReply(t, l, transitOpts{outerSrc: peerIP}, in, out, icmpTimeExceeded(inner, hostIP))
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_TIME_EXCEEDED_SENT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 1 {
		t.Errorf("counters moved %v, want only METRIC_TIME_EXCEEDED_SENT +1", d)
	}
}

// TestTimeExceededNotAboutErrors: as the kernel's icmp_send (RFC 1122 3.2.2, RFC 1812
// 4.3.2.7), an expiring packet that is a fragment after the first, an ICMP error or
// an ICMP type the kernel does not know gets no ICMP error from the datapath, at a
// pod's interface or in transit on a gateway: it is dropped and counted
// (DROP_TTL_EXCEEDED), so two nodes can never answer each other's errors. An echo
// request (a ping with TTL 1) is still answered.
func TestTimeExceededNotAboutErrors(t *testing.T) {
	// scapy: ICMP(type=3, code=1)/<an IPv4 header and 8 bytes it quotes>
	unreach := append([]byte{3, 1, 0, 0, 0, 0, 0, 0}, ipv4Packet(remotePodIP, memberPod, 17, ipOpts{ttl: 60}, udpDatagram(53, 4000, nil))...)
	binary.BigEndian.PutUint16(unreach[2:], csum16(unreach))
	unknown := []byte{42, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(unknown[2:], csum16(unknown))
	cases := []struct {
		name   string
		proto  byte
		o      ipOpts
		l4     []byte
		answer bool
	}{
		{"later fragment", 17, ipOpts{ttl: 1, fragOff: 0x2005}, []byte("a fragment after the first"), false},
		{"ICMP error", 1, ipOpts{ttl: 1}, unreach, false},
		{"unknown ICMP type", 1, ipOpts{ttl: 1}, unknown, false},
		{"echo request", 1, ipOpts{ttl: 1}, icmpEcho(8, 7, 1, []byte("ping")), true},
	}

	t.Run("pod_ingress", func(t *testing.T) {
		l := newLab(t)
		setTunnelIP(t, l, hostIP)
		hook := IsthmusHookHOOK_POD_INGRESS
		for _, c := range cases {
			in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, c.proto, c.o, c.l4))
			before := l.counts(t)
			ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
			d := delta(before, l.counts(t))
			if c.answer {
				want := ethFrame(podMAC, l.podHMAC, 0x0800, icmpTimeExceeded(in[14:], hostIP))
				if ret != tcActRedirect || !bytes.Equal(out, want) {
					t.Errorf("%s: verdict %d, reply %x; want TC_ACT_REDIRECT with %x", c.name, ret, out, want)
				}
				continue
			}
			if ret != tcActShot || d[dropKey(IsthmusDropReasonDROP_TTL_EXCEEDED, hook)] != 1 || len(d) != 1 {
				t.Errorf("%s: verdict %d, counters %v; want TC_ACT_SHOT and only DROP_TTL_EXCEEDED +1", c.name, ret, d)
			}
		}
	})
	t.Run("transit", func(t *testing.T) {
		l := gatewayLab(t)
		setTunnelIP(t, l, hostIP)
		hook := IsthmusHookHOOK_UNDERLAY_TC
		for _, c := range cases {
			inner := ipv4Packet(memberPod, remotePodIP, c.proto, c.o, c.l4)
			in := outerFrame(l.undMAC, gwMAC, memberIP, underlayIP, 61, transitOpts{}, inner)
			before := l.counts(t)
			ret, _ := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			d := delta(before, l.counts(t))
			if c.answer {
				if ret != tcActRedirect || d[metricKey(IsthmusMetricMETRIC_TIME_EXCEEDED_SENT, hook)] != 1 {
					t.Errorf("%s: verdict %d, counters %v; want TC_ACT_REDIRECT, METRIC_TIME_EXCEEDED_SENT +1", c.name, ret, d)
				}
				continue
			}
			if ret != tcActShot || d[dropKey(IsthmusDropReasonDROP_TTL_EXCEEDED, hook)] != 1 || len(d) != 1 {
				t.Errorf("%s: verdict %d, counters %v; want TC_ACT_SHOT and only DROP_TTL_EXCEEDED +1", c.name, ret, d)
			}
		}
	})
}

// TestPodSourceIPv6: pod_ingress checks a pod's IPv6 sources as its IPv4 ones. On an
// interface without reservations a source must route back through it (strict reverse
// path, which needs IPv6 forwarding on the interface: without it, no source passes);
// on the CNI plugin's interface it must be one reserved for it in pod_addrs6,
// whatever the routes say. Link-local and unspecified sources (neighbour discovery,
// duplicate address detection) stay on the link and pass. What passes goes to the
// stack untouched and uncounted.
func TestPodSourceIPv6(t *testing.T) {
	l := newLab(t)
	a := netip.MustParseAddr
	own, routed, stranger := a("fd10::5"), a("fd10::6"), a("fd10::9")
	ifindex := l.pod.Attrs().Index
	if err := inNS(l.ns, func() error {
		for _, p := range []netip.Addr{own, routed} {
			r := &netlink.Route{Dst: &net.IPNet{IP: p.AsSlice(), Mask: net.CIDRMask(128, 128)}, LinkIndex: ifindex}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("add route %v: %w", p, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	forwarding := func(on string) {
		t.Helper()
		if err := inNS(l.ns, func() error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte(on), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	frame := func(src netip.Addr) []byte {
		return ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Packet(src, a("fd20::7"), 17, 64, udpDatagram(4000, 5000, []byte("v6"))))
	}
	wantPass := func(t *testing.T, src netip.Addr) {
		t.Helper()
		before := l.counts(t)
		in := frame(src)
		ret, out := l.run(t, l.objs.PodIngress, in, ifindex)
		if ret != tcActOK || !bytes.Equal(out, in) || l.mark != 0 {
			t.Errorf("source %v: verdict %d, mark %#x, changed %v; want TC_ACT_OK, untouched", src, ret, l.mark, !bytes.Equal(out, in))
		}
		if d := delta(before, l.counts(t)); len(d) != 0 {
			t.Errorf("source %v: counters moved %v, want none", src, d)
		}
	}
	linkScoped := []netip.Addr{a("fe80::1234"), a("::")}

	t.Run("no forwarding", func(t *testing.T) {
		forwarding("0")
		wantDrop(t, l, l.objs.PodIngress, ifindex, frame(own), IsthmusDropReasonDROP_POD_SRC_SPOOFED, IsthmusHookHOOK_POD_INGRESS)
		for _, src := range linkScoped {
			wantPass(t, src)
		}
	})
	forwarding("1")
	t.Run("reverse path", func(t *testing.T) {
		wantPass(t, own)
		wantPass(t, routed)
		for _, src := range linkScoped {
			wantPass(t, src)
		}
		for _, src := range []netip.Addr{stranger, a("ff02::1"), a("::1")} {
			wantDrop(t, l, l.objs.PodIngress, ifindex, frame(src), IsthmusDropReasonDROP_POD_SRC_SPOOFED, IsthmusHookHOOK_POD_INGRESS)
		}
	})
	t.Run("reserved", func(t *testing.T) {
		if err := l.objs.PodIfaces.Put(uint32(ifindex), IsthmusPodIfaceValue{Flags: 1}); err != nil { // POD_IFACE_F_RESERVED
			t.Fatal(err)
		}
		key := IsthmusPodAddr6Key{Ifindex: uint32(ifindex)}
		b := own.As16()
		for i := range key.Addr {
			key.Addr[i] = binary.NativeEndian.Uint32(b[4*i:])
		}
		if err := l.objs.PodAddrs6.Put(key, IsthmusPodAddrValue{}); err != nil {
			t.Fatal(err)
		}
		wantPass(t, own)
		for _, src := range linkScoped {
			wantPass(t, src)
		}
		// Routed through the pod's interface, but not reserved for it.
		for _, src := range []netip.Addr{routed, stranger} {
			wantDrop(t, l, l.objs.PodIngress, ifindex, frame(src), IsthmusDropReasonDROP_POD_SRC_NOT_RESERVED, IsthmusHookHOOK_POD_INGRESS)
		}
	})
}
