package bpf

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

var innerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x02, 0x07}

type frameOpts struct {
	outerSrc netip.Addr
	outerDst netip.Addr
	dport    uint16
	gnv      geneveOpts
	innerSrc netip.Addr
	innerDst netip.Addr
}

func goodOpts(dst netip.Addr) frameOpts {
	return frameOpts{
		outerSrc: peerIP, outerDst: underlayIP, dport: 6081,
		gnv:      geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1},
		innerSrc: remotePodIP, innerDst: dst,
	}
}

func innerIPv4(o frameOpts) []byte {
	return ipv4Packet(o.innerSrc, o.innerDst, 17, ipOpts{ttl: 64}, udpDatagram(4000, 5000, []byte("payload")))
}

// geneveFrame builds what a peer sends.
// scapy: Ether(dst=<und0 MAC>, src="02:00:00:00:01:fe")/IP(src=outerSrc, dst=outerDst, flags="DF", ttl=64)/UDP(sport=50000, dport=6081, chksum=0)/GENEVE(vni=0x123456, proto=0x6558)/Ether(dst="02:00:00:00:02:07", src="02:00:00:00:02:07")/IP(src=innerSrc, dst=innerDst, ttl=64)/UDP(sport=4000, dport=5000, chksum=0)/b"payload"
func geneveFrame(l *lab, o frameOpts, inner []byte) []byte {
	return ethFrame(l.undMAC, gwMAC, 0x0800,
		ipv4Packet(o.outerSrc, o.outerDst, 17, ipOpts{ttl: 64, fragOff: 0x4000},
			udpDatagram(50000, o.dport, geneveHeader(o.gnv, inner))))
}

func innerEth(payload []byte) []byte { return ethFrame(innerMAC, innerMAC, 0x0800, payload) }

func TestDecapTC(t *testing.T) {
	l := newLab(t)
	setTunnelIP(t, l, hostIP)                                     // host delivery is for the node's tunnel address only
	opt := []byte{0x01, 0x02, 0x03, 0x01, 0xaa, 0xbb, 0xcc, 0xdd} // one non-critical option, 4 data bytes
	for _, tc := range []struct {
		name    string
		dst     netip.Addr
		options []byte
		wantEth func() []byte
		ttl     byte
		metric  IsthmusMetric
		mark    uint32
	}{
		// A UDP datagram opens a flow as conntrack sees it: the pod gets it through
		// the stack (isthmus0 ingress, TTL left to the stack's forwarding), marked.
		{name: "to pod", dst: podIP, wantEth: func() []byte { return append(append([]byte{}, l.istMAC...), gwMAC...) }, ttl: 64, metric: IsthmusMetricMETRIC_DELIVER_POD, mark: overlayMark},
		{name: "to pod with option", dst: podIP, options: opt, wantEth: func() []byte { return append(append([]byte{}, l.istMAC...), gwMAC...) }, ttl: 64, metric: IsthmusMetricMETRIC_DELIVER_POD, mark: overlayMark},
		{name: "to host", dst: hostIP, wantEth: func() []byte { return append(append([]byte{}, l.istMAC...), gwMAC...) }, ttl: 64, metric: IsthmusMetricMETRIC_DELIVER_HOST},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := goodOpts(tc.dst)
			o.gnv.options = tc.options
			in := geneveFrame(l, o, innerEth(innerIPv4(o)))
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}
			o2 := o
			wantIP := ipv4Packet(o2.innerSrc, o2.innerDst, 17, ipOpts{ttl: tc.ttl}, udpDatagram(4000, 5000, []byte("payload")))
			want := append(append(tc.wantEth(), 0x08, 0x00), wantIP...)
			if !bytes.Equal(out, want) {
				t.Fatalf("decapsulated frame differs\n got %x\nwant %x", out, want)
			}
			if l.mark != tc.mark {
				t.Errorf("skb mark %#x, want %#x", l.mark, tc.mark)
			}
			d := delta(before, l.counts(t))
			if d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 ||
				d[metricKey(tc.metric, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 2 {
				t.Errorf("counters moved %v, want METRIC_DECAP and %d +1", d, tc.metric)
			}
		})
	}
}

