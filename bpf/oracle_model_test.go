package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// The oracle's model (docs/fuzzing.md): what each program must do with a frame, derived
// from the frame's bytes as gopacket decodes them and from oracleWorld, the plain data the
// test also installs into the maps. Nothing here calls the programs, reads a map back or
// reuses the C logic: longest-prefix matches are done with net/netip, the rules come from
// docs/architecture.md, DESIGN.md ("Invariants") and RFC 8926 / RFC 6040.

// oracleRoute is one entry of routes: a prefix and the peers a flow to it may take (the
// route's peer, or the live members of its next-hop group; none: a group without a live
// member).
type oracleRoute struct {
	prefix netip.Prefix
	peers  []netip.Addr
	group  uint32 // 0: a plain route to peers[0]
	// notForPods: for forwarded packets only (ROUTE_F_NOT_FOR_PODS); a pod's
	// packet to it is as one to no route, whatever a shorter prefix says.
	notForPods bool
}

// oracleWorld is the node the oracle's lab stands for: its configuration and the contents
// of every map the programs read, as the test installed them.
type oracleWorld struct {
	underlay  netip.Addr
	vni       uint32
	tunnelMTU int
	transit   bool // CFG_F_TRANSIT
	// underlayMTU is the MTU toward every next hop on the underlay (the lab's und0).
	underlayMTU int

	peers       []netip.Addr                  // known peers (underlay addresses)
	peerSources map[netip.Addr][]netip.Prefix // inner sources each peer may use
	routes      []oracleRoute

	ownPods map[netip.Addr]net.HardwareAddr // pods on pod0h: address -> MAC
	// tunnelIP is this node's tunnel address (config.tunnel_ip, on isthmus0): its one
	// overlay address, and the return-path SNAT source for sources outside snatExempt
	// that are not the host's own. The world keeps every own pod exempt, so SNAT is
	// seen on overlay_egress only (other CNIs' pods, forged sources), translating to
	// a port of [snatPortMin, snatPortMax] when the flow's own is taken, as the agent
	// configures it.
	tunnelIP                 netip.Addr
	snatExempt               []netip.Prefix
	snatPortMin, snatPortMax uint16

	// nat holds the translated flows, as the test writes them before every input.
	// masquerade is CFG_F_MASQUERADE: replies to the underlay address are translated
	// back on underlay_ingress.
	health []oracleHealth // health_reach
	// conntrack is the lab's conntrack table (a flow the stack saw, in its original
	// direction), which bpf_skb_ct_lookup reads.
	conntrack []oracleCT
	// nat holds the translated flows of both tables: return-path SNAT's (addr the
	// tunnel address) in nat, masquerade's (addr the underlay address) in masq_nat,
	// each source's flows per table counted in nat_sources; natSourceFlowsMax is
	// nat_source_flows_max, a source's share of a table. The lab's namespace holds no
	// socket, so only conntrack and these tables claim a translated tuple.
	// snatNatMax and masqNatMax are the sizes (entries) of nat and masq_nat.
	nat                    []oracleNat
	natSourceFlowsMax      int
	snatNatMax, masqNatMax int
	masquerade             bool
	// fibDirect is CFG_F_FIB_DIRECT: the lab's namespace has only the kernel's
	// policy rules, so the agent would let the fast path's FIB lookups go straight
	// to main, and the model's FIB (one table) answers the same either way.
	fibDirect  bool
	masqExempt []netip.Prefix // masq_exempt
	// fabricPrefixes is fabric_prefixes (this site's own blocks); the FIB routes
	// fabricRoutes of them to the fabric router on the underlay (fabricMAC) and
	// cniRoutes to an interface of another CNI (not a pod interface of isthmus).
	// Everything else in 10/8 but the own pods it routes into isthmus0.
	fabricPrefixes, fabricRoutes, cniRoutes []netip.Prefix

	// The IPv6 side (architecture.md, "IPv6 pods" and "IPv6 underlay"): underlay6 is
	// config.underlay_ip6, this node's address on the IPv6 underlay; handles are the
	// peers on the IPv6 underlay, each by its handle (an address in 0.0.0.0/8, the name
	// routes, groups and the source tables give it; peers marks it PEER_F_UNDERLAY6)
	// with its IPv6 address (peers6 maps it back). routes6 and peerSources6 (keyed by
	// the peer's IPv4 address or handle) are the IPv6 twins of routes and peerSources;
	// ownPods6 the pods' IPv6 addresses the FIB routes to pod0h. The world forwards
	// IPv6.
	underlay6    netip.Addr
	handles      map[netip.Addr]netip.Addr
	routes6      []oracleRoute
	peerSources6 map[netip.Addr][]netip.Prefix
	ownPods6     map[netip.Addr]net.HardwareAddr

	// gwMAC is the underlay neighbour every peer is reached through: the site router;
	// gw6MAC the IPv6 router's (the neighbour the IPv6 underlay's peers are behind).
	undMAC, podHMAC, istMAC, gwMAC, gw6MAC, fabricMAC net.HardwareAddr
	// The lab's interfaces, as a delivery's trace records its target: the underlay
	// device, the pods' host interface (pod_ifaces), isthmus0.
	undIfindex, podIfindex, istIfindex int
}

// directOK is direct, with its reasoning added to e.
func (w *oracleWorld) directOK(e *expectation, v *ipv4View, src, dst netip.Addr, dport uint16) bool {
	ok, why, reopened := w.directReopens(v, src, dst, dport)
	e.because("%s", why)
	if reopened != nil {
		e.reopens = append(e.reopens, *reopened)
	}
	return ok
}

// toStack is f as a delivery into isthmus0's ingress (the stack), with OVERLAY_MARK
// if mark (a pod's packet), without it for the host's own.
func (w *oracleWorld) toStack(f outputForm, mark bool) outputForm {
	f.target, f.mark = w.istIfindex, mark
	f.name += fmt.Sprintf(" (to ifindex %d, mark %v)", f.target, mark)
	return f
}

// toPod is f as a direct delivery to the pod: redirected to the pod's host interface
// (bpf_redirect_peer), unmarked.
func (w *oracleWorld) toPod(f outputForm) outputForm {
	f.target = w.podIfindex
	f.name += fmt.Sprintf(" (to ifindex %d)", f.target)
	return f
}

// oracleNat is one translated flow in nat: pod:podPort -> remote:remotePort leaves as
// addr:port (the tunnel address for return-path SNAT, the underlay address for egress
// masquerade). ICMP echo: the ports are identifiers, remotePort 0.
type oracleNat struct {
	proto      uint8
	pod        netip.Addr
	podPort    uint16
	remote     netip.Addr
	remotePort uint16
	addr       netip.Addr
	port       uint16
	expired    bool // idle past its timeout: as if absent
}

// oracleHealth is one claim in health_reach: what this node answers a probe on port
// for site ("" the default) with, until its deadline (expired: passed).
type oracleHealth struct {
	port             uint16
	site             string
	reaches, expired bool
}

// healthAnswer returns the kind of the answer to inner IPv4 packet v if it is a health
// probe some claim covers (architecture.md, decapsulation step 3; loader/health's wire
// format): UDP without options and not a fragment to the tunnel address, whose UDP
// length is what the total length leaves, carrying the magic, kind 'P', the round and a
// site name of at most 64 bytes, for a (port, site) claim or, failing that, a (port,
// "") one. 'R' if that claim reaches and has not expired, else 'N'.
func (w *oracleWorld) healthAnswer(v *ipv4View) (byte, bool) {
	const hdr = 8 + 16 + 1 + 8 // UDP, magic, kind, round
	if v.dst() != w.tunnelIP || v.ip.Protocol != layers.IPProtocolUDP || v.hlen != 20 || v.fragment() {
		return 0, false
	}
	tl, m := int(binary.BigEndian.Uint16(v.raw[2:])), v.l4()
	if tl < 20+hdr || len(m) < hdr {
		return 0, false
	}
	ulen := int(binary.BigEndian.Uint16(m[4:]))
	if ulen != tl-20 || string(m[8:24]) != "isthmus-health1\x00" || m[24] != 'P' || ulen-hdr > 64 || len(m) < ulen {
		return 0, false
	}
	// The site is compared as the map's key holds it: zero-padded to 64 bytes.
	site := strings.TrimRight(string(m[hdr:ulen]), "\x00")
	port := binary.BigEndian.Uint16(m[2:])
	find := func(site string) (oracleHealth, bool) {
		i := slices.IndexFunc(w.health, func(c oracleHealth) bool { return c.port == port && c.site == site })
		if i < 0 {
			return oracleHealth{}, false
		}
		return w.health[i], true
	}
	c, ok := find(site)
	if !ok && ulen > hdr {
		c, ok = find("")
	}
	if !ok {
		return 0, false
	}
	if c.reaches && !c.expired {
		return 'R', true
	}
	return 'N', true
}

// healthForm accepts the answer to probe frame in (outer IPv4 header of ohlen bytes,
// inner Ethernet at ieOff) with kind: sent back out as it came, every pair of MACs,
// addresses and inner ports swapped, outer TTL 64 and UDP checksum 0, the kind byte
// changed and nothing else; the outer header's and the inner UDP checksum verify where
// they did (a zero inner one stays zero).
func healthForm(in []byte, ohlen, ieOff int, kind byte) outputForm {
	return outputForm{name: fmt.Sprintf("health answer %q", kind), check: func(out []byte) error {
		if len(out) != len(in) {
			return fmt.Errorf("answer %d bytes, probe %d", len(out), len(in))
		}
		want := append([]byte{}, in...)
		swap := func(off, n int) {
			copy(want[off:off+n], in[off+n:off+2*n])
			copy(want[off+n:off+2*n], in[off:off+n])
		}
		ip, udp := ieOff+14, 14+ohlen
		swap(0, 6)
		swap(14+12, 4)
		want[14+8] = 64
		copy(want[24:26], out[24:26]) // the outer header checksum, judged below
		want[udp+6], want[udp+7] = 0, 0
		swap(ieOff, 6)
		swap(ip+12, 4)
		swap(ip+20, 2)
		want[ip+20+8+16] = kind
		copy(want[ip+26:ip+28], out[ip+26:ip+28]) // the inner UDP checksum, judged below
		if err := diffAt("health answer", out, want); err != nil {
			return err
		}
		if csum16(in[14:14+ohlen]) == 0 && csum16(out[14:14+ohlen]) != 0 {
			return errors.New("outer IPv4 checksum verified on the probe, not on the answer")
		}
		old, now := binary.BigEndian.Uint16(in[ip+26:]), binary.BigEndian.Uint16(out[ip+26:])
		_, inOK := sumsVerified(in[ip:])
		_, outOK := sumsVerified(out[ip:])
		if (old == 0 && now != 0) || (inOK && !outOK) {
			return fmt.Errorf("inner UDP checksum %#04x (was %#04x) does not verify where it did", now, old)
		}
		return nil
	}}
}

// snatKey returns the original tuple (pod source, ports; ICMP echo request: the
// identifier as source port, 0) of IPv4 packet v, which snatFault lets through apart
// from DROP_SNAT_REWRITE.
func snatKey(v *ipv4View) (proto uint8, sport, dport uint16) {
	l4 := v.l4()
	if v.ip.Protocol == layers.IPProtocolICMPv4 {
		return 1, binary.BigEndian.Uint16(l4[4:]), 0
	}
	return uint8(v.ip.Protocol), binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
}

// natFlow returns the flow of w.nat (live or expired) translated to addr whose
// original tuple is pod:sport -> remote:dport.
func (w *oracleWorld) natFlow(proto uint8, pod, remote, addr netip.Addr, sport, dport uint16) (oracleNat, bool) {
	i := slices.IndexFunc(w.nat, func(f oracleNat) bool {
		return f.proto == proto && f.pod == pod && f.remote == remote && f.addr == addr && f.podPort == sport && f.remotePort == dport
	})
	if i < 0 {
		return oracleNat{}, false
	}
	return w.nat[i], true
}

// snatRefuses adds to e the drop of IPv4 packet v translated to addr (the tunnel
// address: nat; the underlay address: masq_nat), if it has one (architecture.md,
// "Return-path SNAT" steps 1 to 4, "The NAT tables"), and reports whether that drop
// is the only outcome. First what snatFault refuses by the packet alone; then, for a
// new flow (no live flow of its tuple in the table), its source's share: a source
// already holding natSourceFlowsMax flows of the table (an expired flow counts until
// the datapath deletes it, which it does when the flow's own tuple comes again) gets
// DROP_NAT_SOURCE_LIMIT before any port is looked for; then the table's room: the
// new flow's two entries go in without evicting anything, so a table with fewer than
// two free slots refuses it (DROP_SNAT_INSERT), counting the slots of the expired
// entries the flow deletes on its way (its own tuple's, the reply entry of its own
// port); and only then a TCP checksum field past the frame (DROP_SNAT_REWRITE), which
// stops the rewrite. Where the room depends on a port of the range the flow hash
// picks (an expired reply entry it may land on), e is hashed and the drop one of two
// outcomes.
func (w *oracleWorld) snatRefuses(e *expectation, v *ipv4View, addr netip.Addr) bool {
	refuse := func(r IsthmusDropReason, format string, a ...any) bool {
		e.because(format, a...)
		e.allowDrop(r)
		return true
	}
	r, fault := snatFault(v)
	if fault && r != IsthmusDropReasonDROP_SNAT_REWRITE {
		return refuse(r, "the translation cannot carry it")
	}
	proto, sport, dport := snatKey(v)
	src, dst := v.src(), v.dst()
	f, ok := w.natFlow(proto, src, dst, addr, sport, dport)
	if !ok || f.expired {
		held, entries := 0, 0
		for _, g := range w.nat {
			if g.addr == addr {
				entries += 2
				if g.pod == src {
					held++
				}
			}
		}
		free := w.natMax(addr) - entries
		if ok {
			held-- // the expired flow of the same tuple, deleted first
			free++
		}
		if held >= w.natSourceFlowsMax {
			return refuse(IsthmusDropReasonDROP_NAT_SOURCE_LIMIT, "a new flow of %v, which holds %d flows of its table (share %d): DROP_NAT_SOURCE_LIMIT", src, held, w.natSourceFlowsMax)
		}
		// The reply entry of the flow's own port: an expired one is deleted; a live
		// one (or conntrack's) sends the search into the range, where an expired
		// reply entry of the same remote end may be the port the hash picks.
		ownExpired, ownFree, rangeExpired := false, w.portFree(proto, dst, addr, dport, sport), false
		for _, g := range w.nat {
			if g.expired && g.addr == addr && g.proto == proto && g.remote == dst && g.remotePort == dport {
				if g.port == sport {
					ownExpired = true
				} else if g.port >= w.snatPortMin && g.port <= w.snatPortMax {
					rangeExpired = true
				}
			}
		}
		if ownFree && ownExpired {
			free++
		}
		if free < 2 {
			if !ownFree && rangeExpired && free == 1 {
				e.hashed = true
				e.allowDrop(IsthmusDropReasonDROP_SNAT_INSERT)
				e.because("a new flow in a table with %d free slot: DROP_SNAT_INSERT, unless the port the hash picks is an expired reply entry's", free)
				return false
			}
			return refuse(IsthmusDropReasonDROP_SNAT_INSERT, "a new flow in a table with %d free slots: DROP_SNAT_INSERT", free)
		}
	}
	if fault {
		return refuse(r, "the TCP checksum field is past the frame")
	}
	return false
}

// natMax is the size (entries) of the table of flows translated to addr.
func (w *oracleWorld) natMax(addr netip.Addr) int {
	if addr == w.underlay {
		return w.masqNatMax
	}
	return w.snatNatMax
}

