package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// The oracle's model for IPv6 (docs/fuzzing.md): IPv6 pods over either underlay and
// GENEVE over the IPv6 underlay, from docs/architecture.md ("IPv6 pods", "IPv6
// underlay", "The conntrack fast path") and DESIGN.md ("Invariants"), as the rest of
// the model is: nothing here reads a map back or reuses the C logic.

// ipv6View is an IPv6 fixed header as gopacket reads it, with the bytes from it to the
// end of the frame.
type ipv6View struct {
	ip  *layers.IPv6
	raw []byte
}

// decodeIPv6 decodes the IPv6 fixed header at b[off:]. gopacket is given the fixed
// header alone, with no next header and a payload of one byte: the payload length is
// read but not trusted (as IPv4's total length: the bytes present are judged), and no
// extension header is walked (the datapath takes none but the fixed header's own next
// header: architecture.md, "IPv6 underlay" and "The conntrack fast path").
func decodeIPv6(b []byte, off int) (*ipv6View, error) {
	if len(b) < off+40 {
		return nil, errors.New("IPv6 header truncated")
	}
	if b[off]>>4 != 6 {
		return nil, fmt.Errorf("IP version %d", b[off]>>4)
	}
	cp := append(append([]byte{}, b[off:off+40]...), 0)
	cp[4], cp[5], cp[6] = 0, 1, 59
	v := &ipv6View{ip: &layers.IPv6{}, raw: b[off:]}
	if err := v.ip.DecodeFromBytes(cp, gopacket.NilDecodeFeedback); err != nil {
		return nil, fmt.Errorf("gopacket: %w", err)
	}
	v.ip.NextHeader = layers.IPProtocol(b[off+6])
	v.ip.Length = binary.BigEndian.Uint16(b[off+4:])
	return v, nil
}

func (v *ipv6View) src() netip.Addr { a, _ := netip.AddrFromSlice(v.ip.SrcIP); return a }
func (v *ipv6View) dst() netip.Addr { a, _ := netip.AddrFromSlice(v.ip.DstIP); return a }
func (v *ipv6View) next() byte      { return byte(v.ip.NextHeader) }
func (v *ipv6View) ecn() byte       { return v.ip.TrafficClass & 0x03 }

// l4 returns the bytes after the fixed header that are present.
func (v *ipv6View) l4() []byte { return v.raw[40:] }

// isIPv6Frame reports whether gopacket decodes in as an untagged Ethernet frame of type
// IPv6 whose fixed header is present and of version 6. Anything else of type IPv6 is
// no IPv6 packet a program reads: the stack's.
func isIPv6Frame(in []byte) bool {
	return untaggedOf(in, layers.EthernetTypeIPv6) && len(in) >= 14+40 && in[14]>>4 == 6
}

// untaggedOf reports whether gopacket decodes in as an untagged Ethernet frame of type t.
func untaggedOf(in []byte, t layers.EthernetType) bool {
	eth := &layers.Ethernet{}
	return eth.DecodeFromBytes(in, gopacket.NilDecodeFeedback) == nil && eth.EthernetType == t
}

// isHandle reports whether a is the handle of a peer on the IPv6 underlay.
func (w *oracleWorld) isHandle(a netip.Addr) bool { _, ok := w.handles[a]; return ok }

// handleOf returns the handle of the peer whose IPv6 underlay address is a (peers6).
func (w *oracleWorld) handleOf(a netip.Addr) (netip.Addr, bool) {
	for h, addr := range w.handles {
		if addr == a {
			return h, true
		}
	}
	return netip.Addr{}, false
}

// viaHandle reports whether route r leads to a peer on the IPv6 underlay.
func (w *oracleWorld) viaHandle(r oracleRoute) bool { return slices.ContainsFunc(r.peers, w.isHandle) }

// route6 returns the longest prefix of w.routes6 that holds a.
func (w *oracleWorld) route6(a netip.Addr) (oracleRoute, bool) {
	best, found := oracleRoute{}, false
	for _, r := range w.routes6 {
		if r.prefix.Contains(a) && (!found || r.prefix.Bits() > best.prefix.Bits()) {
			best, found = r, true
		}
	}
	return best, found
}

// mayUse6 reports whether peer (an IPv4 address or a handle) may send inner IPv6
// source src: some prefix of its own in peer_sources6 holds it. An IPv4 prefix of the
// peer's allows no IPv6 source.
func (w *oracleWorld) mayUse6(peer, src netip.Addr) bool {
	return slices.ContainsFunc(w.peerSources6[peer], func(p netip.Prefix) bool { return p.Contains(src) })
}

