package bpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// Egress masquerade (lib/masq.h): underlay_egress translates a pod source of this
// node (snat_exempt) going to a destination outside masq_exempt to the underlay
// address, in the nat table; underlay_ingress translates replies back.

var (
	worldIP     = netip.MustParseAddr("203.0.113.10") // the Internet
	noMasqNet   = netip.MustParsePrefix("203.0.113.128/25")
	noMasqIP    = netip.MustParseAddr("203.0.113.200") // in noMasqNet
	exempt2IP   = netip.MustParseAddr("10.1.1.10")     // a second pod of this node
	underlayOut = IsthmusHookHOOK_UNDERLAY_EGRESS
)

const cfgMasquerade = 1 << 2 // CFG_F_MASQUERADE

// masqLab is natLab with masquerade on and noMasqNet in masq_exempt. The node's pods
// are exemptNet (snat_exempt).
func masqLab(t *testing.T, min, max uint16) *lab {
	t.Helper()
	l := natLab(t, min, max, nil)
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	cfg.Flags |= cfgMasquerade
	if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatalf("put config: %v", err)
	}
	if err := l.objs.MasqExempt.Put(IsthmusRouteKey{Prefixlen: uint32(noMasqNet.Bits()), Addr: be32(noMasqNet.Addr())},
		IsthmusMasqExemptValue{}); err != nil {
		t.Fatalf("put masq_exempt: %v", err)
	}
	return l
}

// leaving is a frame the stack sends out of the underlay device.
// scapy: Ether(dst=<gateway MAC>, src=<und0 MAC>)/IP(src=src, dst=dst, ttl=63)/seg
func leaving(l *lab, ip []byte) []byte { return ethFrame(gwMAC, l.undMAC, 0x0800, ip) }

// arriving is a plain (not GENEVE) frame the underlay device receives.
// scapy: Ether(dst=<und0 MAC>, src=<gateway MAC>)/IP(src=src, dst=dst, ttl=60)/seg
func arriving(l *lab, ip []byte) []byte { return ethFrame(l.undMAC, gwMAC, 0x0800, ip) }

// masqOut runs underlay_egress on in and wants TC_ACT_OK and want, byte-exact.
func masqOut(t *testing.T, l *lab, in, want []byte) {
	t.Helper()
	runOK(t, l, "underlay_egress", l.objs.UnderlayEgress, in, want)
}

// masqIn runs underlay_ingress on in and wants TC_ACT_OK (to the stack) and want.
func masqIn(t *testing.T, l *lab, in, want []byte) {
	t.Helper()
	runOK(t, l, "underlay_ingress", l.objs.UnderlayIngress, in, want)
}

// runOK runs prog on the underlay device with in and wants TC_ACT_OK and want,
// byte-exact, with checksums that verify.
func runOK(t *testing.T, l *lab, name string, prog *ebpf.Program, in, want []byte) {
	t.Helper()
	ret, out := l.run(t, prog, in, l.und.Attrs().Index)
	if ret != tcActOK || !bytes.Equal(out, want) {
		t.Fatalf("%s: verdict %d\n got %x\nwant %x", name, ret, out, want)
	}
	checkSums(t, name, out[14:])
}

