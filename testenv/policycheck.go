package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket/layers"

	"github.com/isthmus-dev/isthmus/maps"
)

// Kinds of PolicyProbe.
const (
	// ProbeUDP is a 100-byte UDP datagram from a socket.
	ProbeUDP = "udp 100 B"
	// ProbeUDPFragmented is a 3,000-byte UDP datagram from an unprivileged
	// socket, which the sender's kernel fragments at the pod's MTU.
	ProbeUDPFragmented = "udp 3000 B, fragmented"
	// ProbeICMPTimestamp is an ICMP timestamp request (type 13), sent by scapy.
	ProbeICMPTimestamp = "icmp timestamp"
	// ProbeUnknownProto is an IPv4 packet of protocol 253 (RFC 3692,
	// experimentation), sent by scapy.
	ProbeUnknownProto = "ip proto 253"
	// ProbeEntryDeleted is an established TCP flow whose conntrack entry on the
	// judging node is deleted (`conntrack -D`) while the policy still allows it.
	ProbeEntryDeleted = "tcp entry deleted"
	// ProbeRevoked is an established TCP flow that the operator revokes: a DROP
	// rule for its sender in the policy chain, after the chain's ESTABLISHED
	// accept, and `conntrack -D` of its entry on the judging node.
	ProbeRevoked = "tcp revoked"
)

// Outcomes a PolicyProbe wants.
const (
	WantDenied    = "denied"    // nothing of it reaches the destination pod
	WantDelivered = "delivered" // every packet reaches the destination pod
	WantCut       = "cut"       // no data sent after the revocation arrives
	WantCarries   = "carries"   // the data sent after the deletion arrives
)

// policyProbeCount is how many packets a datagram probe sends, and how many
// lines a TCP probe sends in each phase.
const policyProbeCount = 3

// PolicyProbe is the outcome of one probe of CheckPolicy.
type PolicyProbe struct {
	// Case names the policy ("aks1-p1 ingress"); empty for a control that
	// serves several.
	Case     string
	Src, Dst string
	Kind     string
	Want     string
	OK       bool
	// Got says what the destination pod received, as its socket and the
	// capture on its eth0 saw it.
	Got string
	// Err says why the probe could not run; such a probe is not OK.
	Err string
}

// PolicyCheck is what CheckPolicy found.
type PolicyCheck struct {
	Cases  []PolicyCase
	Probes []PolicyProbe
	Took   time.Duration
}

// Failures returns the probes that did not see what they want.
func (c *PolicyCheck) Failures() []PolicyProbe {
	var out []PolicyProbe
	for _, p := range c.Probes {
		if !p.OK {
			out = append(out, p)
		}
	}
	return out
}

// Get returns the probe of kind from src to dst.
func (c *PolicyCheck) Get(src, dst, kind string) (PolicyProbe, bool) {
	for _, p := range c.Probes {
		if p.Src == src && p.Dst == dst && p.Kind == kind {
			return p, true
		}
	}
	return PolicyProbe{}, false
}

