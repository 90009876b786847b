package bpf

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The NAT tables' bounds and what they refuse (lib/nat.h, lib/conntrack.h,
// docs/architecture.md "The NAT tables"): each pod source holds at most
// nat_source_flows_max flows of a table, a reply that misses is never left to the
// host's reset, ports the node's conntrack holds are not handed out, and a flow an
// RST did not end is established again.

// natTCP is a TCP segment src:sport -> dst:dport with flags and a valid checksum.
func natTCP(src, dst netip.Addr, sport, dport uint16, flags byte) []byte {
	return withCsum(src, dst, 6, tcpSegment(sport, dport, flags, nil))
}

// podTCPOut sends the pod's (podIP) TCP segment to remotePodIP:80 from sport with
// flags through the node and wants it translated to the tunnel address and port p.
func podTCPOut(t *testing.T, l *lab, sport, p uint16, flags byte) {
	t.Helper()
	in := fromPod(l, podMAC, podIP, remotePodIP, 6, natTCP(podIP, remotePodIP, sport, 80, flags))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 6, ipOpts{ttl: 63}, natTCP(tunnelIP, remotePodIP, p, 80, flags)))
}

// remoteTCPIn runs remotePodIP:80's segment to the tunnel address port dport with
// flags through underlay_ingress and returns the verdict.
func remoteTCPIn(t *testing.T, l *lab, dport uint16, flags byte) uint32 {
	t.Helper()
	ip := ipv4Packet(remotePodIP, tunnelIP, 6, ipOpts{ttl: 64}, natTCP(remotePodIP, tunnelIP, 80, dport, flags))
	ret, _ := l.run(t, l.objs.UnderlayIngress, fromRemote(l, ip), l.und.Attrs().Index)
	return ret
}

// natState returns the state of both entries of the pod's flow podIP:sport ->
// remotePodIP:80 (translated to port p); it fails unless they agree.
func natState(t *testing.T, l *lab, sport, p uint16) uint8 {
	t.Helper()
	fv, ok := natEntry(t, l, natKey(podIP, remotePodIP, sport, 80, 6))
	rv, rok := natEntry(t, l, natKey(remotePodIP, tunnelIP, 80, p, 6))
	if !ok || !rok {
		t.Fatalf("flow %d: entries present %v/%v", sport, ok, rok)
	}
	if fv.State != rv.State {
		t.Fatalf("flow %d: states %d and %d differ", sport, fv.State, rv.State)
	}
	return fv.State
}