// martian6 reports whether a is an inner IPv6 source no peer may send from
// (architecture.md, "IPv6 pods"): unspecified, loopback, IPv4-mapped, link-local or
// multicast, whatever peer_sources6 allows.
func martian6(a netip.Addr) bool {
	return a.IsUnspecified() || a.IsLoopback() || a.Is4In6() || a.IsLinkLocalUnicast() || a.IsMulticast()
}

// modelUnderlay6 is the model of underlay_ingress and underlay_xdp for an IPv6 frame
// on the underlay device (architecture.md, "IPv6 underlay"): a header that is not IPv6
// (its version) is DROP_INVALID_PACKET, as a malformed outer IPv4 one is; only UDP
// right after the fixed header, to port 6081 of config.underlay_ip6, is GENEVE for
// this node (a UDP header cut short there is DROP_INVALID_PACKET), and from
// there it is validated as over IPv4 with the handle peers6 names as the peer.
// Everything else, extension headers (a fragment's included) in front of UDP too, is
// the stack's, untouched: no IPv6 frame is masqueraded or taken by fabric ingress.
func modelUnderlay6(w *oracleWorld, in []byte, xdp bool) expectation {
	var e expectation
	o, err := decodeIPv6(in, 14)
	if err != nil {
		// As a malformed outer IPv4 header: this node is on the IPv6 underlay.
		e.allowDrop(IsthmusDropReasonDROP_INVALID_PACKET)
		e.because("outer IPv6 malformed (%v): DROP_INVALID_PACKET", err)
		return e
	}
	if o.dst() != w.underlay6 || o.next() != 17 {
		e.pass = true
		e.because("outer IPv6 %v -> %v next header %d: not UDP right after the fixed header to this node, the stack's", o.src(), o.dst(), o.next())
		return e
	}
	udpOff := 14 + 40
	udp, err := udpPorts(in[udpOff:])
	if err != nil {
		e.allowDrop(IsthmusDropReasonDROP_INVALID_PACKET)
		e.because("outer UDP over IPv6 truncated: DROP_INVALID_PACKET")
		return e
	}
	if udp.DstPort != 6081 {
		e.pass = true
		e.because("outer IPv6 UDP port %d, not GENEVE: the stack's", udp.DstPort)
		return e
	}
	e.because("GENEVE over IPv6 from %v", o.src())
	return decapGeneve(w, in, outerGeneve{src: o.src(), udpOff: udpOff, ce: o.ecn() == 0x03}, xdp, e)
}

// decapInner6 is the model of decapsulation for a valid GENEVE frame from peer (over
// either underlay) whose inner Ethernet frame at ieOff says IPv6 (architecture.md,
// "IPv6 pods", "Out of the tunnel"): the inner fixed header must be whole and of
// version 6 (DROP_INNER_INVALID), its source no martian (DROP_INNER_MARTIAN) and one the
// peer may use (DROP_INNER_SRC_DENIED). Outer CE drops a Not-ECT inner packet and marks
// an ECN-capable one (RFC 6040). XDP pops it (the Ethernet header it keeps saying
// IPv6). At TC, a destination the IPv6 FIB routes to a pod interface enters isthmus0's
// ingress marked, byte for byte but the MSS clamp and CE, unless the conntrack fast
// path takes it (a hop left, the rule of direct6), which redirects it into the pod
// with its hop limit decremented; anything else is DROP_NOT_LOCAL. Before all that, on
// a gateway over the IPv4 underlay, a destination routes6 sends to a peer on the IPv4
// underlay transits (architecture.md, "Transit"): XDP leaves it whole; TC forwards it
// with the outer IPv4 header rewritten and the inner hop limit decremented, or drops
// it as no next hop, a loop, an expiring hop limit or longer than the next link: no
// ICMPv6 is built anywhere (a last hop goes through the stack).
func decapInner6(w *oracleWorld, in []byte, ieOff int, o outerGeneve, peer netip.Addr, xdp bool, e *expectation) {
	fault := func(r IsthmusDropReason, format string, a ...any) {
		e.allowDrop(r)
		e.because(format, a...)
	}
	ipOff := ieOff + 14
	v, err := decodeIPv6(in, ipOff)
	if err != nil {
		fault(IsthmusDropReasonDROP_INNER_INVALID, "inner IPv6 malformed: %v", err)
		return
	}
	src, dst := v.src(), v.dst()
	switch {
	case martian6(src):
		fault(IsthmusDropReasonDROP_INNER_MARTIAN, "inner IPv6 source %v is a martian", src)
		return
	case !w.mayUse6(peer, src):
		fault(IsthmusDropReasonDROP_INNER_SRC_DENIED, "peer %v may not send from %v", peer, src)
		return
	}
	e.because("valid GENEVE from peer %v, inner IPv6 %v -> %v next header %d hop limit %d", peer, src, dst, v.next(), v.ip.HopLimit)
	if rt, ok := w.route6(dst); ok && w.transit && o.v4 != nil && !w.viaHandle(rt) {
		transit6(w, in, ipOff, o, peer, xdp, rt, v.ip.HopLimit, e)
		return
	}
	if o.ce && v.ecn() == 0 {
		fault(IsthmusDropReasonDROP_ECN_NOT_ECT, "outer CE, inner Not-ECT: DROP_ECN_NOT_ECT (RFC 6040)")
		return
	}
	ce := o.ce
	inIP := in[ipOff:]
	if xdp {
		e.forms = append(e.forms, xdpPopForm(w, in, peer, ipOff, ce))
		return
	}
	mac := w.ownPods6[dst]
	if mac == nil {
		fault(IsthmusDropReasonDROP_NOT_LOCAL, "%v is no pod of this node: DROP_NOT_LOCAL", dst)
		return
	}
	if w.directOK6(e, v) && v.ip.HopLimit > 1 {
		e.because("to own pod %v, around the stack, hop limit decremented", dst)
		e.forms = append(e.forms, w.untraced(deliverForm6("IPv6 pod delivery", mac, w.podHMAC, inIP, true, ce, w.tunnelMTU), false))
		return
	}
	e.because("to own pod %v: through the stack (isthmus0's ingress, marked)", dst)
	e.forms = append(e.forms, w.untraced(deliverForm6("IPv6 pod delivery through the stack", w.istMAC, in[6:12], inIP, false, ce, w.tunnelMTU), true))
}

