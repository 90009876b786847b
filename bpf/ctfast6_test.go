package bpf

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
)

// ctLab6 is ctLab with the IPv6 side filled (fillIPv6) and a permanent neighbour
// for pod6 (the CNI plugin makes one per pod address), so that delivery resolves
// the pod's MAC.
func ctLab6(t *testing.T) *lab {
	t.Helper()
	l := ctLab(t)
	l.fillIPv6(t)
	if err := inNS(l.ns, func() error {
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.pod.Attrs().Index, Family: netlink.FAMILY_V6,
			State: netlink.NUD_PERMANENT, IP: pod6.AsSlice(), HardwareAddr: podMAC})
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

// podTCP6 is the frame the pod sends on pod0h for IPv6 segment u (u.src is pod6),
// with hop limit hop.
func (l *lab) podTCP6(u tuple, seq, ack uint32, flags byte, payload []byte, hop byte) []byte {
	return ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Packet(u.src, u.dst, 6, hop, tcpSeg(u, seq, ack, flags, payload)))
}

// remoteTCP6 is the GENEVE frame peerIP sends for IPv6 segment u (to pod6), with
// hop limit hop.
func (l *lab) remoteTCP6(u tuple, seq, ack uint32, flags byte, payload []byte, hop byte) []byte {
	return geneveFrame6(l, peerIP, 0, ipv6Packet(u.src, u.dst, 6, hop, tcpSeg(u, seq, ack, flags, payload)))
}

