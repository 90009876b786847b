package bpf

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
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
	proto    byte   // 17 (default), 6: a SYN, 1: an echo request
	sport    uint16 // TCP only (default 40000)
	dport    uint16 // UDP default 5000, TCP 80
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
		sport, dport := p.sport, p.dport
		if sport == 0 {
			sport = 40000
		}
		if dport == 0 {
			dport = 80
		}
		seg := tcpSegment(sport, dport, flags, payload)
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
		a("10.50.0.1"), a("10.2.0.9"), a("10.2.0.70"), notForPodsDst.Addr(), memberPod, groupDst, a("10.6.0.1"), a("10.0.3.20")} {
		add(uframe{innerDst: dst})
	}
	// Issue 11: a peer's pod dialling this node's underlay address (a TCP SYN), also
	// with an expiring TTL: delivered to the host, no routing hop.
	for _, k := range []ipkt{{proto: 6}, {proto: 6, ttl: 1}, {ttl0: true}} {
		k.src, k.dst = remotePodIP, underlayIP
		add(uframe{inner: k.build()})
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
		// Two MSS options, the large one last (Linux keeps the last); one of another
		// length before one to clamp.
		{proto: 6, mssOpts: []byte{2, 4, 0x02, 0x00, 2, 4, 0x05, 0xb4}},
		{proto: 6, flags: 0x12, mssOpts: []byte{2, 3, 0x05, 1, 2, 4, 0x05, 0xb4, 0, 0, 0, 0}},
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
	s = append(s, underlay6Seeds(l)...)
	return append(s, natSeeds(l)...)
}

// icmpError is an ICMP error of type typ (code) from from about orig, quoting its
// header and n bytes after it, with a valid checksum.
func icmpError(typ, code byte, from netip.Addr, orig []byte, n int) []byte {
	hl := int(orig[0]&0x0f) * 4
	icmp := append([]byte{typ, code, 0, 0, 0, 0, 0, 0}, orig[:min(len(orig), hl+n)]...)
	binary.BigEndian.PutUint16(icmp[2:], csum16(icmp))
	return ipv4Packet(from, netip.AddrFrom4([4]byte(orig[12:16])), 1, ipOpts{ttl: 64}, icmp)
}

// tcpWith is a TCP segment sport -> dport with flags and options, its checksum right
// for src -> dst.
func tcpWith(src, dst netip.Addr, sport, dport uint16, flags byte, opts []byte) []byte {
	seg := tcpSegment(sport, dport, flags, []byte("data"))
	if len(opts) > 0 {
		seg = append(append(append([]byte{}, seg[:20]...), opts...), seg[20:]...)
		seg[12] = byte((20+len(opts))/4) << 4
	}
	return withCsum(src, dst, 6, seg)
}