// TestMasqueradeTCPUDP: a pod's TCP and UDP flows to the world leave from the
// underlay address with their own port, the replies come back to the pod, a second
// pod on the same port and destination gets a port from the range, and the entries
// are in masq_nat, none in return-path SNAT's nat. A TCP segment to the underlay
// address that no flow, socket or conntrack entry claims is dropped, not left to the
// host's reset; a bare SYN and UDP are the host's.
func TestMasqueradeTCPUDP(t *testing.T) {
	const min, max = 40000, 40009
	l := masqLab(t, min, max)
	for _, proto := range []byte{6, 17} {
		seg := func(src, dst netip.Addr, sport, dport uint16, flags byte) []byte {
			if proto == 6 {
				return withCsum(src, dst, 6, tcpSegment(sport, dport, flags, nil))
			}
			return withCsum(src, dst, 17, udpDatagram(sport, dport, []byte("hello")))
		}
		before := l.counts(t)
		masqOut(t, l, leaving(l, ipv4Packet(exemptIP, worldIP, proto, ipOpts{ttl: 63}, seg(exemptIP, worldIP, 33000, 80, 0x02))),
			leaving(l, ipv4Packet(underlayIP, worldIP, proto, ipOpts{ttl: 63}, seg(underlayIP, worldIP, 33000, 80, 0x02))))
		wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
			metricKey(IsthmusMetricMETRIC_MASQ, underlayOut): 1, metricKey(IsthmusMetricMETRIC_SNAT_NEW, underlayOut): 1})
		wantTableEntry(t, l.objs.MasqNat, natKey(exemptIP, worldIP, 33000, 80, proto), underlayIP, 33000, natNew, 0)
		wantTableEntry(t, l.objs.MasqNat, natKey(worldIP, underlayIP, 80, 33000, proto), exemptIP, 33000, natNew, natReply)
		if _, ok := natEntry(t, l, natKey(exemptIP, worldIP, 33000, 80, proto)); ok {
			t.Fatalf("masquerade wrote its entry into nat")
		}

		// Another pod, same port and destination: the next port of the range.
		p2 := snatPort(exempt2IP, worldIP, 33000, 80, proto, min, max, 0)
		masqOut(t, l, leaving(l, ipv4Packet(exempt2IP, worldIP, proto, ipOpts{ttl: 63}, seg(exempt2IP, worldIP, 33000, 80, 0x02))),
			leaving(l, ipv4Packet(underlayIP, worldIP, proto, ipOpts{ttl: 63}, seg(underlayIP, worldIP, p2, 80, 0x02))))

		// Replies go back to each pod, through the stack (TC_ACT_OK).
		before = l.counts(t)
		masqIn(t, l, arriving(l, ipv4Packet(worldIP, underlayIP, proto, ipOpts{ttl: 60}, seg(worldIP, underlayIP, 80, 33000, 0x12))),
			arriving(l, ipv4Packet(worldIP, exemptIP, proto, ipOpts{ttl: 60}, seg(worldIP, exemptIP, 80, 33000, 0x12))))
		masqIn(t, l, arriving(l, ipv4Packet(worldIP, underlayIP, proto, ipOpts{ttl: 60}, seg(worldIP, underlayIP, 80, p2, 0x12))),
			arriving(l, ipv4Packet(worldIP, exempt2IP, proto, ipOpts{ttl: 60}, seg(worldIP, exempt2IP, 80, 33000, 0x12))))
		wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
			metricKey(IsthmusMetricMETRIC_MASQ_REVERSE, underlayTC): 2})
		wantTableEntry(t, l.objs.MasqNat, natKey(exemptIP, worldIP, 33000, 80, proto), underlayIP, 33000, natEstablished, 0)

		// A packet to the underlay address of no flow that opens one (bare SYN) or
		// is UDP is the host's: untouched.
		other := arriving(l, ipv4Packet(worldIP, underlayIP, proto, ipOpts{ttl: 60}, seg(worldIP, underlayIP, 80, 33999, 0x02)))
		before = l.counts(t)
		masqIn(t, l, other, other)
		wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{})
		if proto == 6 {
			// A SYN-ACK of no flow would get the host's reset: dropped instead.
			other = arriving(l, ipv4Packet(worldIP, underlayIP, proto, ipOpts{ttl: 60}, seg(worldIP, underlayIP, 80, 33999, 0x12)))
			before = l.counts(t)
			if ret, _ := l.run(t, l.objs.UnderlayIngress, other, l.und.Attrs().Index); ret != tcActShot {
				t.Fatalf("SYN-ACK of no flow: verdict %d, want TC_ACT_SHOT", ret)
			}
			wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
				dropKey(IsthmusDropReasonDROP_NAT_REPLY_UNKNOWN, underlayTC): 1})
		}
	}
}