// TestNATStateAfterRST: an RST ends a flow's translation after the closing timeout
// only if the flow stays ended. A flow whose both sides send again after it (the RST
// was not accepted: outside the window, say) is ESTABLISHED again, with the
// established timeout; one side alone (in-flight data, or the other side's reset
// answer) is not enough, and a new RST starts over.
func TestNATStateAfterRST(t *testing.T) {
	l := natLab(t, 40000, 40009, nil)
	const (
		syn, synAck, ack, rst, rstAck, psh = 0x02, 0x12, 0x10, 0x04, 0x14, 0x18
		rstState                           = uint8(IsthmusNatStateNAT_STATE_RST)
		rstOrig                            = uint8(IsthmusNatStateNAT_STATE_RST_ORIG)
		rstReply                           = uint8(IsthmusNatStateNAT_STATE_RST_REPLY)
	)
	steps := []struct {
		what  string
		reply bool
		flags byte
		want  uint8
	}{
		{"SYN", false, syn, natNew},
		{"SYN-ACK", true, synAck, natEstablished},
		{"ACK", false, ack, natEstablished},
		{"the pod's RST", false, rst, rstState},
		{"in-flight data from the remote side", true, psh, rstReply},
		{"its data again", true, ack, rstReply},
		{"the pod's data: both sides are alive", false, psh, natEstablished},
		{"the remote side's RST", true, rstAck, rstState},
		{"the pod's data", false, ack, rstOrig},
		{"the remote side answers with an RST", true, rst, rstState},
		{"the remote side's data", true, psh, rstReply},
		{"the pod's data", false, psh, natEstablished},
		{"a FIN", false, 0x11, uint8(IsthmusNatStateNAT_STATE_FIN_ORIG)},
		{"the other FIN", true, 0x11, natClosing},
		{"the last ACK: closed by FINs stays closing", false, ack, natClosing},
		{"and the other side's", true, ack, natClosing},
	}
	for i, s := range steps {
		if s.reply {
			if ret := remoteTCPIn(t, l, 33000, s.flags); ret == tcActShot {
				t.Fatalf("step %d (%s): reply dropped", i, s.what)
			}
		} else {
			podTCPOut(t, l, 33000, 33000, s.flags)
		}
		if got := natState(t, l, 33000, 33000); got != s.want {
			t.Fatalf("step %d (%s): state %d, want %d", i, s.what, got, s.want)
		}
	}

	// The timeouts: after an RST the closing one, once established again the
	// established one. Aged 11 s (past the closing 10 s), an entry after an RST is
	// gone for the next reply, an established one is not.
	for _, tc := range []struct {
		sport uint16
		after []byte // the pod's flags after the handshake; remote PSH then pod ACK for "resumed"
		live  bool
	}{
		{34000, []byte{rst}, false},
		{34001, []byte{rst, 0}, true},
	} {
		podTCPOut(t, l, tc.sport, tc.sport, syn)
		remoteTCPIn(t, l, tc.sport, synAck)
		podTCPOut(t, l, tc.sport, tc.sport, tc.after[0])
		if len(tc.after) > 1 {
			remoteTCPIn(t, l, tc.sport, psh)
			podTCPOut(t, l, tc.sport, tc.sport, ack)
		}
		old := monoNow(t) - uint64(11*time.Second)
		for _, k := range []IsthmusNatKey{natKey(podIP, remotePodIP, tc.sport, 80, 6), natKey(remotePodIP, tunnelIP, 80, tc.sport, 6)} {
			v, _ := natEntry(t, l, k)
			v.LastSeen = old
			if err := l.objs.Nat.Put(k, v); err != nil {
				t.Fatalf("age entry: %v", err)
			}
		}
		before := l.counts(t)
		remoteTCPIn(t, l, tc.sport, psh)
		_, reversed := delta(before, l.counts(t))[metricKey(IsthmusMetricMETRIC_SNAT_REVERSE, underlayTC)]
		if reversed != tc.live {
			t.Errorf("flow %d (%d packets after the RST), idle 11 s: reply translated %v, want %v", tc.sport, len(tc.after)-1, reversed, tc.live)
		}
	}
}

// TestSNATReplyUnknown: a TCP segment to the tunnel address that matches no
// translation (its entry expired or was removed while the remote side still talks)
// is dropped with DROP_NAT_REPLY_UNKNOWN, not handed to the host, which has no socket
// for it and would reset the remote side's live connection. The stack gets what it
// may own: an RST (never answered), a bare SYN (a new connection, the host's to
// refuse), a segment for a local socket, one conntrack holds, and UDP.
func TestSNATReplyUnknown(t *testing.T) {
	l := natLab(t, 40000, 40009, nil)
	wantDrop := func(dport uint16, flags byte) {
		t.Helper()
		before := l.counts(t)
		if ret := remoteTCPIn(t, l, dport, flags); ret != tcActShot {
			t.Fatalf("flags %#x to port %d: verdict %d, want TC_ACT_SHOT", flags, dport, ret)
		}
		wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
			metricKey(IsthmusMetricMETRIC_DECAP, underlayTC): 1, dropKey(IsthmusDropReasonDROP_NAT_REPLY_UNKNOWN, underlayTC): 1})
	}
	wantHost := func(dport uint16, flags byte) {
		t.Helper()
		before := l.counts(t)
		if ret := remoteTCPIn(t, l, dport, flags); ret != tcActRedirect {
			t.Fatalf("flags %#x to port %d: verdict %d, want TC_ACT_REDIRECT to the host", flags, dport, ret)
		}
		wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
			metricKey(IsthmusMetricMETRIC_DECAP, underlayTC): 1, metricKey(IsthmusMetricMETRIC_DELIVER_HOST, underlayTC): 1})
	}
	for _, f := range []byte{0x10, 0x18, 0x12, 0x11} { // ACK, data, SYN-ACK, FIN
		wantDrop(33000, f)
	}
	wantHost(33000, 0x04) // RST
	wantHost(33000, 0x14) // RST-ACK
	wantHost(33000, 0x02) // SYN

	// A live translation whose entries are then removed: its next reply is dropped.
	podTCPOut(t, l, 33001, 33001, 0x02)
	if ret := remoteTCPIn(t, l, 33001, 0x12); ret == tcActShot {
		t.Fatalf("SYN-ACK of a translated flow dropped")
	}
	for _, k := range []IsthmusNatKey{natKey(podIP, remotePodIP, 33001, 80, 6), natKey(remotePodIP, tunnelIP, 80, 33001, 6)} {
		if err := l.objs.Nat.Delete(k); err != nil {
			t.Fatalf("delete entry: %v", err)
		}
	}
	wantDrop(33001, 0x18)

	// A listener on the tunnel address: the host's.
	var ln net.Listener
	if err := inNS(l.ns, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(tunnelIP, 33002).String())
		return err
	}); err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	wantHost(33002, 0x10)

	// A flow conntrack holds (here its reply tuple, as a NodePort masquerade
	// binding would be): the stack's.
	ctCreate(t, l, netip.AddrPortFrom(netip.MustParseAddr("10.5.0.1"), 44444), netip.AddrPortFrom(netip.MustParseAddr("10.99.0.2"), 30080),
		netip.AddrPortFrom(remotePodIP, 80), netip.AddrPortFrom(tunnelIP, 33003))
	wantHost(33003, 0x10)

	// UDP: the host's, as before.
	udp := ipv4Packet(remotePodIP, tunnelIP, 17, ipOpts{ttl: 64}, udpDatagram(53, 33004, []byte("x")))
	if ret, _ := l.run(t, l.objs.UnderlayIngress, fromRemote(l, udp), l.und.Attrs().Index); ret != tcActRedirect {
		t.Fatalf("UDP of no flow: verdict %d, want TC_ACT_REDIRECT to the host", ret)
	}
}