// portFree reports whether a new flow to remote:rport may take port of addr: no live
// flow of the table replies on remote:rport -> addr:port and, for TCP and UDP,
// conntrack holds no entry with that tuple in either direction (the lab holds no
// socket).
func (w *oracleWorld) portFree(proto uint8, remote, addr netip.Addr, rport, port uint16) bool {
	if _, ok := w.natReply(proto, remote, addr, rport, port); ok {
		return false
	}
	if proto == 1 {
		return true
	}
	_, ok := w.ctEntry(proto, oracleTuple{src: remote, dst: addr, sport: rport, dport: port})
	return !ok
}

// replyUnknown reports whether IPv4 packet v, addressed to addr (the tunnel address:
// nat; the underlay address: masq_nat), is a TCP segment that nothing claims
// (architecture.md, "Return-path SNAT" step 5): not a fragment, its flags readable,
// neither an RST nor a bare SYN (SYN without ACK), no live flow whose reply it is
// (reverseNAT found none), no socket (the lab has none) and no conntrack entry for its
// tuple in either direction. The host would reset it: DROP_NAT_REPLY_UNKNOWN.
func (w *oracleWorld) replyUnknown(v *ipv4View, addr netip.Addr) bool {
	l4 := v.l4()
	if v.dst() != addr || v.fragment() || v.ip.Protocol != layers.IPProtocolTCP || len(l4) < 14 {
		return false
	}
	if flags := l4[13]; flags&0x04 != 0 || flags&0x12 == 0x02 {
		return false
	}
	t := oracleTuple{src: v.src(), dst: addr, sport: binary.BigEndian.Uint16(l4), dport: binary.BigEndian.Uint16(l4[2:])}
	if _, ok := w.natReply(6, t.src, addr, t.sport, t.dport); ok {
		return false
	}
	_, ok := w.ctEntry(6, t)
	return !ok
}

// natReply returns the live flow whose reply is remote:rport -> addr:port (proto).
func (w *oracleWorld) natReply(proto uint8, remote, addr netip.Addr, rport, port uint16) (oracleNat, bool) {
	for _, f := range w.nat {
		if !f.expired && f.proto == proto && f.remote == remote && f.addr == addr && f.remotePort == rport && f.port == port {
			return f, true
		}
	}
	return oracleNat{}, false
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}

// route returns the longest prefix of w.routes that holds a.
func (w *oracleWorld) route(a netip.Addr) (oracleRoute, bool) {
	best, found := oracleRoute{}, false
	for _, r := range w.routes {
		if r.prefix.Contains(a) && (!found || r.prefix.Bits() > best.prefix.Bits()) {
			best, found = r, true
		}
	}
	return best, found
}

// martian reports whether a is an inner source no peer may send from: "this network"
// 0/8, loopback 127/8, multicast 224/4, reserved 240/4 with the limited broadcast, and
// this node's own underlay and tunnel addresses.
func (w *oracleWorld) martian(a netip.Addr) bool {
	b := a.As4()
	return b[0] == 0 || b[0] == 127 || b[0] >= 224 || a == w.underlay || a == w.tunnelIP
}

// mayUse reports whether peer may send inner source src: some prefix of its own holds it.
func (w *oracleWorld) mayUse(peer, src netip.Addr) bool {
	for _, p := range w.peerSources[peer] {
		if p.Contains(src) {
			return true
		}
	}
	return false
}

func (w *oracleWorld) isPeer(a netip.Addr) bool { return slices.Contains(w.peers, a) }

// snatExempted reports whether source a is in snat_exempt.
func (w *oracleWorld) snatExempted(a netip.Addr) bool {
	return slices.ContainsFunc(w.snatExempt, func(p netip.Prefix) bool { return p.Contains(a) })
}

// oracleTuple is one direction of a conntrack entry: src:sport -> dst:dport.
type oracleTuple struct {
	src, dst     netip.Addr
	sport, dport uint16
}

// inverse is the tuple of the other direction of an untranslated flow.
func (t oracleTuple) inverse() oracleTuple {
	return oracleTuple{src: t.dst, dst: t.src, sport: t.dport, dport: t.sport}
}

// oracleCT is an entry of the lab's conntrack: its original tuple and its reply tuple
// (as the kernel keeps them; equal to the inverse of the original unless the flow is
// translated), and whether conntrack holds it TCP ESTABLISHED, CONFIRMED and ASSURED
// (assured; an entry created without ASSURED is established but not assured). closed:
// the flow was closed on the fast path (a RST or both FINs; none of the world's are
// until fast-path close tracking exists).
type oracleCT struct {
	proto   uint8
	orig    oracleTuple
	reply   oracleTuple
	assured bool
	closed  bool
}

// untranslated reports whether no translation of any kind applies to c: its original
// tuple is the inverse of its reply tuple (iptables or nftables NAT, and IPVS, which
// rewrites the reply tuple without setting a NAT status bit, all break this).
func (c oracleCT) untranslated() bool { return c.orig == c.reply.inverse() }

// ctEntry returns the entry of the lab's conntrack that packet tuple t of protocol
// proto belongs to, in either direction: t is its original or its reply tuple (the
// kernel hashes both).
func (w *oracleWorld) ctEntry(proto uint8, t oracleTuple) (oracleCT, bool) {
	i := slices.IndexFunc(w.conntrack, func(c oracleCT) bool {
		return c.proto == proto && (c.orig == t || c.reply == t)
	})
	if i < 0 {
		return oracleCT{}, false
	}
	return w.conntrack[i], true
}

// direct reports whether a pod's IPv4 packet v may go around the node's stack, by the
// fail-closed rule (DESIGN.md, "Invariants"; docs/architecture.md, "Netfilter"), and
// why (or why not). src and dst are the packet's addresses and dport, if not 0, its
// destination port (a reply translated back: v's own destination and port are the
// translated ones). Direct only if ALL of these hold:
//  1. not a fragment (neither MF nor an offset);
//  2. TCP, with the whole 20-byte header present;
//  3. no SYN (with or without ACK);
//  4. conntrack has an entry for its tuple, in either direction;
//  5. that entry is established, confirmed and assured, and untranslated;
//  6. the flow was not closed on the fast path.
//
// Everything else passes the stack: fragments, UDP, ICMP of every type, every other
// protocol, a cut L4 header, SYNs, no entry, a translated or unassured entry.
func (w *oracleWorld) direct(v *ipv4View, src, dst netip.Addr, dport uint16) (bool, string) {
	ok, why, _ := w.directReopens(v, src, dst, dport)
	return ok, why
}

// directReopens is direct, and also returns the closed entry a bare SYN (without ACK)
// on its tuple reopens: the fast path closed that flow, so the SYN starts a new one,
// which conntrack must see as NEW (the datapath expires the entry; the test puts the
// world's entry back after the input).
func (w *oracleWorld) directReopens(v *ipv4View, src, dst netip.Addr, dport uint16) (bool, string, *oracleCT) {
	if v.fragment() {
		return false, "a fragment: the stack", nil
	}
	if v.ip.Protocol != layers.IPProtocolTCP {
		return false, fmt.Sprintf("protocol %v, not TCP: the stack", v.ip.Protocol), nil
	}
	return w.ctDecide(v.l4(), src, dst, dport)
}

// ctDecide is the part of the fail-closed rule after the network header: the TCP
// segment l4 of src -> dst (dport, if not 0, its destination port) goes around the
// stack only with its whole 20-byte header present, without SYN, of an entry
// conntrack holds established, assured, untranslated and not closed on the fast path;
// a bare SYN on a closed flow's tuple reopens it.
func (w *oracleWorld) ctDecide(l4 []byte, src, dst netip.Addr, dport uint16) (bool, string, *oracleCT) {
	if len(l4) < 20 {
		return false, fmt.Sprintf("TCP header cut at %d bytes: the stack", len(l4)), nil
	}
	t := oracleTuple{src: src, dst: dst, sport: binary.BigEndian.Uint16(l4), dport: binary.BigEndian.Uint16(l4[2:])}
	if dport != 0 {
		t.dport = dport
	}
	c, ok := w.ctEntry(6, t)
	if l4[13]&0x02 != 0 {
		if ok && c.closed && l4[13]&0x10 == 0 {
			return false, "a SYN on the tuple of a closed flow: the stack, as a new flow", &c
		}
		return false, "a SYN: the stack", nil
	}
	switch {
	case !ok:
		return false, fmt.Sprintf("no conntrack entry for %v:%d -> %v:%d: the stack", t.src, t.sport, t.dst, t.dport), nil
	case !c.assured:
		return false, "conntrack entry not assured: the stack", nil
	case !c.untranslated():
		return false, "conntrack entry translated (original != inverse of reply): the stack", nil
	case c.closed:
		return false, "flow closed on the fast path: the stack", nil
	}
	return true, "established, assured, untranslated TCP flow: around the stack", nil
}

// expectation is what the model allows for one frame on one program. Anything not
// allowed fails the test with why.
type expectation struct {
	why string
	// pass: returning the frame to the stack untouched is right (TC_ACT_OK, XDP_PASS).
	pass bool
	// mark: with pass, or a form handed to the stack, skb->mark carries OVERLAY_MARK
	// (a pod's packet the stack must see); without, it is left 0.
	mark bool
	// drop: a counted drop is right, with the one reason in reasons.
	drop    bool
	reasons []IsthmusDropReason
	// forms: the output a redirect (or an XDP pop) must produce; check returns nil if
	// out is that output. Empty: no redirect and no rewrite is right.
	forms []outputForm
	// hashed: the outcome depends on what the flow hash picks, which the model does
	// not compute: a transit frame whose group holds its sender is forwarded to
	// another member or DROP_TRANSIT_LOOP; a new flow in a table one slot short is
	// translated if the port of the range the hash picks is an expired reply entry's,
	// else DROP_SNAT_INSERT. The input classes with two outcomes.
	hashed bool
	// reopens: the closed conntrack entries the input expires (a bare SYN on a closed
	// flow's tuple), which the test puts back for the next input.
	reopens []oracleCT
	// formDrop, if not 0, is the drop a redirect to one of forms must have counted
	// (exactly once, at the hook): a dropped packet answered in its place, as a pod's
	// packet to a group without a live member is with ICMP net unreachable.
	formDrop IsthmusDropReason
}

type outputForm struct {
	name  string
	check func(out []byte) error
	// toStack: the form is returned to the stack rewritten (TC_ACT_OK), not redirected.
	toStack bool
	// target: the interface a delivery must be redirected to, as the program's trace
	// records it (0: not a delivery, or not judged); peer: bpf_redirect_peer into the
	// pod's namespace (a direct delivery) rather than a plain redirect.
	target int
	// mark: skb->mark carries OVERLAY_MARK after the run (a pod's packet handed to the
	// stack).
	mark bool
}

func (e *expectation) allowDrop(r ...IsthmusDropReason) {
	e.drop = true
	e.reasons = append(e.reasons, r...)
}

func (e *expectation) because(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	if e.why == "" {
		e.why = s
	} else {
		e.why += "; " + s
	}
}

func (e *expectation) allows(r IsthmusDropReason) bool {
	return e.drop && slices.Contains(e.reasons, r)
}

// outcomes returns how many outcomes e allows: passing untouched, each drop reason,
// each output form. The model names exactly one for every input (two only where
// hashed says why).
func (e *expectation) outcomes() int {
	n := len(e.reasons) + len(e.forms)
	if e.pass {
		n++
	}
	if e.drop && len(e.reasons) == 0 {
		n += 100 // a drop without a reason is no outcome: the model is broken
	}
	return n
}

// ipv4View is an IPv4 header as gopacket reads it, with where it sits.
type ipv4View struct {
	ip     *layers.IPv4
	off    int // offset of the header in the frame
	hlen   int // IHL * 4
	raw    []byte
	hdrOK  bool // header checksum verifies
	optErr bool // gopacket rejected the options (neither the datapath nor the model needs them)
}

// decodeIPv4 decodes the IPv4 header at b[off:]. The total length field is read but not
// trusted (the datapath locates headers by IHL and the stack judges the length after
// delivery), so gopacket is given a copy whose length is the bytes present; malformed
// options are read as NOPs for the same reason. Returns an error for what no IPv4 parser
// may accept: version not 4, IHL < 5, a header longer than the frame.
func decodeIPv4(b []byte, off int) (*ipv4View, error) {
	if len(b) < off+20 {
		return nil, errors.New("IPv4 header truncated")
	}
	if b[off]>>4 != 4 {
		return nil, fmt.Errorf("IP version %d", b[off]>>4)
	}
	hlen := int(b[off]&0x0f) * 4
	if hlen < 20 {
		return nil, fmt.Errorf("IHL %d", hlen/4)
	}
	if len(b) < off+hlen {
		return nil, fmt.Errorf("IPv4 header of %d bytes, %d present", hlen, len(b)-off)
	}
	cp := append([]byte{}, b[off:]...)
	binary.BigEndian.PutUint16(cp[2:], uint16(min(len(cp), 0xffff)))
	v := &ipv4View{ip: &layers.IPv4{}, off: off, hlen: hlen, raw: b[off:], hdrOK: csum16(b[off:off+hlen]) == 0}
	if err := v.ip.DecodeFromBytes(cp, gopacket.NilDecodeFeedback); err != nil {
		for i := 20; i < hlen; i++ {
			cp[i] = 1 // NOP
		}
		v.optErr = true
		if err := v.ip.DecodeFromBytes(cp, gopacket.NilDecodeFeedback); err != nil {
			return nil, fmt.Errorf("gopacket: %w", err)
		}
	}
	return v, nil
}

func (v *ipv4View) src() netip.Addr { a, _ := netip.AddrFromSlice(v.ip.SrcIP.To4()); return a }
func (v *ipv4View) dst() netip.Addr { a, _ := netip.AddrFromSlice(v.ip.DstIP.To4()); return a }
func (v *ipv4View) fragment() bool {
	return v.ip.Flags&layers.IPv4MoreFragments != 0 || v.ip.FragOffset != 0
}

// l4 returns the bytes after the IPv4 header that are present, whatever the total length
// field says (it is not trusted, see decodeIPv4).
func (v *ipv4View) l4() []byte { return v.raw[v.hlen:] }

// errorAllowed says whether an ICMP error may be sent about v, as the kernel's
// icmp_send decides (RFC 1122 3.2.2, RFC 1812 4.3.2.7): never about a fragment after
// the first, an ICMP type past 18 (NR_ICMP_TYPES) or one net/ipv4/icmp.c's
// icmp_pointers marks as an error: destination unreachable, source quench, redirect,
// time exceeded, parameter problem, and the unassigned or retired 1, 2, 6, 7 and the
// router advertisement and solicitation 9, 10 (only the informational 0, 8 and 13 to
// 18 are answered); and, as
// the datapath builds every error (architecture.md, encapsulation step 3), only with
// the header and the 8 bytes after it present to quote.
func (v *ipv4View) errorAllowed() bool {
	if v.ip.FragOffset != 0 || len(v.raw) < v.hlen+8 {
		return false
	}
	if v.ip.Protocol != layers.IPProtocolICMPv4 {
		return true
	}
	l4 := v.l4()
	if len(l4) == 0 {
		return false
	}
	t := l4[0]
	return t == 0 || t == 8 || (t >= 13 && t <= 18)
}

// udpPorts decodes a UDP header with gopacket. Like the IPv4 total length, the UDP length
// field is read but not trusted (gopacket refuses one below 8): the datapath locates
// GENEVE by the header size, and the model judges the bytes present.
func udpPorts(b []byte) (*layers.UDP, error) {
	u := &layers.UDP{}
	if len(b) < 8 {
		return nil, errors.New("UDP header truncated")
	}
	cp := append([]byte{}, b[:8]...)
	binary.BigEndian.PutUint16(cp[4:], 8)
	if err := u.DecodeFromBytes(cp, gopacket.NilDecodeFeedback); err != nil {
		return nil, fmt.Errorf("gopacket: %w", err)
	}
	u.Length = binary.BigEndian.Uint16(b[4:])
	return u, nil
}

