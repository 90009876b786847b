package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Return-path SNAT (lib/nat.h, lib/conntrack.h): pod sources outside snat_exempt are
// translated to the tunnel address on the way into the tunnel, replies and ICMP errors
// back after decapsulation.

var (
	tunnelIP  = hostIP // 10.99.0.1 on ist0, which stands in for isthmus0
	exemptNet = netip.MustParsePrefix("10.1.1.0/24")
	exemptIP  = netip.MustParseAddr("10.1.1.9")
	pod2IP    = netip.MustParseAddr("10.1.0.6") // a second pod behind pod0h
	pod2MAC   = net.HardwareAddr{0x02, 0, 0, 0, 0x0a, 0x06}
)

const snatSeed = 0x5a7c0de1 // SNAT_HASH_SEED

const (
	natNew         = uint8(IsthmusNatStateNAT_STATE_NEW)
	natEstablished = uint8(IsthmusNatStateNAT_STATE_ESTABLISHED)
	natClosing     = uint8(IsthmusNatStateNAT_STATE_CLOSING)
	natReply       = uint8(1) // NAT_F_REPLY
)

// natLab is the lab with SNAT on: tunnel address tunnelIP, port range [min, max],
// exemptNet exempt, and a second pod pod2IP reachable on pod0h.
func natLab(t *testing.T, min, max uint16, edit func(*ebpf.CollectionSpec)) *lab {
	t.Helper()
	l := newLabSpec(t, edit)
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	cfg.TunnelIp = be32(tunnelIP)
	cfg.SnatPortMin, cfg.SnatPortMax = min, max
	if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatalf("put config: %v", err)
	}
	if err := l.objs.SnatExempt.Put(IsthmusRouteKey{Prefixlen: uint32(exemptNet.Bits()), Addr: be32(exemptNet.Addr())},
		IsthmusSnatExemptValue{}); err != nil {
		t.Fatalf("put snat_exempt: %v", err)
	}
	err := inNS(l.ns, func() error {
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.pod.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: pod2IP.AsSlice(), HardwareAddr: pod2MAC}); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: pod2IP.AsSlice(), Mask: net.CIDRMask(32, 32)},
			LinkIndex: l.pod.Attrs().Index, Scope: netlink.SCOPE_LINK}); err != nil {
			return err
		}
		// exemptIP sends from pod0h too: pod_ingress takes only sources routed there.
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: exemptIP.AsSlice(), Mask: net.CIDRMask(32, 32)},
			LinkIndex: l.pod.Attrs().Index, Scope: netlink.SCOPE_LINK})
	})
	if err != nil {
		t.Fatalf("add pod2: %v", err)
	}
	return l
}

// nport is a port as the C side stores a __be16 in a Go uint16 field.
func nport(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func natKey(src, dst netip.Addr, sport, dport uint16, proto uint8) IsthmusNatKey {
	return IsthmusNatKey{Saddr: be32(src), Daddr: be32(dst), Sport: nport(sport), Dport: nport(dport), Proto: proto}
}

// snatPort is the Go twin of the allocator's i-th try in [min, max] (snat_hash in
// lib/nat.h): jhash_3words over the raw source, destination and ports+protocol words
// of the pod's key (ICMP: identifier, 0).
func snatPort(src, dst netip.Addr, sport, dport uint16, proto uint8, min, max uint16, i uint32) uint16 {
	var pb [4]byte
	binary.BigEndian.PutUint16(pb[0:], sport)
	binary.BigEndian.PutUint16(pb[2:], dport)
	s, d := src.As4(), dst.As4()
	h := jhash3(binary.LittleEndian.Uint32(s[:]), binary.LittleEndian.Uint32(d[:]),
		binary.LittleEndian.Uint32(pb[:])+uint32(proto), snatSeed)
	return min + uint16((h+i)%(uint32(max-min)+1))
}

// pseudoSum is the checksum of seg with the pseudo-header of src, dst and proto
// (IPv4, or IPv6 for IPv6 addresses).
func pseudoSum(src, dst netip.Addr, proto byte, seg []byte) uint16 {
	if src.Is6() {
		s, d := src.As16(), dst.As16()
		b := append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, byte(len(seg)>>8), byte(len(seg)), 0, 0, 0, proto)
		return csum16(append(b, seg...))
	}
	s, d := src.As4(), dst.As4()
	b := append(append(append([]byte{}, s[:]...), d[:]...), 0, proto, byte(len(seg)>>8), byte(len(seg)))
	return csum16(append(b, seg...))
}