// natSeeds are the frames that reach the nat table's reverse paths and fabric ingress
// (the world's nat flows, oracle_test.go): replies to the tunnel address in GENEVE
// (return-path SNAT), plain replies to the underlay address (egress masquerade), ICMP
// errors about translated flows, replies of no or an expired flow; and plain overlay
// packets from the site router and other neighbours (fabric ingress), and GENEVE for
// this site's fabric (fabric delivery).
func natSeeds(l *lab) [][]byte {
	a := netip.MustParseAddr
	var s [][]byte
	gnv := func(from netip.Addr, ip []byte) { s = append(s, uframe{outerSrc: from, inner: ip}.build(l)) }
	plain := func(mac net.HardwareAddr, ip []byte) { s = append(s, ethFrame(l.undMAC, mac, 0x0800, ip)) }
	udp := func(src, dst netip.Addr, sport, dport uint16, ttl byte) []byte {
		return ipv4Packet(src, dst, 17, ipOpts{ttl: ttl}, withCsum(src, dst, 17, udpDatagram(sport, dport, []byte("reply"))))
	}
	tcp := func(src, dst netip.Addr, sport, dport uint16, flags byte, opts []byte, ttl byte) []byte {
		return ipv4Packet(src, dst, 6, ipOpts{ttl: ttl}, tcpWith(src, dst, sport, dport, flags, opts))
	}
	echoReply := func(src, dst netip.Addr, id uint16) []byte {
		return ipv4Packet(src, dst, 1, ipOpts{ttl: 60}, icmpEcho(0, id, 1, []byte("pong")))
	}
	mss := []byte{1, 2, 4, 0x05, 0xb4, 1, 1, 0}

	// Return-path SNAT: replies in GENEVE to the tunnel address.
	gnv(peerIP, udp(remotePodIP, hostIP, 5000, 61001, 60))                                                      // another CNI's pod: to the stack
	gnv(peerIP, udp(remotePodIP, hostIP, 5000, 61001, 1))                                                       // the same, TTL 1
	gnv(peerIP, udp(remotePodIP, hostIP, 5000, 61005, 60))                                                      // an expired flow: the host's
	gnv(peerIP, udp(remotePodIP, hostIP, 5000, 61009, 60))                                                      // no flow: the host's
	gnv(groupPeerA, udp(a("10.5.0.1"), hostIP, 5000, 61004, 60))                                                // this node's pod: opens a flow, through the stack
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 61002, 0x12, mss, 60))                                             // SYN-ACK to another CNI's pod, MSS clamped
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 40000, 0x12, mss, 60))                                             // SYN-ACK to this node's pod: straight to it
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 40000, 0x10, nil, 60))                                             // ACK
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 40000, 0x11, nil, 60))                                             // FIN
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 40000, 0x04, nil, 60))                                             // RST
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 40000, 0x10, nil, 1))                                              // TTL 1 for the pod
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 40000, 0x02, nil, 60))                                             // a SYN (opens a flow) on the flow's tuple
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 40000, 0x10, nil, 60)[:20+16])                                     // the TCP checksum past the frame
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 40000, 0x10, nil, 60)[:20+18])                                     // just the checksum
	gnv(peerIP, echoReply(remotePodIP, hostIP, 61003))                                                          // echo reply to another CNI's pod
	gnv(peerIP, echoReply(remotePodIP, hostIP, 0x78))                                                           // to this node's pod
	gnv(peerIP, ipv4Packet(remotePodIP, hostIP, 17, ipOpts{ttl: 60}, udpDatagram(5000, 61001, []byte("none")))) // no UDP checksum
	gnv(peerIP, withIPOptions(udp(remotePodIP, hostIP, 5000, 61001, 60), ipOptionBytes(8)))
	s = append(s, uframe{outerTOS: 0x03, inner: ipv4Packet(remotePodIP, hostIP, 6, ipOpts{ttl: 60, tos: 0x02},
		tcpWith(remotePodIP, hostIP, 80, 40000, 0x10, nil))}.build(l)) // outer CE, inner ECT(0)
	// TCP to the tunnel address that no flow claims: dropped (the host would reset
	// it), unless an RST, a bare SYN, or a tuple conntrack holds (the host's own
	// connection from port 61013).
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 61020, 0x10, nil, 60))
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 61020, 0x04, nil, 60))
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 61020, 0x02, nil, 60))
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 61013, 0x10, nil, 60))
	frag := udp(remotePodIP, hostIP, 5000, 61001, 60)
	frag[6] = 0x20 // MF: a fragment is never translated
	gnv(peerIP, frag)
	// ICMP errors about translated flows, quoting 8 bytes or the whole TCP header.
	sent := func(proto byte, sport, dport uint16, dst netip.Addr, from netip.Addr) []byte {
		switch proto {
		case 6:
			return tcp(from, dst, sport, dport, 0x02, nil, 63)
		case 1:
			return ipv4Packet(from, dst, 1, ipOpts{ttl: 63}, icmpEcho(8, sport, 1, []byte("ping")))
		}
		return udp(from, dst, sport, dport, 63)
	}
	for _, q := range []struct {
		proto        byte
		sport, dport uint16
		n            int
	}{{17, 61001, 5000, 8}, {6, 61002, 80, 8}, {6, 40000, 80, 20}, {6, 40000, 80, 24}, {1, 0x78, 0, 8}, {1, 61003, 0, 12}, {17, 61005, 5000, 8}} {
		orig := sent(q.proto, q.sport, q.dport, remotePodIP, hostIP)
		gnv(peerIP, icmpError(3, 3, remotePodIP, orig, q.n))
		gnv(peerIP, icmpError(11, 0, remotePodIP, orig, q.n))
	}
	noSum := udp(hostIP, remotePodIP, 61001, 5000, 63)
	noSum[20+6], noSum[20+7] = 0, 0
	gnv(peerIP, icmpError(3, 4, remotePodIP, noSum, 8))
	gnv(peerIP, icmpError(12, 0, remotePodIP, withIPOptions(sent(17, 61001, 5000, remotePodIP, hostIP), ipOptionBytes(4)), 8))
	gnv(peerIP, icmpError(5, 0, remotePodIP, sent(17, 61001, 5000, remotePodIP, hostIP), 8)) // a redirect: not translated

	// Health probes to the tunnel address: covered by a claim (reaching, not, expired,
	// the default for an unknown site), by none, and not quite probes.
	probe := func(port uint16, msg []byte, csum bool) []byte {
		seg := udpDatagram(40001, port, msg)
		if csum {
			seg = withCsum(proberIP, hostIP, 17, seg)
		}
		return ipv4Packet(proberIP, hostIP, 17, ipOpts{ttl: 64}, seg)
	}
	for _, p := range []struct {
		port uint16
		site string
	}{{healthPort, ""}, {healthPort, "site-b"}, {healthPort, "site-x"}, {healthPort + 1, "site-c"}, {healthPort + 1, "site-x"},
		{healthPort + 2, ""}, {healthPort, "site-b\x00\x00"}, {healthPort, strings.Repeat("s", 65)}} {
		gnv(peerIP, probe(p.port, healthMsg('P', 7, p.site), true))
		gnv(peerIP, probe(p.port, healthMsg('P', 7, p.site), false))
	}
	badMagic := healthMsg('P', 7, "")
	badMagic[3] = 'X'
	gnv(peerIP, probe(healthPort, badMagic, true))
	gnv(peerIP, probe(healthPort, healthMsg('R', 7, ""), true))
	gnv(peerIP, probe(healthPort, healthMsg('P', 7, "")[:24], true))
	gnv(peerIP, withIPOptions(probe(healthPort, healthMsg('P', 7, ""), true), ipOptionBytes(4)))
	s = append(s, uframe{outerOpts: ipOptionBytes(8), gnvOptLen: 8, inner: probe(healthPort, healthMsg('P', 7, "site-b"), true)}.build(l))
	s = append(s, uframe{outerTOS: 0x03, inner: probe(healthPort, healthMsg('P', 7, ""), true)}.build(l))

	// Egress masquerade: plain replies to the underlay address.
	plain(gwMAC, tcp(worldIP, underlayIP, 80, 33000, 0x12, mss, 60))
	plain(gwMAC, tcp(worldIP, underlayIP, 80, 33000, 0x10, nil, 1))
	plain(gwMAC, tcp(worldIP, underlayIP, 80, 33000, 0x10, nil, 60)[:20+16])
	plain(gwMAC, udp(worldIP, underlayIP, 53, 61006, 60))
	plain(gwMAC, udp(worldIP, underlayIP, 53, 61007, 60)) // expired
	plain(gwMAC, udp(worldIP, underlayIP, 53, 61008, 60)) // no flow
	plain(fabricMAC, udp(worldIP, underlayIP, 53, 61006, 60))
	plain(gwMAC, echoReply(worldIP, underlayIP, 0x1234))
	plain(gwMAC, icmpError(3, 3, worldIP, sent(17, 61006, 53, worldIP, underlayIP), 8))
	plain(gwMAC, icmpError(11, 0, worldIP, sent(6, 33000, 80, worldIP, underlayIP), 20))
	plain(gwMAC, icmpError(3, 1, worldIP, sent(1, 0x1234, 0, worldIP, underlayIP), 8))
	plain(gwMAC, udp(worldIP, underlayIP, 53, 6081, 60))
	// TCP to the underlay address that no flow claims, as to the tunnel address (the
	// host's own connection from port 33021 is in conntrack).
	plain(gwMAC, tcp(worldIP, underlayIP, 80, 33020, 0x18, nil, 60))
	plain(gwMAC, tcp(worldIP, underlayIP, 80, 33020, 0x14, nil, 60))
	plain(gwMAC, tcp(worldIP, underlayIP, 80, 33020, 0x02, nil, 60))
	plain(gwMAC, tcp(worldIP, underlayIP, 80, 33021, 0x10, nil, 60))
	// The tunnel's translations are not the underlay's, nor the other way round.
	plain(gwMAC, udp(remotePodIP, hostIP, 5000, 61001, 60))
	gnv(peerIP, udp(remotePodIP, underlayIP, 5000, 61001, 60))

	// Fabric ingress: plain overlay packets for this node's pod, from the site router
	// (to the stack if they open a flow, else straight to the pod) and from others.
	for _, mac := range []net.HardwareAddr{gwMAC, fabricMAC, {0x02, 0, 0, 0, 0x77, 0x77}} {
		plain(mac, udp(remotePodIP, podIP, 4000, 5000, 63))
		plain(mac, tcp(remotePodIP, podIP, 80, 33000, 0x12, nil, 63))
	}
	// An MSS above every clamp bound, where nothing clamps.
	plain(gwMAC, tcp(remotePodIP, podIP, 80, 33000, 0x02, []byte{2, 4, 0xff, 0xff}, 63))
	plain(gwMAC, tcp(worldIP, underlayIP, 80, 33000, 0x12, []byte{2, 4, 0xff, 0xff}, 60))
	for _, ip := range [][]byte{
		udp(a("10.5.0.1"), podIP, 4000, 5000, 63),  // a group's source
		udp(a("10.6.0.1"), podIP, 4000, 5000, 63),  // a group without a live member
		udp(a("10.50.0.1"), podIP, 4000, 5000, 63), // not routed
		udp(remotePodIP, podIP, 4000, 5000, 1),     // TTL 1: the stack answers
		tcp(remotePodIP, podIP, 80, 33000, 0x10, nil, 2),
		udp(remotePodIP, fabricPod, 4000, 5000, 63), // the fabric's, not this node's
		udp(remotePodIP, pod2IP, 4000, 5000, 63),    // a fabric address routed into isthmus0
		udp(remotePodIP, a("10.7.0.9"), 4000, 5000, 63),
		withIPOptions(udp(remotePodIP, podIP, 4000, 5000, 63), ipOptionBytes(4)),
		func() []byte { b := udp(remotePodIP, podIP, 4000, 5000, 63); b[6] = 0x20; return b }(),
		ipv4Packet(remotePodIP, podIP, 1, ipOpts{ttl: 63}, icmpEcho(8, 9, 1, nil)),
		ipv4Packet(remotePodIP, podIP, 1, ipOpts{ttl: 63}, icmpEcho(0, 9, 1, nil)),
	} {
		plain(gwMAC, ip)
	}
	// Flows conntrack knows, to this node's pod: through the stack whatever their flags.
	gnv(peerIP, tcp(remotePodIP, podIP, 80, 33000, 0x10, nil, 63))
	gnv(peerIP, tcp(remotePodIP, podIP, 80, 33001, 0x10, nil, 63))
	gnv(peerIP, tcp(remotePodIP, podIP, 80, 33000, 0x10, nil, 63)[:24])
	gnv(peerIP, tcp(remotePodIP, hostIP, 80, 61008, 0x10, nil, 60)) // translated back to a known flow
	plain(gwMAC, tcp(remotePodIP, podIP, 80, 33000, 0x10, nil, 63))
	plain(gwMAC, tcp(remotePodIP, podIP, 80, 33000, 0x10, nil, 63)[:24])
	// The fast path's flow (established, assured): straight to the pod, FIN and RST
	// too; without a whole TCP header, through the stack.
	for _, flags := range []byte{0x10, 0x11, 0x04, 0x18} {
		gnv(peerIP, tcp(remotePodIP, podIP, 80, 33002, flags, nil, 63))
		plain(gwMAC, tcp(remotePodIP, podIP, 80, 33002, flags, nil, 63))
	}
	gnv(peerIP, tcp(remotePodIP, podIP, 80, 33002, 0x10, nil, 63)[:24])
	// The fail-closed rule (DESIGN.md, "Invariants"): only an unfragmented TCP packet
	// without SYN, its whole header present, of an established, assured, untranslated
	// entry goes around the stack. Each of these passes it instead.
	icmp := func(typ byte, src, dst netip.Addr) []byte {
		return ipv4Packet(src, dst, 1, ipOpts{ttl: 63}, icmpEcho(typ, 9, 1, []byte("timestamp-ish")))
	}
	for _, ip := range [][]byte{
		tcp(remotePodIP, podIP, 80, 33003, 0x10, nil, 63),                                                                      // no entry (deleted, expired)
		tcp(remotePodIP, podIP, 80, 33002, 0x12, nil, 63),                                                                      // a SYN-ACK on a direct flow's tuple
		tcp(remotePodIP, podIP, 80, 33002, 0x02, nil, 63),                                                                      // a new SYN on it
		tcp(remotePodIP, podIP, 8080, 40005, 0x10, nil, 63),                                                                    // IPVS's shape: the backend's reply
		ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 63, fragOff: 0x2000}, tcpWith(remotePodIP, podIP, 80, 33002, 0x10, nil)), // a first fragment
		ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 63, fragOff: 0x0003}, tcpWith(remotePodIP, podIP, 80, 33002, 0x10, nil)), // a later one
		ipv4Packet(remotePodIP, podIP, 17, ipOpts{ttl: 63, fragOff: 0x2000}, withCsum(remotePodIP, podIP, 17, udpDatagram(4000, 5000, make([]byte, 64)))),
		ipv4Packet(remotePodIP, podIP, 17, ipOpts{ttl: 63, fragOff: 0x00b9}, make([]byte, 64)),
		ipv4Packet(remotePodIP, podIP, 47, ipOpts{ttl: 63}, make([]byte, 24)),  // GRE
		ipv4Packet(remotePodIP, podIP, 132, ipOpts{ttl: 63}, make([]byte, 24)), // SCTP
		icmp(13, remotePodIP, podIP), // timestamp
		icmp(0, remotePodIP, podIP),  // echo reply
		icmpError(3, 4, remotePodIP, ipv4Packet(podIP, remotePodIP, 6, ipOpts{ttl: 63}, tcpWith(podIP, remotePodIP, 40004, 80, 0x10, nil)), 28), // frag needed about a direct flow
		icmpError(11, 0, remotePodIP, ipv4Packet(podIP, a("10.2.0.70"), 17, ipOpts{ttl: 1}, udpDatagram(4002, 5000, nil)), 28),
		tcp(remotePodIP, podIP, 80, 33002, 0x10, nil, 63)[:20+14], // the TCP header cut after the flags' byte
	} {
		gnv(peerIP, ip)
		plain(gwMAC, ip)
	}
	// Flows closed on the fast path: what still comes passes the stack; a bare SYN
	// starts a new flow (through the stack, the entry expired).
	for _, flags := range []byte{0x10, 0x11, 0x04, 0x02, 0x12} {
		gnv(peerIP, tcp(remotePodIP, podIP, 80, 33004, flags, nil, 63))
	}
	// Martian inner sources: no peer may send from them.
	for _, src := range []netip.Addr{a("127.0.0.1"), a("0.1.2.3"), a("224.0.0.1"), a("255.255.255.255"), a("240.0.0.1"), hostIP, underlayIP} {
		gnv(peerIP, udp(src, podIP, 4000, 5000, 63))
	}
	// The pod outside snat_exempt: replies to its translated flows (direct ACK,
	// SYN-ACK, FIN, RST; a datagram) and an ICMP error about its flow.
	for _, flags := range []byte{0x10, 0x12, 0x11, 0x04} {
		gnv(peerIP, tcp(remotePodIP, hostIP, 80, 61010, flags, nil, 60))
	}
	gnv(peerIP, udp(remotePodIP, hostIP, 5000, 61011, 60))
	gnv(peerIP, icmpError(3, 4, remotePodIP, ipv4Packet(hostIP, remotePodIP, 6, ipOpts{ttl: 63}, tcpWith(hostIP, remotePodIP, 61010, 80, 0x10, nil)), 28))
	gnv(peerIP, tcp(remotePodIP, natPodIP, 80, 40010, 0x10, nil, 63)) // untranslated to it: its conntrack tuple
	gnv(peerIP, tcp(remotePodIP, podIP, 80, 33002, 0x02, nil, 63))    // a SYN opens a flow: the stack
	// Fabric delivery: GENEVE for this site's fabric.
	gnv(peerIP, udp(remotePodIP, fabricPod, 4000, 5000, 63))
	gnv(peerIP, tcp(remotePodIP, fabricPod, 80, 33000, 0x12, mss, 63))
	gnv(peerIP, udp(remotePodIP, fabricPod, 4000, 5000, 1))
	gnv(peerIP, udp(remotePodIP, pod2IP, 4000, 5000, 63))
	gnv(peerIP, udp(remotePodIP, pod2IP, 4000, 5000, 1))
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
	for _, dst := range []netip.Addr{remotePodIP, a("10.2.0.70"), notForPodsDst.Addr(), a("10.2.0.200"), groupDst, a("10.6.0.1"), memberPod, a("10.0.3.1"),
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
	if !fromPod {
		s = append(s, ethFrame(dmac, smac, 0x0800, udpZeroAfter(a("10.200.0.9"), remotePodIP, own, 4010, 53)))
	}
	// IPv6 of every source class: global (none is the pod's), link-local, the
	// unspecified address of duplicate address detection, multicast; and one cut
	// short of its fixed header's version.
	for _, src := range []netip.Addr{a("fd10::5"), a("fe80::1"), a("::"), a("ff02::1"), a("::1")} {
		s = append(s, ethFrame(dmac, smac, 0x86dd, ipv6Packet(src, a("fd20::7"), 17, 64, udpDatagram(4000, 5000, []byte("v6")))))
	}
	badVersion := ipv6Packet(a("fd10::5"), a("fd20::7"), 17, 64, udpDatagram(4000, 5000, nil))
	badVersion[0] = 0x40
	s = append(s, ethFrame(dmac, smac, 0x86dd, badVersion))
	if fromPod {
		// Flows conntrack knows (oracleLab): left to the stack on a route hit, in
		// either direction, even to a group without a live member; and unknown ones.
		for _, c := range []struct {
			proto        byte
			dst          netip.Addr
			sport, dport uint16
		}{{6, remotePodIP, 40001, 80}, {6, a("10.6.0.1"), 40002, 80}, {17, a("10.2.0.70"), 4002, 5000}, {6, remotePodIP, 33000, 80},
			{6, remotePodIP, 40009, 80}, {17, a("10.2.0.70"), 4009, 5000}, {6, remotePodIP, 40004, 80}, {6, ipvsVIP, 40005, 80}} {
			l4 := withCsum(own, c.dst, 17, udpDatagram(c.sport, c.dport, []byte("known?")))
			if c.proto == 6 {
				l4 = tcpWith(own, c.dst, c.sport, c.dport, 0x10, nil)
			}
			ip := ipv4Packet(own, c.dst, c.proto, ipOpts{ttl: 64}, l4)
			s = append(s, ethFrame(dmac, smac, 0x0800, ip), ethFrame(dmac, smac, 0x0800, ip[:24]))
		}
	}
	if fromPod {
		// The fail-closed rule on the way out: a direct flow's ACK, FIN, RST and a
		// SYN on its tuple; fragments, other protocols, ICMP types.
		for _, flags := range []byte{0x10, 0x11, 0x04, 0x02, 0x12} {
			add(ipkt{dst: remotePodIP, proto: 6, sport: 40004, flags: flags})
		}
		add(ipkt{dst: remotePodIP, proto: 6, sport: 40004, flags: 0x10, fragOff: 0x2000})
		add(ipkt{dst: remotePodIP, fragOff: 0x2000, size: 200})
		add(ipkt{dst: remotePodIP, fragOff: 0x0010, size: 200})
		s = append(s, ethFrame(dmac, smac, 0x0800, ipv4Packet(own, remotePodIP, 47, ipOpts{ttl: 64}, make([]byte, 24))))
		s = append(s, ethFrame(dmac, smac, 0x0800, ipv4Packet(own, remotePodIP, 1, ipOpts{ttl: 64}, icmpEcho(13, 9, 1, []byte("ts")))))
		// The pod outside snat_exempt: its direct flow (translated here), its UDP
		// (through the stack), a flow without an entry, and a route without a live
		// member (answered, untranslated).
		for _, p := range []ipkt{{proto: 6, sport: 40010, flags: 0x10}, {proto: 6, sport: 40010, flags: 0x11}, {proto: 6, sport: 40011, flags: 0x10}, {}, {proto: 1}} {
			p.src, p.dst = natPodIP, remotePodIP
			add(p)
		}
		add(ipkt{src: natPodIP, dst: a("10.6.0.1")})
		// Its direct flow with a header checksum wrong by exactly what the TTL's
		// decrement changes (a fuzz finding: the model judged the translated header's
		// sum, not the input's).
		badSum := ipkt{src: natPodIP, dst: remotePodIP, proto: 6, sport: 40010, flags: 0x10}.build()
		c := uint32(binary.BigEndian.Uint16(badSum[10:])) + 0xfeff // less 0x100, one's complement
		binary.BigEndian.PutUint16(badSum[10:], uint16(c&0xffff+c>>16))
		s = append(s, ethFrame(dmac, smac, 0x0800, badSum))
		// A flow closed on the fast path: the stack; a bare SYN reopens it.
		for _, flags := range []byte{0x10, 0x02} {
			add(ipkt{dst: remotePodIP, proto: 6, sport: 40006, flags: flags})
		}
		add(ipkt{src: natPodIP, dst: podIP})
	} else {
		// The pod outside snat_exempt, forwarded by the stack into isthmus0.
		for _, p := range []ipkt{{}, {proto: 6, sport: 40011, flags: 0x10}, {proto: 1}, {fragOff: 0x2000}} {
			p.src, p.dst = natPodIP, remotePodIP
			add(p)
		}
	}
	// GENEVE from the pod to peers' underlay addresses.
	for _, dst := range []netip.Addr{peerIP, memberIP, groupPeerA, strangerIP} {
		add(ipkt{dst: dst, dport: 6081})
	}
	// A new flow of the pod outside snat_exempt whose own port's reply tuple the host's
	// connection holds in conntrack: on isthmus0 it takes another port of the range.
	add(ipkt{src: natPodIP, dst: remotePodIP, proto: 6, flags: 0x10, sport: 61013})
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
		{proto: 6, mssOpts: []byte{2, 4, 0x02, 0x00, 2, 4, 0x05, 0xb4}}, // the large MSS last
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
	s = append(s, short)
	return append(s, encap6Seeds(l, fromPod)...)
}