// geneveFixed decodes the 8-byte GENEVE header with gopacket and returns it with the
// option bytes (Opt Len * 4). gopacket is given the fixed header only: its option walk
// keeps the offset in a uint8 (wrong for 63 words) and lets a TLV run past Opt Len;
// RFC 8926 3.4 lets a receiver that parses no options skip them by Opt Len alone.
func geneveFixed(b []byte) (*layers.Geneve, int, error) {
	if len(b) < 8 {
		return nil, 0, errors.New("GENEVE header truncated")
	}
	hdr := append([]byte{b[0] & 0xc0}, b[1:8]...)
	g := &layers.Geneve{}
	if err := g.DecodeFromBytes(hdr, gopacket.NilDecodeFeedback); err != nil {
		return nil, 0, fmt.Errorf("gopacket: %w", err)
	}
	return g, int(b[0]&0x3f) * 4, nil
}

// mssClamp returns ip (an IPv4 packet) with every MSS option of a TCP SYN above
// mtu - 40 lowered to it, and whether it changed anything. The options are walked as
// RFC 9293 3.2 lays them out and Linux's tcp_parse_options reads them: it keeps the
// last MSS option, so every one counts; an MSS option of another length is skipped by
// its length; an option that does not fit ends the walk. mtu 0 means no clamp (a path
// that does not clamp: an MSS of 65535 is above every bound).
func mssClamp(ip []byte, mtu int) ([]byte, bool) {
	v, err := decodeIPv4(ip, 0)
	if err != nil || mtu <= 0 || v.ip.Protocol != layers.IPProtocolTCP || v.fragment() {
		return ip, false
	}
	return clampAt(ip, v.hlen, uint16(mtu-40))
}

// clampAt returns ip with every MSS option of the TCP SYN (or SYN-ACK) at ip[off:]
// above max lowered to it, and whether it changed anything (see mssClamp).
func clampAt(ip []byte, off int, max uint16) ([]byte, bool) {
	seg := ip[off:]
	if len(seg) < 20 || seg[13]&0x02 == 0 {
		return ip, false
	}
	doff := int(seg[12]>>4) * 4
	if doff <= 20 || len(seg) < doff {
		return ip, false
	}
	opts := seg[20:doff]
	out, changed := ip, false
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0: // end of option list
			return out, changed
		case 1: // no-operation
			i++
			continue
		}
		if i+1 >= len(opts) {
			return out, changed
		}
		l := int(opts[i+1])
		if l < 2 || i+l > len(opts) {
			return out, changed
		}
		if opts[i] == 2 && l == 4 && binary.BigEndian.Uint16(opts[i+2:]) > max {
			if !changed {
				out = append([]byte{}, ip...)
			}
			binary.BigEndian.PutUint16(out[off+20+i+2:], max)
			changed = true
		}
		i += l
	}
	return out, changed
}

// l4SumOK reports whether the TCP or UDP checksum of IPv4 packet ip verifies (a zero UDP
// checksum counts as none, which verifies); false for other protocols, fragments and
// packets shorter than their total length.
func l4SumOK(ip []byte) bool {
	v, err := decodeIPv4(ip, 0)
	if err != nil || v.fragment() {
		return false
	}
	tl := int(binary.BigEndian.Uint16(ip[2:]))
	if tl < v.hlen || tl > len(ip) {
		return false
	}
	seg := ip[v.hlen:tl]
	switch v.ip.Protocol {
	case layers.IPProtocolTCP:
		if len(seg) < 20 {
			return false
		}
	case layers.IPProtocolUDP:
		if len(seg) < 8 {
			return false
		}
		if binary.BigEndian.Uint16(seg[6:]) == 0 {
			return true
		}
	default:
		return false
	}
	pseudo := append(append([]byte{}, ip[12:20]...), 0, byte(v.ip.Protocol), byte(len(seg)>>8), byte(len(seg)))
	return csum16(append(pseudo, seg...)) == 0
}

// innerAfter is inIP (an inner IPv4 packet as received) as it must leave: with the TTL
// decremented if decTTL, the ECN field set to CE if ce, and the MSS clamped to mtu. Its
// checksums are recomputed where the received ones verified; where they did not, the
// datapath's bytes for them are taken from got (it cannot be expected to fix a sum that
// was already wrong). The result has the length of inIP.
func innerAfter(inIP, got []byte, decTTL, ce bool, mtu int) []byte {
	return innerAfterSums(inIP, got, decTTL, ce, mtu, csum16(inIP[:int(inIP[0]&0x0f)*4]) == 0, l4SumOK(inIP))
}

// innerAfterSums is innerAfter for a packet whose header and L4 checksums verified on
// input as hdrOK and l4OK say: inIP may be a packet the model has already rewritten
// (translated), whose sums are then the datapath's and prove nothing.
func innerAfterSums(inIP, got []byte, decTTL, ce bool, mtu int, hdrOK, l4OK bool) []byte {
	want := append([]byte{}, inIP...)
	hlen := int(want[0]&0x0f) * 4
	if decTTL {
		want[8]--
	}
	if ce {
		want[1] |= 0x03
	}
	want, clamped := mssClamp(want, mtu)
	if hdrOK {
		want[10], want[11] = 0, 0
		binary.BigEndian.PutUint16(want[10:], csum16(want[:hlen]))
	} else if len(got) >= 12 {
		copy(want[10:12], got[10:12])
	}
	if clamped {
		off := hlen + 16 // TCP checksum
		if l4OK {
			want[off], want[off+1] = 0, 0
			tl := int(binary.BigEndian.Uint16(want[2:]))
			seg := want[hlen:tl]
			pseudo := append(append([]byte{}, want[12:20]...), 0, 6, byte(len(seg)>>8), byte(len(seg)))
			binary.BigEndian.PutUint16(want[off:], csum16(append(pseudo, seg...)))
		} else if len(got) >= off+2 {
			copy(want[off:off+2], got[off:off+2])
		}
	}
	return want
}

// diffAt describes the first difference of got and want.
func diffAt(what string, got, want []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Errorf("%s differs at byte %d (got %d bytes, want %d)\n got %x\nwant %x", what, i, len(got), len(want), got, want)
}

// icmpErrorForm accepts an output that gopacket decodes as an ICMPv4 error of type typ
// (code, if >= 0) addressed to dst, possibly inside GENEVE.
func icmpErrorForm(name string, typ uint8, code int, dst netip.Addr) outputForm {
	return outputForm{name: name, check: func(out []byte) error {
		p := gopacket.NewPacket(geneveInner(out), layers.LayerTypeEthernet, gopacket.Default)
		var lastIP *layers.IPv4
		for _, l := range p.Layers() {
			switch l := l.(type) {
			case *layers.IPv4:
				lastIP = l
			case *layers.ICMPv4:
				if l.TypeCode.Type() != typ || (code >= 0 && int(l.TypeCode.Code()) != code) {
					return fmt.Errorf("ICMP %v, want type %d code %d", l.TypeCode, typ, code)
				}
				if a, _ := netip.AddrFromSlice(lastIP.DstIP.To4()); a != dst {
					return fmt.Errorf("ICMP error to %v, want %v", a, dst)
				}
				return nil
			}
		}
		return errors.New("no ICMPv4 layer in the output")
	}}
}

// geneveInner returns the inner Ethernet frame of out when out is GENEVE (IPv4 or
// IPv6, UDP to port 6081), else out itself. The offsets come from the fixed headers:
// gopacket's GENEVE layer gives up on options that are not well-formed TLVs, which
// the datapath carries without reading.
func geneveInner(out []byte) []byte {
	udpOff := 0
	if isIPv6Frame(out) {
		v6, err := decodeIPv6(out, 14)
		if err != nil || v6.next() != 17 {
			return out
		}
		udpOff = 14 + 40
	} else {
		ip, err := decodeIPv4(out, 14)
		if err != nil || ip.ip.Protocol != layers.IPProtocolUDP {
			return out
		}
		udpOff = 14 + ip.hlen
	}
	if u, err := udpPorts(out[udpOff:]); err != nil || u.DstPort != 6081 {
		return out
	}
	_, optlen, err := geneveFixed(out[udpOff+8:])
	if err != nil || udpOff+16+optlen > len(out) {
		return out
	}
	return out[udpOff+16+optlen:]
}

// untaggedIPv4 reports whether gopacket decodes in as an Ethernet frame of type IPv4. A
// VLAN tag, ARP, IPv6...: not the datapath's, the stack's.
func untaggedIPv4(in []byte) bool {
	eth := &layers.Ethernet{}
	return eth.DecodeFromBytes(in, gopacket.NilDecodeFeedback) == nil && eth.EthernetType == layers.EthernetTypeIPv4
}

// modelUnderlay is the model of underlay_ingress (xdp false) and underlay_xdp (xdp true)
// for frame in arriving on the underlay device.
func modelUnderlay(w *oracleWorld, in []byte, xdp bool) expectation {
	var e expectation
	if untaggedOf(in, layers.EthernetTypeIPv6) {
		return modelUnderlay6(w, in, xdp)
	}
	if !untaggedIPv4(in) {
		e.pass = true
		e.because("not an untagged IPv4 frame: the stack's")
		return e
	}
	outer, err := decodeIPv4(in, 14)
	if err != nil {
		e.allowDrop(IsthmusDropReasonDROP_INVALID_PACKET)
		e.because("outer IPv4 malformed (%v): DROP_INVALID_PACKET", err)
		return e
	}
	if outer.dst() != w.underlay || outer.ip.Protocol != layers.IPProtocolUDP || outer.ip.FragOffset != 0 {
		// A later fragment carries no ports to tell (architecture.md, decapsulation
		// step 1): the stack's reassembly keeps it.
		e.because("outer %v -> %v proto %v offset %d: not UDP to this node, or a later fragment", outer.src(), outer.dst(), outer.ip.Protocol, outer.ip.FragOffset)
		plainUnderlay(w, in, outer, xdp, &e)
		return e
	}
	udpOff := 14 + outer.hlen
	udp, err := udpPorts(in[udpOff:])
	if err != nil {
		e.allowDrop(IsthmusDropReasonDROP_INVALID_PACKET)
		e.because("outer UDP truncated: DROP_INVALID_PACKET")
		return e
	}
	if udp.DstPort != 6081 {
		e.because("UDP port %d, not GENEVE", udp.DstPort)
		plainUnderlay(w, in, outer, xdp, &e)
		return e
	}
	if outer.fragment() {
		// The first fragment of a GENEVE datagram: counted, never popped (its payload
		// is not the whole frame; architecture.md, decapsulation step 1).
		e.allowDrop(IsthmusDropReasonDROP_OUTER_FRAGMENT)
		e.because("first outer fragment: DROP_OUTER_FRAGMENT")
		return e
	}
	return decapGeneve(w, in, outerGeneve{v4: outer, src: outer.src(), udpOff: udpOff, ce: outer.ip.TOS&0x03 == 0x03}, xdp, e)
}

// outerGeneve is the outer header of a GENEVE frame to this node: IPv4 (v4) or IPv6
// (v4 nil), its source address, where its UDP header starts and whether its ECN field
// is CE.
type outerGeneve struct {
	v4     *ipv4View
	src    netip.Addr
	udpOff int
	ce     bool
}

// peerOf returns the peer an outer source names: an IPv4 address in peers (never a
// handle: no IPv4 frame comes from one) or, over the IPv6 underlay, the handle peers6
// maps the address to.
func (w *oracleWorld) peerOf(o outerGeneve) (netip.Addr, bool) {
	if o.v4 != nil {
		return o.src, w.isPeer(o.src)
	}
	return w.handleOf(o.src)
}

