package bpf

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The conntrack fast path (lib/ct.h, lib/stack.h) against the kernel's own conntrack:
// entries are made with the conntrack CLI in the lab namespace, and what the kernel
// then holds is read back with it (conntrack -L prints what is left of an entry in
// seconds, converted by the kernel with its own HZ) or counted by nft rules that match
// on the kernel's classification of a packet (ct state new / established).

// The conntrack timeouts ctLab gives its namespace, in seconds.
const (
	ctLabEstablished = 3000
	ctLabTimeWait    = 600
	ctLabClose       = 60
)

// ctLab is newLab with the conntrack TCP timeouts above in its namespace.
func ctLab(t *testing.T) *lab {
	t.Helper()
	l := newLab(t)
	if err := inNS(l.ns, func() error {
		for name, v := range map[string]int{"established": ctLabEstablished, "time_wait": ctLabTimeWait, "close": ctLabClose} {
			f := "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_" + name
			if err := os.WriteFile(f, []byte(strconv.Itoa(v)), 0o644); err != nil {
				return fmt.Errorf("set %s: %w", f, err)
			}
		}
		// The remote pods, for the stack's forwarding of what a test sends through it.
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: remoteNet.Addr().AsSlice(), Mask: net.CIDRMask(remoteNet.Bits(), 32)},
			Gw: underlayGW.AsSlice(), LinkIndex: l.und.Attrs().Index})
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

// exec runs a program in the lab namespace and returns its combined output.
func (l *lab) exec(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	var out []byte
	err := inNS(l.ns, func() error {
		var err error
		// The child is forked from this thread, so it starts in the lab namespace.
		out, err = exec.Command(name, args...).CombinedOutput()
		return err
	})
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// tuple is one direction of a TCP flow.
type tuple struct {
	src, dst     netip.Addr
	sport, dport uint16
}

func (u tuple) inverse() tuple { return tuple{u.dst, u.src, u.dport, u.sport} }

// ctInsert makes an entry with original tuple orig and reply tuple reply in TCP state
// state, with the given status (conntrack -u), with the conntrack CLI.
func (l *lab) ctInsert(t *testing.T, orig, reply tuple, state, status string) {
	t.Helper()
	args := []string{"-I", "-p", "tcp", "-s", orig.src.String(), "-d", orig.dst.String(),
		"--sport", strconv.Itoa(int(orig.sport)), "--dport", strconv.Itoa(int(orig.dport)),
		"-r", reply.src.String(), "-q", reply.dst.String(),
		"--reply-port-src", strconv.Itoa(int(reply.sport)), "--reply-port-dst", strconv.Itoa(int(reply.dport)),
		"--state", state, "-t", strconv.Itoa(ctLabEstablished)}
	if status != "" {
		args = append(args, "-u", status)
	}
	if _, err := l.exec(t, "conntrack", args...); err != nil {
		t.Fatal(err)
	}
}

// ctEstablished makes conntrack hold the TCP flow u as established, assured and
// untranslated: the entry that lets u's non-SYN segments, either way, take the direct
// path (lib/stack.h stack_sees). Tests of what the direct path does use it.
func (l *lab) ctEstablished(t *testing.T, u tuple) {
	t.Helper()
	l.ctInsert(t, u, u.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
}

// ctEntry returns conntrack -L's line for the TCP flow whose original tuple is orig,
// and the seconds it has left; ok is false if conntrack holds no such entry.
func (l *lab) ctEntry(t *testing.T, orig tuple) (line string, left int, ok bool) {
	t.Helper()
	out, err := l.exec(t, "conntrack", "-L", "-p", "tcp", "-s", orig.src.String(), "-d", orig.dst.String(),
		"--sport", strconv.Itoa(int(orig.sport)), "--dport", strconv.Itoa(int(orig.dport)))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		// tcp      6 299 ESTABLISHED src=...: the third field is what is left, in s.
		if f := strings.Fields(line); len(f) > 3 && f[0] == "tcp" {
			left, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatalf("parse conntrack line %q: %v", line, err)
			}
			return line, left, true
		}
	}
	return "", 0, false
}