// withCsum returns a copy of the TCP or UDP segment seg with its checksum computed
// for src -> dst (a computed UDP 0 is sent as 0xffff).
func withCsum(src, dst netip.Addr, proto byte, seg []byte) []byte {
	b := append([]byte{}, seg...)
	off := 6
	if proto == 6 {
		off = 16
	}
	b[off], b[off+1] = 0, 0
	c := pseudoSum(src, dst, proto, b)
	if proto == 17 && c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[off:], c)
	return b
}

// icmpEcho is an ICMP echo request (type 8) or reply (0) with a valid checksum.
func icmpEcho(typ byte, id, seq uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	b = append(b, payload...)
	binary.BigEndian.PutUint16(b[2:], csum16(b))
	return b
}

// checkSums verifies the IPv4 header checksum of ip and its L4 checksum by
// recomputation (a zero UDP checksum is "none").
func checkSums(t *testing.T, what string, ip []byte) {
	t.Helper()
	ihl := int(ip[0]&0x0f) * 4
	if csum16(ip[:ihl]) != 0 {
		t.Errorf("%s: IPv4 header checksum does not verify", what)
	}
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	seg := ip[ihl:]
	switch ip[9] {
	case 6:
		if pseudoSum(src, dst, 6, seg) != 0 {
			t.Errorf("%s: TCP checksum does not verify", what)
		}
	case 17:
		if binary.BigEndian.Uint16(seg[6:]) != 0 && pseudoSum(src, dst, 17, seg) != 0 {
			t.Errorf("%s: UDP checksum does not verify", what)
		}
	case 1:
		if csum16(seg) != 0 {
			t.Errorf("%s: ICMP checksum does not verify", what)
		}
	}
}

// fromPod is a pod's packet as it arrives on pod0h.
// scapy: Ether(dst=<pod0h MAC>, src=mac)/IP(src=src, dst=dst, ttl=64)/seg
func fromPod(l *lab, mac net.HardwareAddr, src, dst netip.Addr, proto byte, seg []byte) []byte {
	return ethFrame(l.podHMAC, mac, 0x0800, ipv4Packet(src, dst, proto, ipOpts{ttl: 64}, seg))
}

// encapsulated is what pod_ingress must send for the inner IPv4 packet ip (already
// translated and with its TTL decremented) that arrived in frame in.
func encapsulated(l *lab, in, ip []byte) []byte {
	inner := append(append([]byte{}, in[:14]...), ip...)
	gnv := geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, inner)
	udp := udpDatagram(flowSport(ip), 6081, gnv)
	return ethFrame(gwMAC, l.undMAC, 0x0800, ipv4Packet(underlayIP, peerIP, 17, ipOpts{tos: ip[1], ttl: 64, fragOff: 0x4000}, udp))
}

// fromRemote is the GENEVE frame a peer sends for the inner IPv4 packet ip.
func fromRemote(l *lab, ip []byte) []byte {
	return geneveFrame(l, goodOpts(tunnelIP), innerEth(ip))
}

// toStack is the frame handed to the stack (isthmus0 ingress) for a local pod: the
// outer Ethernet header kept, addressed to isthmus0; the stack forwards ip, so its TTL
// is as received.
func toStack(l *lab, ip []byte) []byte {
	return ethFrame(l.istMAC, gwMAC, 0x0800, ip)
}

// toPod is the frame delivered to a pod (dst MAC mac) for the inner packet ip.
func toPod(l *lab, mac net.HardwareAddr, ip []byte) []byte {
	return ethFrame(mac, l.podHMAC, 0x0800, ip)
}