// ctCreate creates a TCP conntrack entry in the lab namespace with original tuple
// osrc -> odst and reply tuple rsrc -> rdst (a translation when they are not each
// other's inverse), established, for a minute.
func ctCreate(t *testing.T, l *lab, osrc, odst, rsrc, rdst netip.AddrPort) {
	t.Helper()
	f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 60,
		Forward:   netlink.IPTuple{Protocol: 6, SrcIP: osrc.Addr().AsSlice(), DstIP: odst.Addr().AsSlice(), SrcPort: osrc.Port(), DstPort: odst.Port()},
		Reverse:   netlink.IPTuple{Protocol: 6, SrcIP: rsrc.Addr().AsSlice(), DstIP: rdst.Addr().AsSlice(), SrcPort: rsrc.Port(), DstPort: rdst.Port()},
		ProtoInfo: &netlink.ProtoInfoTCP{State: 3}}
	if err := inNS(l.ns, func() error { return netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f) }); err != nil {
		t.Fatalf("create conntrack entry %s -> %s / %s -> %s: %v", osrc, odst, rsrc, rdst, err)
	}
}

// TestSNATPortAvoidsConntrack: a port whose reply tuple the node's conntrack holds
// (kube-proxy's NodePort masquerade made the same binding: a client's connection to
// a NodePort, masqueraded to the tunnel address and port 33000 towards the remote
// backend) is not given to a pod's flow: the flow gets a port from the range, and
// the binding's replies stay the stack's.
func TestSNATPortAvoidsConntrack(t *testing.T) {
	const min, max = 40000, 40009
	l := natLab(t, min, max, nil)
	ctCreate(t, l, netip.AddrPortFrom(netip.MustParseAddr("10.5.0.1"), 44444), netip.AddrPortFrom(netip.MustParseAddr("10.99.0.2"), 30080),
		netip.AddrPortFrom(remotePodIP, 80), netip.AddrPortFrom(tunnelIP, 33000))
	p := snatPort(podIP, remotePodIP, 33000, 80, 6, min, max, 0)
	podTCPOut(t, l, 33000, p, 0x02)
	wantEntry(t, l, natKey(remotePodIP, tunnelIP, 80, p, 6), podIP, 33000, natNew, natReply)
	if _, ok := natEntry(t, l, natKey(remotePodIP, tunnelIP, 80, 33000, 6)); ok {
		t.Errorf("the pod's flow took the port of the conntrack binding")
	}
	// UDP is checked the same way.
	f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 60,
		Forward: netlink.IPTuple{Protocol: 17, SrcIP: net.IPv4(10, 5, 0, 1), DstIP: net.IPv4(10, 99, 0, 2), SrcPort: 44444, DstPort: 30053},
		Reverse: netlink.IPTuple{Protocol: 17, SrcIP: remotePodIP.AsSlice(), DstIP: tunnelIP.AsSlice(), SrcPort: 53, DstPort: 35000}}
	if err := inNS(l.ns, func() error { return netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f) }); err != nil {
		t.Fatalf("create conntrack entry: %v", err)
	}
	pu := snatPort(podIP, remotePodIP, 35000, 53, 17, min, max, 0)
	in := fromPod(l, podMAC, podIP, remotePodIP, 17, udpDatagram(35000, 53, []byte("x")))
	sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udpDatagram(pu, 53, []byte("x"))))
}