// String lists the cases and every probe, one a line.
func (c *PolicyCheck) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d pod policies probed, %d probes, %d failed, in %s\n", len(c.Cases), len(c.Probes), len(c.Failures()), c.Took.Round(time.Millisecond))
	for _, pc := range c.Cases {
		fmt.Fprintf(&b, "policy %s %s (%s on %s): denied %s, control %s, revoked %s (reverse %v)\n",
			pc.Pod, pc.Dir, pc.Chain, pc.Node, pairText(pc.Denied), pairText(pc.Control), pairText(pc.Revoke), pc.RevokeReverse)
	}
	for _, p := range c.Probes {
		mark := "ok  "
		if !p.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(&b, "%s %s -> %s %s: want %s, got %s", mark, p.Src, p.Dst, p.Kind, p.Want, p.Got)
		if p.Err != "" {
			fmt.Fprintf(&b, " (%s)", p.Err)
		}
		if p.Case != "" {
			fmt.Fprintf(&b, " [%s]", p.Case)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func pairText(p [2]string) string {
	if p == [2]string{} {
		return "-"
	}
	return p[0] + "->" + p[1]
}

// CheckPolicy probes every pod policy of the scenario (Scenario.PolicyCases)
// past what the matrix's ICMP echo, TCP and UDP show, with the packets the
// datapath cannot classify and with revocation:
//   - from the policy's denied pair: a 100-byte UDP datagram, a 3,000-byte one
//     that the sending pod's kernel fragments, an ICMP timestamp request and a
//     packet of IP protocol 253 (both from scapy): nothing of any may reach the
//     destination pod (WantDenied);
//   - the same probes on the case's control pair (no policy denies it), where
//     every packet must arrive (WantDelivered), so a probe that reaches nothing
//     cannot pass as denied;
//   - an established TCP flow through the policy, on the conntrack fast path
//     (both ends' nodes have judged it through their stacks): its entry on the
//     judging node deleted with `conntrack -D` while the policy allows it, it
//     still carries data (WantCarries: deleting an entry alone cuts nothing the
//     policy allows); then with a DROP rule for its sender inserted after the
//     chain's ESTABLISHED accept and the entry deleted again, it carries nothing
//     (WantCut). A flow the policy denies its sender opening is opened from the
//     other end, and only the cut is probed.
//
// What a destination received is decided by the destination pod itself: its
// sockets (a UDP socket, a TCP connection) and a capture on its eth0 decoded by
// gopacket, never by the sender. The error is nil only when every probe saw what
// it wants; the PolicyCheck is nil only when the check could not run.
func (l *Lab) CheckPolicy(ctx context.Context) (*PolicyCheck, error) {
	start := time.Now()
	c := &PolicyCheck{Cases: l.Scenario.PolicyCases()}
	// Denied probes first, every case's, then the controls, then the TCP
	// flows: conntrack tracks a protocol without ports (253) by addresses
	// alone, so a control's packets from B to A would make a later denied
	// packet from A to B a reply that the chain's ESTABLISHED accept lets
	// through, without isthmus or anything else failing open. (probeDatagrams
	// also deletes such entries left by an earlier check.)
	for _, pc := range c.Cases {
		if pc.Denied == [2]string{} {
			continue
		}
		name := pc.Pod + " " + pc.Dir
		ps, err := l.probeDatagrams(ctx, pc.Denied, false)
		if err != nil {
			return nil, fmt.Errorf("check policy of lab %s: %s: %w", l.Name, name, err)
		}
		for i := range ps {
			ps[i].Case = name
		}
		c.Probes = append(c.Probes, ps...)
	}
	done := map[[2]string]bool{}
	for _, pc := range c.Cases {
		if pc.Denied == [2]string{} {
			continue
		}
		name := pc.Pod + " " + pc.Dir
		switch {
		case pc.Control == [2]string{}:
			c.Probes = append(c.Probes, PolicyProbe{Case: name, Src: pc.Denied[0], Dst: pc.Denied[1], Kind: "control",
				Want: WantDelivered, Got: "nothing", Err: "no pair that no policy denies shares an end with the denied one: the denied probes have no positive control"})
		case !done[pc.Control]:
			done[pc.Control] = true
			ps, err := l.probeDatagrams(ctx, pc.Control, true)
			if err != nil {
				return nil, fmt.Errorf("check policy of lab %s: %s: control: %w", l.Name, name, err)
			}
			c.Probes = append(c.Probes, ps...)
		}
	}
	for _, pc := range c.Cases {
		if pc.Revoke != [2]string{} {
			c.Probes = append(c.Probes, l.probeRevoke(ctx, pc)...)
		}
	}
	c.Took = time.Since(start)
	if failed := c.Failures(); len(failed) > 0 {
		var list []string
		for _, p := range failed {
			list = append(list, fmt.Sprintf("%s -> %s %s (want %s, got %s%s)", p.Src, p.Dst, p.Kind, p.Want, p.Got, errSuffix(p.Err)))
		}
		return c, fmt.Errorf("check policy of lab %s: %d of %d probes failed: %s", l.Name, len(failed), len(c.Probes), strings.Join(list, "; "))
	}
	return c, nil
}

func errSuffix(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

// probeDatagrams sends the datagram probes (ProbeUDP, ProbeUDPFragmented,
// ProbeICMPTimestamp, ProbeUnknownProto) from pair[0] to pair[1], and judges
// them by what pair[1] receives: every packet (delivered) or nothing.
func (l *Lab) probeDatagrams(ctx context.Context, pair [2]string, delivered bool) ([]PolicyProbe, error) {
	src, ok := l.Pod(pair[0])
	if !ok {
		return nil, fmt.Errorf("no pod %q", pair[0])
	}
	dst, ok := l.Pod(pair[1])
	if !ok {
		return nil, fmt.Errorf("no pod %q", pair[1])
	}
	// The source the destination sees: its own address, or the tunnel address
	// of its node when return-path SNAT translates it.
	sources := []netip.Addr{src.Address}
	if e, ok := l.Scenario.Expect(src.Name, dst.Name); ok && e.Saw != src.Address {
		sources = append(sources, e.Saw)
	}
	from := func(f Frame) bool { return slices.Contains(sources, f.Src) && f.Dst == dst.Address }
	want := WantDenied
	if delivered {
		want = WantDelivered
	}
	// How long to wait: until everything arrived, for a control; a denied probe
	// waits the full settle time for anything that might leak.
	const settle = 1500 * time.Millisecond

	if !delivered {
		if err := l.forgetPortless(ctx, []string{src.Node, dst.Node}, sources, dst.Address); err != nil {
			return nil, err
		}
	}

	capt, err := StartPodCapture(l.PodNS(dst.Name))
	if err != nil {
		return nil, err
	}
	defer capt.Close()
	var udp net.PacketConn
	if err := Do(l.PodNS(dst.Name), func() error {
		var err error
		udp, err = net.ListenPacket("udp4", "0.0.0.0:0")
		return err
	}); err != nil {
		return nil, fmt.Errorf("listen udp in %s: %w", dst.Name, err)
	}
	defer udp.Close()
	port := udp.LocalAddr().(*net.UDPAddr).Port
	var mu sync.Mutex
	var datagrams []int // sizes of the datagrams the socket read from the source
	go func() {
		buf := make([]byte, 65536)
		for {
			n, a, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			ap := a.(*net.UDPAddr).AddrPort()
			if slices.Contains(sources, ap.Addr().Unmap()) && bytes.HasPrefix(buf[:n], []byte("isthmus policy probe")) {
				mu.Lock()
				datagrams = append(datagrams, n)
				mu.Unlock()
			}
		}
	}()

	var out []PolicyProbe
	for _, probe := range []struct {
		kind string
		size int
	}{{ProbeUDP, 100}, {ProbeUDPFragmented, 3000}} {
		p := PolicyProbe{Src: src.Name, Dst: dst.Name, Kind: probe.kind, Want: want}
		capt.Reset()
		mu.Lock()
		datagrams = nil
		mu.Unlock()
		err := sendUDP(l.PodNS(src.Name), netip.AddrPortFrom(dst.Address, uint16(port)), probe.size, policyProbeCount)
		if err != nil {
			p.Err = err.Error()
		}
		var n int
		var frames []Frame
		deadline := time.Now().Add(settle)
		for {
			mu.Lock()
			n = len(datagrams)
			mu.Unlock()
			frames = capt.Frames(func(f Frame) bool { return from(f) && f.Proto == layers.IPProtocolUDP })
			if (delivered && n >= policyProbeCount) || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if delivered {
			// The capture reads on its own: let it catch up with the socket,
			// so that this probe's last packets are not counted in the next.
			time.Sleep(300 * time.Millisecond)
			frames = capt.Frames(func(f Frame) bool { return from(f) && f.Proto == layers.IPProtocolUDP })
		}
		frags := 0
		for _, f := range frames {
			if f.Fragment {
				frags++
			}
		}
		p.Got = fmt.Sprintf("%d of %d datagrams read by the socket; eth0 received %d packets (%d fragments)", n, policyProbeCount, len(frames), frags)
		switch {
		case p.Err != "":
		case delivered:
			p.OK = n == policyProbeCount
			if probe.size > 1500 && frags < 2*policyProbeCount {
				p.OK = false
				p.Err = "the datagrams did not arrive as fragments: the probe does not probe fragments"
			}
		default:
			p.OK = n == 0 && len(frames) == 0
		}
		out = append(out, p)
	}

	// scapy: three ICMP timestamp requests, then three packets of protocol 253.
	capt.Reset()
	script := `
import sys
from scapy.all import IP, ICMP, Raw, send, conf, L3RawSocket
conf.L3socket = L3RawSocket  # the kernel routes, as for any socket
dst, count = sys.argv[1], int(sys.argv[2])
send(IP(dst=dst) / ICMP(type=13, id=0x6973, seq=1) , count=count, inter=0.05, verbose=False)
send(IP(dst=dst, proto=253) / Raw(b"isthmus policy probe: ip proto 253"), count=count, inter=0.05, verbose=False)
`
	_, scapyErr := l.Exec(ctx, l.PodNS(src.Name), "/usr/bin/python3", "-c", script, dst.Address.String(), strconv.Itoa(policyProbeCount))
	kinds := []struct {
		kind  string
		match func(Frame) bool
	}{
		{ProbeICMPTimestamp, func(f Frame) bool { return from(f) && f.Proto == layers.IPProtocolICMPv4 && f.ICMPType == 13 }},
		{ProbeUnknownProto, func(f Frame) bool { return from(f) && f.Proto == 253 }},
	}
	deadline := time.Now().Add(settle)
	for {
		all := true
		for _, k := range kinds {
			all = all && len(capt.Frames(k.match)) >= policyProbeCount
		}
		if (delivered && all) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, k := range kinds {
		p := PolicyProbe{Src: src.Name, Dst: dst.Name, Kind: k.kind, Want: want}
		n := len(capt.Frames(k.match))
		p.Got = fmt.Sprintf("eth0 received %d of %d", n, policyProbeCount)
		switch {
		case scapyErr != nil:
			p.Err = scapyErr.Error()
		case delivered:
			p.OK = n == policyProbeCount
		default:
			p.OK = n == 0
		}
		out = append(out, p)
	}
	return out, nil
}

// sendUDP sends count datagrams of size bytes from a socket in the named
// namespace, 50 ms apart; the kernel fragments what exceeds the path MTU.
func sendUDP(nsName string, to netip.AddrPort, size, count int) error {
	var c *net.UDPConn
	if err := Do(nsName, func() error {
		var err error
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		return fmt.Errorf("open udp in %s: %w", nsName, err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte{'.'}, size)
	copy(msg, "isthmus policy probe")
	for i := range count {
		if i > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := c.Write(msg); err != nil {
			return fmt.Errorf("send %d bytes: %w", size, err)
		}
	}
	return nil
}

// probeRevoke runs the TCP probes of a case (ProbeEntryDeleted unless the flow
// is opened in reverse, then ProbeRevoked) on one connection.
func (l *Lab) probeRevoke(ctx context.Context, pc PolicyCase) []PolicyProbe {
	sender, receiver := pc.Revoke[0], pc.Revoke[1]
	name := pc.Pod + " " + pc.Dir
	fail := func(kind, want, err string) []PolicyProbe {
		return []PolicyProbe{{Case: name, Src: sender, Dst: receiver, Kind: kind, Want: want, Got: "nothing probed", Err: err}}
	}
	// The listener sits at the end that does not open the flow.
	dialer, listener := sender, receiver
	if pc.RevokeReverse {
		dialer, listener = receiver, sender
	}
	lAddr := netip.AddrPortFrom(l.PodAddr(listener), 0)
	var ln net.Listener
	if err := Do(l.PodNS(listener), func() error {
		var err error
		ln, err = net.Listen("tcp4", lAddr.String())
		return err
	}); err != nil {
		return fail(ProbeRevoked, WantCut, fmt.Sprintf("listen in %s: %v", listener, err))
	}
	defer ln.Close()
	lAddr = netip.AddrPortFrom(lAddr.Addr(), uint16(ln.Addr().(*net.TCPAddr).Port))
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	var dc net.Conn
	if err := Do(l.PodNS(dialer), func() error {
		var err error
		dc, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp4", lAddr.String())
		return err
	}); err != nil {
		return fail(ProbeRevoked, WantCut, fmt.Sprintf("connect %s -> %s: %v", dialer, lAddr, err))
	}
	defer dc.(*net.TCPConn).SetLinger(0)
	defer dc.Close()
	var lc net.Conn
	select {
	case c, ok := <-accepted:
		if !ok {
			return fail(ProbeRevoked, WantCut, "accept failed")
		}
		lc = c
	case <-time.After(3 * time.Second):
		return fail(ProbeRevoked, WantCut, "nothing accepted the connection")
	}
	defer lc.(*net.TCPConn).SetLinger(0)
	defer lc.Close()
	send, recv := dc, lc
	if pc.RevokeReverse {
		send, recv = lc, dc
	}
	var mu sync.Mutex
	var got []string
	go func() {
		buf := make([]byte, 4096)
		var acc []byte
		for {
			n, err := recv.Read(buf)
			acc = append(acc, buf[:n]...)
			for {
				i := bytes.IndexByte(acc, '\n')
				if i < 0 {
					break
				}
				mu.Lock()
				got = append(got, string(acc[:i]))
				mu.Unlock()
				acc = acc[i+1:]
			}
			if err != nil {
				return
			}
		}
	}()
	// phase sends policyProbeCount lines tagged tag and waits up to wait for
	// them; it returns how many arrived.
	phase := func(tag string, wait time.Duration, all bool) (int, error) {
		for i := range policyProbeCount {
			if i > 0 {
				time.Sleep(100 * time.Millisecond)
			}
			if _, err := fmt.Fprintf(send, "%s %d\n", tag, i); err != nil {
				return 0, fmt.Errorf("send: %w", err)
			}
		}
		deadline := time.Now().Add(wait)
		for {
			mu.Lock()
			n := 0
			for _, g := range got {
				if strings.HasPrefix(g, tag+" ") {
					n++
				}
			}
			mu.Unlock()
			if (all && n == policyProbeCount) || time.Now().After(deadline) || ctx.Err() != nil {
				return n, nil
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	fastBefore, ferr := l.fastPackets(pc.Node)
	if n, err := phase("established", 3*time.Second, true); err != nil || n != policyProbeCount {
		return fail(ProbeRevoked, WantCut, fmt.Sprintf("the flow carried %d of %d lines before it was touched (%v): nothing to revoke", n, policyProbeCount, err))
	}
	// Let the last ACKs settle: the entry is ESTABLISHED and ASSURED on both
	// nodes, the flow on the fast path.
	time.Sleep(200 * time.Millisecond)
	if l.Datapath == DatapathIsthmus {
		// The revocation must meet a flow on the conntrack fast path of the
		// judging node, the case where the stack no longer sees its packets.
		fastAfter, err := l.fastPackets(pc.Node)
		if err = errors.Join(ferr, err); err != nil {
			return fail(ProbeRevoked, WantCut, err.Error())
		}
		if fastAfter == fastBefore {
			return fail(ProbeRevoked, WantCut, fmt.Sprintf("ct_fast on %s did not move while the established flow carried data: it is not on the conntrack fast path, and revoking it tests nothing of the fast path", pc.Node))
		}
	}
	var out []PolicyProbe
	if !pc.RevokeReverse {
		p := PolicyProbe{Case: name, Src: sender, Dst: receiver, Kind: ProbeEntryDeleted, Want: WantCarries}
		if deleted, err := l.deleteEntry(ctx, pc.Node, lAddr); err != nil || deleted != 1 {
			p.Got, p.Err = "nothing probed", fmt.Sprintf("conntrack -D on %s deleted %d entries of the established flow, want 1 (%v)", pc.Node, deleted, err)
		} else {
			n, err := phase("after-delete", 3*time.Second, true)
			p.Got = fmt.Sprintf("%d of %d lines read by the receiver's socket", n, policyProbeCount)
			p.OK = err == nil && n == policyProbeCount
			if err != nil {
				p.Err = err.Error()
			}
		}
		out = append(out, p)
		time.Sleep(200 * time.Millisecond)
	}
	p := PolicyProbe{Case: name, Src: sender, Dst: receiver, Kind: ProbeRevoked, Want: WantCut}
	rule := append(append([]string{pc.Chain}, pc.RevokeMatch...), "-p", "tcp", "-m", "comment", "--comment", "isthmus lab: revoked", "-j", "DROP")
	if _, err := l.Exec(ctx, l.NodeNS(pc.Node), append([]string{"iptables", "-w", "-I", rule[0], "2"}, rule[1:]...)...); err != nil {
		p.Got, p.Err = "nothing probed", err.Error()
		return append(out, p)
	}
	defer l.Exec(context.WithoutCancel(ctx), l.NodeNS(pc.Node), append([]string{"iptables", "-w", "-D"}, rule...)...)
	// After an earlier deletion conntrack holds an entry again only if the
	// flow's packets went through the stack since: none to delete means they
	// did not, and the cut shows what that costs.
	deleted, err := l.deleteEntry(ctx, pc.Node, lAddr)
	if err == nil && pc.RevokeReverse && deleted != 1 {
		err = fmt.Errorf("conntrack -D on %s deleted %d entries of the established flow, want 1", pc.Node, deleted)
	}
	if err != nil {
		p.Got, p.Err = "nothing probed", err.Error()
		return append(out, p)
	}
	n, err := phase("after-revoke", 2*time.Second, false)
	p.Got = fmt.Sprintf("%d of %d lines read by the receiver's socket (conntrack -D deleted %d entries on %s)", n, policyProbeCount, deleted, pc.Node)
	p.OK = err == nil && n == 0
	if err != nil {
		p.Err = err.Error()
	}
	return append(out, p)
}

var ctDeleted = regexp.MustCompile(`(\d+) flow entries have been deleted`)

// deleteEntry deletes, with the conntrack CLI, the node's conntrack entries of the
// TCP flow with the listener at to, in either direction (conntrack may have picked
// the flow up again from a packet of either end), and returns how many it deleted.
func (l *Lab) deleteEntry(ctx context.Context, node string, to netip.AddrPort) (int, error) {
	total := 0
	for _, match := range [][]string{
		{"--orig-dst", to.Addr().String(), "--orig-port-dst", strconv.Itoa(int(to.Port()))},
		{"--orig-src", to.Addr().String(), "--orig-port-src", strconv.Itoa(int(to.Port()))},
	} {
		out, err := l.Exec(ctx, l.NodeNS(node), append([]string{"conntrack", "-D", "-p", "tcp"}, match...)...)
		m := ctDeleted.FindStringSubmatch(out)
		if m == nil {
			return total, fmt.Errorf("conntrack -D on %s for the flow with %s: %w", node, to, err)
		}
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	return total, nil
}

// fastPackets returns the node's ct_fast packet count (docs/metrics.md): packets
// of TCP flows that took the conntrack fast path. It reads the pinned metrics
// map itself: loader/inspect would make testenv import the plan, whose tests
// import testenv.
func (l *Lab) fastPackets(node string) (uint64, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(l.PinDir(node), string(maps.MapMetrics)), nil)
	if err != nil {
		return 0, fmt.Errorf("read counters of %s: %w", node, err)
	}
	defer m.Close()
	all, err := maps.ReadMetrics(m)
	if err != nil {
		return 0, fmt.Errorf("read counters of %s: %w", node, err)
	}
	var n uint64
	for k, c := range all {
		if !k.IsDrop() && k.Name() == "ct_fast" {
			n += c.Packets
		}
	}
	return n, nil
}

// forgetPortless deletes, on each node, conntrack's entries of IP protocol 253
// between any of the addresses as and b, both ways: left by an earlier probe
// from b, such an entry would make a denied packet from as a reply.
func (l *Lab) forgetPortless(ctx context.Context, nodes []string, as []netip.Addr, b netip.Addr) error {
	for _, n := range slices.Compact(slices.Sorted(slices.Values(nodes))) {
		for _, a := range as {
			for _, dir := range [][2]netip.Addr{{a, b}, {b, a}} {
				out, err := l.Exec(ctx, l.NodeNS(n), "conntrack", "-D", "-p", "253", "-s", dir[0].String(), "-d", dir[1].String())
				if !ctDeleted.MatchString(out) {
					return fmt.Errorf("conntrack -D of protocol 253 entries on %s: %w", n, err)
				}
			}
		}
	}
	return nil
}