func TestDecapXDP(t *testing.T) {
	l := newLab(t)
	o := goodOpts(podIP)
	inner := innerIPv4(o)
	in := geneveFrame(l, o, innerEth(inner))
	before := l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayXdp, in, 0)
	if ret != xdpPass {
		t.Fatalf("verdict %d, want XDP_PASS", ret)
	}
	// BPF_PROG_TEST_RUN returns the metadata in front of the frame.
	if len(out) < 8 {
		t.Fatalf("output %d bytes", len(out))
	}
	meta, frame := out[:8], out[8:]
	if m := binary.NativeEndian.Uint32(meta); m != 0x69737468 {
		t.Errorf("decap_meta magic %#x", m)
	}
	if p := binary.NativeEndian.Uint32(meta[4:]); p != be32(peerIP) {
		t.Errorf("decap_meta peer %#x, want %#x", p, be32(peerIP))
	}
	want := append(append([]byte{}, in[:14]...), inner...)
	if !bytes.Equal(frame, want) {
		t.Fatalf("popped frame differs\n got %x\nwant %x", frame, want)
	}
	d := delta(before, l.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_XDP)] != 1 || len(d) != 1 {
		t.Errorf("counters moved %v, want only METRIC_DECAP/XDP +1", d)
	}

	// underlay_ingress takes the popped frame (with its metadata) straight to delivery.
	// The skb test run has no way to pass data_meta, so this half is covered by the lab.
}

// xdpMd is struct xdp_md, the context of an XDP test run.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// TestDecapXDPNoMetadata: when XDP cannot put its decap_meta in front of a frame (a
// driver without metadata support; here the driver's own metadata fills the headroom
// up to the xdp_frame the kernel keeps there, 216 of the test run's 256 bytes), the frame
// passes unpopped and uncounted, and underlay_ingress decapsulates and delivers it
// as without XDP. Popped without metadata, it would reach the stack on the underlay
// device as plain IPv4, where strict rp_filter drops it uncounted.
func TestDecapXDPNoMetadata(t *testing.T) {
	l := newLab(t)
	o := goodOpts(podIP)
	frame := geneveFrame(l, o, innerEth(innerIPv4(o)))
	driverMeta := bytes.Repeat([]byte{0xd5}, 216)
	in := append(append([]byte{}, driverMeta...), frame...)
	before := l.counts(t)
	var ret uint32
	out := make([]byte, len(in)+512)
	err := inNS(l.ns, func() error {
		opts := &ebpf.RunOptions{Data: in, DataOut: out, Context: xdpMd{Data: uint32(len(driverMeta)), DataEnd: uint32(len(in))}}
		var err error
		ret, err = l.objs.UnderlayXdp.Run(opts)
		out = opts.DataOut
		return err
	})
	if err != nil {
		t.Fatalf("run underlay_xdp: %v", err)
	}
	if ret != xdpPass {
		t.Fatalf("verdict %d, want XDP_PASS", ret)
	}
	if !bytes.Equal(out, in) {
		t.Fatalf("frame changed without room for decap_meta\n got %x\nwant %x", out, in)
	}
	if d := delta(before, l.counts(t)); len(d) != 0 {
		t.Fatalf("counters moved %v for a frame XDP left to TC", d)
	}

	ret, _ = l.run(t, l.objs.UnderlayIngress, out[len(driverMeta):], l.und.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("underlay_ingress verdict %d on the unpopped frame, want TC_ACT_REDIRECT", ret)
	}
	d := delta(before, l.counts(t))
	if d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 ||
		d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 2 {
		t.Errorf("counters moved %v, want METRIC_DECAP and METRIC_DELIVER_POD at underlay_tc +1", d)
	}
}

type rejectCase struct {
	name   string
	in     []byte
	reason IsthmusDropReason // 0: must pass untouched
}