// tcpSeg is a TCP segment with sequence and acknowledgement numbers and a checksum
// for u. scapy: TCP(sport=u.sport, dport=u.dport, seq=seq, ack=ack, flags=flags, window=65535)/payload
func tcpSeg(u tuple, seq, ack uint32, flags byte, payload []byte) []byte {
	b := tcpSegment(u.sport, u.dport, flags, payload)
	binary.BigEndian.PutUint32(b[4:], seq)
	binary.BigEndian.PutUint32(b[8:], ack)
	return withCsum(u.src, u.dst, 6, b)
}

// TCP flags besides mtu_test.go's.
const (
	tcpFIN = 0x01
	tcpRST = 0x04
	tcpPSH = 0x08
)

// podTCP is the frame the pod sends on pod0h for segment u (u.src is podIP).
func (l *lab) podTCP(u tuple, seq, ack uint32, flags byte, payload []byte) []byte {
	return ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(u.src, u.dst, 6, ipOpts{ttl: 64}, tcpSeg(u, seq, ack, flags, payload)))
}

// remoteTCP is the GENEVE frame peerIP sends for segment u (from a remote pod to podIP).
func (l *lab) remoteTCP(u tuple, seq, ack uint32, flags byte, payload []byte) []byte {
	return geneveFrame(l, goodOpts(u.dst), innerEth(ipv4Packet(u.src, u.dst, 6, ipOpts{ttl: 64}, tcpSeg(u, seq, ack, flags, payload))))
}

// fastOut runs the pod's frame through pod_ingress and returns true if it took the
// direct path (encapsulated there, counted as ct_fast), false if pod_ingress left it
// to the stack (untouched, marked, ct_fast not counted); anything else fails the test.
func (l *lab) fastOut(t *testing.T, frame []byte) bool {
	t.Helper()
	before := l.counts(t)
	ret, out := l.run(t, l.objs.PodIngress, frame, l.pod.Attrs().Index)
	fast := delta(before, l.counts(t))[metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_POD_INGRESS)]
	switch {
	case ret == tcActRedirect && fast == 1:
		return true
	case ret == tcActOK && fast == 0 && l.mark&overlayMark != 0 && string(out[:len(frame)]) == string(frame):
		return false
	}
	t.Fatalf("pod_ingress: verdict %d, ct_fast +%d, mark %#x: neither the direct path nor the stack", ret, fast, l.mark)
	return false
}

// fastIn runs the peer's GENEVE frame through underlay_ingress and returns true if
// the inner packet took the direct path into the pod (counted as ct_fast), false if
// it went to the stack (delivered to isthmus0, counted as deliver_pod without
// ct_fast); anything else fails the test.
func (l *lab) fastIn(t *testing.T, frame []byte) bool {
	t.Helper()
	before := l.counts(t)
	ret, _ := l.run(t, l.objs.UnderlayIngress, frame, l.und.Attrs().Index)
	d := delta(before, l.counts(t))
	fast := d[metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_UNDERLAY_TC)]
	pod := d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)]
	if ret != tcActRedirect || pod != 1 || fast > 1 {
		t.Fatalf("underlay_ingress: verdict %d, counters %v: want a delivery to the pod", ret, d)
	}
	return fast == 1
}