// sendOut sends the pod's frame in out as the node does (podSend) and wants the
// inner packet ip (translated, its TTL decremented) encapsulated byte-exact, checking
// the inner checksums by recomputation.
func sendOut(t *testing.T, l *lab, in, ip []byte) {
	t.Helper()
	ret, out, frame, hook := l.podSend(t, in)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d at hook %d, want TC_ACT_REDIRECT", ret, hook)
	}
	if want := encapsulated(l, frame, ip); !bytes.Equal(out, want) {
		t.Fatalf("encapsulated frame differs\n got %x\nwant %x", out, want)
	}
	checkSums(t, "inner packet", out[64:])
}

// sendIn runs underlay_ingress on in and wants the delivered frame want (byte-exact).
// want is a pod's packet: handed to the stack (toStack) it must carry OVERLAY_MARK.
func sendIn(t *testing.T, l *lab, in, want []byte) {
	t.Helper()
	ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("underlay_ingress verdict %d, want TC_ACT_REDIRECT", ret)
	}
	if !bytes.Equal(out, want) {
		t.Fatalf("delivered frame differs\n got %x\nwant %x", out, want)
	}
	if bytes.Equal(want[:6], l.istMAC) && l.mark&overlayMark == 0 {
		t.Fatalf("delivered to the stack with mark %#x, want %#x", l.mark, overlayMark)
	}
	checkSums(t, "delivered packet", out[14:])
}

func wantCounts(t *testing.T, d map[IsthmusMetricsKey]uint64, want map[IsthmusMetricsKey]uint64) {
	t.Helper()
	if len(d) != len(want) {
		t.Errorf("counters moved %v, want %v", d, want)
		return
	}
	for k, n := range want {
		if d[k] != n {
			t.Errorf("counters moved %v, want %v", d, want)
			return
		}
	}
}

func natEntry(t *testing.T, l *lab, k IsthmusNatKey) (IsthmusNatValue, bool) {
	t.Helper()
	return tableEntry(t, l.objs.Nat, k)
}

// tableEntry looks k up in the nat table m (nat or masq_nat).
func tableEntry(t *testing.T, m *ebpf.Map, k IsthmusNatKey) (IsthmusNatValue, bool) {
	t.Helper()
	var v IsthmusNatValue
	err := m.Lookup(k, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return v, false
	}
	if err != nil {
		t.Fatalf("lookup %s %+v: %v", m, k, err)
	}
	return v, true
}

// wantEntry checks the nat entry k: address, port (host order), state and flags.
func wantEntry(t *testing.T, l *lab, k IsthmusNatKey, addr netip.Addr, port uint16, state, flags uint8) IsthmusNatValue {
	t.Helper()
	return wantTableEntry(t, l.objs.Nat, k, addr, port, state, flags)
}

// wantTableEntry is wantEntry in the nat table m (nat or masq_nat).
func wantTableEntry(t *testing.T, m *ebpf.Map, k IsthmusNatKey, addr netip.Addr, port uint16, state, flags uint8) IsthmusNatValue {
	t.Helper()
	v, ok := tableEntry(t, m, k)
	if !ok {
		t.Fatalf("%s entry %+v missing", m, k)
	}
	if v.Addr != be32(addr) || v.Port != nport(port) || v.State != state || v.Flags != flags {
		t.Fatalf("%s entry %+v = %+v, want addr %s port %d state %d flags %d", m, k, v, addr, port, state, flags)
	}
	return v
}

func monoNow(t testing.TB) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatalf("clock_gettime: %v", err)
	}
	return uint64(ts.Nano())
}

var (
	podIngress = IsthmusHookHOOK_POD_INGRESS
	// overlayEgress encapsulates (and translates) what the stack forwards into
	// isthmus0: a pod's packets that open a flow (sendOut).
	overlayEgress = IsthmusHookHOOK_OVERLAY_EGRESS
	underlayTC    = IsthmusHookHOOK_UNDERLAY_TC
)