func rejectCases(l *lab) []rejectCase {
	g := goodOpts(podIP)
	ie := innerEth(innerIPv4(g))
	with := func(f func(*frameOpts)) frameOpts { o := goodOpts(podIP); f(&o); return o }
	outerIPHead := ipv4Packet(peerIP, underlayIP, 17, ipOpts{ttl: 64}, nil)
	var cases []rejectCase
	add := func(name string, in []byte, r IsthmusDropReason) { cases = append(cases, rejectCase{name, in, r}) }

	o := with(func(o *frameOpts) { o.outerSrc = strangerIP })
	add("non-peer", geneveFrame(l, o, ie), IsthmusDropReasonDROP_UNKNOWN_PEER)
	o = with(func(o *frameOpts) { o.innerSrc = deniedIP })
	add("disallowed inner source", geneveFrame(l, o, innerEth(innerIPv4(o))), IsthmusDropReasonDROP_INNER_SRC_DENIED)
	o = with(func(o *frameOpts) { o.gnv.ver = 1 })
	add("version 1", geneveFrame(l, o, ie), IsthmusDropReasonDROP_GENEVE_VERSION)
	o = with(func(o *frameOpts) { o.gnv.optWords = 63 })
	add("options past the packet", geneveFrame(l, o, ie), IsthmusDropReasonDROP_GENEVE_OPT_LEN)
	o = with(func(o *frameOpts) { o.gnv.critical = true; o.gnv.options = []byte{0, 1, 0x80, 0} })
	add("critical option", geneveFrame(l, o, ie), IsthmusDropReasonDROP_GENEVE_CRITICAL)
	o = with(func(o *frameOpts) { o.gnv.proto = 0x0800 })
	add("protocol IPv4", geneveFrame(l, o, ie), IsthmusDropReasonDROP_GENEVE_PROTOCOL)
	o = with(func(o *frameOpts) { o.gnv.vni = testVNI + 1 })
	add("wrong VNI", geneveFrame(l, o, ie), IsthmusDropReasonDROP_GENEVE_VNI)
	// The kernel's test run refuses an IPv4 skb shorter than 20 bytes of IP, so the
	// truncation is an IHL of 15 (60 bytes) in a 24-byte packet.
	// scapy: Ether()/raw(IP(src=peer, dst=underlay, ihl=15, options=[]))[:20] + b"\x00"*4
	shortIP := append(append([]byte{}, outerIPHead...), 0, 0, 0, 0)
	shortIP[0] = 0x4f
	add("truncated outer IPv4", ethFrame(l.undMAC, gwMAC, 0x0800, shortIP), IsthmusDropReasonDROP_INVALID_PACKET)
	// scapy: Ether()/IP(dst=underlay, proto=17)/b"\x13\xc1\x17\xc1" (4 bytes of UDP)
	add("truncated UDP", ethFrame(l.undMAC, gwMAC, 0x0800, ipv4Packet(peerIP, underlayIP, 17, ipOpts{ttl: 64}, []byte{0x13, 0xc1, 0x17, 0xc1})), IsthmusDropReasonDROP_INVALID_PACKET)
	add("truncated GENEVE", ethFrame(l.undMAC, gwMAC, 0x0800, ipv4Packet(peerIP, underlayIP, 17, ipOpts{ttl: 64}, udpDatagram(50000, 6081, []byte{0, 0, 0x65, 0x58}))), IsthmusDropReasonDROP_GENEVE_TRUNCATED)
	add("truncated inner Ethernet", geneveFrame(l, g, ie[:10]), IsthmusDropReasonDROP_INNER_INVALID)
	add("truncated inner IPv4", geneveFrame(l, g, ie[:14+12]), IsthmusDropReasonDROP_INNER_INVALID)
	add("inner IPv6 of version 0", geneveFrame(l, g, ethFrame(innerMAC, innerMAC, 0x86dd, make([]byte, 40))), IsthmusDropReasonDROP_INNER_INVALID)
	add("truncated inner IPv6", geneveFrame(l, g, ethFrame(innerMAC, innerMAC, 0x86dd, ipv6Packet(remotePodIP, podIP, 17, 64, nil)[:39])), IsthmusDropReasonDROP_INNER_INVALID)
	add("inner IPv6 from a source peer_sources6 lacks", geneveFrame(l, g, ethFrame(innerMAC, innerMAC, 0x86dd,
		ipv6Packet(netip.MustParseAddr("fd20::7"), netip.MustParseAddr("fd10::5"), 17, 64, udpDatagram(1, 2, nil)))), IsthmusDropReasonDROP_INNER_SRC_DENIED)
	add("inner ARP", geneveFrame(l, g, ethFrame(innerMAC, innerMAC, 0x0806, make([]byte, 28))), IsthmusDropReasonDROP_INNER_UNSUPPORTED)
	// Not ours: must pass untouched and count nothing.
	o = with(func(o *frameOpts) { o.dport = 4789 })
	add("other UDP port", geneveFrame(l, o, ie), 0)
	o = with(func(o *frameOpts) { o.outerDst = netip.MustParseAddr("192.168.1.7") })
	add("other destination", geneveFrame(l, o, ie), 0)
	add("outer fragment", ethFrame(l.undMAC, gwMAC, 0x0800, ipv4Packet(peerIP, underlayIP, 17, ipOpts{ttl: 64, fragOff: 0x2000}, udpDatagram(50000, 6081, geneveHeader(g.gnv, ie)))), IsthmusDropReasonDROP_OUTER_FRAGMENT)
	add("ARP", ethFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, gwMAC, 0x0806, make([]byte, 28)), 0)
	return cases
}