// masqSeeds are the generated frames for underlay_egress: what the stack sends out of
// the underlay device, from every source class (this node's pods and tunnel address,
// another CNI's pod, the underlay address, forged) to every destination class (the
// world, pods and nodes in masq_exempt), of every protocol masquerade tells apart, and
// truncated.
func masqSeeds(l *lab) [][]byte {
	a := netip.MustParseAddr
	var s [][]byte
	add := func(ip []byte) { s = append(s, ethFrame(gwMAC, l.undMAC, 0x0800, ip)) }
	for _, src := range []netip.Addr{podIP, pod2IP, hostIP, underlayIP, cniPod, spoofedIP} {
		for _, dst := range []netip.Addr{worldIP, a("8.8.8.8"), remotePodIP, peerIP} {
			add(ipv4Packet(src, dst, 17, ipOpts{ttl: 63}, withCsum(src, dst, 17, udpDatagram(35002, 53, []byte("q")))))
			add(ipv4Packet(src, dst, 6, ipOpts{ttl: 63}, tcpWith(src, dst, 33002, 443, 0x02, []byte{2, 4, 0x05, 0xb4})))
			add(ipv4Packet(src, dst, 1, ipOpts{ttl: 63}, icmpEcho(8, 0x4321, 1, []byte("ping"))))
		}
	}
	// The world's masqueraded flows, going on; a reply's ICMP error; other protocols.
	add(ipv4Packet(podIP, worldIP, 6, ipOpts{ttl: 63}, tcpWith(podIP, worldIP, 33000, 80, 0x10, nil)))
	add(ipv4Packet(podIP, worldIP, 17, ipOpts{ttl: 63}, withCsum(podIP, worldIP, 17, udpDatagram(35000, 53, []byte("q")))))
	add(ipv4Packet(podIP, worldIP, 17, ipOpts{ttl: 63}, udpDatagram(35000, 53, []byte("no checksum"))))
	add(ipv4Packet(podIP, worldIP, 1, ipOpts{ttl: 63}, icmpEcho(8, 0x1234, 2, []byte("ping"))))
	add(ipv4Packet(podIP, worldIP, 1, ipOpts{ttl: 63}, icmpEcho(0, 0x1234, 2, []byte("pong"))))
	add(icmpError(3, 3, podIP, ipv4Packet(worldIP, podIP, 17, ipOpts{ttl: 60}, udpDatagram(53, 35000, nil)), 8))
	add(udpZeroAfter(podIP, worldIP, underlayIP, 35010, 53))
	add(ipv4Packet(podIP, worldIP, 47, ipOpts{ttl: 63}, make([]byte, 8)))
	add(withIPOptions(ipv4Packet(podIP, worldIP, 17, ipOpts{ttl: 63}, withCsum(podIP, worldIP, 17, udpDatagram(35003, 53, []byte("q")))), ipOptionBytes(8)))
	add(ipv4Packet(podIP, worldIP, 17, ipOpts{ttl: 63, fragOff: 0x2000}, udpDatagram(35004, 53, []byte("first"))))
	add(ipv4Packet(podIP, worldIP, 17, ipOpts{ttl: 63, fragOff: 0x0003}, []byte("a later fragment")))
	add(ipv4Packet(podIP, worldIP, 6, ipOpts{ttl: 1}, tcpWith(podIP, worldIP, 33004, 80, 0x02, nil)))
	// masq_nat is one slot short of a new flow, and podIP holds its whole share of it,
	// its expired flow included. That flow's own tuple deletes it and starts over
	// (translated); another pod's flow on the expired flow's port deletes its reply
	// entry and takes the port (translated); one whose own port's reply tuple
	// conntrack holds (the host's connection from port 33021) finds no room.
	add(ipv4Packet(podIP, worldIP, 17, ipOpts{ttl: 63}, withCsum(podIP, worldIP, 17, udpDatagram(35001, 53, []byte("q")))))
	add(ipv4Packet(pod2IP, worldIP, 17, ipOpts{ttl: 63}, withCsum(pod2IP, worldIP, 17, udpDatagram(61007, 53, []byte("q")))))
	add(ipv4Packet(pod2IP, worldIP, 6, ipOpts{ttl: 63}, tcpWith(pod2IP, worldIP, 33021, 80, 0x10, nil)))
	// The node's own GENEVE leaves from the underlay address: never masqueraded.
	add(uframe{outerSrc: underlayIP, outerDst: peerIP}.build(l)[14:])
	// Truncations of a TCP SYN with options.
	syn := ethFrame(gwMAC, l.undMAC, 0x0800, ipv4Packet(podIP, worldIP, 6, ipOpts{ttl: 63}, tcpWith(podIP, worldIP, 33005, 80, 0x02, []byte{2, 4, 0x05, 0xb4})))
	for n := 34; n < len(syn); n++ {
		s = append(s, syn[:n])
	}
	s = append(s, ethFrame(gwMAC, l.undMAC, 0x8100, append([]byte{0, 5, 8, 0}, syn[14:]...)),
		ethFrame(gwMAC, l.undMAC, 0x86dd, make([]byte, 40)))
	// IPv6 leaves untranslated (egress masquerade is IPv4 only): the pod's packets to
	// the world of each protocol, the node's own, its GENEVE over the IPv6 underlay,
	// every truncation of a pod's SYN.
	world6 := a("2001:db8::10")
	for _, src := range []netip.Addr{pod6, underlayIP6, a("fd10::6")} {
		for _, p := range []i6pkt{{}, {proto: 6, opts: []byte{2, 4, 0x05, 0xb4}}, {proto: 58}, {proto: 6, flags: 0x10, ext: 44}} {
			p.src, p.dst = src, world6
			s = append(s, ethFrame(gwMAC, l.undMAC, 0x86dd, p.build()))
		}
	}
	g6 := u6frame{src: underlayIP6, dst: peer6}.build(l)
	copy(g6[0:6], gwMAC)
	copy(g6[6:12], l.undMAC)
	s = append(s, g6)
	syn6 := ethFrame(gwMAC, l.undMAC, 0x86dd, i6pkt{src: pod6, dst: world6, proto: 6, opts: []byte{2, 4, 0x05, 0xb4}}.build())
	for n := 14 + 40; n < len(syn6); n++ {
		s = append(s, syn6[:n])
	}
	return s
}