// TestCtFastDecision: the fast path is taken only for a non-SYN TCP segment of a flow
// the kernel's conntrack holds as established, assured and untranslated; everything
// else passes the stack, in both directions (pod_ingress and after decapsulation).
// The entry of the IPVS shape (reply tuple rewritten to a backend, no NAT status bit,
// as the conntrack CLI leaves it: checked with conntrack -L) must keep the stack.
func TestCtFastDecision(t *testing.T) {
	l := ctLab(t)
	plain := tuple{podIP, remotePodIP, 40001, 80}
	l.ctInsert(t, plain, plain.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
	// IPVS: the pod dials a virtual address (here inside the remote prefix, so the
	// route exists), the backend 10.2.0.7:8080 answers; IPVS sets no NAT bit.
	vip := netip.MustParseAddr("10.2.0.99")
	ipvs := tuple{podIP, vip, 40002, 80}
	ipvsReply := tuple{remotePodIP, podIP, 8080, 40002}
	l.ctInsert(t, ipvs, ipvsReply, "ESTABLISHED", "ASSURED,SEEN_REPLY")
	unassured := tuple{podIP, remotePodIP, 40003, 80}
	l.ctInsert(t, unassured, unassured.inverse(), "ESTABLISHED", "SEEN_REPLY")
	synRecv := tuple{podIP, remotePodIP, 40004, 80}
	l.ctInsert(t, synRecv, synRecv.inverse(), "SYN_RECV", "ASSURED,SEEN_REPLY")
	none := tuple{podIP, remotePodIP, 40005, 80}

	// The kernel kept the IPVS shape: the reply tuple as given, and no NAT status
	// (conntrack's --src-nat and --dst-nat filters test the IPS_*_NAT bits).
	line, _, ok := l.ctEntry(t, ipvs)
	if !ok || !strings.Contains(line, "src=10.2.0.7 dst=10.1.0.5 sport=8080 dport=40002") {
		t.Fatalf("conntrack holds the IPVS-shaped entry as %q, want its reply tuple from 10.2.0.7:8080", line)
	}
	for _, f := range []string{"--src-nat", "--dst-nat"} {
		out, err := l.exec(t, "conntrack", "-L", f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "tcp") {
			t.Fatalf("conntrack -L %s lists entries, want none (no NAT status bit):\n%s", f, out)
		}
	}

	for _, tc := range []struct {
		name string
		out  []byte // the pod's frame; nil: none
		in   []byte // the peer's frame; nil: none
		fast bool
	}{
		{"untranslated established, pod's ACK", l.podTCP(plain, 1000, 2000, tcpACK, []byte("x")), nil, true},
		{"untranslated established, remote ACK", nil, l.remoteTCP(plain.inverse(), 2000, 1001, tcpACK, []byte("y")), true},
		{"untranslated established, PSH", l.podTCP(plain, 1001, 2001, tcpACK|tcpPSH, []byte("x")), nil, true},
		{"IPVS shape, the pod's packet to the VIP", l.podTCP(ipvs, 1000, 2000, tcpACK, nil), nil, false},
		{"IPVS shape, the backend's reply", nil, l.remoteTCP(ipvsReply, 2000, 1000, tcpACK, nil), false},
		{"not assured", l.podTCP(unassured, 1000, 2000, tcpACK, nil), nil, false},
		{"SYN_RECV", l.podTCP(synRecv, 1000, 2000, tcpACK, nil), nil, false},
		{"no entry, pod's ACK", l.podTCP(none, 1000, 2000, tcpACK, nil), nil, false},
		{"no entry, remote ACK", nil, l.remoteTCP(none.inverse(), 1000, 2000, tcpACK, nil), false},
		{"SYN of an established flow", l.podTCP(plain, 1000, 0, tcpSYN, nil), nil, false},
		{"SYN-ACK of an established flow", nil, l.remoteTCP(plain.inverse(), 2000, 1001, tcpSYN|tcpACK, nil), false},
		{"first fragment of an established flow",
			ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 6, ipOpts{ttl: 64, fragOff: 0x2000}, tcpSeg(plain, 1002, 2001, tcpACK, make([]byte, 64)))), nil, false},
		{"TCP header cut short",
			ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 6, ipOpts{ttl: 64}, tcpSeg(plain, 1002, 2001, tcpACK, nil)[:12])), nil, false},
		{"UDP on the ports of an established flow",
			ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 17, ipOpts{ttl: 64}, udpDatagram(40001, 80, []byte("u")))), nil, false},
		{"ICMP echo reply",
			ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 1, ipOpts{ttl: 64}, icmpEcho(0, 1, 1, nil))), nil, false},
		{"protocol 253", ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(podIP, remotePodIP, 253, ipOpts{ttl: 64}, make([]byte, 24))), nil, false},
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
}