func TestDecapRejects(t *testing.T) {
	l := newLab(t)
	for _, hook := range []IsthmusHook{IsthmusHookHOOK_UNDERLAY_TC, IsthmusHookHOOK_UNDERLAY_XDP} {
		for _, tc := range rejectCases(l) {
			t.Run(map[IsthmusHook]string{IsthmusHookHOOK_UNDERLAY_TC: "tc", IsthmusHookHOOK_UNDERLAY_XDP: "xdp"}[hook]+"/"+tc.name, func(t *testing.T) {
				prog, ifindex, shot, pass := l.objs.UnderlayIngress, l.und.Attrs().Index, uint32(tcActShot), uint32(tcActOK)
				if hook == IsthmusHookHOOK_UNDERLAY_XDP {
					prog, ifindex, shot, pass = l.objs.UnderlayXdp, 0, xdpDrop, xdpPass
				}
				before := l.counts(t)
				ret, out := l.run(t, prog, tc.in, ifindex)
				d := delta(before, l.counts(t))
				if tc.reason == 0 {
					if ret != pass || !bytes.Equal(out, tc.in) || len(d) != 0 {
						t.Fatalf("verdict %d, changed %v, counters %v; want pass, untouched, none", ret, !bytes.Equal(out, tc.in), d)
					}
					return
				}
				if ret != shot {
					t.Fatalf("verdict %d, want drop (%d)", ret, shot)
				}
				if k := dropKey(tc.reason, hook); d[k] != 1 || len(d) != 1 {
					t.Errorf("counters moved %v, want only %v +1", d, k)
				}
			})
		}
	}
}

// TestDropReasonsMatchHeader checks that the drop_reason enum in the compiled object's
// BTF has exactly the entries of lib/drop.h, so nobody renumbers one side only.
func TestDropReasonsMatchHeader(t *testing.T) {
	src, err := os.ReadFile("lib/drop.h")
	if err != nil {
		t.Fatalf("read drop.h: %v", err)
	}
	want := map[string]int32{}
	for _, m := range regexp.MustCompile(`(?m)^\s*(DROP_\w+)\s*=\s*(-\d+)\s*,`).FindAllStringSubmatch(string(src), -1) {
		v, err := strconv.Atoi(m[2])
		if err != nil {
			t.Fatalf("parse %s: %v", m[0], err)
		}
		want[m[1]] = int32(v)
	}
	if len(want) < 20 {
		t.Fatalf("found only %d reasons in drop.h: the pattern is broken", len(want))
	}
	spec, err := LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName("drop_reason", &e); err != nil {
		t.Fatalf("find drop_reason in BTF: %v", err)
	}
	got := map[string]int32{}
	for _, v := range e.Values {
		got[v.Name] = int32(uint32(v.Value)) // clang 14 emits the enum unsigned
	}
	if len(got) != len(want) {
		t.Errorf("BTF has %d reasons, drop.h %d", len(got), len(want))
	}
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s: BTF %d (present %v), drop.h %d", name, g, ok, v)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s in BTF but not in drop.h", name)
		}
	}
}

// dropCodes returns the metrics codes of every drop reason in the object's BTF.
func dropCodes(tb testing.TB) map[uint16]bool {
	codes := map[uint16]bool{}
	for c := range dropNames(tb) {
		codes[c] = true
	}
	return codes
}

