package bpf

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// kernelDropReasons reads enum skb_drop_reason from the running kernel's BTF: the
// test's own decoder of the tracer's reason codes, independent of maps/.
func kernelDropReasons(t *testing.T) map[uint32]string {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatalf("load kernel BTF: %v", err)
	}
	var e *btf.Enum
	if err := spec.TypeByName("skb_drop_reason", &e); err != nil {
		t.Fatalf("find enum skb_drop_reason: %v", err)
	}
	out := map[uint32]string{}
	for _, v := range e.Values {
		out[uint32(v.Value)] = v.Name
	}
	return out
}

// redirectDrops returns the packets of redirect_drops per (kernel reason, hook),
// summed over CPUs.
func (l *lab) redirectDrops(t *testing.T) map[IsthmusRedirectDropKey]uint64 {
	t.Helper()
	return perCPUPackets[IsthmusRedirectDropKey](t, l.objs.RedirectDrops)
}

func sum[K comparable](m map[K]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// linkStats returns the kernel's statistics of the interface called name in ns.
func linkStats(t *testing.T, ns netns.NsHandle, name string) netlink.LinkStatistics {
	t.Helper()
	var st netlink.LinkStatistics
	err := inNS(ns, func() error {
		lk, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		st = *lk.Attrs().Statistics
		return nil
	})
	if err != nil {
		t.Fatalf("read statistics of %s: %v", name, err)
	}
	return st
}

// noIPv6 turns IPv6 off on every interface of the calling thread's namespace.
func noIPv6() error {
	ents, err := os.ReadDir("/proc/sys/net/ipv6/conf")
	if err != nil {
		return err
	}
	for _, e := range ents {
		f := "/proc/sys/net/ipv6/conf/" + e.Name() + "/disable_ipv6"
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", f, err)
		}
	}
	return nil
}

// setLink sets the interface called name in ns up or down.
func setLink(t *testing.T, ns netns.NsHandle, name string, up bool) {
	t.Helper()
	err := inNS(ns, func() error {
		lk, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if up {
			return netlink.LinkSetUp(lk)
		}
		return netlink.LinkSetDown(lk)
	})
	if err != nil {
		t.Fatalf("set %s up=%v: %v", name, up, err)
	}
}