// transit6 is the model of a gateway's transit of the frame in, whose inner IPv6
// packet at ipOff (hop limit hop) hit route rt: the order of transit_forward6.
func transit6(w *oracleWorld, in []byte, ipOff int, o outerGeneve, peer netip.Addr, xdp bool, rt oracleRoute, hop uint8, e *expectation) {
	if xdp {
		e.pass = true
		e.because("IPv6 transit: XDP leaves it whole to TC")
		return
	}
	e.because("IPv6 transit via %v (route %v)", rt.peers, rt.prefix)
	others := slices.DeleteFunc(slices.Clone(rt.peers), func(a netip.Addr) bool { return a == peer })
	switch {
	case len(rt.peers) == 0:
		e.allowDrop(IsthmusDropReasonDROP_NO_NEXTHOP)
		e.because("no live member")
		return
	case len(others) == 0:
		e.allowDrop(IsthmusDropReasonDROP_TRANSIT_LOOP)
		e.because("the only next hop is the sender")
		return
	case len(others) < len(rt.peers):
		e.hashed = true
		e.allowDrop(IsthmusDropReasonDROP_TRANSIT_LOOP)
	}
	switch {
	case hop <= 1:
		e.allowDrop(IsthmusDropReasonDROP_TTL_EXCEEDED)
		e.because("hop limit %d: dropped, no ICMPv6 from a gateway", hop)
	case len(in)-14 > w.underlayMTU:
		e.allowDrop(IsthmusDropReasonDROP_UNDERLAY_MTU)
		e.because("longer than the underlay MTU %d: dropped, no Packet Too Big from a gateway", w.underlayMTU)
	case len(others) > 0:
		e.forms = append(e.forms, transitFormOf(w, in, o.v4, ipOff, others, true))
	}
}

// untraced is f as an IPv6 delivery, with OVERLAY_MARK if mark: the datapath does not
// trace IPv6 yet (architecture.md, "IPv6 pods"), so the target interface is told by
// the frame's MACs and the mark, not by a trace record.
func (w *oracleWorld) untraced(f outputForm, mark bool) outputForm {
	f.mark = mark
	f.name += fmt.Sprintf(" (mark %v)", mark)
	return f
}