// decapGeneve is the model of both decapsulation programs for a frame whose outer
// header o says it is UDP to port 6081 of this node (over either underlay family),
// from its GENEVE header on.
func decapGeneve(w *oracleWorld, in []byte, o outerGeneve, xdp bool, e expectation) expectation {
	// GENEVE for this node. The first fault in the order of architecture.md
	// (decapsulation steps 2 and 3) is the reason: version, options inside the frame,
	// C bit, O bit, protocol, VNI, peer, inner Ethernet and IPv4, inner source.
	udpOff := o.udpOff
	peer, known := w.peerOf(o)
	gOff := udpOff + 8
	g, optlen, err := geneveFixed(in[gOff:])
	if err != nil {
		e.allowDrop(IsthmusDropReasonDROP_GENEVE_TRUNCATED)
		e.because("GENEVE header truncated")
		return e
	}
	fault := func(r IsthmusDropReason, format string, a ...any) expectation {
		e.allowDrop(r)
		e.because(format, a...)
		return e
	}
	ieOff := gOff + 8 + optlen
	ieth := &layers.Ethernet{}
	switch {
	case g.Version != 0:
		return fault(IsthmusDropReasonDROP_GENEVE_VERSION, "GENEVE version %d", g.Version)
	case ieOff > len(in):
		return fault(IsthmusDropReasonDROP_GENEVE_OPT_LEN, "GENEVE options (%d bytes) run past the frame", optlen)
	case g.CriticalOption:
		return fault(IsthmusDropReasonDROP_GENEVE_CRITICAL, "GENEVE C bit")
	case g.OAMPacket:
		// Control frames are not data: never delivered or forwarded.
		return fault(IsthmusDropReasonDROP_GENEVE_OAM, "GENEVE O bit (control frame)")
	case g.Protocol != layers.EthernetTypeTransparentEthernetBridging:
		return fault(IsthmusDropReasonDROP_GENEVE_PROTOCOL, "GENEVE protocol %#04x", uint16(g.Protocol))
	case g.VNI != w.vni:
		return fault(IsthmusDropReasonDROP_GENEVE_VNI, "VNI %#x, ours %#x", g.VNI, w.vni)
	case !known:
		return fault(IsthmusDropReasonDROP_UNKNOWN_PEER, "outer source %v is no peer", o.src)
	case ieth.DecodeFromBytes(in[ieOff:], gopacket.NilDecodeFeedback) != nil:
		return fault(IsthmusDropReasonDROP_INNER_INVALID, "inner Ethernet truncated")
	case ieth.EthernetType == layers.EthernetTypeIPv6:
		decapInner6(w, in, ieOff, o, peer, xdp, &e)
		return e
	case ieth.EthernetType != layers.EthernetTypeIPv4:
		return fault(IsthmusDropReasonDROP_INNER_UNSUPPORTED, "inner EtherType %#04x", uint16(ieth.EthernetType))
	}
	inner, err := decodeIPv4(in, ieOff+14)
	if err != nil {
		return fault(IsthmusDropReasonDROP_INNER_INVALID, "inner IPv4 malformed: %v", err)
	}
	src, dst := inner.src(), inner.dst()
	if w.martian(src) {
		// No peer may send from these, whatever peer_sources allows (a gateway's peer
		// may have 0.0.0.0/0): the stack would trust them as its own or as local.
		return fault(IsthmusDropReasonDROP_INNER_MARTIAN, "inner source %v is a martian", src)
	}
	if !w.mayUse(peer, src) {
		return fault(IsthmusDropReasonDROP_INNER_SRC_DENIED, "peer %v may not send from %v", peer, src)
	}
	if o.v4 != nil && o.v4.hlen > 20 {
		e.because("outer IPv4 options (%d bytes): popped with them", o.v4.hlen-20)
	}
	e.because("valid GENEVE from peer %v, inner %v -> %v ttl %d", peer, src, dst, inner.ip.TTL)
	inIP := in[ieOff+14:]
	ce := o.ce && inIP[1]&0x03 != 0

	// Over the IPv6 underlay nothing is answered or forwarded from here: health
	// checks and gateways over it are not there yet (architecture.md, "IPv6
	// underlay"), and the answer to an expiring TTL is transit's, which rewrites an
	// outer IPv4 header. Such a frame is delivered (or not) as any other, and XDP pops
	// it.
	v4 := o.v4 != nil
	if kind, ok := w.healthAnswer(inner); ok && !xdp && v4 {
		// A health probe the claims cover is answered before transit, TTL and ECN
		// (architecture.md, decapsulation step 3); XDP leaves it to TC.
		e.because("a health probe the claims cover: answered %q back to the peer", kind)
		e.forms = append(e.forms, healthForm(in, o.v4.hlen, ieOff, kind))
		return e
	}

	// A gateway transits only over the IPv4 underlay: a route whose next hop is a peer
	// on the IPv6 underlay is no transit route (the frame would need an outer IPv6
	// header; its handle is no IPv4 address to send to), and the frame goes on as on
	// a member.
	if rt, ok := w.route(dst); ok && w.transit && v4 && !w.viaHandle(rt) {
		if xdp {
			e.pass = true
			e.because("transits: XDP leaves it whole to TC")
			return e
		}
		e.because("transit via %v (route %v)", rt.peers, rt.prefix)
		others := slices.DeleteFunc(slices.Clone(rt.peers), func(a netip.Addr) bool { return a == peer })
		switch {
		case len(rt.peers) == 0:
			return fault(IsthmusDropReasonDROP_NO_NEXTHOP, "no live member")
		case len(others) == 0:
			return fault(IsthmusDropReasonDROP_TRANSIT_LOOP, "the only next hop is the sender")
		case len(others) < len(rt.peers):
			// Which member the flow hash picks is not modelled: the sender's slot
			// is a loop, another's a forward (below).
			e.hashed = true
			e.allowDrop(IsthmusDropReasonDROP_TRANSIT_LOOP)
		}
		if inner.ip.TTL <= 1 {
			if inner.errorAllowed() {
				e.because("inner TTL %d: ICMP time exceeded back to the sender", inner.ip.TTL)
				e.forms = append(e.forms, icmpErrorForm("ICMP time exceeded", 11, 0, src))
			} else {
				e.allowDrop(IsthmusDropReasonDROP_TTL_EXCEEDED)
			}
			return e
		}
		if len(in)-14 > w.underlayMTU {
			// Next the size, against the link toward the next hop: the frame cannot
			// go on whole, DF makes the inner sender hear it (RFC 1191).
			e.because("longer than the underlay MTU %d", w.underlayMTU)
			if inIP[6]&0x40 != 0 && inner.errorAllowed() {
				e.forms = append(e.forms, icmpErrorForm("ICMP frag needed", 3, 4, src))
			} else {
				e.allowDrop(IsthmusDropReasonDROP_UNDERLAY_MTU)
			}
			return e
		}
		if len(others) > 0 {
			e.forms = append(e.forms, transitForm(w, in, o.v4, ieOff+14, others))
		}
		return e
	}

	if inner.ip.TTL <= 1 && dst != w.tunnelIP && dst != w.underlay && v4 {
		if xdp {
			e.pass = true
			e.because("inner TTL %d: XDP leaves it whole to TC", inner.ip.TTL)
			return e
		}
		if w.ownPods[dst] != nil || inPrefixes(w.fabricPrefixes, dst) {
			// Delivering it is a routing hop: answered before the pop (and before
			// RFC 6040), back through the tunnel, as transit answers. A destination
			// of this site's fabric counts as one wherever the FIB routes it.
			e.because("to own pod or fabric %v with TTL %d: time exceeded back to the peer", dst, inner.ip.TTL)
			if inner.errorAllowed() {
				e.forms = append(e.forms, icmpErrorForm("ICMP time exceeded", 11, 0, src))
			} else {
				e.allowDrop(IsthmusDropReasonDROP_TTL_EXCEEDED)
			}
			return e
		}
	}
	if xdp && v4 && dst == w.tunnelIP && inner.ip.Protocol == layers.IPProtocolUDP && inner.hlen == 20 && !inner.fragment() {
		// Inner UDP to the tunnel address may be a health probe: XDP leaves it
		// whole to TC, which answers it (architecture.md, decapsulation step 3).
		e.pass = true
		e.because("inner UDP to the tunnel address: XDP leaves it to TC")
		return e
	}
	if o.ce && inIP[1]&0x03 == 0 {
		// RFC 6040 4.2: CE on a Not-ECT inner packet is dropped, before any delivery.
		e.allowDrop(IsthmusDropReasonDROP_ECN_NOT_ECT)
		e.because("outer CE, inner Not-ECT: DROP_ECN_NOT_ECT (RFC 6040)")
		return e
	}
	if xdp {
		// RFC 6040: the outer CE reaches an ECN-capable inner header.
		e.forms = append(e.forms, xdpPopForm(w, in, peer, ieOff+14, ce))
		return e
	}
	if r, ok := w.reverseNAT(inner, w.tunnelIP); ok {
		// Return-path SNAT reversed before delivery (architecture.md, step 5): the
		// reply goes to the flow's pod as any packet to it would.
		to := r.flow.pod
		e.because("reply to the translated flow of %v port %d: destination translated back", to, r.flow.podPort)
		switch {
		case r.rewriteFails:
			e.because("the TCP checksum field is past the frame")
			e.allowDrop(IsthmusDropReasonDROP_SNAT_REWRITE)
		case w.ownPods[to] != nil && (inner.ip.TTL <= 1 || !w.directOK(&e, inner, inner.src(), to, r.flow.podPort)):
			// No hop left (over the IPv6 underlay only) goes through the stack,
			// which answers it, before the fast path is asked.
			e.forms = append(e.forms, w.toStack(reverseForm("reverse SNAT, pod delivery through the stack", w.istMAC, in[6:12], r, inIP, false, ce, w.tunnelMTU), true))
		case w.ownPods[to] != nil:
			e.forms = append(e.forms, w.toPod(reverseForm("reverse SNAT, pod delivery", w.ownPods[to], w.podHMAC, r, inIP, true, ce, w.tunnelMTU)))
		case inPrefixes(w.cniRoutes, to):
			// Another CNI's pod: the stack forwards the reply as it did the request.
			e.forms = append(e.forms, w.toStack(reverseForm("reverse SNAT, to the stack", w.istMAC, nil, r, inIP, false, ce, w.tunnelMTU), false))
		default:
			e.allowDrop(IsthmusDropReasonDROP_NOT_LOCAL)
		}
		return e
	}
	if w.replyUnknown(inner, w.tunnelIP) {
		e.because("TCP to the tunnel address that no translation, socket or conntrack entry claims: DROP_NAT_REPLY_UNKNOWN")
		e.allowDrop(IsthmusDropReasonDROP_NAT_REPLY_UNKNOWN)
		return e
	}
	switch {
	case inPrefixes(w.fabricPrefixes, dst) && inPrefixes(w.fabricRoutes, dst) && w.ownPods[dst] == nil && inner.ip.TTL <= 1:
		// Only over the IPv6 underlay (over IPv4 it was answered above): the
		// forward to the fabric has no hop left and nothing answers here.
		e.because("to %v of this site's fabric with TTL %d, over the IPv6 underlay: DROP_TTL_EXCEEDED", dst, inner.ip.TTL)
		e.allowDrop(IsthmusDropReasonDROP_TTL_EXCEEDED)
	case inPrefixes(w.fabricPrefixes, dst) && inPrefixes(w.fabricRoutes, dst) && w.ownPods[dst] == nil:
		// Fabric delivery: this site's block, routed to the fabric router.
		e.because("to %v of this site's fabric: forwarded to the fabric router", dst)
		f := deliverForm("fabric delivery", w.fabricMAC, w.undMAC, inIP, true, ce, w.tunnelMTU)
		f.target = w.undIfindex
		e.forms = append(e.forms, f)
	case w.ownPods[dst] != nil && (inner.ip.TTL <= 1 || !w.directOK(&e, inner, src, dst, 0)):
		// The fail-closed rule: the pod's packet reaches it through the stack
		// (isthmus0 ingress, marked), which forwards it and decrements its TTL; the
		// frame keeps its source MAC. So does one with no hop left (only over the
		// IPv6 underlay: over IPv4 it was answered above), before the fast path is
		// asked: the stack answers it.
		e.because("to own pod %v with TTL %d: through the stack", dst, inner.ip.TTL)
		e.forms = append(e.forms, w.toStack(deliverForm("pod delivery through the stack", w.istMAC, in[6:12], in[ieOff+14:], false, ce, w.tunnelMTU), true))
	case w.ownPods[dst] != nil:
		e.because("to own pod %v, around the stack", dst)
		e.forms = append(e.forms, w.toPod(deliverForm("pod delivery", w.ownPods[dst], w.podHMAC, in[ieOff+14:], true, ce, w.tunnelMTU)))
	case dst == w.tunnelIP || dst == w.underlay:
		// The underlay address too, for a peer's pods, which reach it through the
		// tunnel because this node answers them there. Unmarked: the host's own.
		e.because("to this node's tunnel or underlay address %v", dst)
		e.forms = append(e.forms, w.toStack(deliverForm("host delivery", w.istMAC, nil, in[ieOff+14:], false, ce, w.tunnelMTU), false))
	default:
		// Host delivery only for the node's tunnel and underlay addresses.
		e.because("%v is neither a local pod nor a tunnel or underlay address of this node", dst)
		e.allowDrop(IsthmusDropReasonDROP_NOT_LOCAL)
	}
	return e
}

// plainUnderlay is the model of underlay_ingress for an IPv4 frame v that is not GENEVE
// for this node: a reply to a masqueraded flow gets its pod's address and port back and
// goes to the stack (architecture.md, "Egress masquerade"); an overlay packet the site
// fabric hands over for a local pod is delivered (fabric_ingress); everything else is
// the stack's, untouched. XDP passes all of it.
func plainUnderlay(w *oracleWorld, in []byte, v *ipv4View, xdp bool, e *expectation) {
	e.pass = true
	if xdp {
		return
	}
	if r, ok := w.reverseNAT(v, w.underlay); ok && w.masquerade {
		e.pass = false
		e.because("reply to the masqueraded flow of %v port %d: translated back, to the stack", r.flow.pod, r.flow.podPort)
		if r.rewriteFails {
			e.because("the TCP checksum field is past the frame")
			e.allowDrop(IsthmusDropReasonDROP_SNAT_REWRITE)
			return
		}
		f := reverseForm("masquerade reversed", in[0:6], in[6:12], r, in[14:], false, false, 0)
		f.toStack = true
		e.forms = append(e.forms, f)
		return
	}
	if w.masquerade && w.replyUnknown(v, w.underlay) {
		e.pass = false
		e.because("TCP to the underlay address that no translation, socket or conntrack entry claims: DROP_NAT_REPLY_UNKNOWN")
		e.allowDrop(IsthmusDropReasonDROP_NAT_REPLY_UNKNOWN)
		return
	}
	// Fabric ingress: only for a local pod in this site's fabric prefixes, from a
	// source some route sends to a peer and the node does not route back out of the
	// underlay (the lab's FIB: 10/8 into isthmus0 but fabricRoutes, to the fabric
	// router), and from the neighbour this node reaches that peer through (the site
	// router); else the kernel's.
	src, dst := v.src(), v.dst()
	rt, routed := w.route(src)
	if dst == w.underlay || !inPrefixes(w.fabricPrefixes, dst) || !routed || len(rt.peers) == 0 {
		return
	}
	if !netip.MustParsePrefix("10.0.0.0/8").Contains(src) || inPrefixes(w.fabricRoutes, src) {
		e.because("fabric ingress %v -> %v: the node routes the source back out of the underlay: the kernel's", src, dst)
		return
	}
	if !bytes.Equal(in[6:12], w.gwMAC) {
		e.because("fabric ingress %v -> %v from %v, not the site router: the kernel's", src, dst, net.HardwareAddr(in[6:12]))
		return
	}
	if w.ownPods[dst] == nil || v.ip.TTL <= 1 {
		e.because("fabric ingress %v -> %v: not a local pod, or TTL %d (the stack answers)", src, dst, v.ip.TTL)
		return
	}
	e.pass = false
	if !w.directOK(e, v, src, dst, 0) {
		e.because("fabric ingress %v -> %v: through the stack", src, dst)
		e.forms = append(e.forms, w.toStack(deliverForm("fabric ingress through the stack", w.istMAC, in[6:12], in[14:], false, false, 0), true))
		return
	}
	e.because("fabric ingress %v -> %v: to the pod", src, dst)
	e.forms = append(e.forms, w.toPod(deliverForm("fabric ingress", w.ownPods[dst], w.podHMAC, in[14:], true, false, 0)))
}

// natReverse is a packet to a translated address that a flow in nat claims: a reply
// (its destination and port are the flow's), or an ICMP error quoting the flow's
// translated packet.
type natReverse struct {
	flow    oracleNat
	icmpErr bool
	// rewriteFails: the packet is a reply, but its TCP checksum field lies past the
	// frame, so the translation cannot be written.
	rewriteFails bool
}

// reverseNAT returns the flow of w.nat that IPv4 packet v, addressed to addr (the
// tunnel address or the underlay address), is a reply to or an ICMP error about, as
// architecture.md ("Return-path SNAT", step 5) describes them: not a fragment; a TCP
// or UDP reply by its ports, an ICMP echo reply by its identifier; an ICMP destination
// unreachable, time exceeded or parameter problem whose quote (IPv4, not a later
// fragment, its header and 8 bytes present) goes from addr on the flow's port
// (identifier) to the flow's remote end.
func (w *oracleWorld) reverseNAT(v *ipv4View, addr netip.Addr) (natReverse, bool) {
	var r natReverse
	if v.dst() != addr || v.fragment() {
		return r, false
	}
	l4, src, ok := v.l4(), v.src(), false
	port := func(b []byte, off int) uint16 { return binary.BigEndian.Uint16(b[off:]) }
	switch v.ip.Protocol {
	case layers.IPProtocolTCP:
		if len(l4) < 14 {
			return r, false
		}
		r.flow, ok = w.natReply(6, src, addr, port(l4, 0), port(l4, 2))
		r.rewriteFails = len(l4) < 18
	case layers.IPProtocolUDP:
		if len(l4) < 8 {
			return r, false
		}
		r.flow, ok = w.natReply(17, src, addr, port(l4, 0), port(l4, 2))
	case layers.IPProtocolICMPv4:
		if len(l4) < 8 {
			return r, false
		}
		switch l4[0] {
		case 0: // echo reply
			r.flow, ok = w.natReply(1, src, addr, 0, port(l4, 4))
		case 3, 11, 12:
			q := l4[8:]
			if len(q) < 20 || q[0]>>4 != 4 || q[0]&0x0f < 5 || port(q, 6)&0x1fff != 0 ||
				netip.AddrFrom4([4]byte(q[12:16])) != addr {
				return r, false
			}
			qhl := int(q[0]&0x0f) * 4
			if len(q) < qhl+8 {
				return r, false
			}
			qdst, ql4 := netip.AddrFrom4([4]byte(q[16:20])), q[qhl:]
			r.icmpErr = true
			switch q[9] {
			case 6, 17:
				r.flow, ok = w.natReply(q[9], qdst, addr, port(ql4, 2), port(ql4, 0))
			case 1:
				if ql4[0] == 8 { // a quoted echo request
					r.flow, ok = w.natReply(1, qdst, addr, 0, port(ql4, 4))
				}
			}
		}
	}
	return r, ok
}