// TestRedirectDropsAfterReturn attaches underlay_ingress to the underlay device and
// the kfree_skb tracer, moves the pod's end of its veth into a namespace of its own,
// and sends real GENEVE frames into the underlay. With the pod's eth0 down every
// frame the program delivers (and counts as deliver_pod) is freed by the kernel
// after the program returned: redirect_drops must count exactly those, per kernel
// reason, and nothing while the pod is up (the pod's own stack then frees them, in
// its namespace: not our loss), nor for unrelated drops elsewhere on the machine.
func TestRedirectDropsAfterReturn(t *testing.T) {
	l := newLab(t)
	reasons := kernelDropReasons(t)
	podNS := newNetns(t)
	other := newNetns(t)

	// No IPv6: its neighbour discovery and MLD would add frames of their own to the
	// interface counters the test compares.
	for _, ns := range []netns.NsHandle{l.ns, podNS} {
		if err := inNS(ns, noIPv6); err != nil {
			t.Fatalf("disable IPv6: %v", err)
		}
	}
	// The pod's eth0 lives in its own namespace, as a real pod's does.
	err := inNS(l.ns, func() error {
		c, err := netlink.LinkByName("pod0c")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(c, int(podNS))
	})
	if err != nil {
		t.Fatalf("move pod0c: %v", err)
	}
	err = inNS(podNS, func() error {
		for _, n := range []string{"lo", "pod0c"} {
			lk, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(lk); err != nil {
				return err
			}
		}
		c, _ := netlink.LinkByName("pod0c")
		if err := netlink.LinkSetHardwareAddr(c, podMAC); err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(podIP.String() + "/24")
		return netlink.AddrAdd(c, a)
	})
	if err != nil {
		t.Fatalf("configure pod namespace: %v", err)
	}
	if err := inNS(other, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatalf("configure other namespace: %v", err)
	}

	var (
		ingress, tracer link.Link
		fd              int
		und1            int
	)
	err = inNS(l.ns, func() error {
		var err error
		ingress, err = link.AttachTCX(link.TCXOptions{Interface: l.und.Attrs().Index, Program: l.objs.UnderlayIngress, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("attach underlay_ingress: %w", err)
		}
		tracer, err = link.AttachTracing(link.TracingOptions{Program: l.objs.KfreeSkbAfterRedirect})
		if err != nil {
			return fmt.Errorf("attach tp_btf/kfree_skb: %w", err)
		}
		u, err := netlink.LinkByName("und1")
		if err != nil {
			return err
		}
		und1 = u.Attrs().Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: und1})
	})
	if ingress != nil {
		defer ingress.Close()
	}
	if tracer != nil {
		defer tracer.Close()
	}
	if err != nil {
		t.Fatalf("set up: %v", err)
	}
	defer unix.Close(fd)

	const n = 7
	o := goodOpts(podIP)
	// A TCP ACK of a flow conntrack holds as established: delivered straight to the
	// pod with bpf_redirect_peer (lib/fib.h forward_to_pod), counted as ct_fast.
	l.ctEstablished(t, tuple{podIP, remotePodIP, 5000, 4000})
	ack := geneveFrame(l, o, innerEth(ipv4Packet(remotePodIP, podIP, 6, ipOpts{ttl: 64},
		tcpWithOptions(remotePodIP, podIP, 4000, 5000, 0x10, nil))))
	// A UDP datagram opens a flow: handed to the stack through isthmus0, which forwards
	// it to the pod's host veth (lib/stack.h).
	udp := geneveFrame(l, o, innerEth(innerIPv4(o)))

	send := func(frame []byte) {
		t.Helper()
		for i := 0; i < n; i++ {
			if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: und1, Halen: 6}); err != nil {
				t.Fatalf("send on und1: %v", err)
			}
		}
		time.Sleep(200 * time.Millisecond) // the backlog and softirqs run
	}
	deliverPod := metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)
	ctFast := metricKey(IsthmusMetricMETRIC_CT_FAST, IsthmusHookHOOK_UNDERLAY_TC)
	type step struct {
		name      string
		frame     []byte
		peer      bool // bpf_redirect_peer, not the stack
		podUp     bool
		wantDrops uint64
		// txDropped: the pod's host veth counts the drops itself (the stack's
		// forwarding ends in veth_xmit); a bpf_redirect_peer the kernel refuses in
		// skb_do_redirect is counted by no interface.
		txDropped bool
	}
	for _, s := range []step{
		{"peer delivery, pod up", ack, true, true, 0, false},
		{"stack delivery, pod up", udp, false, true, 0, false},
		{"peer delivery, pod down", ack, true, false, n, false},
		{"stack delivery, pod down", udp, false, false, n, true},
	} {
		setLink(t, podNS, "pod0c", s.podUp)
		time.Sleep(50 * time.Millisecond)
		before, dropsBefore := l.counts(t), l.redirectDrops(t)
		hostBefore, podBefore := linkStats(t, l.ns, "pod0h"), linkStats(t, podNS, "pod0c")
		send(s.frame)
		d := delta(before, l.counts(t))
		hostAfter, podAfter := linkStats(t, l.ns, "pod0h"), linkStats(t, podNS, "pod0c")
		drops := map[IsthmusRedirectDropKey]uint64{}
		for k, v := range l.redirectDrops(t) {
			if v != dropsBefore[k] {
				drops[k] = v - dropsBefore[k]
			}
		}
		named := map[string]uint64{}
		for k, v := range drops {
			named[fmt.Sprintf("%s@%d", reasons[k.Reason], k.Hook)] = v
		}
		t.Logf("%s: deliver_pod +%d, redirect_drops %v, pod0h tx_dropped +%d, pod0c rx +%d",
			s.name, d[deliverPod], named, hostAfter.TxDropped-hostBefore.TxDropped, podAfter.RxPackets-podBefore.RxPackets)

		// The program believed it delivered every frame.
		if d[deliverPod] != n {
			t.Fatalf("%s: deliver_pod +%d, want %d (counters %v)", s.name, d[deliverPod], n, d)
		}
		// By the path the step names.
		want := uint64(0)
		if s.peer {
			want = n
		}
		if d[ctFast] != want {
			t.Fatalf("%s: ct_fast +%d, want %d (counters %v)", s.name, d[ctFast], want, d)
		}
		if got := sum(drops); got != s.wantDrops {
			t.Errorf("%s: redirect_drops +%d (%v), want %d", s.name, got, named, s.wantDrops)
		}
		for k := range drops {
			if k.Hook != uint8(IsthmusHookHOOK_UNDERLAY_TC) {
				t.Errorf("%s: drop counted at hook %d, want underlay_tc", s.name, k.Hook)
			}
			if _, ok := reasons[k.Reason]; !ok {
				t.Errorf("%s: reason %d is not in the kernel's enum skb_drop_reason", s.name, k.Reason)
			}
		}
		// Independent accounts of the same packets: what the pod received, and what
		// its host veth says it dropped.
		lost := n - (podAfter.RxPackets - podBefore.RxPackets)
		if s.podUp && lost != 0 {
			t.Errorf("%s: pod0c received %d of %d", s.name, n-lost, n)
		}
		if !s.podUp && lost != n {
			t.Errorf("%s: pod0c (down) received %d", s.name, n-lost)
		}
		if s.txDropped && hostAfter.TxDropped-hostBefore.TxDropped != sum(drops) {
			t.Errorf("%s: pod0h tx_dropped +%d, redirect_drops +%d: they must agree",
				s.name, hostAfter.TxDropped-hostBefore.TxDropped, sum(drops))
		}
	}

	// Delivered to this host through isthmus0, whose stack then frees it (no socket
	// on the port): the host's decision, not a loss of the redirect.
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	cfg.TunnelIp = be32(hostIP)
	if err := l.objs.Config.Put(uint32(0), cfg); err != nil {
		t.Fatalf("write config: %v", err)
	}
	toHost := goodOpts(hostIP)
	before, dropsBefore := l.counts(t), sum(l.redirectDrops(t))
	send(geneveFrame(l, toHost, innerEth(innerIPv4(toHost))))
	if d := delta(before, l.counts(t))[metricKey(IsthmusMetricMETRIC_DELIVER_HOST, IsthmusHookHOOK_UNDERLAY_TC)]; d != n {
		t.Fatalf("host delivery: deliver_host +%d, want %d", d, n)
	}
	if got := sum(l.redirectDrops(t)) - dropsBefore; got != 0 {
		t.Errorf("host delivery: redirect_drops +%d for packets the host stack refused", got)
	}

	// Unrelated drops: UDP to a closed port, freed with NO_SOCKET, in another
	// namespace and in the lab's own; the counters must not move.
	dropsBefore = sum(l.redirectDrops(t))
	for _, ns := range []netns.NsHandle{other, l.ns} {
		if err := inNS(ns, func() error {
			c, err := net.Dial("udp4", "127.0.0.1:9")
			if err != nil {
				return err
			}
			defer c.Close()
			for i := 0; i < n; i++ {
				c.Write([]byte("nobody listens")) // ECONNREFUSED after the first ICMP: expected
			}
			return nil
		}); err != nil {
			t.Fatalf("send to a closed port: %v", err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if got := sum(l.redirectDrops(t)) - dropsBefore; got != 0 {
		t.Errorf("redirect_drops +%d for drops that were never redirected", got)
	}
}