// onCPU runs fn on a thread bound to cpu.
func onCPU(t *testing.T, cpu int, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatalf("sched_getaffinity: %v", err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatalf("sched_setaffinity %d: %v", cpu, err)
	}
	defer unix.SchedSetaffinity(0, &all)
	fn()
}

// warmClock runs a fast-path packet of flow u (which conntrack holds as established)
// on every CPU, twice, more than CT_CLOCK_MIN_NS apart, so that each CPU has measured
// HZ (ct_hz), and returns the rate each found.
func (l *lab) warmClock(t *testing.T, u tuple) []uint32 {
	t.Helper()
	for pass := 0; pass < 2; pass++ {
		for cpu := 0; cpu < runtime.NumCPU(); cpu++ {
			onCPU(t, cpu, func() {
				if !l.fastOut(t, l.podTCP(u, 1, 1, tcpACK, nil)) {
					t.Fatal("warming the clock: the packet did not take the fast path")
				}
			})
		}
		time.Sleep(250 * time.Millisecond)
	}
	var vs []IsthmusCtClock
	if err := l.objs.CtClock.Lookup(uint32(0), &vs); err != nil {
		t.Fatalf("look up ct_clock: %v", err)
	}
	hz := make([]uint32, len(vs))
	for i, v := range vs {
		hz[i] = v.Hz
	}
	return hz
}

// wantLeft fails the test unless conntrack holds the entry of orig with between lo
// and hi seconds left.
func (l *lab) wantLeft(t *testing.T, what string, orig tuple, lo, hi int) {
	t.Helper()
	line, left, ok := l.ctEntry(t, orig)
	if !ok || left < lo || left > hi {
		t.Fatalf("%s: conntrack holds %v: %q; want %d-%d s left", what, ok, line, lo, hi)
	}
}