// udpZeroAfter is a UDP datagram src:sport -> dst:dport with a valid checksum whose
// checksum, once its source is to (same ports), computes to zero: sent as 0xffff
// (RFC 768), the one case where an incremental update and a recomputation may write
// different bytes for the same sum.
func udpZeroAfter(src, dst, to netip.Addr, sport, dport uint16) []byte {
	for x := 0; x <= 0xffff; x++ {
		seg := udpDatagram(sport, dport, []byte{'z', 'z', byte(x >> 8), byte(x)})
		if pseudoSum(to, dst, 17, seg) == 0 {
			return ipv4Packet(src, dst, 17, ipOpts{ttl: 63}, withCsum(src, dst, 17, seg))
		}
	}
	panic("no payload makes the checksum zero")
}

// i6pkt describes an IPv6 packet for the seeds.
type i6pkt struct {
	src, dst     netip.Addr
	hop          byte // 0: 64, unless hop0
	hop0         bool
	tclass       byte
	label        uint32
	proto        byte // 17 (default), 6: TCP (a SYN unless flags), 58: an ICMPv6 echo request, 59: no next header
	flags        byte
	sport, dport uint16 // defaults 4000 and 5000 (TCP 40000 and 80)
	opts         []byte // TCP options
	ext          byte   // an 8-byte extension header of this type (extHBH, 43, 44, 60) before the L4 header; 0: none
	size         int    // pad the payload to make the packet this long
}