func TestSNATTCP(t *testing.T) {
	l := natLab(t, 40000, 40009, nil)
	tcp := func(src, dst netip.Addr, sport, dport uint16, flags byte) []byte {
		return withCsum(src, dst, 6, tcpSegment(sport, dport, flags, nil))
	}

	// SYN from a non-exempt pod: source -> tunnel address, port kept.
	t0 := monoNow(t)
	before := l.counts(t)
	in := fromPod(l, podMAC, podIP, remotePodIP, 6, tcp(podIP, remotePodIP, 33000, 80, 0x02))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 6, ipOpts{ttl: 63}, tcp(tunnelIP, remotePodIP, 33000, 80, 0x02)))
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_SNAT, overlayEgress): 1, metricKey(IsthmusMetricMETRIC_SNAT_NEW, overlayEgress): 1,
		metricKey(IsthmusMetricMETRIC_ENCAP, overlayEgress): 1})
	fk := natKey(podIP, remotePodIP, 33000, 80, 6)
	rk := natKey(remotePodIP, tunnelIP, 80, 33000, 6)
	fv := wantEntry(t, l, fk, tunnelIP, 33000, natNew, 0)
	rv := wantEntry(t, l, rk, podIP, 33000, natNew, natReply)
	if t1 := monoNow(t); fv.LastSeen < t0 || fv.LastSeen > t1 || rv.LastSeen != fv.LastSeen {
		t.Errorf("last_seen %d / %d, want both equal and in [%d, %d]", fv.LastSeen, rv.LastSeen, t0, t1)
	}

	// The SYN-ACK comes back encapsulated: destination -> the pod, both entries
	// established; a SYN-ACK passes the stack (into isthmus0, TTL as received).
	before = l.counts(t)
	sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, 6, ipOpts{ttl: 64}, tcp(remotePodIP, tunnelIP, 80, 33000, 0x12))),
		toStack(l, ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 64}, tcp(remotePodIP, podIP, 80, 33000, 0x12))))
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_DECAP, underlayTC): 1, metricKey(IsthmusMetricMETRIC_SNAT_REVERSE, underlayTC): 1,
		metricKey(IsthmusMetricMETRIC_DELIVER_POD, underlayTC): 1})
	wantEntry(t, l, fk, tunnelIP, 33000, natEstablished, 0)
	wantEntry(t, l, rk, podIP, 33000, natEstablished, natReply)

	// The ACK reuses the entry (no new flow); a FIN half-closes it in both entries.
	// The kernel's conntrack holds the flow (untranslated: isthmus translates after
	// it) as established, so pod_ingress translates these itself.
	l.ctEstablished(t, tuple{podIP, remotePodIP, 33000, 80})
	before = l.counts(t)
	in = fromPod(l, podMAC, podIP, remotePodIP, 6, tcp(podIP, remotePodIP, 33000, 80, 0x10))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 6, ipOpts{ttl: 63}, tcp(tunnelIP, remotePodIP, 33000, 80, 0x10)))
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_SNAT, podIngress): 1, metricKey(IsthmusMetricMETRIC_ENCAP, podIngress): 1,
		metricKey(IsthmusMetricMETRIC_CT_FAST, podIngress): 1})
	in = fromPod(l, podMAC, podIP, remotePodIP, 6, tcp(podIP, remotePodIP, 33000, 80, 0x11))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 6, ipOpts{ttl: 63}, tcp(tunnelIP, remotePodIP, 33000, 80, 0x11)))
	wantEntry(t, l, fk, tunnelIP, 33000, uint8(IsthmusNatStateNAT_STATE_FIN_ORIG), 0)
	wantEntry(t, l, rk, podIP, 33000, uint8(IsthmusNatStateNAT_STATE_FIN_ORIG), natReply)

	// A packet to the tunnel address that matches no translation and opens a
	// connection (bare SYN) goes to the host unchanged: it is the host's to refuse.
	other := ipv4Packet(remotePodIP, tunnelIP, 6, ipOpts{ttl: 64}, tcp(remotePodIP, tunnelIP, 80, 33001, 0x02))
	before = l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayIngress, fromRemote(l, other), l.und.Attrs().Index)
	if want := ethFrame(l.istMAC, gwMAC, 0x0800, other); ret != tcActRedirect || !bytes.Equal(out, want) {
		t.Fatalf("untranslated packet: verdict %d\n got %x\nwant %x", ret, out, want)
	}
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_DECAP, underlayTC): 1, metricKey(IsthmusMetricMETRIC_DELIVER_HOST, underlayTC): 1})
}