// reverseForm accepts inIP (the packet arriving for the translated address, after the
// TTL, CE and MSS changes innerAfter makes) translated back to r's flow and delivered
// in a frame to dmac (and from smac, unless nil): a reply with the pod's address as
// destination and its port (identifier); an ICMP error with that destination and the
// quoted packet's source and port the pod's. Nothing else may change but checksums,
// and every checksum that verified as gopacket checks it (and the quoted header's)
// still does; a quoted TCP, UDP or echo checksum, which the truncated quote does not
// let anyone verify, is updated for the changed fields (RFC 1624), as Linux NAT does.
func reverseForm(name string, dmac, smac net.HardwareAddr, r natReverse, inIP []byte, forward, ce bool, mtu int) outputForm {
	return outputForm{name: name, check: func(out []byte) error {
		if err := outputEthernet(out, dmac, smac); err != nil {
			return err
		}
		got := out[14:]
		if len(got) != len(inIP) {
			return fmt.Errorf("translated packet %d bytes, want %d", len(got), len(inIP))
		}
		want := innerAfter(inIP, got, forward, ce, mtu)
		hlen := int(want[0]&0x0f) * 4
		to := r.flow.pod.As4()
		keep := func(off int) { copy(want[off:off+2], got[off:off+2]) } // a checksum, judged below
		setPort := func(off int) { binary.BigEndian.PutUint16(want[off:], r.flow.podPort) }
		copy(want[16:20], to[:])
		keep(10)
		quotedSum := -1
		switch {
		case !r.icmpErr && want[9] == 6:
			setPort(hlen + 2)
			keep(hlen + 16)
		case !r.icmpErr && want[9] == 17:
			setPort(hlen + 2)
			keep(hlen + 6)
		case !r.icmpErr:
			setPort(hlen + 4)
			keep(hlen + 2)
		default:
			q := hlen + 8
			qhl := int(want[q]&0x0f) * 4
			ql4 := q + qhl
			copy(want[q+12:q+16], to[:])
			keep(q + 10)
			keep(hlen + 2)
			switch want[q+9] {
			case 17:
				setPort(ql4)
				quotedSum = ql4 + 6
			case 6:
				setPort(ql4)
				if ql4+20 <= len(want) {
					quotedSum = ql4 + 16
				}
			case 1:
				setPort(ql4 + 4)
				quotedSum = ql4 + 2
			}
			if quotedSum >= 0 {
				keep(quotedSum)
			}
		}
		if err := diffAt("translated packet", got, want); err != nil {
			return err
		}
		return natSumsKept(inIP, got, r, quotedSum)
	}}
}

// natSumsKept checks the checksums of a packet translated from in to got (reverseForm):
// each that verified on input, as gopacket checks them, verifies on output. The
// datapath updates sums incrementally, which keeps each sum over the bytes present;
// gopacket sums up to the total length, so an L4 sum is judged only when the total
// length covers every byte that changed.
func natSumsKept(in, got []byte, r natReverse, quotedSum int) error {
	inHdr, inL4 := sumsVerified(in)
	outHdr, outL4 := sumsVerified(got)
	if inHdr && !outHdr {
		return errors.New("IPv4 header checksum verified before the translation, not after")
	}
	end := len(got)
	for end > 0 && got[end-1] == in[end-1] {
		end--
	}
	if inL4 && !outL4 && int(binary.BigEndian.Uint16(in[2:])) >= end {
		return errors.New("L4 checksum verified before the translation, not after")
	}
	if !r.icmpErr {
		return nil
	}
	hlen := int(in[0]&0x0f) * 4
	q := hlen + 8
	qhl := int(in[q]&0x0f) * 4
	if csum16(in[q:q+qhl]) == 0 && csum16(got[q:q+qhl]) != 0 {
		return errors.New("quoted IPv4 header checksum verified before the translation, not after")
	}
	if quotedSum < 0 {
		return nil
	}
	old, now := binary.BigEndian.Uint16(in[quotedSum:]), binary.BigEndian.Uint16(got[quotedSum:])
	ql4 := q + qhl
	var from, to []byte
	switch in[q+9] {
	case 1: // the echo's own checksum covers the identifier only
		from, to = in[ql4+4:ql4+6], got[ql4+4:ql4+6]
	default: // the pseudo-header's source address and the source port
		from = append(append([]byte{}, in[q+12:q+16]...), in[ql4:ql4+2]...)
		to = append(append([]byte{}, got[q+12:q+16]...), got[ql4:ql4+2]...)
	}
	switch {
	case in[q+9] == 17 && old == 0:
		if now != 0 {
			return fmt.Errorf("quoted UDP checksum %#04x, was none", now)
		}
	case in[q+9] == 17 && now == 0:
		return errors.New("quoted UDP checksum became none")
	default:
		if want := csumAdjust(old, from, to); sum0(want) != sum0(now) {
			return fmt.Errorf("quoted L4 checksum %#04x, want %#04x (RFC 1624 from %#04x)", now, want, old)
		}
	}
	return nil
}

// sumsVerified reports whether the IPv4 header checksum of ip and its TCP, UDP or ICMP
// one verify, as gopacket's VerifyChecksum says (the L4 one false where gopacket cannot
// decode that layer; the header one by RFC 1071 where it cannot decode the packet).
func sumsVerified(ip []byte) (hdr, l4 bool) {
	p := gopacket.NewPacket(ip, layers.LayerTypeIPv4, gopacket.DecodeOptions{NoCopy: true})
	v4, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if v4 == nil {
		return csum16(ip[:int(ip[0]&0x0f)*4]) == 0, false
	}
	_, res := v4.VerifyChecksum()
	hdr = res.Valid
	var err error
	switch l := p.Layer(layers.LayerTypeTCP).(type) {
	case *layers.TCP:
		if l.SetNetworkLayerForChecksum(v4) == nil {
			err, res = l.VerifyChecksum()
			return hdr, err == nil && res.Valid
		}
	}
	if l, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok && l.SetNetworkLayerForChecksum(v4) == nil {
		err, res = l.VerifyChecksum()
		return hdr, err == nil && res.Valid
	}
	if l, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
		err, res = l.VerifyChecksum()
		return hdr, err == nil && res.Valid
	}
	return hdr, false
}