// modelEncap6 is the model of pod_ingress (fromPod) and overlay_egress for an IPv6
// frame (architecture.md, "IPv6 pods", "IPv6 underlay", "The conntrack fast path").
//
// pod_ingress: the source check first (a link-local or unspecified source passes it;
// any other must be one the IPv6 FIB routes to the pod's interface, else
// DROP_POD_SRC_SPOOFED); then UDP right after the fixed header to port 6081 of a peer's
// IPv6 underlay address is DROP_POD_GENEVE. A link-local or multicast destination is
// never tunnelled: the stack's, unmarked, whatever routes6 says. A destination in
// routes6 goes on through the stack, marked, unless the packet is on the conntrack
// fast path (direct6), has a hop left, fits the tunnel and its route a live next hop:
// then it is encapsulated here, its hop limit decremented. A destination the FIB
// routes to a pod of this node is marked too; anything else is the stack's, unmarked.
// No ICMPv6 is built here: the stack's forwarding answers.
//
// overlay_egress: link-local, multicast and unspecified destinations pass untouched; a
// miss in routes6 is DROP_NO_OVERLAY_ROUTE, a group without a live member
// DROP_NO_NEXTHOP, a packet longer than the tunnel MTU DROP_FRAG_NEEDED; everything
// else is encapsulated to the route's peer (over IPv4 or IPv6, by its underlay) as
// it came, the MSS of a SYN clamped to the tunnel MTU less 60. No IPv6 source is
// translated (return-path SNAT is IPv4 only).
func modelEncap6(w *oracleWorld, in []byte, fromPod bool) expectation {
	var e expectation
	v, err := decodeIPv6(in, 14)
	if err != nil {
		e.pass = true
		e.because("IPv6 malformed (%v): the stack's", err)
		return e
	}
	src, dst := v.src(), v.dst()
	e.because("IPv6 %v -> %v next header %d hop limit %d len %d", src, dst, v.next(), v.ip.HopLimit, len(in)-14)
	linkScoped := dst.IsLinkLocalUnicast() || dst.IsMulticast()
	if !fromPod {
		if linkScoped || dst.IsUnspecified() {
			e.pass = true
			e.because("to link-scoped or multicast %v: never tunnelled", dst)
			return e
		}
		rt, ok := w.route6(dst)
		switch {
		case !ok:
			e.allowDrop(IsthmusDropReasonDROP_NO_OVERLAY_ROUTE)
			e.because("no routes6 entry on isthmus0: DROP_NO_OVERLAY_ROUTE")
		case len(rt.peers) == 0:
			e.allowDrop(IsthmusDropReasonDROP_NO_NEXTHOP)
			e.because("route %v: no live member, DROP_NO_NEXTHOP", rt.prefix)
		case len(in)-14 > w.tunnelMTU:
			e.allowDrop(IsthmusDropReasonDROP_FRAG_NEEDED)
			e.because("longer than the tunnel MTU %d: DROP_FRAG_NEEDED", w.tunnelMTU)
		default:
			e.because("route %v via %v: encapsulated", rt.prefix, rt.peers)
			e.forms = append(e.forms, encapForm(w, in, rt.peers, false))
		}
		return e
	}

	// DESIGN.md: a pod sends only from its own addresses. The reverse lookup goes
	// from the packet's destination (from :: for one on the link); the kernel
	// answers none from the loopback address, so nothing vouches for any source then.
	switch {
	case src.IsUnspecified() || src.IsLinkLocalUnicast():
		e.because("link-scoped source %v passes the source check", src)
	case w.ownPods6[src] == nil:
		e.allowDrop(IsthmusDropReasonDROP_POD_SRC_SPOOFED)
		e.because("source %v does not route back to the pod's interface: DROP_POD_SRC_SPOOFED", src)
		return e
	case dst.IsLoopback():
		e.allowDrop(IsthmusDropReasonDROP_POD_SRC_SPOOFED)
		e.because("no reverse route from loopback %v: DROP_POD_SRC_SPOOFED", dst)
		return e
	}
	if l4 := v.l4(); v.next() == 17 && len(l4) >= 4 && binary.BigEndian.Uint16(l4[2:]) == 6081 {
		if _, ok := w.handleOf(dst); ok {
			e.allowDrop(IsthmusDropReasonDROP_POD_GENEVE)
			e.because("GENEVE from a pod to peer %v's IPv6 underlay address: DROP_POD_GENEVE", dst)
			return e
		}
	}
	if linkScoped {
		e.pass = true
		e.because("to link-scoped or multicast %v: never tunnelled, the stack's", dst)
		return e
	}
	rt, ok := w.route6(dst)
	if !ok {
		// Same-node delivery is what the FIB forwards to a pod interface; it
		// forwards no link-local source (RFC 4291 2.5.6), so that is unmarked.
		e.pass = true
		e.mark = w.ownPods6[dst] != nil && !src.IsLinkLocalUnicast()
		e.because("no routes6 entry: to the stack (a local pod the FIB forwards to: marked %v)", e.mark)
		return e
	}
	e.because("route %v via %v", rt.prefix, rt.peers)
	direct := w.directOK6(&e, v)
	switch {
	case !direct:
	case v.ip.HopLimit <= 1:
		direct = false
		e.because("hop limit %d: the stack answers", v.ip.HopLimit)
	case len(in)-14 > w.tunnelMTU:
		direct = false
		e.because("longer than the tunnel MTU %d: the stack answers", w.tunnelMTU)
	case len(rt.peers) == 0:
		direct = false
		e.because("no live member: the stack's")
	}
	if !direct {
		e.pass, e.mark = true, true
		e.because("through the stack, marked")
		return e
	}
	e.because("encapsulated here, hop limit decremented")
	e.forms = append(e.forms, encapForm(w, in, rt.peers, true))
	return e
}