func TestSNATUDP(t *testing.T) {
	l := natLab(t, 40000, 40009, nil)
	for _, tc := range []struct {
		name  string
		csum  bool
		sport uint16
	}{
		{"with checksum", true, 5353},
		{"zero checksum", false, 5354},
	} {
		t.Run(tc.name, func(t *testing.T) {
			udp := func(src, dst netip.Addr, sport, dport uint16) []byte {
				b := udpDatagram(sport, dport, []byte("query"))
				if tc.csum {
					b = withCsum(src, dst, 17, b)
				}
				return b
			}
			in := fromPod(l, podMAC, podIP, remotePodIP, 17, udp(podIP, remotePodIP, tc.sport, 53))
			sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udp(tunnelIP, remotePodIP, tc.sport, 53)))
			wantEntry(t, l, natKey(podIP, remotePodIP, tc.sport, 53, 17), tunnelIP, tc.sport, natNew, 0)
			sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, 17, ipOpts{ttl: 64}, udp(remotePodIP, tunnelIP, 53, tc.sport))),
				toStack(l, ipv4Packet(remotePodIP, podIP, 17, ipOpts{ttl: 64}, udp(remotePodIP, podIP, 53, tc.sport))))
			wantEntry(t, l, natKey(remotePodIP, tunnelIP, 53, tc.sport, 17), podIP, tc.sport, natEstablished, natReply)
		})
	}
}

func TestSNATICMPEcho(t *testing.T) {
	const min, max = 40000, 40009
	l := natLab(t, min, max, nil)
	payload := []byte("ping")
	// The first pod keeps its identifier.
	in := fromPod(l, podMAC, podIP, remotePodIP, 1, icmpEcho(8, 0x1234, 1, payload))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 1, ipOpts{ttl: 63}, icmpEcho(8, 0x1234, 1, payload)))
	wantEntry(t, l, natKey(podIP, remotePodIP, 0x1234, 0, 1), tunnelIP, 0x1234, natNew, 0)
	wantEntry(t, l, natKey(remotePodIP, tunnelIP, 0, 0x1234, 1), podIP, 0x1234, natNew, natReply)

	// A second pod pinging the same remote with the same identifier gets another one.
	id2 := snatPort(pod2IP, remotePodIP, 0x1234, 0, 1, min, max, 0)
	before := l.counts(t)
	in = fromPod(l, pod2MAC, pod2IP, remotePodIP, 1, icmpEcho(8, 0x1234, 7, payload))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 1, ipOpts{ttl: 63}, icmpEcho(8, id2, 7, payload)))
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_SNAT, overlayEgress): 1, metricKey(IsthmusMetricMETRIC_SNAT_NEW, overlayEgress): 1,
		metricKey(IsthmusMetricMETRIC_ENCAP, overlayEgress): 1})

	// Both replies find their pod, translated back, through the stack (ICMP never
	// takes the direct path).
	sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, 1, ipOpts{ttl: 64}, icmpEcho(0, 0x1234, 1, payload))),
		toStack(l, ipv4Packet(remotePodIP, podIP, 1, ipOpts{ttl: 64}, icmpEcho(0, 0x1234, 1, payload))))
	sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, 1, ipOpts{ttl: 64}, icmpEcho(0, id2, 7, payload))),
		toStack(l, ipv4Packet(remotePodIP, pod2IP, 1, ipOpts{ttl: 64}, icmpEcho(0, 0x1234, 7, payload))))

	// ICMP other than echo request from a translated source cannot be translated.
	wantSNATUnsupported(t, l, "timestamp request", fromPod(l, podMAC, podIP, remotePodIP, 1, icmpEcho(13, 1, 1, make([]byte, 12))))
}

// wantSNATUnsupported sends the pod's frame in as the node does (podSend): it must
// pass the stack untouched and be dropped at overlay_egress as DROP_SNAT_UNSUPPORTED,
// nothing else counted.
func wantSNATUnsupported(t *testing.T, l *lab, what string, in []byte) {
	t.Helper()
	before := l.counts(t)
	if ret, _, _, hook := l.podSend(t, in); ret != tcActShot || hook != overlayEgress {
		t.Fatalf("%s: verdict %d at hook %d, want TC_ACT_SHOT at overlay_egress", what, ret, hook)
	}
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		dropKey(IsthmusDropReasonDROP_SNAT_UNSUPPORTED, overlayEgress): 1})
}