func (p i6pkt) build() []byte {
	if p.hop == 0 && !p.hop0 {
		p.hop = 64
	}
	payload := []byte("oracle6")
	if p.size > 0 {
		payload = make([]byte, max(0, p.size-40-20))
		for i := range payload {
			payload[i] = byte(i)
		}
	}
	proto := p.proto
	if proto == 0 {
		proto = 17
	}
	var l4 []byte
	switch proto {
	case 6:
		flags, sport, dport := p.flags, p.sport, p.dport
		if flags == 0 {
			flags = 0x02
		}
		if sport == 0 {
			sport = 40000
		}
		if dport == 0 {
			dport = 80
		}
		seg := tcpSegment(sport, dport, flags, payload)
		if len(p.opts) > 0 {
			seg = append(append(append([]byte{}, seg[:20]...), p.opts...), seg[20:]...)
			seg[12] = byte((20+len(p.opts))/4) << 4
		}
		l4 = withCsum(p.src, p.dst, 6, seg)
	case 58:
		l4 = append([]byte{128, 0, 0, 0, 0x12, 0x34, 0, 1}, payload...)
		binary.BigEndian.PutUint16(l4[2:], pseudoSum(p.src, p.dst, 58, l4))
	case 59:
	default:
		sport, dport := p.sport, p.dport
		if sport == 0 {
			sport = 4000
		}
		if dport == 0 {
			dport = 5000
		}
		l4 = withCsum(p.src, p.dst, proto, udpDatagram(sport, dport, payload))
	}
	next := proto
	switch {
	case p.ext == extHBH:
		l4 = append(ext6(0, proto), l4...)
		next = 0
	case p.ext != 0:
		l4 = append(ext6(p.ext, proto), l4...)
		next = p.ext
	}
	ip := ipv6Packet(p.src, p.dst, next, p.hop, l4)
	binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(p.tclass)<<20|p.label&0xfffff)
	return ip
}

// extHBH asks i6pkt and u6frame for a hop-by-hop header (type 0, which the zero value
// cannot tell from "none").
const extHBH = 0xfe

// ext6 is an 8-byte IPv6 extension header of type typ (hop-by-hop, routing, fragment:
// a first fragment with more to come, destination options) whose next header is next.
func ext6(typ, next byte) []byte {
	switch typ {
	case 44:
		return []byte{next, 0, 0x00, 0x01, 0x12, 0x34, 0x56, 0x78}
	case 43:
		return []byte{next, 0, 0, 0, 0, 0, 0, 0}
	}
	return []byte{next, 0, 1, 4, 0, 0, 0, 0} // options: PadN of 4 bytes
}

// u6frame describes a GENEVE frame over the IPv6 underlay; the zero value of a field
// means the ordinary choice (see build).
type u6frame struct {
	src, dst  netip.Addr // outer; default peer6 -> underlayIP6
	tclass    byte
	hop       byte
	ext       byte // an extension header of this type before UDP (extHBH: hop-by-hop); 0: none
	next      byte // the outer next header when not UDP (6: TCP)
	dport     uint16
	udpSum    bool // a computed outer UDP checksum instead of zero
	vlan      bool
	gnv       geneveOpts
	oam       bool
	gnvOptLen int
	innerType uint16
	inner     []byte // default: UDP from peer6Pod4 to podIP
}

func (u u6frame) build(l *lab) []byte {
	if !u.src.IsValid() {
		u.src = peer6
	}
	if !u.dst.IsValid() {
		u.dst = underlayIP6
	}
	if u.hop == 0 {
		u.hop = 64
	}
	if u.dport == 0 {
		u.dport = 6081
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
	if u.gnvOptLen > 0 {
		u.gnv.options = geneveTLVs(u.gnvOptLen)
	}
	if u.innerType == 0 {
		u.innerType = 0x0800
	}
	inner := u.inner
	if inner == nil {
		inner = ipkt{src: peer6Pod4, dst: podIP}.build()
	}
	gnv := geneveHeader(u.gnv, ethFrame(innerMAC, innerMAC, u.innerType, inner))
	if u.oam {
		gnv[1] |= 0x80
	}
	l4 := udpDatagram(50000, u.dport, gnv)
	if u.udpSum {
		l4 = withCsum(u.src, u.dst, 17, l4)
	}
	next := byte(17)
	if u.next != 0 {
		next = u.next
		binary.BigEndian.PutUint16(l4[2:], u.dport) // the same bytes, another protocol
	}
	switch {
	case u.ext == extHBH:
		l4 = append(ext6(0, next), l4...)
		next = 0
	case u.ext != 0:
		l4 = append(ext6(u.ext, next), l4...)
		next = u.ext
	}
	ip := ipv6Packet(u.src, u.dst, next, u.hop, l4)
	binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(u.tclass)<<20|0x2468a)
	if u.vlan {
		return ethFrame(l.undMAC, gwMAC, 0x8100, append([]byte{0, 7, 0x86, 0xdd}, ip...))
	}
	return ethFrame(l.undMAC, gwMAC, 0x86dd, ip)
}

