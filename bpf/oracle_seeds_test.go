package bpf

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Generated frames for the oracle: every shape issue 10 lists (outer and inner IPv4
// options, GENEVE options of every length, C and O bits, fragments, VLAN tags,
// truncations, wrong VNIs, unknown peers, every source class), built here and judged by
// the model, never by an expected verdict written beside them.

// uframe describes a GENEVE frame on the underlay; the zero value of a field means the
// ordinary choice (see build).
type uframe struct {
	outerSrc, outerDst netip.Addr
	outerOpts          []byte // outer IPv4 options, a multiple of 4
	outerTOS           byte
	fragOff            uint16 // outer flags and offset; 0 means DF
	dport              uint16
	outerVLAN          bool
	gnv                geneveOpts
	oam                bool
	rawGnvOpts         bool // gnv.options are raw bytes, not TLVs to generate
	gnvOptLen          int  // bytes of TLV options to generate
	innerType          uint16
	innerDMAC          net.HardwareAddr
	inner              []byte // inner IPv4 packet; nil: ipkt{}.build() from innerSrc to innerDst
	innerSrc, innerDst netip.Addr
}

// ipkt describes an inner IPv4 packet.
type ipkt struct {
	src, dst netip.Addr
	ttl, tos byte
	ttl0     bool // TTL 0 (ttl 0 means the default, 64)
	opts     []byte
	fragOff  uint16
	proto    byte // 17 (default), 6: a SYN, 1: an echo request
	dport    uint16
	mssOpts  []byte // TCP options of the SYN
	flags    byte   // TCP flags (default SYN)
	size     int    // pad the payload to make the IPv4 packet this long
}

func (p ipkt) build() []byte {
	if p.ttl == 0 && !p.ttl0 {
		p.ttl = 64
	}
	payload := []byte("oracle")
	if p.size > 0 {
		payload = make([]byte, max(0, p.size-20-len(p.opts)-8))
		for i := range payload {
			payload[i] = byte(i)
		}
	}
	var l4 []byte
	switch p.proto {
	case 6:
		flags := p.flags
		if flags == 0 {
			flags = 0x02
		}
		seg := tcpSegment(40000, 80, flags, payload)
		if len(p.mssOpts) > 0 {
			seg = append(append(append([]byte{}, seg[:20]...), p.mssOpts...), seg[20:]...)
			seg[12] = byte((20+len(p.mssOpts))/4) << 4
		}
		l4 = withCsum(p.src, p.dst, 6, seg)
	case 1:
		l4 = icmpEcho(8, 0x77, 1, payload)
	default:
		dport := p.dport
		if dport == 0 {
			dport = 5000
		}
		l4 = withCsum(p.src, p.dst, 17, udpDatagram(4000, dport, payload))
	}
	proto := p.proto
	if proto == 0 {
		proto = 17
	}
	return withIPOptions(ipv4Packet(p.src, p.dst, proto, ipOpts{ttl: p.ttl, tos: p.tos, fragOff: p.fragOff, id: 0x0101}, l4), p.opts)
}

// geneveTLVs returns n bytes (a multiple of 4) of non-critical GENEVE options, each at
// most 128 bytes (the 5-bit length field).
func geneveTLVs(n int) []byte {
	var b []byte
	for n > 0 {
		l := min(n, 128)
		b = append(b, 0x01, 0x02, 0x03, byte((l-4)/4))
		for i := 4; i < l; i++ {
			b = append(b, byte(i))
		}
		n -= l
	}
	return b
}

func (u uframe) build(l *lab) []byte {
	if !u.outerSrc.IsValid() {
		u.outerSrc = peerIP
	}
	if !u.outerDst.IsValid() {
		u.outerDst = underlayIP
	}
	if u.dport == 0 {
		u.dport = 6081
	}
	if u.fragOff == 0 {
		u.fragOff = 0x4000
	}
	if u.gnv.proto == 0 {
		u.gnv.proto = 0x6558
	}
	if u.gnv.vni == 0 {
		u.gnv.vni = testVNI
	}
	if u.gnv.optWords == 0 {
		u.gnv.optWords = -1
	}
	if !u.rawGnvOpts && u.gnvOptLen > 0 {
		u.gnv.options = geneveTLVs(u.gnvOptLen)
	}
	if u.innerType == 0 {
		u.innerType = 0x0800
	}
	if u.innerDMAC == nil {
		u.innerDMAC = innerMAC
	}
	inner := u.inner
	if inner == nil {
		src, dst := u.innerSrc, u.innerDst
		if !src.IsValid() {
			src = remotePodIP
		}
		if !dst.IsValid() {
			dst = podIP
		}
		inner = ipkt{src: src, dst: dst}.build()
	}
	gnv := geneveHeader(u.gnv, ethFrame(u.innerDMAC, innerMAC, u.innerType, inner))
	if u.oam {
		gnv[1] |= 0x80
	}
	ip := withIPOptions(ipv4Packet(u.outerSrc, u.outerDst, 17, ipOpts{ttl: 61, tos: u.outerTOS, fragOff: u.fragOff, id: 0x1234},
		udpDatagram(50000, u.dport, gnv)), u.outerOpts)
	if u.outerVLAN {
		return ethFrame(l.undMAC, gwMAC, 0x8100, append([]byte{0, 7, 8, 0}, ip...))
	}
	return ethFrame(l.undMAC, gwMAC, 0x0800, ip)
}

// ipOptionBytes returns n bytes (a multiple of 4) of IPv4 options: a record-route-like
// option of type 7 filling all but the last byte, then EOL; 4 bytes are 3 NOPs and EOL.
func ipOptionBytes(n int) []byte {
	if n == 0 {
		return nil
	}
	if n == 4 {
		return []byte{1, 1, 1, 0}
	}
	b := []byte{7, byte(n - 1), 4}
	for len(b) < n-1 {
		b = append(b, 0)
	}
	return append(b, 0)
}

// forgedFrame is the attack of issue 10: a peer's frame whose outer IPv4 header carries
// 40 bytes of options, whose GENEVE options end with a forged IPv4 + UDP header from
// spoofedIP that starts 40 bytes before the real inner IPv4 header, followed by an inner
// frame with an allowed source. A pop that assumes a 20-byte outer header delivers the
// forged packet.
func forgedFrame(l *lab) []byte {
	forged := ipv4Packet(spoofedIP, podIP, 17, ipOpts{ttl: 64}, udpDatagram(6666, 5000, make([]byte, 12)))[:28]
	opts := append([]byte{0x01, 0x02, 0x03, 7}, make([]byte, 28)...)
	copy(opts[32-26:], forged[:26])
	// The forged UDP checksum (0) is the first two bytes of the inner destination MAC.
	dmac := net.HardwareAddr{forged[26], forged[27], 0, 0, 0x02, 0x07}
	return uframe{outerOpts: ipOptionBytes(40), gnv: geneveOpts{options: opts}, rawGnvOpts: true, innerDMAC: dmac}.build(l)
}

// underlaySeeds are the generated frames for underlay_ingress and underlay_xdp.
func underlaySeeds(l *lab) [][]byte {
	var s [][]byte
	add := func(u uframe) { s = append(s, u.build(l)) }
	a := netip.MustParseAddr

	// Inner destinations of every class, from an allowed source.
	for _, dst := range []netip.Addr{podIP, hostIP, underlayIP, a("127.0.0.1"), a("255.255.255.255"), a("172.16.0.1"),
		a("10.50.0.1"), a("10.2.0.9"), a("10.2.0.70"), memberPod, groupDst, a("10.6.0.1"), a("10.0.3.20")} {
		add(uframe{innerDst: dst})
	}
	// Inner sources of every class, from every kind of sender.
	for _, c := range []struct{ peer, src netip.Addr }{
		{peerIP, remotePodIP}, {peerIP, a("10.0.2.5")}, {peerIP, a("10.2.0.200")}, {peerIP, spoofedIP},
		{peerIP, podIP}, {peerIP, hostIP}, {peerIP, memberPod}, {peerIP, a("0.0.0.0")}, {peerIP, a("255.255.255.255")},
		{peerIP, a("127.0.0.1")}, {memberIP, memberPod}, {memberIP, a("10.2.0.130")}, {memberIP, remotePodIP},
		{groupPeerA, a("10.5.0.1")}, {groupPeerB, remotePodIP}, {strangerIP, remotePodIP}, {underlayIP, remotePodIP},
	} {
		add(uframe{outerSrc: c.peer, innerSrc: c.src})
		add(uframe{outerSrc: c.peer, innerSrc: c.src, innerDst: a("10.2.0.70")})
	}
	// Outer IPv4 options x GENEVE options of every length.
	for _, oo := range []int{0, 4, 40} {
		for n := 0; n <= 252; n += 4 {
			add(uframe{outerOpts: ipOptionBytes(oo), gnvOptLen: n})
		}
	}
	s = append(s, forgedFrame(l))
	// GENEVE header fields.
	for _, u := range []uframe{
		{gnv: geneveOpts{critical: true}},
		{gnv: geneveOpts{critical: true}, gnvOptLen: 8},
		{oam: true}, {oam: true, gnvOptLen: 8}, {oam: true, innerDst: hostIP}, {oam: true, innerDst: memberPod},
		{gnv: geneveOpts{ver: 1}}, {gnv: geneveOpts{ver: 3}},
		{gnv: geneveOpts{proto: 0x0800}}, {gnv: geneveOpts{proto: 0x86dd}},
		{gnv: geneveOpts{vni: testVNI + 1}}, {gnv: geneveOpts{vni: 0xffffff}},
		{gnv: geneveOpts{optWords: 63}}, {gnv: geneveOpts{optWords: 2}},
		{outerSrc: strangerIP, gnv: geneveOpts{vni: 7}},
	} {
		add(u)
	}
	// Inner frame shapes.
	for _, p := range []ipkt{
		{ttl: 1}, {ttl0: true}, {ttl: 1, dst: memberPod}, {ttl: 1, dst: hostIP},
		{opts: ipOptionBytes(4)}, {opts: ipOptionBytes(40)},
		{proto: 6, mssOpts: []byte{2, 4, 0x05, 0xb4}},
		{proto: 6, mssOpts: []byte{1, 2, 4, 0x05, 0xb4, 1, 1, 0}},
		{proto: 6, mssOpts: []byte{2, 4, 0x03, 0xe8}},
		{proto: 6, flags: 0x12, mssOpts: []byte{1, 1, 1, 2, 4, 0x23, 0x28, 0}},
		{proto: 6, flags: 0x10, mssOpts: []byte{2, 4, 0x05, 0xb4}},
		{proto: 1}, {fragOff: 0x2000}, {fragOff: 0x0010}, {tos: 0x02}, {tos: 0x03},
		{size: 1400},
	} {
		if !p.src.IsValid() {
			p.src = remotePodIP
		}
		if !p.dst.IsValid() {
			p.dst = podIP
		}
		add(uframe{inner: p.build()})
		p.dst = hostIP
		add(uframe{inner: p.build()})
	}
	good := ipkt{src: remotePodIP, dst: podIP}.build()
	badIHL := append([]byte{}, good...)
	badIHL[0] = 0x44
	v6 := append([]byte{}, good...)
	v6[0] = 0x65
	add(uframe{inner: badIHL})
	add(uframe{inner: v6})
	add(uframe{innerType: 0x86dd, inner: make([]byte, 40)})
	add(uframe{innerType: 0x8100, inner: append([]byte{0, 5, 8, 0}, good...)})
	add(uframe{innerType: 0x0806, inner: make([]byte, 28)})
	// Outer shapes.
	for _, u := range []uframe{
		{outerVLAN: true}, {fragOff: 0x2000}, {fragOff: 0x0020}, {fragOff: 0x2000, outerOpts: ipOptionBytes(8)},
		{outerTOS: 0x03, inner: ipkt{src: remotePodIP, dst: podIP, tos: 0x01}.build()},
		{outerTOS: 0x03, inner: ipkt{src: remotePodIP, dst: hostIP, tos: 0x02}.build()},
		{outerTOS: 0x03},
		{outerTOS: 0x02},
		{dport: 4789}, {outerDst: a("192.168.1.7")},
		{outerTOS: 0x03, outerOpts: ipOptionBytes(12), innerDst: memberPod},
	} {
		add(u)
	}
	// Truncations of a frame with options everywhere.
	full := uframe{outerOpts: ipOptionBytes(8), gnvOptLen: 12, inner: ipkt{src: remotePodIP, dst: podIP, proto: 6, opts: ipOptionBytes(4),
		mssOpts: []byte{1, 2, 4, 0x05, 0xb4, 0}}.build()}.build(l)
	for n := 34; n < len(full); n++ {
		s = append(s, full[:n])
	}
	badOuterIHL := uframe{}.build(l)
	badOuterIHL[14] = 0x44
	s = append(s, badOuterIHL)
	return s
}

// encapSeeds are the generated frames for pod_ingress (fromPod) and overlay_egress.
func encapSeeds(l *lab, fromPod bool) [][]byte {
	a := netip.MustParseAddr
	dmac, smac, own := l.podHMAC, podMAC, podIP
	if !fromPod {
		dmac, smac, own = l.istMAC, l.istMAC, hostIP
	}
	var s [][]byte
	add := func(p ipkt) {
		if !p.src.IsValid() {
			p.src = own
		}
		s = append(s, ethFrame(dmac, smac, 0x0800, p.build()))
	}
	for _, dst := range []netip.Addr{remotePodIP, a("10.2.0.70"), a("10.2.0.200"), groupDst, a("10.6.0.1"), memberPod, a("10.0.3.1"),
		podIP, hostIP, a("10.50.0.1"), a("172.16.0.1"), peerIP, underlayIP} {
		add(ipkt{dst: dst})
		add(ipkt{dst: dst, proto: 1})
	}
	// Sources of every class: own, a neighbour pod, this node, a remote pod, forged.
	for _, src := range []netip.Addr{own, a("10.1.0.6"), hostIP, podIP, remotePodIP, spoofedIP, a("0.0.0.0")} {
		add(ipkt{src: src, dst: remotePodIP})
		add(ipkt{src: src, dst: podIP})
	}
	// Another CNI's pod (no exempt source, not the host's: return-path SNAT on
	// isthmus0), with every protocol class SNAT tells apart, and a TTL of 1 (the host
	// stack forwards such packets into isthmus0).
	for _, p := range []ipkt{{}, {proto: 6}, {proto: 1}, {ttl: 1}, {ttl: 1, proto: 6}, {fragOff: 0x2000}, {proto: 47}} {
		p.src, p.dst = a("10.200.0.9"), remotePodIP
		add(p)
	}
	// GENEVE from the pod to peers' underlay addresses.
	for _, dst := range []netip.Addr{peerIP, memberIP, groupPeerA, strangerIP} {
		add(ipkt{dst: dst, dport: 6081})
	}
	// Outside snat_exempt with TTL 1: on isthmus0 still translated (nothing refuses it there).
	add(ipkt{src: spoofedIP, dst: remotePodIP, ttl: 1})
	add(ipkt{src: spoofedIP, dst: remotePodIP, ttl: 2})
	inner := uframe{}.build(l)[14:]
	add(ipkt{dst: peerIP, dport: 6081, size: 20 + 8 + len(inner)})
	for _, p := range []ipkt{
		{ttl: 1}, {ttl: 2}, {ttl0: true}, {tos: 0xb9}, {opts: ipOptionBytes(4)}, {opts: ipOptionBytes(40)},
		{fragOff: 0x2000}, {fragOff: 0x0008},
		{proto: 6, mssOpts: []byte{2, 4, 0x05, 0xb4}},
		{proto: 6, mssOpts: []byte{1, 2, 4, 0x05, 0xb4, 1, 1, 0}},
		{proto: 6, mssOpts: []byte{1, 1, 1, 2, 4, 0x23, 0x28, 0}},
		{proto: 6, mssOpts: []byte{3, 3, 7, 2, 4, 0x05, 0xb4, 0}},
		{proto: 6, mssOpts: []byte{2, 4, 0x01, 0x00}},
		{proto: 6, flags: 0x10, mssOpts: []byte{2, 4, 0x05, 0xb4}},
		{size: 1450}, {size: 1451}, {size: 1480, fragOff: 0x4000}, {size: 1480},
	} {
		p.dst = remotePodIP
		add(p)
		p.dst = groupDst
		add(p)
	}
	good := ethFrame(dmac, smac, 0x0800, ipkt{src: own, dst: remotePodIP}.build())
	vlan := ethFrame(dmac, smac, 0x8100, append([]byte{0, 5, 8, 0}, good[14:]...))
	arp := ethFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, smac, 0x0806, make([]byte, 28))
	badIHL := append([]byte{}, good...)
	badIHL[14] = 0x44
	v6in4 := append([]byte{}, good...)
	v6in4[14] = 0x65
	s = append(s, vlan, arp, badIHL, v6in4, ethFrame(dmac, smac, 0x86dd, make([]byte, 40)))
	for n := 34; n < len(good); n++ {
		s = append(s, good[:n])
	}
	var tcp []byte
	for _, f := range s {
		if len(f) > 34 && f[23] == 6 {
			tcp = f
		}
	}
	// A SYN whose data offset runs past the packet.
	short := append([]byte{}, tcp[:14+20+20]...)
	short[14+20+12] = 0xf0
	binary.BigEndian.PutUint16(short[16:], uint16(len(short)-14))
	return append(s, short)
}