func TestSNATPortCollision(t *testing.T) {
	const min, max = 40000, 40009
	l := natLab(t, min, max, nil)
	for _, proto := range []byte{6, 17} {
		seg := func(src, dst netip.Addr, sport, dport uint16) []byte {
			if proto == 6 {
				return withCsum(src, dst, 6, tcpSegment(sport, dport, 0x02, nil))
			}
			return withCsum(src, dst, 17, udpDatagram(sport, dport, []byte("x")))
		}
		in := fromPod(l, podMAC, podIP, remotePodIP, proto, seg(podIP, remotePodIP, 33000, 80))
		sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, proto, ipOpts{ttl: 63}, seg(tunnelIP, remotePodIP, 33000, 80)))
		// Same port, same destination, another pod: a port from the range.
		p2 := snatPort(pod2IP, remotePodIP, 33000, 80, proto, min, max, 0)
		in = fromPod(l, pod2MAC, pod2IP, remotePodIP, proto, seg(pod2IP, remotePodIP, 33000, 80))
		sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, proto, ipOpts{ttl: 63}, seg(tunnelIP, remotePodIP, p2, 80)))
		wantEntry(t, l, natKey(pod2IP, remotePodIP, 33000, 80, proto), tunnelIP, p2, natNew, 0)
		wantEntry(t, l, natKey(remotePodIP, tunnelIP, 80, p2, proto), pod2IP, 33000, natNew, natReply)
		// Both reverse to their own pod (a SYN or a datagram: through the stack).
		sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, proto, ipOpts{ttl: 64}, seg(remotePodIP, tunnelIP, 80, 33000))),
			toStack(l, ipv4Packet(remotePodIP, podIP, proto, ipOpts{ttl: 64}, seg(remotePodIP, podIP, 80, 33000))))
		sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, proto, ipOpts{ttl: 64}, seg(remotePodIP, tunnelIP, 80, p2))),
			toStack(l, ipv4Packet(remotePodIP, pod2IP, proto, ipOpts{ttl: 64}, seg(remotePodIP, pod2IP, 80, 33000))))
	}
}

// TestSNATLocalSocket: a socket on the tunnel address that the reply would reach
// takes its port away from the allocator.
func TestSNATLocalSocket(t *testing.T) {
	const min, max = 40000, 40009
	l := natLab(t, min, max, nil)
	const sport = 34567
	for _, proto := range []byte{6, 17} {
		var c interface{ Close() error }
		err := inNS(l.ns, func() error {
			var err error
			addr := netip.AddrPortFrom(tunnelIP, sport).String()
			if proto == 6 {
				c, err = net.Listen("tcp4", addr)
			} else {
				c, err = net.ListenPacket("udp4", addr)
			}
			return err
		})
		if err != nil {
			t.Fatalf("open socket on the tunnel address: %v", err)
		}
		defer c.Close()
		seg := func(src, dst netip.Addr, sport, dport uint16) []byte {
			if proto == 6 {
				return withCsum(src, dst, 6, tcpSegment(sport, dport, 0x02, nil))
			}
			return withCsum(src, dst, 17, udpDatagram(sport, dport, []byte("x")))
		}
		p := snatPort(podIP, remotePodIP, sport, 80, proto, min, max, 0)
		in := fromPod(l, podMAC, podIP, remotePodIP, proto, seg(podIP, remotePodIP, sport, 80))
		sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, proto, ipOpts{ttl: 63}, seg(tunnelIP, remotePodIP, p, 80)))
	}
}