// csumAdjust is checksum c after the 16-bit words old became new (RFC 1624, eqn. 3).
func csumAdjust(c uint16, old, new []byte) uint16 {
	s := uint32(^c)
	for i := 0; i+1 < len(old); i += 2 {
		s += uint32(^binary.BigEndian.Uint16(old[i:])) + uint32(binary.BigEndian.Uint16(new[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// sum0 maps the two one's complement zeros of a checksum field to one.
func sum0(c uint16) uint16 {
	if c == 0xffff {
		return 0
	}
	return c
}

// outputEthernet checks that gopacket decodes out as an IPv4 frame to dmac (and from
// smac, unless nil).
func outputEthernet(out []byte, dmac, smac net.HardwareAddr) error {
	return outputEthernetOf(out, dmac, smac, layers.EthernetTypeIPv4)
}

// outputEthernetOf is outputEthernet for a frame of type t.
func outputEthernetOf(out []byte, dmac, smac net.HardwareAddr, t layers.EthernetType) error {
	oe := &layers.Ethernet{}
	if err := oe.DecodeFromBytes(out, gopacket.NilDecodeFeedback); err != nil {
		return fmt.Errorf("output Ethernet: %w", err)
	}
	if !bytes.Equal(oe.DstMAC, dmac) || (smac != nil && !bytes.Equal(oe.SrcMAC, smac)) || oe.EthernetType != t {
		return fmt.Errorf("output Ethernet %v -> %v type %v, want -> %v (from %v) %v", oe.SrcMAC, oe.DstMAC, oe.EthernetType, dmac, smac, t)
	}
	return nil
}

// deliverForm accepts the inner packet inIP delivered in a frame to dmac (and from smac,
// unless nil), with the TTL decremented if forward, CE copied if ce, the MSS clamped.
func deliverForm(name string, dmac, smac net.HardwareAddr, inIP []byte, forward, ce bool, mtu int) outputForm {
	return outputForm{name: name, check: func(out []byte) error {
		if err := outputEthernet(out, dmac, smac); err != nil {
			return err
		}
		return diffAt("delivered inner IPv4", out[14:], innerAfter(inIP, out[14:], forward, ce, mtu))
	}}
}

// xdpPopForm accepts what underlay_xdp leaves of a frame it popped: its decap_meta
// (magic, the peer: an IPv4 address or an IPv6 peer's handle), then the outer
// Ethernet header with the inner frame's EtherType (architecture.md: XDP writes IPv6
// into the header it keeps for an inner IPv6 packet, IPv4 after an outer IPv6
// header), then the inner IP packet at ipOff (unchanged, or with CE if ce).
func xdpPopForm(w *oracleWorld, in []byte, peer netip.Addr, ipOff int, ce bool) outputForm {
	name := "XDP pop"
	if ce {
		name += " with CE copied"
	}
	return outputForm{name: name, check: func(out []byte) error {
		n := binary.Size(IsthmusDecapMeta{})
		if len(out) < n+14 {
			return fmt.Errorf("output %d bytes", len(out))
		}
		var m IsthmusDecapMeta
		if _, err := binary.Decode(out[:n], binary.NativeEndian, &m); err != nil {
			return fmt.Errorf("decode decap_meta: %w", err)
		}
		if m.Magic != 0x69737468 || m.Peer != be32(peer) {
			return fmt.Errorf("decap_meta magic %#x peer %#x, want %#x %#x", m.Magic, m.Peer, 0x69737468, be32(peer))
		}
		eth := append(append([]byte{}, in[:12]...), in[ipOff-2:ipOff]...)
		if err := diffAt("outer Ethernet", out[n:n+14], eth); err != nil {
			return err
		}
		want := append([]byte{}, in[ipOff:]...)
		if ce && in[ipOff]>>4 == 6 {
			want = innerAfter6(want, out[n+14:], false, true, 0)
		} else if ce {
			want = innerAfter(want, out[n+14:], false, true, 0)
		}
		return diffAt("popped inner packet", out[n+14:], want)
	}}
}

// transitForm accepts frame in forwarded whole toward one of next: the outer IPv4 from
// this node to the next hop with TTL 64 (options, TOS, ID, flags kept), UDP, GENEVE and
// the inner frame unchanged but for the inner TTL, checksums verifying where they did.
func transitForm(w *oracleWorld, in []byte, outer *ipv4View, ipOff int, next []netip.Addr) outputForm {
	return transitFormOf(w, in, outer, ipOff, next, false)
}

// transitFormOf is transitForm for an inner IPv4 packet, or with inner6 an IPv6 one,
// whose hop limit is decremented (nothing else in it changes).
func transitFormOf(w *oracleWorld, in []byte, outer *ipv4View, ipOff int, next []netip.Addr, inner6 bool) outputForm {
	return outputForm{name: "transit", check: func(out []byte) error {
		if len(out) != len(in) {
			return fmt.Errorf("transit output %d bytes, input %d", len(out), len(in))
		}
		o, err := decodeIPv4(out, 14)
		if err != nil {
			return fmt.Errorf("output outer IPv4: %w", err)
		}
		if !slices.Contains(next, o.dst()) {
			return fmt.Errorf("forwarded to %v, want one of %v", o.dst(), next)
		}
		want := append([]byte{}, in...)
		copy(want[0:6], w.gwMAC)
		copy(want[6:12], w.undMAC)
		ip := want[14:]
		s, d := w.underlay.As4(), o.dst().As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		ip[8] = 64
		if outer.hdrOK {
			ip[10], ip[11] = 0, 0
			binary.BigEndian.PutUint16(ip[10:], csum16(ip[:outer.hlen]))
		} else {
			copy(ip[10:12], out[24:26])
		}
		udpOff := 14 + outer.hlen
		if c := binary.BigEndian.Uint16(in[udpOff+6:]); c != 0 {
			// A filled-in outer UDP checksum must still verify if it did.
			copy(want[udpOff+6:udpOff+8], out[udpOff+6:udpOff+8])
			if l4SumOK(in[14:]) && !l4SumOK(out[14:]) {
				return errors.New("outer UDP checksum verified on input, not on output")
			}
		}
		if inner6 {
			want[ipOff+7]--
		} else {
			copy(want[ipOff:], innerAfter(in[ipOff:], out[ipOff:], true, false, 0))
		}
		return diffAt("transit frame", out, want)
	}}
}

// modelEncap is the model of pod_ingress (fromPod) and overlay_egress for frame in
// (an IPv6 one: modelEncap6).
func modelEncap(w *oracleWorld, in []byte, fromPod bool) expectation {
	var e expectation
	if isIPv6Frame(in) {
		return modelEncap6(w, in, fromPod)
	}
	if !untaggedIPv4(in) {
		e.pass = true
		e.because("not an untagged IPv4 frame: the stack's")
		return e
	}
	v, err := decodeIPv4(in, 14)
	if err != nil {
		e.pass = true
		e.because("IPv4 malformed (%v): the stack's", err)
		return e
	}
	src, dst := v.src(), v.dst()
	e.because("%v -> %v proto %v ttl %d len %d", src, dst, v.ip.Protocol, v.ip.TTL, len(in)-14)
	if fromPod {
		// DESIGN.md: a pod sends only from its own addresses.
		if w.ownPods[src] == nil {
			e.allowDrop(IsthmusDropReasonDROP_POD_SRC_SPOOFED)
			e.because("source %v is not the pod's own address: DROP_POD_SRC_SPOOFED", src)
			return e
		}
		// No GENEVE from pods to a peer's underlay address. The port is what counts:
		// a datagram cut short after it, or whose lengths say it is shorter, is no
		// less GENEVE.
		// Any entry of peers counts, a handle too (architecture.md, encapsulation
		// step 1: "an address in peers"): no pod sends to 0.0.0.0/8 in earnest.
		if l4 := v.l4(); v.ip.Protocol == layers.IPProtocolUDP && v.ip.FragOffset == 0 && (w.isPeer(dst) || w.isHandle(dst)) && len(l4) >= 4 {
			if binary.BigEndian.Uint16(l4[2:]) == 6081 {
				e.allowDrop(IsthmusDropReasonDROP_POD_GENEVE)
				e.because("GENEVE from a pod to peer %v's underlay address: DROP_POD_GENEVE", dst)
				return e
			}
		}
	}
	rt, ok := w.route(dst)
	if ok && fromPod && rt.notForPods {
		e.because("route %v serves forwarded packets only: a pod's packet has no route", rt.prefix)
		ok = false
	}
	if !ok {
		if !fromPod {
			e.allowDrop(IsthmusDropReasonDROP_NO_OVERLAY_ROUTE)
			e.because("no route on isthmus0")
			return e
		}
		// Same-node delivery passes the stack, marked (both halves of the flow
		// pass there); anything else is the stack's, unmarked.
		e.pass = true
		e.mark = w.ownPods[dst] != nil
		e.because("no route: to the stack (a local pod: marked %v)", e.mark)
		return e
	}
	e.because("route %v via %v", rt.prefix, rt.peers)
	translated := src != w.tunnelIP && src != w.underlay && !w.snatExempted(src)
	if !fromPod && translated && len(in)-14 <= w.tunnelMTU {
		// On isthmus0 the host stack's packet is translated before the next hop is
		// chosen; no ICMP error is sent from here, so only the drop's name tells.
		e.because("source %v is translated to %v", src, w.tunnelIP)
		if w.snatRefuses(&e, v, w.tunnelIP) {
			return e
		}
	}
	// What the tunnel refuses comes first, and a pod's packet keeps its source (its
	// ICMP error quotes what it sent, architecture.md, encapsulation step 2): no live
	// member, then (a pod's packet, this hop forwards it) TTL, then the size.
	if len(rt.peers) == 0 {
		e.because("no live member")
		if fromPod && noPathAnswer(v) {
			e.formDrop = IsthmusDropReasonDROP_NO_NEXTHOP
			e.forms = append(e.forms, icmpErrorForm("ICMP net unreachable", 3, 0, src))
			e.because("ICMP net unreachable to the pod, DROP_NO_NEXTHOP counted")
		} else {
			e.allowDrop(IsthmusDropReasonDROP_NO_NEXTHOP)
		}
		return e
	}
	if fromPod && v.ip.TTL <= 1 {
		if v.errorAllowed() {
			e.because("TTL %d: ICMP time exceeded to the pod", v.ip.TTL)
			e.forms = append(e.forms, icmpErrorForm("ICMP time exceeded", 11, 0, src))
		} else {
			e.allowDrop(IsthmusDropReasonDROP_TTL_EXCEEDED)
		}
		return e
	}
	if len(in)-14 > w.tunnelMTU {
		e.because("longer than the tunnel MTU %d", w.tunnelMTU)
		if fromPod && v.ip.Flags&layers.IPv4DontFragment == 0 {
			// The stack fragments it on its way into isthmus0 (ip_forward).
			e.because("no DF: through the stack, marked, to be fragmented")
			e.pass, e.mark = true, true
			return e
		}
		if fromPod && v.ip.Flags&layers.IPv4DontFragment != 0 && v.errorAllowed() {
			e.forms = append(e.forms, icmpErrorForm("ICMP frag needed", 3, 4, src))
		} else {
			e.allowDrop(IsthmusDropReasonDROP_FRAG_NEEDED)
		}
		return e
	}
	if fromPod && !w.directOK(&e, v, src, dst, 0) {
		// The fail-closed rule: a pod's packet the tunnel takes goes on through the
		// stack, marked, so the site's egress filters judge it; the stack routes it
		// to overlay_egress.
		e.pass, e.mark = true, true
		return e
	}
	// Return-path SNAT (docs/architecture.md): every source that is neither the
	// host's own (tunnel or underlay address) nor exempt leaves as the tunnel address
	// (a pod's packet here is of a direct flow).
	if !translated {
		e.forms = append(e.forms, encapForm(w, in, rt.peers, fromPod))
		return e
	}
	if fromPod {
		e.because("source %v is translated to %v", src, w.tunnelIP)
	}
	if fromPod && w.snatRefuses(&e, v, w.tunnelIP) { // on isthmus0 judged above
		return e
	}
	e.forms = append(e.forms, encapFormSNAT(w, in, rt.peers, fromPod, w.tunnelIP))
	return e
}

// snatFault returns the drop of a packet that source translation (return-path SNAT,
// egress masquerade) cannot translate: a fragment or a protocol other than TCP, UDP
// and ICMP echo request DROP_SNAT_UNSUPPORTED, ports (identifier) cut off
// DROP_INVALID_PACKET, a TCP checksum field past the frame DROP_SNAT_REWRITE.
func snatFault(v *ipv4View) (IsthmusDropReason, bool) {
	l4 := v.l4()
	switch {
	case v.fragment():
		return IsthmusDropReasonDROP_SNAT_UNSUPPORTED, true
	case v.ip.Protocol == layers.IPProtocolTCP && len(l4) < 14,
		(v.ip.Protocol == layers.IPProtocolUDP || v.ip.Protocol == layers.IPProtocolICMPv4) && len(l4) < 8:
		return IsthmusDropReasonDROP_INVALID_PACKET, true
	case v.ip.Protocol == layers.IPProtocolTCP && len(l4) < 18:
		return IsthmusDropReasonDROP_SNAT_REWRITE, true
	case v.ip.Protocol == layers.IPProtocolTCP, v.ip.Protocol == layers.IPProtocolUDP,
		v.ip.Protocol == layers.IPProtocolICMPv4 && l4[0] == 8:
		return 0, false
	}
	return IsthmusDropReasonDROP_SNAT_UNSUPPORTED, true
}

// modelMasq is the model of underlay_egress for frame in leaving the underlay device
// (architecture.md, "Egress masquerade"): with masquerade on, a source in snat_exempt
// that is not the underlay address, to a destination outside masq_exempt, leaves from
// the underlay address on the flow's own port (ICMP echo: identifier) or one of the
// range, checksums verifying where they did, returned to the stack (TC_ACT_OK); what
// the translation cannot carry is a named drop; everything else passes untouched.
func modelMasq(w *oracleWorld, in []byte) expectation {
	var e expectation
	e.pass = true
	if !untaggedIPv4(in) {
		e.because("not an untagged IPv4 frame")
		return e
	}
	v, err := decodeIPv4(in, 14)
	if err != nil {
		e.because("IPv4 malformed (%v): not translated", err)
		return e
	}
	src, dst := v.src(), v.dst()
	e.because("%v -> %v proto %v len %d", src, dst, v.ip.Protocol, len(in)-14)
	if !w.masquerade || src == w.underlay || !w.snatExempted(src) || inPrefixes(w.masqExempt, dst) {
		e.because("not masqueraded (source not exempt, the underlay's own, or destination in masq_exempt)")
		return e
	}
	e.pass = false
	if w.snatRefuses(&e, v, w.underlay) {
		return e
	}
	e.because("masqueraded to %v", w.underlay)
	e.forms = append(e.forms, outputForm{name: "masquerade", toStack: true, check: func(out []byte) error {
		if len(out) != len(in) {
			return fmt.Errorf("output %d bytes, input %d", len(out), len(in))
		}
		if err := diffAt("Ethernet header", out[:14], in[:14]); err != nil {
			return err
		}
		want, err := snatAfter(w, in[14:], out[14:], w.underlay)
		if err != nil {
			return err
		}
		return diffAt("masqueraded packet", out[14:], want)
	}})
	return e
}

// noPathAnswer says whether a pod's packet v to a route without a live member is
// answered with ICMP net unreachable: where the kernel's icmp_send would answer it
// (errorAllowed: not an ICMP error, not a fragment after the first), and with the
// header and the 8 bytes after it present to quote (RFC 792).
func noPathAnswer(v *ipv4View) bool {
	return v.errorAllowed()
}

// snatAfter is inIP (an IPv4 packet as received) translated to source to: the port
// (ICMP echo: identifier) the datapath chose, taken from got after checking it is the
// flow's own or one of w's range, with every checksum that verified still verifying.
func snatAfter(w *oracleWorld, inIP, got []byte, to netip.Addr) ([]byte, error) {
	want := append([]byte{}, inIP...)
	hlen := int(want[0]&0x0f) * 4
	if len(got) != len(want) {
		return nil, fmt.Errorf("translated packet %d bytes, want %d", len(got), len(want))
	}
	a := to.As4()
	copy(want[12:16], a[:])
	proto := want[9]
	portOff, sumOff := hlen, hlen+16
	switch proto {
	case 17:
		sumOff = hlen + 6
	case 1:
		portOff, sumOff = hlen+4, hlen+2
	}
	if len(want) < sumOff+2 {
		return nil, fmt.Errorf("no room for the %d-byte L4 checksum field at %d", len(want), sumOff)
	}
	port := binary.BigEndian.Uint16(got[portOff:])
	if err := w.snatPort(inIP, to, port); err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint16(want[portOff:], port)
	if csum16(inIP[:hlen]) == 0 {
		want[10], want[11] = 0, 0
		binary.BigEndian.PutUint16(want[10:], csum16(want[:hlen]))
	} else {
		copy(want[10:12], got[10:12])
	}
	tl := int(binary.BigEndian.Uint16(inIP[2:]))
	switch {
	case proto == 17 && binary.BigEndian.Uint16(inIP[sumOff:]) == 0:
		// No UDP checksum stays none.
	case proto == 1 && tl >= hlen+8 && tl <= len(inIP) && csum16(inIP[hlen:tl]) == 0:
		want[sumOff], want[sumOff+1] = 0, 0
		binary.BigEndian.PutUint16(want[sumOff:], csum16(want[hlen:tl]))
	case proto != 1 && l4SumOK(inIP):
		want[sumOff], want[sumOff+1] = 0, 0
		seg := want[hlen:tl]
		pseudo := append(append([]byte{}, want[12:20]...), 0, proto, byte(len(seg)>>8), byte(len(seg)))
		c := csum16(append(pseudo, seg...))
		if proto == 17 && c == 0 {
			c = 0xffff // RFC 768: a computed zero is sent as all ones; zero means none
		}
		binary.BigEndian.PutUint16(want[sumOff:], c)
	default:
		// A sum that did not verify: the datapath cannot be expected to fix it.
		copy(want[sumOff:sumOff+2], got[sumOff:sumOff+2])
	}
	return want, nil
}

// snatPort returns why port is not the one the translation of IPv4 packet inIP to to
// may use (architecture.md, "Return-path SNAT" step 3): a live flow of its tuple keeps
// its port; a new flow takes its own port if that port is free, else one of
// [snatPortMin, snatPortMax] that is free (which one the flow hash picks is not
// modelled). Free: no live flow of the table replies on that tuple (remote, to,
// remote port, port) and, for TCP and UDP, conntrack holds no entry with it in either
// direction (the lab holds no socket).
func (w *oracleWorld) snatPort(inIP []byte, to netip.Addr, port uint16) error {
	v, err := decodeIPv4(inIP, 0)
	if err != nil {
		return err
	}
	proto, sport, dport := snatKey(v)
	if f, ok := w.natFlow(proto, v.src(), v.dst(), to, sport, dport); ok && !f.expired {
		if port != f.port {
			return fmt.Errorf("translated port %d: the live flow's is %d", port, f.port)
		}
		return nil
	}
	free := func(p uint16) bool { return w.portFree(proto, v.dst(), to, dport, p) }
	switch {
	case free(sport) && port != sport:
		return fmt.Errorf("translated port %d: the flow's own %d is free", port, sport)
	case port == sport && !free(sport):
		return fmt.Errorf("translated port %d: the flow's own, but another flow or conntrack holds its reply tuple", port)
	case port != sport && (port < w.snatPortMin || port > w.snatPortMax):
		return fmt.Errorf("translated port %d: neither the flow's %d nor in %d-%d", port, sport, w.snatPortMin, w.snatPortMax)
	case port != sport && !free(port):
		return fmt.Errorf("translated port %d: another flow or conntrack holds its reply tuple", port)
	}
	return nil
}

// encapForm accepts frame in encapsulated toward one of peers. Over the IPv4 underlay
// (an IPv4 peer): outer Ethernet to the underlay gateway, IPv4 (ihl 5, this node to the
// peer, TOS of the inner packet, DF, TTL 64, a checksum that verifies, the right
// length), UDP (a source port in 49152-65535, port 6081, the right length, checksum
// zero or verifying). Over the IPv6 underlay (a handle, architecture.md "IPv6
// underlay"): outer Ethernet to the IPv6 router, IPv6 (config.underlay_ip6 to the
// handle's address, the inner DSCP and ECN as traffic class, hop limit 64, next header
// UDP, the right payload length; the flow label is the flow's hash, which the model
// does not compute), UDP as over IPv4 with checksum zero (RFC 6935). Then GENEVE
// (version 0, no options, O and C clear, protocol 0x6558, our VNI) and the input frame,
// with its TTL or hop limit decremented if forward and its MSS clamped.
func encapForm(w *oracleWorld, in []byte, peers []netip.Addr, forward bool) outputForm {
	return encapFormSNAT(w, in, peers, forward, netip.Addr{})
}

// innerTClass is the TOS of the IPv4 packet or the traffic class of the IPv6 packet
// frame in carries.
func innerTClass(in []byte) byte {
	if binary.BigEndian.Uint16(in[12:]) == 0x86dd {
		return in[14]<<4 | in[15]>>4
	}
	return in[15]
}

// encapFormSNAT is encapForm with the inner packet's source translated to snat (if
// valid) as snatAfter allows.
func encapFormSNAT(w *oracleWorld, in []byte, peers []netip.Addr, forward bool, snat netip.Addr) outputForm {
	name := "encapsulation"
	if snat.IsValid() {
		name += " with SNAT to " + snat.String()
	}
	return outputForm{name: name, check: func(out []byte) error {
		var problems []string
		bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
		oe := &layers.Ethernet{}
		if err := oe.DecodeFromBytes(out, gopacket.NilDecodeFeedback); err != nil {
			return fmt.Errorf("outer Ethernet: %w", err)
		}
		ohl, gw := 20, w.gwMAC
		switch oe.EthernetType {
		case layers.EthernetTypeIPv4:
			o, err := decodeIPv4(out, 14)
			if err != nil {
				return fmt.Errorf("outer IPv4: %w", err)
			}
			to := o.dst()
			if o.hlen != 20 || o.src() != w.underlay || !slices.Contains(peers, to) || w.isHandle(to) || o.ip.TTL != 64 ||
				o.ip.Flags != layers.IPv4DontFragment || o.ip.FragOffset != 0 || o.ip.Protocol != layers.IPProtocolUDP ||
				!o.hdrOK || int(binary.BigEndian.Uint16(out[16:])) != len(out)-14 || o.ip.TOS != innerTClass(in) {
				bad("outer IPv4 %v -> %v (want one of %v) ihl %d ttl %d flags %v tos %#x len %d sum ok %v",
					o.src(), to, peers, o.hlen/4, o.ip.TTL, o.ip.Flags, o.ip.TOS, binary.BigEndian.Uint16(out[16:]), o.hdrOK)
			}
		case layers.EthernetTypeIPv6:
			ohl, gw = 40, w.gw6MAC
			if len(out) < 14+40 {
				return fmt.Errorf("outer IPv6 header cut at %d bytes", len(out)-14)
			}
			o := &layers.IPv6{}
			if err := o.DecodeFromBytes(out[14:], gopacket.NilDecodeFeedback); err != nil {
				return fmt.Errorf("outer IPv6: %w", err)
			}
			to, _ := netip.AddrFromSlice(o.DstIP)
			from, _ := netip.AddrFromSlice(o.SrcIP)
			h, ok := w.handleOf(to)
			if o.Version != 6 || from != w.underlay6 || !ok || !slices.Contains(peers, h) || o.HopLimit != 64 ||
				o.NextHeader != layers.IPProtocolUDP || int(o.Length) != len(out)-14-40 || o.TrafficClass != innerTClass(in) {
				bad("outer IPv6 %v -> %v (want %v's address; one of %v) hop limit %d next %v tclass %#x len %d",
					from, to, h, peers, o.HopLimit, o.NextHeader, o.TrafficClass, o.Length)
			}
		default:
			return fmt.Errorf("outer Ethernet type %v, not IP", oe.EthernetType)
		}
		if !bytes.Equal(oe.DstMAC, gw) || !bytes.Equal(oe.SrcMAC, w.undMAC) {
			bad("outer Ethernet %v -> %v, want %v -> %v", oe.SrcMAC, oe.DstMAC, w.undMAC, gw)
		}
		uOff := 14 + ohl
		u, err := udpPorts(out[uOff:])
		if err != nil {
			return fmt.Errorf("outer UDP: %w", err)
		}
		if u.DstPort != 6081 || u.SrcPort < 49152 || int(u.Length) != len(out)-uOff ||
			(u.Checksum != 0 && (ohl == 40 || !l4SumOK(out[14:]))) {
			bad("outer UDP %d -> %d len %d checksum %#x", u.SrcPort, u.DstPort, u.Length, u.Checksum)
		}
		g, optlen, err := geneveFixed(out[uOff+8:])
		if err != nil {
			return fmt.Errorf("GENEVE: %w", err)
		}
		if g.Version != 0 || optlen != 0 || g.OAMPacket || g.CriticalOption ||
			g.Protocol != layers.EthernetTypeTransparentEthernetBridging || g.VNI != w.vni {
			bad("GENEVE version %d options %d O %v C %v protocol %v VNI %#x", g.Version, optlen, g.OAMPacket, g.CriticalOption, g.Protocol, g.VNI)
		}
		ie := uOff + 16
		if len(out) < ie+14 {
			return fmt.Errorf("output %d bytes: no inner frame", len(out))
		}
		if err := diffAt("inner Ethernet", out[ie:ie+14], in[:14]); err != nil {
			bad("%v", err)
		}
		got := out[ie+14:]
		if binary.BigEndian.Uint16(in[12:]) == 0x86dd {
			if err := diffAt("inner IPv6", got, innerAfter6(in[14:], got, forward, false, w.tunnelMTU)); err != nil {
				bad("%v", err)
			}
		} else {
			inIP := in[14:]
			// Whether each sum verified is the input's: the translated packet
			// carries the datapath's sums where the input's did not verify.
			hdrOK, l4OK := len(inIP) >= 20 && csum16(inIP[:int(inIP[0]&0x0f)*4]) == 0, l4SumOK(inIP)
			if snat.IsValid() {
				var err error
				if inIP, err = snatAfter(w, inIP, got, snat); err != nil {
					return err
				}
			}
			if err := diffAt("inner IPv4", got, innerAfterSums(inIP, got, forward, false, w.tunnelMTU, hdrOK, l4OK)); err != nil {
				bad("%v", err)
			}
		}
		if len(problems) > 0 {
			return errors.New(strings.Join(problems, "\n"))
		}
		return nil
	}}
}

// TestOracleModel checks the model itself, without the kernel: it must accept outputs
// built by hand the way docs/architecture.md describes them, and refuse the outputs of
// known defects. An oracle that accepts everything finds nothing.
func TestOracleModel(t *testing.T) {
	fl := &lab{undMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 1}, podHMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 2}, istMAC: net.HardwareAddr{2, 0, 0, 0, 0xee, 3}}
	w := newOracleWorld(fl.undMAC, fl.podHMAC, fl.istMAC)
	accepts := func(e expectation, out []byte) error {
		var errs []string
		for _, f := range e.forms {
			if err := f.check(out); err == nil {
				return nil
			} else {
				errs = append(errs, f.name+": "+err.Error())
			}
		}
		return fmt.Errorf("no form accepts it (%d forms): %s", len(e.forms), strings.Join(errs, "; "))
	}

	if !slices.ContainsFunc(slices.Collect(maps.Keys(w.ownPods)), func(a netip.Addr) bool { return !w.snatExempted(a) }) {
		t.Errorf("every own pod is SNAT-exempt: return-path SNAT of own pods is never exercised")
	}
	if r, _ := w.route(netip.MustParseAddr("10.2.0.70")); r.prefix != memberRoute {
		t.Errorf("LPM for 10.2.0.70 picked %v, want %v", r.prefix, memberRoute)
	}
	if r, _ := w.route(netip.MustParseAddr("10.2.0.9")); r.prefix != remoteNet {
		t.Errorf("LPM for 10.2.0.9 picked %v, want %v", r.prefix, remoteNet)
	}
	if w.mayUse(memberIP, remotePodIP) || !w.mayUse(memberIP, netip.MustParseAddr("10.2.0.130")) || !w.mayUse(peerIP, netip.MustParseAddr("10.2.0.130")) {
		t.Errorf("peer sources are not per peer")
	}

	// The fail-closed rule, each condition on its own: only the first packet goes
	// around the stack.
	seg := func(src, dst netip.Addr, sport, dport uint16, flags byte, frag uint16, cut int) []byte {
		b := ipv4Packet(src, dst, 6, ipOpts{ttl: 63, fragOff: frag}, tcpWith(src, dst, sport, dport, flags, nil))
		if cut > 0 {
			b = b[:cut]
		}
		return b
	}
	for _, tc := range []struct {
		name string
		ip   []byte
		want bool
	}{
		{"an ACK of an assured, untranslated flow", seg(remotePodIP, podIP, 80, 33002, 0x10, 0, 0), true},
		{"the same from the other end (reply tuple)", seg(podIP, remotePodIP, 33002, 80, 0x10, 0, 0), true},
		{"a RST of it", seg(remotePodIP, podIP, 80, 33002, 0x04, 0, 0), true},
		{"a first fragment of it", seg(remotePodIP, podIP, 80, 33002, 0x10, 0x2000, 0), false},
		{"a SYN-ACK on its tuple", seg(remotePodIP, podIP, 80, 33002, 0x12, 0, 0), false},
		{"its TCP header cut at 19 bytes", seg(remotePodIP, podIP, 80, 33002, 0x10, 0, 20+19), false},
		{"no entry", seg(remotePodIP, podIP, 80, 33003, 0x10, 0, 0), false},
		{"an unassured entry", seg(remotePodIP, podIP, 80, 33000, 0x10, 0, 0), false},
		{"IPVS's reply (translated, no NAT bit)", seg(remotePodIP, podIP, 8080, 40005, 0x10, 0, 0), false},
		{"the pod's packet to the Service address", seg(podIP, ipvsVIP, 40005, 80, 0x10, 0, 0), false},
		{"a UDP datagram of a UDP entry", ipv4Packet(podIP, netip.MustParseAddr("10.2.0.70"), 17, ipOpts{ttl: 63}, udpDatagram(4002, 5000, nil)), false},
		{"ICMP", ipv4Packet(remotePodIP, podIP, 1, ipOpts{ttl: 63}, icmpEcho(0, 9, 1, nil)), false},
	} {
		v, err := decodeIPv4(tc.ip, 0)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, why := w.direct(v, v.src(), v.dst(), 0); got != tc.want {
			t.Errorf("%s: direct %v, want %v (%s)", tc.name, got, tc.want, why)
		}
	}

	// Decapsulation to the pod of a datagram (it opens a flow): through the stack, the
	// inner packet as sent, to isthmus0's MAC from the outer source MAC.
	inner := ipkt{src: remotePodIP, dst: podIP}.build()
	in := uframe{inner: inner, gnvOptLen: 8}.build(fl)
	e := modelUnderlay(w, in, false)
	if err := accepts(e, append(append(append([]byte{}, fl.istMAC...), in[6:12]...), append([]byte{8, 0}, inner...)...)); err != nil {
		t.Errorf("decap to pod through the stack: %v", err)
	}
	if e.pass || e.drop {
		t.Errorf("decap to pod: model allows pass %v drop %v", e.pass, e.drop)
	}
	// A SYN-ACK always passes the stack, even of a flow conntrack holds as direct.
	inner = ipkt{src: remotePodIP, dst: podIP, proto: 6, flags: 0x12, sport: 80, dport: 33002}.build()
	in = uframe{inner: inner, gnvOptLen: 8}.build(fl)
	if e := modelUnderlay(w, in, false); len(e.forms) != 1 || !e.forms[0].mark || e.forms[0].target != w.istIfindex {
		t.Errorf("SYN-ACK of a direct flow: %s", e.why)
	}
	// An ACK of that flow goes around the stack: straight to the pod, TTL 63, between
	// the pod's MACs.
	inner = ipkt{src: remotePodIP, dst: podIP, proto: 6, flags: 0x10, sport: 80, dport: 33002}.build()
	in = uframe{inner: inner, gnvOptLen: 8}.build(fl)
	e = modelUnderlay(w, in, false)
	dec := append([]byte{}, inner...)
	dec[8]--
	dec[10], dec[11] = 0, 0
	binary.BigEndian.PutUint16(dec[10:], csum16(dec[:20]))
	good := ethFrame(podMAC, fl.podHMAC, 0x0800, dec)
	if err := accepts(e, good); err != nil {
		t.Errorf("decap to pod: %v", err)
	}
	if accepts(e, append(append(append([]byte{}, fl.istMAC...), in[6:12]...), append([]byte{8, 0}, inner...)...)) == nil {
		t.Errorf("decap of a direct flow's ACK to pod: the model accepts delivery through the stack")
	}
	// Outer CE on a Not-ECT inner packet: DROP_ECN_NOT_ECT only, in TC and XDP.
	for _, xdp := range []bool{false, true} {
		e = modelUnderlay(w, uframe{outerTOS: 0x03}.build(fl), xdp)
		if !e.allows(IsthmusDropReasonDROP_ECN_NOT_ECT) || e.allows(IsthmusDropReasonDROP_NOT_LOCAL) || len(e.forms) > 0 {
			t.Errorf("CE on Not-ECT (xdp %v): %+v", xdp, e)
		}
	}
	// The pop of issue 10: 20 bytes of outer header assumed, 40 bytes of options present.
	in = forgedFrame(fl)
	e = modelUnderlay(w, in, false)
	bad := append(append([]byte{}, podMAC...), fl.podHMAC...)
	bad = append(append(bad, 8, 0), in[14+50+32:]...)
	if accepts(e, bad) == nil {
		t.Errorf("forged frame: the model accepts the early pop")
	}
	// XDP: meta, outer Ethernet, inner packet as received.
	in = uframe{inner: inner}.build(fl)
	meta := binary.NativeEndian.AppendUint32(nil, 0x69737468)
	meta = binary.NativeEndian.AppendUint32(meta, be32(peerIP))
	if err := accepts(modelUnderlay(w, in, true), append(append(meta, in[:14]...), inner...)); err != nil {
		t.Errorf("XDP pop: %v", err)
	}
	// Reasons: every fault of the frame, and only those.
	// Reasons: the first fault in architecture.md's order, and only it.
	e = modelUnderlay(w, uframe{outerSrc: strangerIP, gnv: geneveOpts{vni: 7}}.build(fl), false)
	if !e.allows(IsthmusDropReasonDROP_GENEVE_VNI) || e.outcomes() != 1 {
		t.Errorf("unknown peer, wrong VNI: %+v", e)
	}
	e = modelUnderlay(w, uframe{oam: true}.build(fl), false)
	if !e.allows(IsthmusDropReasonDROP_GENEVE_OAM) || e.outcomes() != 1 {
		t.Errorf("O bit: %+v", e)
	}
	e = modelUnderlay(w, uframe{dport: 4789}.build(fl), false)
	if !e.pass || e.drop || len(e.forms) > 0 {
		t.Errorf("VXLAN port: %+v", e)
	}

	// Encapsulation: TestEncapByteExact's frame on a flow conntrack holds as direct,
	// and the same with a wrong VNI.
	pf := podFrame(fl, remotePodIP, 40004)
	ip := podPacket(remotePodIP, 40004, 63)
	gnv := geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, append(append([]byte{}, pf[:14]...), ip...))
	enc := ethFrame(gwMAC, fl.undMAC, 0x0800, ipv4Packet(underlayIP, peerIP, 17, ipOpts{tos: 0x10, ttl: 64, fragOff: 0x4000},
		udpDatagram(flowSport(pf[14:]), 6081, gnv)))
	e = modelEncap(w, pf, true)
	if err := accepts(e, enc); err != nil {
		t.Errorf("encap: %v", err)
	}
	enc[14+20+8+6] ^= 1
	if accepts(e, enc) == nil {
		t.Errorf("encap: accepted a wrong VNI")
	}
	// A pod's UDP datagram opens a flow: the stack takes it (issue 11).
	udpFrame := ethFrame(fl.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64}, udpDatagram(1234, 80, nil)))
	if e := modelEncap(w, udpFrame, true); !e.pass || e.drop || len(e.forms) > 0 {
		t.Errorf("a pod's UDP datagram: %+v, want passed to the stack", e)
	}
	// The MSS clamp of a SYN whose MSS sits at an odd offset keeps a valid checksum.
	syn := ipkt{src: podIP, dst: remotePodIP, proto: 6, mssOpts: []byte{1, 2, 4, 0x05, 0xb4, 1, 1, 0}}.build()
	clamped, ok := mssClamp(syn, 1450)
	if !ok || binary.BigEndian.Uint16(clamped[20+20+3:]) != 1410 {
		t.Errorf("MSS clamp at offset 1: %x", clamped)
	}
	if want := innerAfter(syn, nil, false, false, 1450); !l4SumOK(want) || !l4SumOK(syn) {
		t.Errorf("clamped SYN checksum does not verify")
	}
	// No live member: a datagram is answered with net unreachable (DROP_NO_NEXTHOP
	// counted), an ICMP error is not.
	e = modelEncap(w, podFrame(fl, netip.MustParseAddr("10.6.0.1"), 1234), true)
	if e.drop || e.formDrop != IsthmusDropReasonDROP_NO_NEXTHOP || len(e.forms) != 1 {
		t.Errorf("no live member: %+v", e)
	}
	unreach := ethFrame(fl.podHMAC, podMAC, 0x0800, icmpUnreachable(ipv4Packet(netip.MustParseAddr("10.6.0.1"), podIP, 17, ipOpts{ttl: 64}, udpDatagram(53, 4321, nil)), 3, 0))
	if e := modelEncap(w, unreach, true); !e.allows(IsthmusDropReasonDROP_NO_NEXTHOP) || len(e.forms) > 0 {
		t.Errorf("no live member, ICMP error: %+v", e)
	}
	// Return-path SNAT on isthmus0: another CNI's pod leaves as the tunnel address,
	// on its own port while that is free, else on one of the range whose reply tuple
	// is free, never another; a pod at its share of nat gets no new flow.
	snatCase := func(src netip.Addr, sport, dport uint16) ([]byte, expectation) {
		of := ethFrame(fl.podHMAC, podMAC, 0x0800, ipv4Packet(src, remotePodIP, 17, ipOpts{ttl: 64}, withCsum(src, remotePodIP, 17, udpDatagram(sport, dport, []byte("hello")))))
		return of, modelEncap(w, of, false)
	}
	snatOut := func(of []byte, port, dport uint16) []byte {
		ip := ipv4Packet(hostIP, remotePodIP, 17, ipOpts{ttl: 64}, withCsum(hostIP, remotePodIP, 17, udpDatagram(port, dport, []byte("hello"))))
		gnv := geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, append(append([]byte{}, of[:14]...), ip...))
		return ethFrame(gwMAC, fl.undMAC, 0x0800, ipv4Packet(underlayIP, peerIP, 17, ipOpts{ttl: 64, fragOff: 0x4000}, udpDatagram(50000, 6081, gnv)))
	}
	other := netip.MustParseAddr("10.200.0.10")
	for _, tc := range []struct {
		sport, dport, port uint16
		ok                 bool
	}{
		{1234, 80, 1234, true}, {1234, 80, 61000, false}, {1234, 80, 1235, false},
		// 61001 replies on cniPod's flow from remotePodIP:5000.
		{61001, 5000, 61001, false}, {61001, 5000, 61000, true}, {61001, 5000, 65535, true},
		{61001, 5000, 61005, true}, {61001, 5000, 60999, false},
	} {
		of, e := snatCase(other, tc.sport, tc.dport)
		if err := accepts(e, snatOut(of, tc.port, tc.dport)); (err == nil) != tc.ok {
			t.Errorf("SNAT of port %d to %d: accepted %v, want %v (%v)", tc.sport, tc.port, err == nil, tc.ok, err)
		}
	}
	if _, e := snatCase(cniPod, 1234, 80); !e.allows(IsthmusDropReasonDROP_NAT_SOURCE_LIMIT) || e.outcomes() != 1 {
		t.Errorf("a new flow of a source at its share: %+v, want DROP_NAT_SOURCE_LIMIT", e)
	}
	if of, e := snatCase(cniPod, 4000, 5000); accepts(e, snatOut(of, 61001, 5000)) != nil || accepts(e, snatOut(of, 4000, 5000)) == nil {
		t.Errorf("a live flow of a source at its share: %+v, want its port 61001", e)
	}
	// Masquerade in a masq_nat one slot short: a new flow finds no room unless it
	// deletes an expired entry on its way; a source at its share is refused first.
	masqOut := func(src netip.Addr, sport uint16) expectation {
		return modelMasq(w, ethFrame(gwMAC, fl.undMAC, 0x0800, ipv4Packet(src, worldIP, 17, ipOpts{ttl: 63},
			withCsum(src, worldIP, 17, udpDatagram(sport, 53, []byte("q"))))))
	}
	for _, tc := range []struct {
		src   netip.Addr
		sport uint16
		want  IsthmusDropReason // 0: translated
	}{
		{pod2IP, 1234, IsthmusDropReasonDROP_SNAT_INSERT},
		{pod2IP, 61007, 0}, // the expired flow's port: its reply entry goes
		{podIP, 35001, 0},  // the expired flow's own tuple: both its share and its slot come back
		{podIP, 35000, 0},  // a live flow
		{podIP, 1234, IsthmusDropReasonDROP_NAT_SOURCE_LIMIT},
	} {
		e := masqOut(tc.src, tc.sport)
		if got := e.outcomes(); got != 1 || (tc.want != 0 && !e.allows(tc.want)) || (tc.want == 0 && len(e.forms) != 1) {
			t.Errorf("masquerade of %v port %d: %+v, want drop %d (0: translated)", tc.src, tc.sport, e, tc.want)
		}
	}
	// A spoofed pod source and GENEVE to a peer are drops.
	if e := modelEncap(w, ethFrame(fl.podHMAC, podMAC, 0x0800, ipkt{src: netip.MustParseAddr("10.1.0.6"), dst: remotePodIP}.build()), true); e.pass || len(e.forms) > 0 {
		t.Errorf("spoofed pod source: %+v", e)
	}
	if e := modelEncap(w, ethFrame(fl.podHMAC, podMAC, 0x0800, ipkt{src: podIP, dst: peerIP, dport: 6081}.build()), true); e.pass || len(e.forms) > 0 {
		t.Errorf("GENEVE to a peer: %+v", e)
	}

	// Reverse SNAT of a reply in GENEVE to another CNI's pod: the destination and port
	// translated back, to the stack; refused untranslated, with the wrong port or a
	// checksum that no longer verifies.
	reply := ipv4Packet(remotePodIP, hostIP, 17, ipOpts{ttl: 60}, withCsum(remotePodIP, hostIP, 17, udpDatagram(5000, 61001, []byte("reply"))))
	e = modelUnderlay(w, uframe{inner: reply}.build(fl), false)
	back := ipv4Packet(remotePodIP, cniPod, 17, ipOpts{ttl: 60}, withCsum(remotePodIP, cniPod, 17, udpDatagram(5000, 4000, []byte("reply"))))
	toStack := func(ip []byte) []byte { return ethFrame(fl.istMAC, gwMAC, 0x0800, ip) }
	if err := accepts(e, toStack(back)); err != nil {
		t.Errorf("reverse SNAT: %v", err)
	}
	wrongPort := ipv4Packet(remotePodIP, cniPod, 17, ipOpts{ttl: 60}, withCsum(remotePodIP, cniPod, 17, udpDatagram(5000, 4001, []byte("reply"))))
	badSum := append([]byte{}, back...)
	badSum[20+6]++
	for name, out := range map[string][]byte{"untranslated": reply, "wrong port": wrongPort, "bad UDP checksum": badSum} {
		if accepts(e, toStack(out)) == nil {
			t.Errorf("reverse SNAT: the model accepts it %s", name)
		}
	}
	// An expired flow's reply is the host's, untranslated.
	e = modelUnderlay(w, uframe{inner: ipv4Packet(remotePodIP, hostIP, 17, ipOpts{ttl: 60}, udpDatagram(5000, 61005, nil))}.build(fl), false)
	if len(e.forms) != 1 || !strings.HasPrefix(e.forms[0].name, "host delivery") {
		t.Errorf("reply of an expired flow: %s", e.why)
	}
	// An ICMP error quoting a translated TCP flow: the quoted source, port and TCP
	// checksum follow (RFC 1624), nothing else.
	quoted := ipv4Packet(hostIP, remotePodIP, 6, ipOpts{ttl: 63}, tcpWith(hostIP, remotePodIP, 40000, 80, 0x02, nil))
	errIn := icmpError(11, 0, remotePodIP, quoted, 20)
	e = modelUnderlay(w, uframe{inner: errIn}.build(fl), false)
	quotedBack := ipv4Packet(podIP, remotePodIP, 6, ipOpts{ttl: 63}, tcpWith(podIP, remotePodIP, 40000, 80, 0x02, nil))
	errOut := icmpError(11, 0, remotePodIP, quotedBack, 20)
	copy(errOut[16:20], podIP.AsSlice())
	errOut[10], errOut[11] = 0, 0
	binary.BigEndian.PutUint16(errOut[10:], csum16(errOut[:20]))
	// ICMP passes the stack (fail-closed), which un-NATs what it must: into isthmus0.
	errFrame := uframe{inner: errIn}.build(fl)
	pod := func(ip []byte) []byte { return ethFrame(fl.istMAC, errFrame[6:12], 0x0800, ip) }
	if err := accepts(e, pod(errOut)); err != nil {
		t.Errorf("ICMP error about a translated flow: %v", err)
	}
	wrongQuoted := append([]byte{}, errOut...)
	wrongQuoted[20+8+20+16] ^= 0x10 // the quoted TCP checksum
	wrongQuoted[20+2] ^= 0x10       // and the ICMP checksum to match
	if accepts(e, pod(wrongQuoted)) == nil {
		t.Errorf("ICMP error: the model accepts a wrong quoted TCP checksum")
	}
	// Masquerade: a reply to the underlay address goes back to the stack translated.
	mq := ipv4Packet(worldIP, underlayIP, 17, ipOpts{ttl: 60}, withCsum(worldIP, underlayIP, 17, udpDatagram(53, 61006, []byte("a"))))
	e = modelUnderlay(w, ethFrame(fl.undMAC, gwMAC, 0x0800, mq), false)
	mqBack := ipv4Packet(worldIP, podIP, 17, ipOpts{ttl: 60}, withCsum(worldIP, podIP, 17, udpDatagram(53, 35000, []byte("a"))))
	if len(e.forms) != 1 || !e.forms[0].toStack || e.forms[0].check(ethFrame(fl.undMAC, gwMAC, 0x0800, mqBack)) != nil || e.pass {
		t.Errorf("masquerade reply: %s", e.why)
	}
	if e := modelUnderlay(w, ethFrame(fl.undMAC, gwMAC, 0x0800, mq), true); !e.pass || len(e.forms) > 0 {
		t.Errorf("masquerade reply on XDP: %s", e.why)
	}
	// Fabric ingress: from the site router delivered, from another neighbour the kernel's.
	fi := ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 63}, tcpWith(remotePodIP, podIP, 80, 33000, 0x12, nil))
	if e := modelUnderlay(w, ethFrame(fl.undMAC, gwMAC, 0x0800, fi), false); e.pass || len(e.forms) != 1 {
		t.Errorf("fabric ingress from the site router: %s", e.why)
	}
	if e := modelUnderlay(w, ethFrame(fl.undMAC, fabricMAC, 0x0800, fi), false); !e.pass || len(e.forms) > 0 || e.drop {
		t.Errorf("fabric ingress from another neighbour: %s", e.why)
	}

	// A flow conntrack knows: left to the stack from the pod, delivered through it.
	known := ethFrame(fl.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 6, ipOpts{ttl: 64}, tcpWith(podIP, remotePodIP, 40001, 80, 0x10, nil)))
	if e := modelEncap(w, known, true); !e.pass || e.drop || len(e.forms) > 0 {
		t.Errorf("pod's packet of a known flow: %s", e.why)
	}
	if e := modelEncap(w, known, false); e.pass {
		t.Errorf("a known flow on isthmus0 (not from a pod) is left to the stack: %s", e.why)
	}
	ack := ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 63}, tcpWith(remotePodIP, podIP, 80, 33000, 0x10, nil))
	if e := modelUnderlay(w, uframe{inner: ack}.build(fl), false); len(e.forms) != 1 || !strings.HasPrefix(e.forms[0].name, "pod delivery through the stack") {
		t.Errorf("decapsulated ACK of a known flow: %s", e.why)
	}

	// IPv6. Over the IPv6 underlay (TestEncapUnderlay6's frame, built here by hand):
	// outer IPv6 from underlay_ip6 to the peer's address, hop limit 64, the inner
	// traffic class, UDP to 6081 with checksum zero; refused with a filled-in
	// checksum, another hop limit or to the handle's IPv4 "address".
	v6 := ipv6Flow(pod6, peer6Pod6, 0xb8, 0x12345, 4000)
	in6f := ethFrame(fl.istMAC, fl.istMAC, 0x86dd, v6)
	outer6 := func(inner []byte, hop byte, sum bool) []byte {
		u := udpDatagram(50000, 6081, geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, inner))
		if sum {
			u = withCsum(underlayIP6, peer6, 17, u)
		}
		ip := ipv6Packet(underlayIP6, peer6, 17, hop, u)
		binary.BigEndian.PutUint32(ip[0:], 6<<28|0xb8<<20|0x777)
		return ethFrame(gwMAC, fl.undMAC, 0x86dd, ip)
	}
	e = modelEncap(w, in6f, false)
	if err := accepts(e, outer6(in6f, 64, false)); err != nil {
		t.Errorf("encap over the IPv6 underlay: %v", err)
	}
	for name, out := range map[string][]byte{"a UDP checksum": outer6(in6f, 64, true), "hop limit 63": outer6(in6f, 63, false),
		"over IPv4 to the handle": ethFrame(gwMAC, fl.undMAC, 0x0800, ipv4Packet(underlayIP, handle6, 17, ipOpts{tos: 0xb8, ttl: 64, fragOff: 0x4000},
			udpDatagram(50000, 6081, geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, in6f))))} {
		if accepts(e, out) == nil {
			t.Errorf("encap over the IPv6 underlay: the model accepts %s", name)
		}
	}
	// An IPv4 packet to the IPv6 peer's pods leaves over IPv6 too.
	in4f := ethFrame(fl.istMAC, fl.istMAC, 0x0800, ipv4Packet(hostIP, peer6Pod4, 17, ipOpts{ttl: 64, tos: 0xb8}, udpDatagram(4000, 5000, []byte("x"))))
	if err := accepts(modelEncap(w, in4f, false), outer6(in4f, 64, false)); err != nil {
		t.Errorf("IPv4 over the IPv6 underlay: %v", err)
	}
	// A pod's IPv6 packet: spoofed, GENEVE to the IPv6 peer, to a route (the stack,
	// marked), to a link-local destination (unmarked), on the fast path (encapsulated,
	// hop limit 63) and with its last hop (the stack).
	pod6f := func(src, dst netip.Addr, next byte, l4 []byte, hop byte) []byte {
		return ethFrame(fl.podHMAC, podMAC, 0x86dd, ipv6Packet(src, dst, next, hop, l4))
	}
	for _, tc := range []struct {
		name       string
		in         []byte
		drop       IsthmusDropReason
		pass, mark bool
	}{
		{"spoofed", pod6f(netip.MustParseAddr("fd10::6"), remotePod6, 17, udpDatagram(1, 2, nil), 64), IsthmusDropReasonDROP_POD_SRC_SPOOFED, false, false},
		{"GENEVE to the IPv6 peer", pod6f(pod6, peer6, 17, udpDatagram(1, 6081, nil), 64), IsthmusDropReasonDROP_POD_GENEVE, false, false},
		{"to a route", pod6f(pod6, remotePod6, 17, udpDatagram(1, 2, nil), 64), 0, true, true},
		{"to a link-local address", pod6f(pod6, netip.MustParseAddr("fe80::1"), 17, udpDatagram(1, 2, nil), 64), 0, true, false},
		{"the fast path's last hop", pod6f(pod6, remotePod6, 6, tcpWith(pod6, remotePod6, 40004, 80, 0x10, nil), 1), 0, true, true},
	} {
		e := modelEncap(w, tc.in, true)
		if e.outcomes() != 1 || (tc.drop != 0 && !e.allows(tc.drop)) || e.pass != tc.pass || e.mark != tc.mark {
			t.Errorf("pod IPv6 %s: %+v", tc.name, e)
		}
	}
	fast6 := tcpWith(pod6, remotePod6, 40004, 80, 0x10, nil)
	e = modelEncap(w, pod6f(pod6, remotePod6, 6, fast6, 64), true)
	want6 := ethFrame(fl.podHMAC, podMAC, 0x86dd, ipv6Packet(pod6, remotePod6, 6, 63, fast6))
	enc6 := ethFrame(gwMAC, fl.undMAC, 0x0800, ipv4Packet(underlayIP, peerIP, 17, ipOpts{ttl: 64, fragOff: 0x4000},
		udpDatagram(50000, 6081, geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, want6))))
	if err := accepts(e, enc6); err != nil {
		t.Errorf("pod IPv6 on the fast path: %v", err)
	}
	// Decapsulation of IPv6: over either underlay, through the stack byte for byte;
	// XDP pops with the Ethernet type of the inner frame and the handle in decap_meta;
	// an IPv4 frame from a handle is from no peer.
	inner6 := ipv6Flow(peer6Pod6, pod6, 0, 0x777, 4000)
	for _, f := range [][]byte{u6frame{innerType: 0x86dd, inner: inner6}.build(fl)} {
		e := modelUnderlay(w, f, false)
		if err := accepts(e, ethFrame(fl.istMAC, f[6:12], 0x86dd, inner6)); err != nil || len(e.forms) != 1 || !e.forms[0].mark {
			t.Errorf("IPv6 over IPv6 to the pod: %v (%s)", err, e.why)
		}
		hopDec := append([]byte{}, inner6...)
		hopDec[7]--
		if accepts(e, ethFrame(fl.istMAC, f[6:12], 0x86dd, hopDec)) == nil {
			t.Errorf("IPv6 through the stack: the model accepts a decremented hop limit")
		}
	}
	f4 := u6frame{}.build(fl)
	meta6 := binary.NativeEndian.AppendUint32(nil, 0x69737468)
	meta6 = binary.NativeEndian.AppendUint32(meta6, be32(handle6))
	popped := append(append(append(meta6, f4[:12]...), 0x08, 0x00), f4[14+40+8+8+14:]...)
	if err := accepts(modelUnderlay(w, f4, true), popped); err != nil {
		t.Errorf("XDP pop over the IPv6 underlay: %v", err)
	}
	popped[len(meta6)+13] = 0xdd
	if accepts(modelUnderlay(w, f4, true), popped) == nil {
		t.Errorf("XDP pop over the IPv6 underlay: the model accepts the outer Ethernet type")
	}
	if e := modelUnderlay(w, uframe{outerSrc: handle6, innerSrc: peer6Pod4}.build(fl), false); !e.allows(IsthmusDropReasonDROP_UNKNOWN_PEER) || e.outcomes() != 1 {
		t.Errorf("IPv4 GENEVE from a handle: %s", e.why)
	}

	// Every generated frame gets exactly one outcome (two only where the flow hash
	// picks a group member).
	one := func(e expectation) bool { n := e.outcomes(); return n == 1 || (e.hashed && n == 2) }
	for i, in := range underlaySeeds(fl) {
		for _, transit := range []bool{false, true} {
			w.transit = transit
			for _, xdp := range []bool{false, true} {
				if e := modelUnderlay(w, in, xdp); !one(e) {
					t.Errorf("underlay seed %d (xdp %v, transit %v): %d outcomes: %s", i, xdp, transit, e.outcomes(), e.why)
				}
			}
		}
	}
	w.transit = false
	for i, in := range masqSeeds(fl) {
		if e := modelMasq(w, in); !one(e) {
			t.Errorf("masquerade seed %d: %d outcomes: %s", i, e.outcomes(), e.why)
		}
	}
	for _, fromPod := range []bool{false, true} {
		for i, in := range encapSeeds(fl, fromPod) {
			if e := modelEncap(w, in, fromPod); !one(e) {
				t.Errorf("encap seed %d (from pod %v): %d outcomes: %s", i, fromPod, e.outcomes(), e.why)
			}
		}
	}
}