// underlay6Seeds are the generated IPv6 frames for underlay_ingress and underlay_xdp:
// inner IPv6 of every source and destination class in GENEVE over IPv4; GENEVE over
// IPv6 from the IPv6 underlay peer, unknown sources and others, with GENEVE options of
// every length, extension headers, ECN, the header fields, inner IPv4 and IPv6 of every
// class, truncated at every byte; the IPv6 flows of the conntrack fast path.
func underlay6Seeds(l *lab) [][]byte {
	a := netip.MustParseAddr
	var s [][]byte
	v4gnv := func(from netip.Addr, p i6pkt) {
		s = append(s, uframe{outerSrc: from, innerType: 0x86dd, inner: p.build()}.build(l))
	}
	v6gnv := func(u u6frame) { s = append(s, u.build(l)) }
	in6 := func(p i6pkt) []byte { return p.build() }

	// Inner IPv6 over the IPv4 underlay: sources of every class, from every kind of
	// sender; destinations of every class.
	for _, c := range []struct{ peer, src netip.Addr }{
		{peerIP, remotePod6}, {peerIP, a("fd20::99")}, {peerIP, peer6Pod6}, {peerIP, pod6}, {peerIP, a("fe80::1")},
		{peerIP, a("::")}, {peerIP, a("::1")}, {peerIP, a("::ffff:10.2.0.7")}, {peerIP, a("::a02:7")}, {peerIP, a("ff02::1")},
		{peerIP, underlayIP6}, {peerIP, a("fd99::1")},
		{groupPeerA, a("fd99::1")}, {groupPeerA, a("fe80::1")}, {groupPeerA, a("::1")}, {groupPeerA, a("ff02::1")},
		{groupPeerA, a("::ffff:1.2.3.4")}, {groupPeerA, underlayIP6}, {groupPeerA, pod6}, {groupPeerA, a("::")},
		{groupPeerB, remotePod6}, {memberIP, remotePod6}, {strangerIP, remotePod6}, {handle6, peer6Pod6},
	} {
		v4gnv(c.peer, i6pkt{src: c.src, dst: pod6})
	}
	for _, dst := range []netip.Addr{pod6, a("fd10::6"), underlayIP6, a("fd20::9"), a("::1"), a("ff02::1"), a("fe80::5"),
		peer6Pod6, groupDst6, a("::"), a("::ffff:10.1.0.5"), peer6} {
		v4gnv(peerIP, i6pkt{src: remotePod6, dst: dst})
		v4gnv(peerIP, i6pkt{src: remotePod6, dst: dst, proto: 6, flags: 0x10, sport: 80, dport: 33002})
	}
	// Transit of inner IPv6 on a gateway: from a group member that may send from
	// anywhere, to a peer's prefix and through the group (whose slots hold the
	// sender too); hop limits, a frame longer than the next link, TCP and UDP flows.
	for _, p := range []i6pkt{{}, {hop: 1}, {hop: 2}, {hop0: true}, {size: 1440}, {size: 1460},
		{proto: 6, flags: 0x10, sport: 80, dport: 33002}, {proto: 17, sport: 80, dport: 33002}, {proto: 58}} {
		for _, dst := range []netip.Addr{remotePod6, groupDst6, deadGroupDst6} {
			p.src, p.dst = a("fd77::1"), dst
			v4gnv(groupPeerA, p)
		}
	}
	// Inner IPv6 shapes to the pod: MSS clamps, the fast path's flow and what keeps a
	// packet off it, extension headers, ECN, hop limits, truncations.
	mss := []byte{2, 4, 0x05, 0xb4}
	for _, p := range []i6pkt{
		{}, {proto: 58}, {proto: 59}, {size: 1400}, {hop: 1}, {hop0: true},
		{proto: 6, opts: mss}, {proto: 6, flags: 0x12, opts: mss}, {proto: 6, opts: []byte{1, 2, 4, 0x05, 0xb4, 1, 1, 0}},
		{proto: 6, opts: []byte{2, 4, 0x02, 0x00, 2, 4, 0x05, 0xb4}}, {proto: 6, flags: 0x10, opts: mss},
		{proto: 6, opts: mss, ext: extHBH}, {proto: 6, opts: mss, ext: 60},
		{proto: 6, flags: 0x10, sport: 80, dport: 33002}, {proto: 6, flags: 0x11, sport: 80, dport: 33002},
		{proto: 6, flags: 0x04, sport: 80, dport: 33002}, {proto: 6, flags: 0x18, sport: 80, dport: 33002},
		{proto: 6, flags: 0x12, sport: 80, dport: 33002}, {proto: 6, flags: 0x02, sport: 80, dport: 33002},
		{proto: 6, flags: 0x10, sport: 80, dport: 33002, hop: 1}, {proto: 6, flags: 0x10, sport: 80, dport: 33002, hop: 2},
		{proto: 6, flags: 0x10, sport: 80, dport: 33002, hop0: true},
		{proto: 6, flags: 0x10, sport: 80, dport: 33002, ext: 44}, {proto: 6, flags: 0x10, sport: 80, dport: 33002, ext: extHBH},
		{proto: 6, flags: 0x10, sport: 80, dport: 33002, ext: 43}, {proto: 6, flags: 0x10, sport: 80, dport: 33002, ext: 60},
		{proto: 6, flags: 0x10, sport: 80, dport: 33002, tclass: 0x02},
		{proto: 6, flags: 0x10, sport: 80, dport: 33000}, {proto: 6, flags: 0x10, sport: 80, dport: 33003},
		{proto: 6, flags: 0x10, sport: 80, dport: 40006}, {proto: 6, flags: 0x02, sport: 80, dport: 40006},
		{proto: 6, flags: 0x10, sport: 8080, dport: 40005}, {proto: 17, sport: 80, dport: 33002},
		{tclass: 0x01}, {tclass: 0x02}, {tclass: 0x03}, {tclass: 0xb8, label: 0xfffff},
	} {
		p.src, p.dst = remotePod6, pod6
		v4gnv(peerIP, p)
	}
	cut := in6(i6pkt{src: remotePod6, dst: pod6, proto: 6, flags: 0x10, sport: 80, dport: 33002})
	for _, n := range []int{39, 40, 41, 52, 59} {
		s = append(s, uframe{innerType: 0x86dd, inner: cut[:n]}.build(l))
	}
	v4in6 := append([]byte{}, cut...)
	v4in6[0] = 0x45
	s = append(s, uframe{innerType: 0x86dd, inner: v4in6}.build(l))
	s = append(s, uframe{inner: cut}.build(l)) // IPv6 bytes in a frame that says IPv4
	for _, tos := range []byte{0x03, 0x02} {
		for _, tc := range []byte{0, 0x01, 0x02, 0x03} {
			s = append(s, uframe{outerTOS: tos, innerType: 0x86dd, inner: in6(i6pkt{src: remotePod6, dst: pod6, tclass: tc})}.build(l))
		}
	}
	for _, n := range []int{8, 252} {
		s = append(s, uframe{gnvOptLen: n, outerOpts: ipOptionBytes(8), innerType: 0x86dd, inner: in6(i6pkt{src: remotePod6, dst: pod6, proto: 6, opts: mss})}.build(l))
	}

	// GENEVE over the IPv6 underlay: inner IPv4 of every source and destination class.
	for _, src := range []netip.Addr{peer6Pod4, a("10.8.200.1"), remotePodIP, memberPod, podIP, hostIP, underlayIP, a("127.0.0.1"), a("0.0.0.0"), a("255.255.255.255"), a("224.0.0.5")} {
		v6gnv(u6frame{inner: ipkt{src: src, dst: podIP}.build()})
	}
	for _, dst := range []netip.Addr{podIP, natPodIP, pod2IP, hostIP, underlayIP, a("127.0.0.1"), a("255.255.255.255"), a("172.16.0.1"),
		remotePodIP, peer6Pod4, memberPod, groupDst, a("10.6.0.1"), fabricPod, cniPod, a("10.50.0.1")} {
		v6gnv(u6frame{inner: ipkt{src: peer6Pod4, dst: dst}.build()})
		v6gnv(u6frame{inner: ipkt{src: peer6Pod4, dst: dst, proto: 6, sport: 80, dport: 33002, flags: 0x10}.build()})
	}
	// Inner IPv4 shapes: TTL (a routing hop for the pod, none for the host), the MSS,
	// ICMP, fragments, ECN, IPv4 options, the direct flow with the pod, a health probe.
	for _, p := range []ipkt{
		{ttl: 1}, {ttl0: true}, {ttl: 1, dst: hostIP}, {ttl: 1, dst: fabricPod}, {ttl: 2},
		{proto: 6, mssOpts: mss}, {proto: 6, flags: 0x12, mssOpts: mss}, {proto: 1}, {fragOff: 0x2000}, {fragOff: 0x0010},
		{tos: 0x02}, {opts: ipOptionBytes(4)}, {size: 1400},
		{proto: 6, flags: 0x10, sport: 80, dport: 40008}, {proto: 6, flags: 0x11, sport: 80, dport: 40008},
		{proto: 6, flags: 0x12, sport: 80, dport: 40008}, {proto: 6, flags: 0x10, sport: 80, dport: 40008, ttl: 1},
	} {
		p.src = peer6Pod4
		if !p.dst.IsValid() {
			p.dst = podIP
		}
		v6gnv(u6frame{inner: p.build()})
	}
	probe := ipv4Packet(peer6Pod4, hostIP, 17, ipOpts{ttl: 64}, withCsum(peer6Pod4, hostIP, 17, udpDatagram(40001, healthPort, healthMsg('P', 7, ""))))
	v6gnv(u6frame{inner: probe})
	for _, sport := range []uint16{61001, 61020} {
		v6gnv(u6frame{inner: ipv4Packet(peer6Pod4, hostIP, 6, ipOpts{ttl: 60}, tcpWith(peer6Pod4, hostIP, 80, sport, 0x10, nil))})
		v6gnv(u6frame{inner: ipv4Packet(peer6Pod4, hostIP, 17, ipOpts{ttl: 60}, withCsum(peer6Pod4, hostIP, 17, udpDatagram(5000, sport, []byte("r"))))})
	}
	// Inner IPv6 over the IPv6 underlay.
	for _, p := range []i6pkt{
		{src: peer6Pod6, dst: pod6}, {src: peer6Pod6, dst: pod6, proto: 6, opts: mss}, {src: peer6Pod6, dst: pod6, proto: 58},
		{src: peer6Pod6, dst: pod6, proto: 6, flags: 0x10, sport: 80, dport: 33005},
		{src: peer6Pod6, dst: pod6, proto: 6, flags: 0x10, sport: 80, dport: 33005, hop: 1},
		{src: peer6Pod6, dst: pod6, proto: 6, flags: 0x12, sport: 80, dport: 33005},
		{src: peer6Pod6, dst: pod6, proto: 6, flags: 0x10, sport: 80, dport: 40007},
		{src: peer6Pod6, dst: a("fd10::6")}, {src: peer6Pod6, dst: underlayIP6}, {src: peer6Pod6, dst: peer6},
		{src: remotePod6, dst: pod6}, {src: a("fe80::7"), dst: pod6}, {src: a("::ffff:10.8.0.7"), dst: pod6}, {src: peer6, dst: pod6},
	} {
		v6gnv(u6frame{innerType: 0x86dd, inner: in6(p)})
	}
	// ECN over IPv6: outer CE on every inner codepoint, of both families.
	for _, tc := range []byte{0, 0x01, 0x02, 0x03} {
		v6gnv(u6frame{tclass: 0x03, inner: ipkt{src: peer6Pod4, dst: podIP, tos: tc}.build()})
		v6gnv(u6frame{tclass: 0x03, innerType: 0x86dd, inner: in6(i6pkt{src: peer6Pod6, dst: pod6, tclass: tc})})
	}
	v6gnv(u6frame{tclass: 0x02})
	v6gnv(u6frame{tclass: 0xb8 | 0x03, inner: ipkt{src: peer6Pod4, dst: podIP, tos: 0x01, proto: 6, mssOpts: mss}.build()})
	// GENEVE options of every length, the header fields, the O and C bits.
	for n := 0; n <= 252; n += 4 {
		v6gnv(u6frame{gnvOptLen: n})
	}
	v6gnv(u6frame{gnvOptLen: 12, innerType: 0x86dd, inner: in6(i6pkt{src: peer6Pod6, dst: pod6})})
	for _, u := range []u6frame{
		{gnv: geneveOpts{critical: true}}, {gnv: geneveOpts{critical: true}, gnvOptLen: 8}, {oam: true}, {oam: true, gnvOptLen: 8},
		{gnv: geneveOpts{ver: 1}}, {gnv: geneveOpts{proto: 0x0800}}, {gnv: geneveOpts{proto: 0x86dd}},
		{gnv: geneveOpts{vni: testVNI + 1}}, {gnv: geneveOpts{optWords: 63}}, {gnv: geneveOpts{optWords: 2}},
		{src: a("fd00:2::9"), gnv: geneveOpts{vni: 7}},
		{innerType: 0x0806, inner: make([]byte, 28)}, {innerType: 0x8100, inner: append([]byte{0, 5, 8, 0}, ipkt{src: peer6Pod4, dst: podIP}.build()...)},
	} {
		v6gnv(u)
	}
	// Outer sources and destinations: unknown, the router, this node, another of its
	// addresses, multicast; IPv4-mapped peers; not UDP; another port; extension
	// headers (a fragment's among them); the UDP checksum filled in; a VLAN tag; the
	// hop limit spent.
	for _, u := range []u6frame{
		{src: a("fd00:2::9")}, {src: gw6}, {src: underlayIP6}, {src: a("::ffff:192.168.2.2")}, {src: a("fe80::2")},
		{dst: a("fd00:1::2")}, {dst: a("ff02::1")}, {dst: a("::ffff:192.168.1.1")},
		{next: 6}, {dport: 4789}, {dport: 6082},
		{ext: extHBH}, {ext: 60}, {ext: 43}, {ext: 44},
		{udpSum: true}, {udpSum: true, innerType: 0x86dd, inner: in6(i6pkt{src: peer6Pod6, dst: pod6})}, {vlan: true}, {hop: 1},
	} {
		v6gnv(u)
	}
	// An outer header of type IPv6 that is not version 6 (a fuzz finding: malformed,
	// as an outer IPv4 header can be).
	for _, ver := range []byte{0x00, 0x40} {
		f := u6frame{}.build(l)
		f[14] = ver | f[14]&0x0f
		s = append(s, f, f[:14+40])
	}
	// GENEVE over IPv4 from a handle (no IPv4 frame comes from one) and to the IPv6
	// peer's IPv4 pods (a route to a handle: no gateway transits over the IPv6
	// underlay).
	s = append(s, uframe{outerSrc: handle6, innerSrc: peer6Pod4}.build(l), uframe{outerSrc: handle6, innerSrc: peer6Pod4, innerDst: hostIP}.build(l))
	s = append(s, uframe{innerDst: peer6Pod4}.build(l), uframe{inner: ipkt{src: remotePodIP, dst: peer6Pod4, ttl: 1}.build()}.build(l))
	// Every truncation of a frame with options everywhere, of both inner families.
	for _, inner := range []struct {
		t  uint16
		ip []byte
	}{
		{0x0800, ipkt{src: peer6Pod4, dst: podIP, proto: 6, opts: ipOptionBytes(4), mssOpts: []byte{1, 2, 4, 0x05, 0xb4, 0}}.build()},
		{0x86dd, in6(i6pkt{src: peer6Pod6, dst: pod6, proto: 6, opts: []byte{1, 2, 4, 0x05, 0xb4, 0, 0, 0}})},
	} {
		full := u6frame{gnvOptLen: 12, innerType: inner.t, inner: inner.ip}.build(l)
		for n := 14 + 40; n < len(full); n++ {
			s = append(s, full[:n])
		}
	}
	// A plain IPv6 packet on the underlay for this node's pod (no fabric ingress for
	// IPv6), and for the node.
	s = append(s, ethFrame(l.undMAC, gwMAC, 0x86dd, in6(i6pkt{src: remotePod6, dst: pod6})),
		ethFrame(l.undMAC, gwMAC, 0x86dd, in6(i6pkt{src: peer6, dst: underlayIP6, proto: 6, sport: 80, dport: 33000, flags: 0x10})))
	return s
}