func FuzzUnderlayIngress(f *testing.F) {
	l := newLab(f)
	isDrop := dropCodes(f)
	for _, tc := range rejectCases(l) {
		f.Add(tc.in)
	}
	f.Add(geneveFrame(l, goodOpts(podIP), innerEth(innerIPv4(goodOpts(podIP)))))
	f.Add(geneveFrame(l, goodOpts(hostIP), innerEth(innerIPv4(goodOpts(hostIP)))))
	// Transit (lib/transit.h): every input runs on the node as a member and as a
	// gateway, where memberIP's frames for a remote prefix are forwarded.
	addMember(f, l)
	f.Add(transitFrame(l, transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: remotePodIP, innerTTL: 63, sport: 1234}))
	f.Add(transitFrame(l, transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: remotePodIP, innerTTL: 1, sport: 1234, udpCsum: true}))
	f.Add(transitFrame(l, transitOpts{outerSrc: peerIP, innerSrc: remotePodIP, innerDst: remotePodIP, innerTTL: 63, sport: 1234, ipOptions: []byte{1, 1, 1, 0}}))
	f.Fuzz(func(t *testing.T, in []byte) {
		// BPF_PROG_TEST_RUN refuses data larger than a page; frames on a 1500-byte
		// underlay are at most 1514 bytes.
		if len(in) > 1514 {
			in = in[:1514]
		}
		// BPF_PROG_TEST_RUN refuses skbs shorter than an Ethernet header, and IPv4 or
		// IPv6 skbs shorter than their fixed L3 header: no packet on a wire looks so.
		if len(in) < 14 ||
			(binary.BigEndian.Uint16(in[12:]) == 0x0800 && len(in) < 14+20) ||
			(binary.BigEndian.Uint16(in[12:]) == 0x86dd && len(in) < 14+40) {
			return
		}
		for _, transit := range []bool{false, true} {
			setTransit(t, l, transit)
			checkUnderlayIngress(t, l, isDrop, in)
		}
	})
}

// checkUnderlayIngress runs underlay_ingress on in and fails t unless the verdict and
// the counters that moved agree: a pass counts nothing, a drop counts one reason, a
// redirect counts a delivery, a fabric ingress or a transit.
func checkUnderlayIngress(t *testing.T, l *lab, isDrop map[uint16]bool, in []byte) {
	t.Helper()
	{
		before := l.counts(t)
		ret, _ := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
		d := delta(before, l.counts(t))
		switch ret {
		case tcActOK:
			if len(d) != 0 {
				t.Fatalf("passed but counters moved: %v", d)
			}
		case tcActShot:
			// Exactly one drop, +1; a frame dropped after the pop (e.g. inner TTL 0)
			// has also been counted as decapsulated.
			drops := 0
			for k, n := range d {
				switch {
				case k == metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC) && n == 1:
				case n == 1 && k.Hook == uint8(IsthmusHookHOOK_UNDERLAY_TC) && isDrop[k.Code]:
					drops++
				default:
					t.Fatalf("dropped, counted %v +%d", k, n)
				}
			}
			if drops != 1 {
				t.Fatalf("dropped with counters %v, want exactly one drop counted", d)
			}
		case tcActRedirect:
			// Decapsulated and delivered, a plain packet the fabric handed over, or
			// forwarded whole to another peer (transit, on a gateway only), or, in
			// transit, answered with ICMP time exceeded back to the sender.
			alone := func(m IsthmusMetric) bool { return d[metricKey(m, IsthmusHookHOOK_UNDERLAY_TC)] == 1 && len(d) == 1 }
			// Time exceeded answers a transiting frame and, on any node, one whose inner
			// TTL expires on its way to a local pod.
			transit := alone(IsthmusMetricMETRIC_TRANSIT)
			if transit && !l.isTransit(t) {
				t.Fatalf("transit without CFG_F_TRANSIT")
			}
			if !alone(IsthmusMetricMETRIC_FABRIC_INGRESS) && !transit && !alone(IsthmusMetricMETRIC_TIME_EXCEEDED_SENT) &&
				(d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || len(d) != 2) {
				t.Fatalf("redirected with counters %v, want METRIC_DECAP and one delivery, METRIC_FABRIC_INGRESS, METRIC_TRANSIT or METRIC_TIME_EXCEEDED_SENT", d)
			}
		default:
			t.Fatalf("verdict %d not one of OK, SHOT, REDIRECT", ret)
		}
	}
}