func TestSNATRangeFull(t *testing.T) {
	l := natLab(t, 40000, 40001, nil)
	udp := func(src, dst netip.Addr, sport uint16) []byte {
		return udpDatagram(sport, 80, []byte("x"))
	}
	// Two flows that keep their ports fill the two-port range for remotePodIP:80.
	for _, sp := range []uint16{40000, 40001} {
		in := fromPod(l, podMAC, podIP, remotePodIP, 17, udp(podIP, remotePodIP, sp))
		sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udp(tunnelIP, remotePodIP, sp)))
	}
	before := l.counts(t)
	in := fromPod(l, pod2MAC, pod2IP, remotePodIP, 17, udp(pod2IP, remotePodIP, 40000))
	if ret, _ := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index); ret != tcActOK {
		t.Fatalf("pod_ingress verdict %d, want TC_ACT_OK (through the stack)", ret)
	}
	if ret, _ := l.run(t, l.objs.OverlayEgress, stackForwarded(l, in), l.ist.Attrs().Index); ret != tcActShot {
		t.Fatalf("overlay_egress verdict %d, want TC_ACT_SHOT", ret)
	}
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		dropKey(IsthmusDropReasonDROP_SNAT_NO_PORT, overlayEgress): 1})
	if _, ok := natEntry(t, l, natKey(pod2IP, remotePodIP, 40000, 80, 17)); ok {
		t.Errorf("a flow without a port left an entry")
	}
}

func TestSNATExemptAndUnsupported(t *testing.T) {
	l := natLab(t, 40000, 40009, nil)
	// An exempt source keeps its address.
	in := fromPod(l, podMAC, exemptIP, remotePodIP, 17, udpDatagram(1000, 53, []byte("x")))
	before := l.counts(t)
	sendOut(t, l, in, ipv4Packet(exemptIP, remotePodIP, 17, ipOpts{ttl: 63}, udpDatagram(1000, 53, []byte("x"))))
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{metricKey(IsthmusMetricMETRIC_ENCAP, overlayEgress): 1})
	var k IsthmusNatKey
	var v IsthmusNatValue
	if it := l.objs.Nat.Iterate(); it.Next(&k, &v) {
		t.Errorf("nat has entry %+v for an exempt source", k)
	}

	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"GRE", fromPod(l, podMAC, podIP, remotePodIP, 47, make([]byte, 8))},
		{"first fragment", ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64, fragOff: 0x2000}, udpDatagram(1, 2, []byte("x"))))},
		{"later fragment", ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64, fragOff: 0x0010}, []byte("datadata")))},
	} {
		wantSNATUnsupported(t, l, tc.name, tc.in)
	}
}

// TestSNATICMPError: frag needed from a router for a translated UDP flow reaches the
// pod (through the stack, as every ICMP does) quoting the pod's own packet, every
// checksum right.
func TestSNATICMPError(t *testing.T) {
	l := natLab(t, 40000, 40009, nil)
	router := netip.MustParseAddr("10.2.0.1")
	data := bytes.Repeat([]byte{0xa5}, 100)
	orig := withCsum(podIP, remotePodIP, 17, udpDatagram(5000, 53, data))
	in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64, id: 0x4242, fragOff: 0x4000}, orig))
	xlated := withCsum(tunnelIP, remotePodIP, 17, udpDatagram(5000, 53, data))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63, id: 0x4242, fragOff: 0x4000}, xlated))

	fragNeeded := func(quote []byte) []byte {
		b := make([]byte, 8, 8+len(quote))
		b[0], b[1] = 3, 4
		binary.BigEndian.PutUint16(b[6:], 1400)
		b = append(b, quote...)
		binary.BigEndian.PutUint16(b[2:], csum16(b))
		return b
	}
	// The router saw the packet with TTL 62 and quotes its header and 8 bytes.
	seen := ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 62, id: 0x4242, fragOff: 0x4000}, xlated)[:28]
	mine := ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 62, id: 0x4242, fragOff: 0x4000}, orig)[:28]
	before := l.counts(t)
	sendIn(t, l, fromRemote(l, ipv4Packet(router, tunnelIP, 1, ipOpts{ttl: 64}, fragNeeded(seen))),
		toStack(l, ipv4Packet(router, podIP, 1, ipOpts{ttl: 64}, fragNeeded(mine))))
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_DECAP, underlayTC): 1, metricKey(IsthmusMetricMETRIC_SNAT_REVERSE, underlayTC): 1,
		metricKey(IsthmusMetricMETRIC_DELIVER_POD, underlayTC): 1})
	// Independent checks of what the byte comparison implies: the quoted header and UDP
	// checksum are the pod's again.
	if csum16(mine[:20]) != 0 {
		t.Errorf("quoted IPv4 header checksum does not verify")
	}
	if !bytes.Equal(mine[26:28], orig[6:8]) {
		t.Errorf("quoted UDP checksum %x, the pod sent %x", mine[26:28], orig[6:8])
	}
}