// encap6Seeds are the generated IPv6 frames (and the IPv4 ones toward the IPv6 underlay
// peer) for pod_ingress (fromPod) and overlay_egress: every source class, every
// destination class, GENEVE to the IPv6 underlay peer, the fast path's flows and what
// keeps a packet off it, MSS clamps, extension headers, sizes, truncations.
func encap6Seeds(l *lab, fromPod bool) [][]byte {
	a := netip.MustParseAddr
	dmac, smac := l.podHMAC, podMAC
	if !fromPod {
		dmac, smac = l.istMAC, l.istMAC
	}
	var s [][]byte
	add := func(p i6pkt) {
		if !p.src.IsValid() {
			p.src = pod6
		}
		s = append(s, ethFrame(dmac, smac, 0x86dd, p.build()))
	}
	add4 := func(p ipkt) {
		if !p.src.IsValid() {
			p.src = podIP
		}
		s = append(s, ethFrame(dmac, smac, 0x0800, p.build()))
	}
	for _, dst := range []netip.Addr{remotePod6, a("fd20::9"), peer6Pod6, groupDst6, deadGroupDst6, pod6, a("fd10::6"), a("fd99::1"),
		a("fe80::1"), a("ff02::1"), a("ff02::16"), a("ff05::2"), a("::"), a("::1"), peer6, underlayIP6, a("::ffff:10.2.0.7")} {
		add(i6pkt{dst: dst})
		add(i6pkt{dst: dst, proto: 58})
		add(i6pkt{dst: dst, proto: 6, flags: 0x10, sport: 40100})
	}
	for _, src := range []netip.Addr{pod6, a("fd10::6"), a("fe80::1"), a("::"), a("ff02::1"), a("::1"), remotePod6, underlayIP6,
		peer6Pod6, a("::ffff:10.1.0.5"), a("fd99::1")} {
		for _, dst := range []netip.Addr{remotePod6, pod6, peer6Pod6, a("ff02::2")} {
			add(i6pkt{src: src, dst: dst})
		}
	}
	// GENEVE from the pod to the IPv6 underlay peer's address: UDP to 6081 right after
	// the fixed header, the datagram cut after its ports or before them; not GENEVE:
	// another port, another address, TCP, an extension header first.
	for _, p := range []i6pkt{
		{dst: peer6, dport: 6081}, {dst: peer6, dport: 6081, size: 600}, {dst: peer6, dport: 5000}, {dst: a("fd00:2::9"), dport: 6081},
		{dst: peer6, dport: 6081, proto: 6}, {dst: peer6, dport: 6081, ext: extHBH}, {dst: peer6, dport: 6081, ext: 44},
		{src: a("fe80::1"), dst: peer6, dport: 6081}, {dst: remotePod6, dport: 6081},
	} {
		add(p)
	}
	for _, n := range []int{2, 4, 6} {
		f := ethFrame(dmac, smac, 0x86dd, i6pkt{src: pod6, dst: peer6, dport: 6081}.build())
		s = append(s, f[:14+40+n])
	}
	// IPv4 toward the IPv6 underlay peer: to its handle (no address), its pods (GENEVE
	// over IPv6), the fast path's flow, TTL and size.
	for _, p := range []ipkt{
		{dst: handle6, dport: 6081}, {dst: peer6Pod4}, {dst: peer6Pod4, proto: 1}, {dst: peer6Pod4, proto: 6, mssOpts: []byte{2, 4, 0x05, 0xb4}},
		{dst: peer6Pod4, proto: 6, sport: 40008, flags: 0x10}, {dst: peer6Pod4, proto: 6, sport: 40008, flags: 0x11},
		{dst: peer6Pod4, proto: 6, sport: 40008, flags: 0x02}, {dst: peer6Pod4, proto: 6, sport: 40008, flags: 0x10, ttl: 1},
		{dst: peer6Pod4, ttl: 1}, {dst: peer6Pod4, size: 1430}, {dst: peer6Pod4, size: 1431, fragOff: 0x4000}, {dst: peer6Pod4, size: 1431},
		{src: natPodIP, dst: peer6Pod4}, {src: a("10.200.0.9"), dst: peer6Pod4},
	} {
		add4(p)
	}
	mss := []byte{2, 4, 0x05, 0xb4}
	for _, dst := range []netip.Addr{remotePod6, peer6Pod6, groupDst6} {
		for _, p := range []i6pkt{
			{proto: 6, opts: mss}, {proto: 6, flags: 0x12, opts: mss}, {proto: 6, opts: []byte{1, 2, 4, 0x05, 0xb4, 1, 1, 0}},
			{proto: 6, opts: []byte{2, 4, 0x01, 0x00}}, {proto: 6, opts: mss, ext: extHBH}, {proto: 6, flags: 0x10, opts: mss},
			{tclass: 0xb8}, {tclass: 0x03, label: 0x12345}, {hop: 1}, {hop0: true},
			{size: 1430}, {size: 1431}, {size: 1400, proto: 6, flags: 0x10, sport: 40004},
		} {
			p.dst = dst
			add(p)
		}
	}
	// The fast path's flows: each way out, what keeps a packet off it.
	for _, p := range []i6pkt{
		{dst: remotePod6, sport: 40004, flags: 0x10}, {dst: remotePod6, sport: 40004, flags: 0x11}, {dst: remotePod6, sport: 40004, flags: 0x04},
		{dst: remotePod6, sport: 40004, flags: 0x18}, {dst: remotePod6, sport: 40004, flags: 0x02}, {dst: remotePod6, sport: 40004, flags: 0x12},
		{dst: remotePod6, sport: 40004, flags: 0x10, hop: 1}, {dst: remotePod6, sport: 40004, flags: 0x10, hop: 2},
		{dst: remotePod6, sport: 40004, flags: 0x10, hop0: true}, {dst: remotePod6, sport: 40004, flags: 0x10, size: 1430},
		{dst: remotePod6, sport: 40004, flags: 0x10, size: 1431}, {dst: remotePod6, sport: 40004, flags: 0x10, ext: 44},
		{dst: remotePod6, sport: 40004, flags: 0x10, ext: extHBH}, {dst: remotePod6, sport: 40004, flags: 0x10, ext: 60},
		{dst: peer6Pod6, sport: 40007, flags: 0x10}, {dst: peer6Pod6, sport: 40007, flags: 0x11}, {dst: groupDst6, sport: 40011, flags: 0x10},
		{dst: deadGroupDst6, sport: 40009, flags: 0x10}, {dst: remotePod6, sport: 40006, flags: 0x10}, {dst: remotePod6, sport: 40006, flags: 0x02},
		{dst: remotePod6, sport: 33000, dport: 80, flags: 0x10}, {dst: ipvsVIP6, sport: 40005, flags: 0x10}, {dst: remotePod6, sport: 40012, flags: 0x10},
		{dst: remotePod6, proto: 17, sport: 40004, dport: 80},
	} {
		if p.proto == 0 {
			p.proto = 6
		}
		add(p)
	}
	fast := ethFrame(dmac, smac, 0x86dd, i6pkt{src: pod6, dst: remotePod6, proto: 6, sport: 40004, flags: 0x10}.build())
	for n := 14 + 40; n < len(fast); n++ {
		s = append(s, fast[:n])
	}
	v4 := append([]byte{}, fast...)
	v4[14] = 0x45
	s = append(s, v4, ethFrame(dmac, smac, 0x8100, append([]byte{0, 5, 0x86, 0xdd}, fast[14:]...)))
	return s
}