// natSourceFlows returns the flows nat_sources counts for addr in table.
func natSourceFlows(t *testing.T, l *lab, addr netip.Addr, table uint32) uint32 {
	t.Helper()
	var v IsthmusNatSourceValue
	if err := l.objs.NatSources.Lookup(IsthmusNatSourceKey{Addr: be32(addr), Table: table}, &v); err != nil {
		t.Fatalf("lookup nat_sources %s/%d: %v", addr, table, err)
	}
	return v.Flows
}

// TestNATSourceLimit: a pod source holds at most nat_source_flows_max flows of the
// nat table (here 4); its next new flow is dropped with DROP_NAT_SOURCE_LIMIT and
// evicts nothing, while another pod's new flow and the first pod's existing flows are
// translated. A flow the datapath itself replaces (expired, same tuple) keeps the
// count right.
func TestNATSourceLimit(t *testing.T) {
	const share = 4
	l := natLab(t, 40000, 40009, func(s *ebpf.CollectionSpec) {
		v, ok := s.Variables["nat_source_flows_max"]
		if !ok {
			t.Fatalf("no variable nat_source_flows_max")
		}
		if err := v.Set(uint32(share)); err != nil {
			t.Fatalf("set nat_source_flows_max: %v", err)
		}
	})
	udp := func(sport uint16) []byte { return udpDatagram(sport, 53, []byte("x")) }
	out := func(mac net.HardwareAddr, src netip.Addr, sport uint16) {
		t.Helper()
		in := fromPod(l, mac, src, remotePodIP, 17, udp(sport))
		sendOut(t, l, in, ipv4Packet(tunnelIP, remotePodIP, 17, ipOpts{ttl: 63}, udp(sport)))
	}
	for i := uint16(0); i < share; i++ {
		out(podMAC, podIP, 20000+i)
	}
	if n := natSourceFlows(t, l, podIP, 0); n != share {
		t.Fatalf("nat_sources counts %d flows of %s, want %d", n, podIP, share)
	}
	for i := uint16(share); i < 3*share; i++ {
		before := l.counts(t)
		in := fromPod(l, podMAC, podIP, remotePodIP, 17, udp(20000+i))
		ret, _, _, hook := l.podSend(t, in)
		if ret != tcActShot {
			t.Fatalf("flow %d beyond the share: verdict %d, want TC_ACT_SHOT", i, ret)
		}
		wantCounts(t, delta(before, l.counts(t)), map[IsthmusMetricsKey]uint64{
			dropKey(IsthmusDropReasonDROP_NAT_SOURCE_LIMIT, hook): 1})
		if _, ok := natEntry(t, l, natKey(podIP, remotePodIP, 20000+i, 53, 17)); ok {
			t.Fatalf("refused flow %d left an entry", i)
		}
	}
	// Nothing was evicted: every admitted flow still translates both ways.
	for i := uint16(0); i < share; i++ {
		out(podMAC, podIP, 20000+i)
		sendIn(t, l, fromRemote(l, ipv4Packet(remotePodIP, tunnelIP, 17, ipOpts{ttl: 64}, udpDatagram(53, 20000+i, []byte("y")))),
			toStack(l, ipv4Packet(remotePodIP, podIP, 17, ipOpts{ttl: 64}, udpDatagram(53, 20000+i, []byte("y")))))
	}
	// Another pod has a share of its own.
	out(pod2MAC, pod2IP, 21000)
	if n := natSourceFlows(t, l, pod2IP, 0); n != 1 {
		t.Fatalf("nat_sources counts %d flows of %s, want 1", n, pod2IP)
	}
	// An expired flow of the first pod starts over on its own tuple: the count
	// stays at the share, and it is translated.
	old := monoNow(t) - uint64(120*time.Second)
	for _, k := range []IsthmusNatKey{natKey(podIP, remotePodIP, 20000, 53, 17), natKey(remotePodIP, tunnelIP, 53, 20000, 17)} {
		v, _ := natEntry(t, l, k)
		v.LastSeen = old
		if err := l.objs.Nat.Put(k, v); err != nil {
			t.Fatalf("age entry: %v", err)
		}
	}
	out(podMAC, podIP, 20000)
	if n := natSourceFlows(t, l, podIP, 0); n != share {
		t.Fatalf("after a flow started over nat_sources counts %d flows of %s, want %d", n, podIP, share)
	}
}