// TestSNATExpired: an expired translation counts as absent: another flow may take
// its port, and the flow itself starts over.
func TestSNATExpired(t *testing.T) {
	const min, max = 40000, 40009
	l := natLab(t, min, max, nil)
	udp := func(sport uint16) []byte { return udpDatagram(sport, 53, []byte("x")) }
	in := fromPod(l, podMAC, podIP, remotePodIP, 17, udp(5000))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udp(5000)))
	fk, rk := natKey(podIP, remotePodIP, 5000, 53, 17), natKey(remotePodIP, tunnelIP, 53, 5000, 17)
	old := monoNow(t) - uint64(120*time.Second) // UDP times out after 60 s
	for _, k := range []IsthmusNatKey{fk, rk} {
		v, _ := natEntry(t, l, k)
		v.LastSeen = old
		if err := l.objs.Nat.Put(k, v); err != nil {
			t.Fatalf("age entry: %v", err)
		}
	}
	// Another pod takes port 5000: the entry that held it expired.
	before := l.counts(t)
	in = fromPod(l, pod2MAC, pod2IP, remotePodIP, 17, udp(5000))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udp(5000)))
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_SNAT, overlayEgress): 1, metricKey(IsthmusMetricMETRIC_SNAT_NEW, overlayEgress): 1,
		metricKey(IsthmusMetricMETRIC_ENCAP, overlayEgress): 1})
	wantEntry(t, l, rk, pod2IP, 5000, natNew, natReply)
	// The first pod's flow starts over, on a port from the range.
	p := snatPort(podIP, remotePodIP, 5000, 53, 17, min, max, 0)
	in = fromPod(l, podMAC, podIP, remotePodIP, 17, udp(5000))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udp(p)))
	v := wantEntry(t, l, fk, tunnelIP, p, natNew, 0)
	if v.LastSeen <= old {
		t.Errorf("last_seen not renewed")
	}
}

// TestSNATTableFull: the nat table is a hash, not an LRU; with room for 8 flows, the
// 8 first are translated and every later new flow is dropped (DROP_SNAT_INSERT)
// without evicting one: the first flow's reply still comes back.
func TestSNATTableFull(t *testing.T) {
	l := natLab(t, 40000, 40009, func(s *ebpf.CollectionSpec) { s.Maps["nat"].MaxEntries = 16 })
	for i := uint16(0); i < 64; i++ {
		sp := 20000 + i
		before := l.counts(t)
		in := fromPod(l, podMAC, podIP, remotePodIP, 17, udpDatagram(sp, 53, []byte("x")))
		if i < 8 {
			sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udpDatagram(sp, 53, []byte("x"))))
			wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
				metricKey(IsthmusMetricMETRIC_SNAT, overlayEgress): 1, metricKey(IsthmusMetricMETRIC_SNAT_NEW, overlayEgress): 1,
				metricKey(IsthmusMetricMETRIC_ENCAP, overlayEgress): 1})
			continue
		}
		ret, _, _, hook := l.podSend(t, in)
		if ret != tcActShot {
			t.Fatalf("flow %d in a full table: verdict %d, want TC_ACT_SHOT", i, ret)
		}
		wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
			dropKey(IsthmusDropReasonDROP_SNAT_INSERT, hook): 1})
	}
	n := 0
	var k IsthmusNatKey
	var v IsthmusNatValue
	for it := l.objs.Nat.Iterate(); it.Next(&k, &v); {
		n++
	}
	if n != 16 {
		t.Errorf("nat holds %d entries, want 16", n)
	}
	sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, 17, ipOpts{ttl: 64}, udpDatagram(53, 20000, []byte("y")))),
		toStack(l, ipv4Packet(remotePodIP, podIP, 17, ipOpts{ttl: 64}, udpDatagram(53, 20000, []byte("y")))))
}