// TestCtSetExpiry: ct_set_expiry gives the entry the timeout asked, as the kernel
// counts it (conntrack -L), in one write. The first write of a fresh object (HZ from
// the boot offset, or as if 100 where that is ambiguous) is never shorter than asked;
// once every CPU has measured HZ, within a second of it. The old measure (set 1 s,
// read back, set again) could leave a 1 s expiry to a packet on another CPU between
// its two writes.
func TestCtSetExpiry(t *testing.T) {
	l := ctLab(t)
	u := tuple{podIP, remotePodIP, 40010, 80}
	w := tuple{podIP, remotePodIP, 40011, 80}
	l.ctInsert(t, u, u.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
	l.ctInsert(t, w, w.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")

	// The first fast-path packet of this object: a RST shortens the entry to at
	// least the CLOSE timeout, at most ten times it (HZ 1000 taken for 100).
	onCPU(t, 0, func() {
		if !l.fastOut(t, l.podTCP(u, 5000, 6000, tcpRST, nil)) {
			t.Fatal("the RST did not take the fast path")
		}
	})
	l.wantLeft(t, "RST before HZ is known", u, ctLabClose-1, 10*ctLabClose)

	hz := l.warmClock(t, w)
	for cpu, h := range hz {
		if h != 100 && h != 250 && h != 300 && h != 1000 {
			t.Fatalf("CPU %d measured HZ %d, want one of 100, 250, 300, 1000 (all: %v)", cpu, h, hz)
		}
		if h != hz[0] {
			t.Fatalf("the CPUs measured different rates: %v", hz)
		}
	}
	t.Logf("HZ %d", hz[0])
	// The RST's receiver speaks on: it refused the RST, the entry is ESTABLISHED-long.
	if !l.fastIn(t, l.remoteTCP(u.inverse(), 6000, 5000, tcpACK, nil)) {
		t.Fatal("the receiver's ACK did not take the fast path")
	}
	l.wantLeft(t, "the receiver answered the RST", u, ctLabEstablished-2, ctLabEstablished)
	for cpu := 0; cpu < runtime.NumCPU(); cpu++ {
		v := tuple{podIP, remotePodIP, uint16(40020 + cpu), 80}
		l.ctInsert(t, v, v.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
		onCPU(t, cpu, func() {
			if !l.fastOut(t, l.podTCP(v, 5000, 6000, tcpRST, nil)) {
				t.Fatal("the RST did not take the fast path")
			}
		})
		l.wantLeft(t, fmt.Sprintf("RST on CPU %d", cpu), v, ctLabClose-2, ctLabClose)
	}
}

// TestCtFastClose: FIN and RST on the fast path shorten a flow's entry only when
// its receiver took them, a flow closed on the fast path leaves the fast path, and a
// new SYN on its tuple is a NEW flow for the kernel's conntrack (counted by an nft
// rule on ct state in the lab's forward hook, the SYN sent through the kernel stack).
func TestCtFastClose(t *testing.T) {
	l := ctLab(t)
	warm := tuple{podIP, remotePodIP, 40030, 80}
	l.ctInsert(t, warm, warm.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
	l.warmClock(t, warm)

	t.Run("FIN out of window", func(t *testing.T) {
		u := tuple{podIP, remotePodIP, 40031, 80}
		l.ctInsert(t, u, u.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
		// An injected FIN the receiver does not take: its answer acknowledges
		// what it really has (1000), not the FIN's end (90001).
		if !l.fastOut(t, l.podTCP(u, 90000, 6000, tcpFIN|tcpACK, nil)) {
			t.Fatal("the FIN did not take the fast path")
		}
		if !l.fastIn(t, l.remoteTCP(u.inverse(), 6000, 1000, tcpACK, nil)) {
			t.Fatal("the receiver's ACK did not take the fast path")
		}
		l.wantLeft(t, "after an unacknowledged FIN", u, ctLabEstablished-2, ctLabEstablished)
		if !l.fastOut(t, l.podTCP(u, 1000, 6000, tcpACK, []byte("more"))) {
			t.Fatal("the flow left the fast path")
		}
	})

	t.Run("RST out of window", func(t *testing.T) {
		u := tuple{podIP, remotePodIP, 40032, 80}
		l.ctInsert(t, u, u.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
		if !l.fastIn(t, l.remoteTCP(u.inverse(), 123456, 0, tcpRST, nil)) {
			t.Fatal("the RST did not take the fast path")
		}
		l.wantLeft(t, "right after the RST", u, ctLabClose-2, ctLabClose)
		// The pod, the RST's receiver, sends on: it refused it.
		if !l.fastOut(t, l.podTCP(u, 1000, 6000, tcpACK, []byte("on"))) {
			t.Fatal("the pod's packet after the RST did not take the fast path")
		}
		l.wantLeft(t, "after the receiver sent on", u, ctLabEstablished-2, ctLabEstablished)
	})

	t.Run("clean close, then a SYN on the tuple", func(t *testing.T) {
		u := tuple{podIP, remotePodIP, 40033, 80}
		l.ctInsert(t, u, u.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
		// The pod closes with 4 bytes in its FIN segment (end 1000+4+1); the remote
		// acknowledges it, then closes; the pod acknowledges that.
		steps := []struct {
			what string
			out  bool
			u    tuple
			seq  uint32
			ack  uint32
			fl   byte
			data []byte
			left [2]int
		}{
			{"pod's FIN", true, u, 1000, 6000, tcpFIN | tcpACK, []byte("last"), [2]int{ctLabEstablished - 2, ctLabEstablished}},
			{"remote ACKs it", false, u.inverse(), 6000, 1005, tcpACK, nil, [2]int{ctLabTimeWait - 2, ctLabTimeWait}},
			{"remote sends on, half-closed", false, u.inverse(), 6000, 1005, tcpACK, []byte("still"), [2]int{ctLabTimeWait - 2, ctLabTimeWait}},
			{"remote's FIN", false, u.inverse(), 6005, 1005, tcpFIN | tcpACK, nil, [2]int{ctLabTimeWait - 2, ctLabTimeWait}},
			{"pod ACKs it", true, u, 1005, 6006, tcpACK, nil, [2]int{ctLabTimeWait - 2, ctLabTimeWait}},
		}
		for _, s := range steps {
			var fast bool
			if s.out {
				fast = l.fastOut(t, l.podTCP(s.u, s.seq, s.ack, s.fl, s.data))
			} else {
				fast = l.fastIn(t, l.remoteTCP(s.u, s.seq, s.ack, s.fl, s.data))
			}
			if !fast {
				t.Fatalf("%s: did not take the fast path", s.what)
			}
			l.wantLeft(t, s.what, u, s.left[0], s.left[1])
		}
		// Closed: what still comes is the stack's to judge.
		if l.fastOut(t, l.podTCP(u, 1005, 6006, tcpACK, nil)) {
			t.Fatal("a packet after the close took the fast path")
		}
		if l.fastIn(t, l.remoteTCP(u.inverse(), 6006, 1005, tcpACK, nil)) {
			t.Fatal("a remote packet after the close took the fast path")
		}

		// The kernel's verdict on a new SYN of the same tuple, sent through the lab's
		// stack from the pod's side of the veth, with and without pod_ingress seeing it
		// first: conntrack must call it NEW only after pod_ingress expired the entry.
		rules := "table ip cttest {\n chain forward {\n  type filter hook forward priority 0; policy accept;\n" +
			"  ct state new counter\n  ct state established counter\n }\n}\n"
		if err := inNS(l.ns, func() error {
			cmd := exec.Command("nft", "-f", "-")
			cmd.Stdin = strings.NewReader(rules)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("nft -f: %w: %s", err, out)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		// What the expiry avoids: a SYN on the tuple of an entry conntrack holds as
		// ESTABLISHED is counted established (conntrack ignores it), not new.
		v := tuple{podIP, remotePodIP, 40034, 80}
		l.ctInsert(t, v, v.inverse(), "ESTABLISHED", "ASSURED,SEEN_REPLY")
		l.inject(t, l.podTCP(v, 777777, 0, tcpSYN, nil))
		if newN, estN := l.nftCounts(t); newN != 0 || estN != 1 {
			t.Fatalf("a SYN on an established entry's tuple: counted new %d, established %d times; want established once", newN, estN)
		}
		new0, est0 := l.nftCounts(t)

		syn := l.podTCP(u, 777777, 0, tcpSYN, nil)
		if l.fastOut(t, syn) {
			t.Fatal("the SYN took the fast path")
		}
		if _, _, ok := l.ctEntry(t, u); ok {
			t.Fatal("conntrack still holds the closed flow after pod_ingress saw a SYN on its tuple")
		}
		l.inject(t, syn)
		newN, estN := l.nftCounts(t)
		newN, estN = newN-new0, estN-est0
		line, _, _ := l.ctEntry(t, u)
		t.Logf("after the SYN through the stack: new %d, established %d; conntrack: %s", newN, estN, line)
		if newN != 1 || estN != 0 {
			t.Fatalf("the kernel counted the SYN as new %d, established %d times; want new once", newN, estN)
		}
		if !strings.Contains(line, "SYN_SENT") {
			t.Fatalf("conntrack holds %q after the SYN, want a new flow in SYN_SENT", line)
		}
	})
}

// inject sends frame out of pod0c, the pod's end of the veth, into the lab's stack.
func (l *lab) inject(t *testing.T, frame []byte) {
	t.Helper()
	if err := inNS(l.ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		peer, err := net.InterfaceByName("pod0c")
		if err != nil {
			return fmt.Errorf("find pod0c: %w", err)
		}
		sa := &unix.SockaddrLinklayer{Ifindex: peer.Index, Protocol: 0x0008}
		return unix.Sendto(fd, frame, 0, sa)
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
}

// nftCounts returns the packets of the lab's "ct state new" and "ct state
// established" counters.
func (l *lab) nftCounts(t *testing.T) (newN, estN int) {
	t.Helper()
	out, err := l.exec(t, "nft", "list", "chain", "ip", "cttest", "forward")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "packets" {
				n, _ := strconv.Atoi(f[i+1])
				switch {
				case strings.Contains(line, "state new"):
					newN = n
				case strings.Contains(line, "state established"):
					estN = n
				}
			}
		}
	}
	return newN, estN
}