// directOK6 is direct6, with its reasoning added to e.
func (w *oracleWorld) directOK6(e *expectation, v *ipv6View) bool {
	ok, why, reopened := w.direct6(v)
	e.because("%s", why)
	if reopened != nil {
		e.reopens = append(e.reopens, *reopened)
	}
	return ok
}

// direct6 is the fail-closed rule (DESIGN.md, "Invariants"; architecture.md, "The
// conntrack fast path") for IPv6 packet v, as direct is for IPv4: TCP must be the
// fixed header's own next header (an extension header, a fragment's included, sends
// it to the stack), with its whole 20-byte header present, no SYN, of a flow conntrack
// holds established, assured and untranslated, not closed on the fast path. The
// callers add what the direct path itself needs: a hop left, and on the way out a
// packet that fits the tunnel on a route with a live next hop.
func (w *oracleWorld) direct6(v *ipv6View) (bool, string, *oracleCT) {
	if v.next() != 6 {
		return false, fmt.Sprintf("next header %d, not TCP right after the fixed header: the stack", v.next()), nil
	}
	return w.ctDecide(v.l4(), v.src(), v.dst(), 0)
}

// deliverForm6 accepts the inner IPv6 packet inIP delivered in a frame to dmac (and
// from smac, unless nil), with the hop limit decremented if forward, CE copied if ce,
// the MSS clamped to mtu less 60.
func deliverForm6(name string, dmac, smac []byte, inIP []byte, forward, ce bool, mtu int) outputForm {
	return outputForm{name: name, check: func(out []byte) error {
		if err := outputEthernetOf(out, dmac, smac, layers.EthernetTypeIPv6); err != nil {
			return err
		}
		return diffAt("delivered inner IPv6", out[14:], innerAfter6(inIP, out[14:], forward, ce, mtu))
	}}
}

// innerAfter6 is inIP (an IPv6 packet as received) as it must leave: the hop limit
// decremented if decHop, the ECN field set to CE if ce, and the MSS of a TCP SYN or
// SYN-ACK right after the fixed header clamped to mtu less 60 (IPv6 and TCP headers;
// a segment behind extension headers is left alone). The TCP checksum is recomputed
// where the received one verified; where it did not, the datapath's bytes are taken
// from got.
func innerAfter6(inIP, got []byte, decHop, ce bool, mtu int) []byte {
	want := append([]byte{}, inIP...)
	if decHop {
		want[7]--
	}
	if ce {
		want[1] |= 0x30
	}
	if want[6] != 6 || mtu <= 0 {
		return want
	}
	want, clamped := clampAt(want, 40, uint16(mtu-60))
	if !clamped {
		return want
	}
	const off = 40 + 16 // TCP checksum
	if l4SumOK6(inIP) {
		want[off], want[off+1] = 0, 0
		seg := want[40 : 40+int(binary.BigEndian.Uint16(want[4:]))]
		binary.BigEndian.PutUint16(want[off:], pseudoSum(netip.AddrFrom16([16]byte(want[8:24])), netip.AddrFrom16([16]byte(want[24:40])), 6, seg))
	} else if len(got) >= off+2 {
		copy(want[off:off+2], got[off:off+2])
	}
	return want
}

// l4SumOK6 reports whether the TCP or UDP checksum of IPv6 packet ip, right after its
// fixed header, verifies over the payload length (which must be present); false for a
// zero UDP checksum (RFC 8200 8.1) and for anything else.
func l4SumOK6(ip []byte) bool {
	if len(ip) < 40 {
		return false
	}
	plen := int(binary.BigEndian.Uint16(ip[4:]))
	if 40+plen > len(ip) {
		return false
	}
	seg := ip[40 : 40+plen]
	switch ip[6] {
	case 6:
		if len(seg) < 20 {
			return false
		}
	case 17:
		if len(seg) < 8 || binary.BigEndian.Uint16(seg[6:]) == 0 {
			return false
		}
	default:
		return false
	}
	return pseudoSum(netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), ip[6], seg) == 0
}