// TestCtFastDecisionIPv6: an IPv6 TCP segment takes the direct path, in GENEVE from
// pod_ingress or into the pod after the pop, only when conntrack holds its flow as
// established, assured and untranslated, it is no SYN, its TCP header follows the
// fixed header (no extension header, a fragment's included), it has a hop left and it
// fits; on the direct path its hop limit is decremented, as the stack's forwarding
// would, and gopacket finds the rest unchanged. Everything else goes through the
// stack.
func TestCtFastDecisionIPv6(t *testing.T) {
	l := ctLab6(t)
	plain := tuple{pod6, remotePod6, 40001, 80}
	l.ctEstablished(t, plain)
	ipvs := tuple{pod6, netip.MustParseAddr("fd20::99"), 40002, 80}
	ipvsReply := tuple{remotePod6, pod6, 8080, 40002}
	l.ctInsert(t, ipvs, ipvsReply, "ESTABLISHED", "ASSURED,SEEN_REPLY")
	unassured := tuple{pod6, remotePod6, 40003, 80}
	l.ctInsert(t, unassured, unassured.inverse(), "ESTABLISHED", "SEEN_REPLY")
	none := tuple{pod6, remotePod6, 40005, 80}
	if _, _, ok := l.ctEntry(t, plain); !ok {
		t.Fatal("conntrack does not list the IPv6 entry it was given")
	}

	// A fragment header (44) before the TCP segment of an established flow.
	fragHdr := append([]byte{6, 0, 0, 0, 0, 0, 0, 1}, tcpSeg(plain, 1002, 2001, tcpACK, make([]byte, 64))...)
	big := make([]byte, int(tunnelMTU)) // with 60 bytes of headers: over the tunnel's MTU
	for _, tc := range []struct {
		name string
		out  []byte
		in   []byte
		fast bool
	}{
		{"untranslated established, pod's ACK", l.podTCP6(plain, 1000, 2000, tcpACK, []byte("x"), 64), nil, true},
		{"untranslated established, remote ACK", nil, l.remoteTCP6(plain.inverse(), 2000, 1001, tcpACK, []byte("y"), 64), true},
		{"IPVS shape, to the VIP", l.podTCP6(ipvs, 1000, 2000, tcpACK, nil, 64), nil, false},
		{"IPVS shape, the backend's reply", nil, l.remoteTCP6(ipvsReply, 2000, 1000, tcpACK, nil, 64), false},
		{"not assured", l.podTCP6(unassured, 1000, 2000, tcpACK, nil, 64), nil, false},
		{"no entry, pod's ACK", l.podTCP6(none, 1000, 2000, tcpACK, nil, 64), nil, false},
		{"no entry, remote ACK", nil, l.remoteTCP6(none.inverse(), 1000, 2000, tcpACK, nil, 64), false},
		{"SYN of an established flow", l.podTCP6(plain, 1000, 0, tcpSYN, nil, 64), nil, false},
		{"SYN-ACK of an established flow", nil, l.remoteTCP6(plain.inverse(), 2000, 1001, tcpSYN|tcpACK, nil, 64), false},
		{"last hop, pod's", l.podTCP6(plain, 1001, 2001, tcpACK, nil, 1), nil, false},
		{"last hop, remote", nil, l.remoteTCP6(plain.inverse(), 2001, 1001, tcpACK, nil, 1), false},
		{"longer than the tunnel carries", l.podTCP6(plain, 1001, 2001, tcpACK, big, 64), nil, false},
		{"fragment header", ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Packet(pod6, remotePod6, 44, 64, fragHdr)), nil, false},
		{"UDP on the ports of an established flow",
			ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Packet(pod6, remotePod6, 17, 64, udpDatagram(40001, 80, []byte("u")))), nil, false},
		{"TCP header cut short",
			ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Packet(pod6, remotePod6, 6, 64, tcpSeg(plain, 1002, 2001, tcpACK, nil)[:12])), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got bool
			if tc.out != nil {
				got = l.fastOut(t, tc.out)
			} else {
				got = l.fastIn(t, tc.in)
			}
			if got != tc.fast {
				t.Errorf("direct path %v, want %v", got, tc.fast)
			}
		})
	}

	t.Run("what the direct path sends", func(t *testing.T) {
		seg := tcpSeg(plain, 3000, 4000, tcpACK|tcpPSH, []byte("payload"))
		in := ethFrame(l.podHMAC, podMAC, 0x86dd, ipv6Packet(pod6, remotePod6, 6, 64, seg))
		ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("pod_ingress verdict %d, want TC_ACT_REDIRECT", ret)
		}
		pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
		gnv, _ := pkt.Layer(layers.LayerTypeGeneve).(*layers.Geneve)
		ip4, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		ip6, _ := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if gnv == nil || ip4 == nil || ip6 == nil || tcp == nil {
			t.Fatalf("want GENEVE over IPv4 around IPv6/TCP, got %v", pkt)
		}
		if ip4.DstIP.String() != peerIP.String() || ip6.HopLimit != 63 || !ip6.SrcIP.Equal(pod6.AsSlice()) ||
			!ip6.DstIP.Equal(remotePod6.AsSlice()) || !bytes.Equal(ip6.Payload, seg) {
			t.Errorf("outer to %v, inner %v -> %v hop limit %d; want to the peer, the pods' addresses, hop limit 63, the segment unchanged",
				ip4.DstIP, ip6.SrcIP, ip6.DstIP, ip6.HopLimit)
		}

		seg = tcpSeg(plain.inverse(), 4000, 3007, tcpACK, []byte("reply"))
		ret, out = l.run(t, l.objs.UnderlayIngress, geneveFrame6(l, peerIP, 0, ipv6Packet(remotePod6, pod6, 6, 64, seg)), l.und.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("underlay_ingress verdict %d, want TC_ACT_REDIRECT", ret)
		}
		pkt = gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
		eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		ip6, _ = pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		if eth == nil || ip6 == nil || pkt.Layer(layers.LayerTypeGeneve) != nil {
			t.Fatalf("want the inner frame alone, got %v", pkt)
		}
		if !bytes.Equal(eth.DstMAC, podMAC) || !bytes.Equal(eth.SrcMAC, l.podHMAC) || ip6.HopLimit != 63 || !bytes.Equal(ip6.Payload, seg) {
			t.Errorf("delivered %v -> %v hop limit %d; want from the pod interface to the pod's MAC, hop limit 63, the segment unchanged",
				eth.SrcMAC, eth.DstMAC, ip6.HopLimit)
		}
	})
}