// TestMasqueradeICMP: echo requests are translated by identifier, the reply and an
// ICMP error quoting a masqueraded UDP flow come back to the pod.
func TestMasqueradeICMP(t *testing.T) {
	l := masqLab(t, 40000, 40009)
	masqOut(t, l, leaving(l, ipv4Packet(exemptIP, worldIP, 1, ipOpts{ttl: 63}, icmpEcho(8, 0x1234, 1, []byte("ping")))),
		leaving(l, ipv4Packet(underlayIP, worldIP, 1, ipOpts{ttl: 63}, icmpEcho(8, 0x1234, 1, []byte("ping")))))
	wantTableEntry(t, l.objs.MasqNat, natKey(worldIP, underlayIP, 0, 0x1234, 1), exemptIP, 0x1234, natNew, natReply)
	masqIn(t, l, arriving(l, ipv4Packet(worldIP, underlayIP, 1, ipOpts{ttl: 60}, icmpEcho(0, 0x1234, 1, []byte("ping")))),
		arriving(l, ipv4Packet(worldIP, exemptIP, 1, ipOpts{ttl: 60}, icmpEcho(0, 0x1234, 1, []byte("ping")))))

	// A UDP flow, then port unreachable from the world quoting its translated header.
	udp := func(src netip.Addr) []byte {
		return ipv4Packet(src, worldIP, 17, ipOpts{ttl: 63}, withCsum(src, worldIP, 17, udpDatagram(35000, 53, []byte("q"))))
	}
	masqOut(t, l, leaving(l, udp(exemptIP)), leaving(l, udp(underlayIP)))
	unreach := func(dst netip.Addr, quoted []byte) []byte {
		b := make([]byte, 8, 8+28)
		b[0], b[1] = 3, 3
		b = append(b, quoted[:28]...)
		binary.BigEndian.PutUint16(b[2:], csum16(b))
		return ipv4Packet(worldIP, dst, 1, ipOpts{ttl: 60}, b)
	}
	before := l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayIngress, arriving(l, unreach(underlayIP, udp(underlayIP))), l.und.Attrs().Index)
	if want := arriving(l, unreach(exemptIP, udp(exemptIP))); ret != tcActOK || !bytes.Equal(out, want) {
		t.Fatalf("ICMP error: verdict %d\n got %x\nwant %x", ret, out, want)
	}
	checkSums(t, "ICMP error", out[14:])
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		metricKey(IsthmusMetricMETRIC_MASQ_REVERSE, underlayTC): 1})
}

// TestMasqueradeNotWanted: a destination in masq_exempt, a source outside
// snat_exempt, the underlay address itself (host traffic, GENEVE) and any packet
// with CFG_F_MASQUERADE off pass untouched; a protocol without ports is a counted
// drop.
func TestMasqueradeNotWanted(t *testing.T) {
	l := masqLab(t, 40000, 40009)
	udp := func(src, dst netip.Addr) []byte {
		return leaving(l, ipv4Packet(src, dst, 17, ipOpts{ttl: 63}, withCsum(src, dst, 17, udpDatagram(36000, 53, []byte("q")))))
	}
	before := l.counts(t)
	for _, in := range [][]byte{udp(exemptIP, noMasqIP), udp(podIP, worldIP), udp(underlayIP, worldIP)} {
		masqOut(t, l, in, in)
	}
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{})

	gre := leaving(l, ipv4Packet(exemptIP, worldIP, 47, ipOpts{ttl: 63}, make([]byte, 8)))
	if ret, _ := l.run(t, l.objs.UnderlayEgress, gre, l.und.Attrs().Index); ret != tcActShot {
		t.Fatalf("GRE from a pod: verdict %d, want TC_ACT_SHOT", ret)
	}
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
		dropKey(IsthmusDropReasonDROP_SNAT_UNSUPPORTED, underlayOut): 1})

	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Flags &^= cfgMasquerade
	if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
	before = l.counts(t)
	in := udp(exemptIP, worldIP)
	masqOut(t, l, in, in)
	wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{})
}