// TestCtFastCloseIPv6: an IPv6 flow closed on the fast path (FINs both ways, each
// acknowledged) is recorded in ct_close6, shortened to the TIME_WAIT timeout, and
// leaves the fast path; a bare SYN on its tuple then expires its conntrack entry, so
// that the stack judges the new flow.
func TestCtFastCloseIPv6(t *testing.T) {
	l := ctLab6(t)
	warm := tuple{podIP, remotePodIP, 40030, 80}
	l.ctEstablished(t, warm)
	l.warmClock(t, warm)

	u := tuple{pod6, remotePod6, 40033, 80}
	l.ctEstablished(t, u)
	steps := []struct {
		what string
		out  bool
		u    tuple
		seq  uint32
		ack  uint32
		fl   byte
		left [2]int
	}{
		{"pod's FIN", true, u, 1000, 6000, tcpFIN | tcpACK, [2]int{ctLabEstablished - 2, ctLabEstablished}},
		{"remote ACKs it", false, u.inverse(), 6000, 1001, tcpACK, [2]int{ctLabTimeWait - 2, ctLabTimeWait}},
		{"remote's FIN", false, u.inverse(), 6000, 1001, tcpFIN | tcpACK, [2]int{ctLabTimeWait - 2, ctLabTimeWait}},
		{"pod ACKs it", true, u, 1001, 6001, tcpACK, [2]int{ctLabTimeWait - 2, ctLabTimeWait}},
	}
	for _, s := range steps {
		var fast bool
		if s.out {
			fast = l.fastOut(t, l.podTCP6(s.u, s.seq, s.ack, s.fl, nil, 64))
		} else {
			fast = l.fastIn(t, l.remoteTCP6(s.u, s.seq, s.ack, s.fl, nil, 64))
		}
		if !fast {
			t.Fatalf("%s: did not take the fast path", s.what)
		}
		l.wantLeft(t, s.what, u, s.left[0], s.left[1])
	}
	key := IsthmusCtClose6Key{Saddr: addr16(u.src), Daddr: addr16(u.dst), Sport: htons(u.sport), Dport: htons(u.dport)}
	var rec IsthmusCtCloseValue
	if err := l.objs.CtClose6.Lookup(key, &rec); err != nil || rec.Closed != 1 {
		t.Fatalf("ct_close6 holds %+v (%v) for the flow, want it closed", rec, err)
	}
	if l.fastOut(t, l.podTCP6(u, 1001, 6001, tcpACK, nil, 64)) || l.fastIn(t, l.remoteTCP6(u.inverse(), 6001, 1001, tcpACK, nil, 64)) {
		t.Fatal("a packet after the close took the fast path")
	}
	if l.fastOut(t, l.podTCP6(u, 777777, 0, tcpSYN, nil, 64)) {
		t.Fatal("the SYN took the fast path")
	}
	if _, _, ok := l.ctEntry(t, u); ok {
		t.Error("conntrack still holds the closed flow after pod_ingress saw a SYN on its tuple")
	}
	if err := l.objs.CtClose6.Lookup(key, &rec); err == nil {
		t.Error("ct_close6 still holds the flow after the SYN")
	}
}

// TestGSOTunnelMTUIPv6: a pod's IPv6 TCP GSO packet of an established flow whose
// segments (60 bytes of headers plus gso_size) fit the tunnel takes the fast path to
// encapsulation at pod_ingress; one whose segments would not goes through the stack,
// marked and untouched, whose forwarding into isthmus0 answers Packet Too Big with the
// tunnel's MTU. (A test run cannot set gso_type, and bpf_skb_adjust_room refuses to
// grow a GSO skb without it, so the encapsulation itself fails here, as in
// TestGSOTunnelMTU; TestDualStackStream carries real IPv6 GSO traffic.)
func TestGSOTunnelMTUIPv6(t *testing.T) {
	l := ctLab6(t)
	u := tuple{pod6, remotePod6, 40000, 80}
	l.ctEstablished(t, u)
	fits := uint32(tunnelMTU) - 60
	in := l.podTCP6(u, 1000, 2000, tcpACK, make([]byte, 2*fits), 64)

	before := l.counts(t)
	l.runGSO(t, l.objs.PodIngress, in, l.pod.Attrs().Index, fits, 2)
	d := delta(before, l.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_POD_INGRESS)] != 1 ||
		d[metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_POD_INGRESS)]+d[dropKey(IsthmusDropReasonDROP_ENCAP_FAILED, IsthmusHookHOOK_POD_INGRESS)] != 1 {
		t.Errorf("segments that fit: counters moved %v; want the fast path to encapsulation", d)
	}

	before = l.counts(t)
	ret, out := l.runGSO(t, l.objs.PodIngress, in, l.pod.Attrs().Index, fits+1, 2)
	if d := delta(before, l.counts(t)); ret != tcActOK || len(d) != 0 || l.mark&overlayMark == 0 || !bytes.Equal(out[:len(in)], in) {
		t.Errorf("segments one byte too long: verdict %d, counters %v, mark %#x; want left to the stack, marked, untouched", ret, d, l.mark)
	}
}
