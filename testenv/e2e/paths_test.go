package e2e

import (
	"context"
	be "encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// tunnelAddr returns a node's tunnel address: the first address of its podCIDR.
func tunnelAddr(t *testing.T, l *testenv.Lab, node string) netip.Addr {
	t.Helper()
	n, ok := l.Node(node)
	if !ok {
		t.Fatalf("no node %q", node)
	}
	p := n.PodCIDR
	if len(n.PodCIDRs) > 0 {
		p = n.PodCIDRs[0]
	}
	if !p.IsValid() {
		t.Fatalf("node %s has no podCIDR", node)
	}
	return p.Masked().Addr().Next()
}

// linkAt returns the named link of the namespace ns.
func linkAt(t *testing.T, ns, name string) netlink.Link {
	t.Helper()
	h, err := netns.GetFromPath(testenv.NSPath(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	lk, err := nh.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s in %s: %v", name, ns, err)
	}
	return lk
}

// addrsAt returns the IPv4 addresses of the named link of the namespace ns.
func addrsAt(t *testing.T, ns, name string) []netip.Addr {
	t.Helper()
	h, err := netns.GetFromPath(testenv.NSPath(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	lk, err := nh.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s in %s: %v", name, ns, err)
	}
	as, err := nh.AddrList(lk, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			out = append(out, ip)
		}
	}
	return out
}

// flushNeigh empties the underlay neighbour table of each node and checks it is
// empty, so the next packet toward the underlay next hop finds it unresolved.
func flushNeigh(t *testing.T, l *testenv.Lab, nodes ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range nodes {
		if out, err := l.Exec(ctx, l.NodeNS(n), "ip", "neigh", "flush", "dev", testenv.UnderlayDev); err != nil {
			t.Fatalf("flush neighbours of %s: %v\n%s", n, err, out)
		}
		out, err := l.Exec(ctx, l.NodeNS(n), "ip", "neigh", "show", "dev", testenv.UnderlayDev)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "lladdr") {
			t.Fatalf("node %s still has resolved underlay neighbours after the flush:\n%s", n, out)
		}
	}
}

// nodeMetrics reads a node's counters from its pinned metrics map.
func nodeMetrics(t *testing.T, l *testenv.Lab, node string) map[maps.MetricKey]maps.Counter {
	t.Helper()
	s, err := maps.OpenPinned(l.PinDir(node))
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	defer s.Close()
	m, err := maps.ReadMetrics(s.Map(maps.MapMetrics))
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	return m
}

// packets returns the packet count of code at hook.
func packets(m map[maps.MetricKey]maps.Counter, code uint16, h maps.Hook) uint64 {
	return m[maps.MetricKey{Code: code, Hook: h}].Packets
}

// Codes of enum metric and enum drop_reason (bpf/lib/types.h, bpf/lib/drop.h).
const (
	metricDecap       = 2
	metricDeliverPod  = 3
	metricDeliverHost = 4
)

func dropCode(t *testing.T, name string) uint16 {
	t.Helper()
	for _, r := range maps.DropReasons() {
		if r.Const == name {
			return uint16(-r.Code)
		}
	}
	t.Fatalf("no drop reason %s", name)
	return 0
}

// formatMetrics renders counters one per line, sorted, for logs.
func formatMetrics(m map[maps.MetricKey]maps.Counter) string {
	var lines []string
	for k, c := range m {
		lines = append(lines, fmt.Sprintf("  %-18s %-14s %d packets", k.Name(), k.Hook, c.Packets))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestHostTraffic: traffic the nodes themselves send and receive through
// isthmus0 works on the first packet, with the underlay neighbour tables of the
// nodes involved flushed before every probe. Each probe is one echo request or one
// TCP connect bounded below the kernel's initial SYN retransmission timeout (1s),
// so a first packet lost toward an unresolved next hop fails the probe. This
// guards the fix of 618cbad: bpf_redirect_neigh with explicit next-hop parameters
// at isthmus0 egress kept the overlay route as the skb's dst and lost the queued
// packet once ARP resolved.
func TestHostTraffic(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	a1Tun := tunnelAddr(t, l, "a1")
	b2Tun := tunnelAddr(t, l, "b2")
	if got := addrsAt(t, l.NodeNS("a1"), "isthmus0"); len(got) != 1 || got[0] != a1Tun {
		t.Fatalf("isthmus0 on a1 has %v, want exactly the tunnel address %s", got, a1Tun)
	}
	if a1Tun != netip.MustParseAddr("10.244.1.1") {
		t.Fatalf("a1's tunnel address %s; the default scenario gives 10.244.1.1", a1Tun)
	}

	servers := map[string]*testenv.EchoServer{}
	for _, ns := range []string{l.PodNS("b1-p1"), l.NodeNS("a1")} {
		srv, err := testenv.StartEchoServer(ns)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		servers[ns] = srv
	}

	for _, tc := range []struct {
		name     string
		srcNS    string
		dstNS    string
		dst      netip.Addr
		saw      netip.Addr // the source the server must see
		involved []string   // nodes whose neighbours are flushed first
	}{
		{"node a1 to pod b1-p1", l.NodeNS("a1"), l.PodNS("b1-p1"), l.PodAddr("b1-p1"), a1Tun, []string{"a1", "b1"}},
		{"pod b1-p1 to a1's tunnel address", l.PodNS("b1-p1"), l.NodeNS("a1"), a1Tun, l.PodAddr("b1-p1"), []string{"b1", "a1"}},
		{"node b2 to a1's tunnel address", l.NodeNS("b2"), l.NodeNS("a1"), a1Tun, b2Tun, []string{"b2", "a1"}},
		{"pod a1-p1 to its node's tunnel address", l.PodNS("a1-p1"), l.NodeNS("a1"), a1Tun, l.PodAddr("a1-p1"), []string{"a1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flushNeigh(t, l, tc.involved...)
			if err := testenv.Ping(tc.srcNS, tc.dst, 2*time.Second); err != nil {
				t.Errorf("the first echo request to %s got no reply: %v", tc.dst, err)
			}
			flushNeigh(t, l, tc.involved...)
			saw, err := testenv.TCPEcho(tc.srcNS, netip.AddrPortFrom(tc.dst, servers[tc.dstNS].TCPPort), 900*time.Millisecond)
			switch {
			case err != nil:
				t.Errorf("TCP connect to %s without a SYN retransmission: %v", tc.dst, err)
			case saw != tc.saw:
				t.Errorf("TCP to %s: the server saw source %s, want %s", tc.dst, saw, tc.saw)
			}
		})
	}
	if t.Failed() {
		for _, n := range []string{"a1", "b1", "b2"} {
			t.Logf("counters of %s:\n%s", n, formatMetrics(nodeMetrics(t, l, n)))
		}
	}
}

// bpftoolNet is the part of `bpftool net show -j` these tests read.
type bpftoolNet []struct {
	XDP []struct {
		Devname string `json:"devname"`
		Mode    string `json:"mode"`
		ID      uint32 `json:"id"`
	} `json:"xdp"`
}

func bpftoolNetShow(t *testing.T, l *testenv.Lab, ns, dev string) bpftoolNet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := testenv.Command(ctx, ns, "bpftool", "-j", "net", "show", "dev", dev).Output()
	if err != nil {
		t.Fatalf("bpftool net show dev %s in %s: %v", dev, ns, err)
	}
	var res bpftoolNet
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("parse bpftool net show: %v\n%s", err, out)
	}
	return res
}

// linkInfo returns the kernel's view of a pinned link.
func linkInfo(t *testing.T, path string) *link.Info {
	t.Helper()
	lk, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		t.Fatalf("open pinned link: %v", err)
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		t.Fatalf("link info of %s: %v", path, err)
	}
	return info
}

// TestXDPDecap: with every agent started with --decap xdp, the whole default
// matrix passes, an XDP program (underlay_xdp, through the pinned link) is
// attached to eth0 of every node, and the counters show XDP popped every frame
// while underlay_ingress delivered them using the metadata XDP left: METRIC_DECAP
// on the XDP hook only, deliveries on the TC hook.
func TestXDPDecap(t *testing.T) {
	beside(t, weightLab)
	l := upWith(t, "--decap", "xdp")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := l.Check(ctx)
	t.Logf("matrix:\n%s", m)
	if err != nil {
		t.Error(err)
	}
	for _, p := range m.Probes {
		if p.Proto != testenv.ICMP && p.OK && p.Saw != l.PodAddr(p.Src) {
			t.Errorf("%s -> %s %s: server saw %s, want the pod's own %s", p.Src, p.Dst, p.Proto, p.Saw, l.PodAddr(p.Src))
		}
	}

	for _, n := range l.Scenario.Nodes() {
		node := n.Name
		// The XDP program on eth0 is ours, in native (driver) mode, through the pinned link.
		net := bpftoolNetShow(t, l, l.NodeNS(node), testenv.UnderlayDev)
		var xdpID uint32
		for _, e := range net {
			for _, x := range e.XDP {
				if x.Devname == testenv.UnderlayDev {
					xdpID = x.ID
					if x.Mode != "driver" {
						t.Errorf("%s: XDP on eth0 in mode %q, want driver (native)", node, x.Mode)
					}
				}
			}
		}
		if xdpID == 0 {
			t.Errorf("%s: bpftool net shows no XDP program on eth0: %+v", node, net)
			continue
		}
		info := linkInfo(t, datapath.LinkPin(l.PinDir(node), testenv.UnderlayDev, datapath.HookUnderlayXDP))
		if info.Type != link.XDPType || uint32(info.Program) != xdpID {
			t.Errorf("%s: pinned XDP link is type %v with program %d, bpftool shows program %d on eth0", node, info.Type, info.Program, xdpID)
		}
		if out, err := l.Exec(ctx, l.NodeNS(node), "bpftool", "prog", "show", "id", strconv.Itoa(int(xdpID))); err != nil || !strings.Contains(out, "underlay_xdp") {
			t.Errorf("%s: program %d on eth0 is not underlay_xdp: %v\n%s", node, xdpID, err, out)
		}

		c := nodeMetrics(t, l, node)
		t.Logf("counters of %s:\n%s", node, formatMetrics(c))
		decapXDP := packets(c, metricDecap, maps.HookUnderlayXDP)
		decapTC := packets(c, metricDecap, maps.HookUnderlayTC)
		deliverTC := packets(c, metricDeliverPod, maps.HookUnderlayTC) + packets(c, metricDeliverHost, maps.HookUnderlayTC)
		if decapXDP == 0 {
			t.Errorf("%s: METRIC_DECAP on underlay_xdp is 0: XDP popped nothing", node)
		}
		if decapTC != 0 {
			t.Errorf("%s: METRIC_DECAP on underlay_tc is %d: TC popped frames XDP should have", node, decapTC)
		}
		if packets(c, metricDeliverPod, maps.HookUnderlayTC) == 0 {
			t.Errorf("%s: no METRIC_DELIVER_POD on underlay_tc: nothing XDP popped was delivered to a pod by underlay_ingress", node)
		}
		// GRO may merge frames between XDP and TC, never split them.
		if deliverTC > decapXDP {
			t.Errorf("%s: underlay_tc delivered %d packets, more than the %d XDP popped", node, deliverTC, decapXDP)
		}
		for k, v := range c {
			if k.IsDrop() && (k.Hook == maps.HookUnderlayTC || k.Hook == maps.HookUnderlayXDP) {
				t.Errorf("%s: %d drops %s at %s during a clean matrix", node, v.Packets, k.Name(), k.Hook)
			}
		}
	}
}

// stream sends numbered UDP datagrams every interval from one pod to another
// and records which arrived.
type stream struct {
	name     string
	conn     *net.UDPConn // sender, in the source pod
	recv     *net.UDPConn // receiver, in the destination pod
	interval time.Duration

	mu       sync.Mutex
	sent     uint64
	sendErrs uint64
	got      map[uint64]int
	started  time.Time
	stop     chan struct{}
	done     sync.WaitGroup
	// stopped is when finish stopped the sender; once makes finish
	// idempotent (the test's cleanup finishes a stream a failure left running).
	stopped time.Time
	once    sync.Once
}

func startStream(t *testing.T, l *testenv.Lab, src, dst string, interval time.Duration) *stream {
	t.Helper()
	s := &stream{name: src + "->" + dst, interval: interval, got: map[uint64]int{}, stop: make(chan struct{})}
	err := testenv.Do(l.PodNS(dst), func() error {
		var err error
		s.recv, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", dst, err)
	}
	to := netip.AddrPortFrom(l.PodAddr(dst), uint16(s.recv.LocalAddr().(*net.UDPAddr).Port))
	err = testenv.Do(l.PodNS(src), func() error {
		var err error
		s.conn, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
		return err
	})
	if err != nil {
		s.recv.Close()
		t.Fatalf("open udp in %s: %v", src, err)
	}
	t.Cleanup(func() { s.finish(0) })
	s.done.Add(2)
	go func() {
		defer s.done.Done()
		buf := make([]byte, 64)
		for {
			n, err := s.recv.Read(buf)
			if err != nil {
				return
			}
			if n >= 8 {
				seq := be.BigEndian.Uint64(buf)
				s.mu.Lock()
				s.got[seq]++
				s.mu.Unlock()
			}
		}
	}()
	go func() {
		defer s.done.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		s.mu.Lock()
		s.started = time.Now()
		s.mu.Unlock()
		msg := make([]byte, 64)
		copy(msg[8:], "isthmus restart probe")
		for seq := uint64(0); ; seq++ {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			be.BigEndian.PutUint64(msg, seq)
			_, err := s.conn.Write(msg)
			s.mu.Lock()
			s.sent++
			if err != nil {
				s.sendErrs++
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// finish stops sending, waits drain for stragglers, closes both sockets and
// returns how many datagrams were sent, received (distinct) and duplicated, and
// the mean interval between sends (the ticker may drop ticks on a busy machine).
// Once finished, it returns the same counts again.
func (s *stream) finish(drain time.Duration) (sent, received, dups, sendErrs uint64, mean time.Duration) {
	s.once.Do(func() {
		close(s.stop)
		s.stopped = time.Now()
		time.Sleep(drain)
		s.conn.Close()
		s.recv.Close()
		s.done.Wait()
	})
	stopped := s.stopped
	s.mu.Lock()
	defer s.mu.Unlock()
	for seq, n := range s.got {
		if seq < s.sent {
			received++
		}
		if n > 1 {
			dups += uint64(n - 1)
		}
	}
	if s.sent > 0 {
		mean = stopped.Sub(s.started) / time.Duration(s.sent)
	}
	return s.sent, received, dups, s.sendErrs, mean
}

// restartAgents stops the agents of nodes, leaves traffic 200 ms with none
// running, starts them again with args and waits until they are ready.
func restartAgents(t *testing.T, l *testenv.Lab, round int, nodes []string, args ...string) {
	t.Helper()
	for _, n := range nodes {
		if err := l.StopAgent(n); err != nil {
			t.Fatalf("round %d: stop agent %s: %v", round, n, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // traffic with no agent running
	for _, n := range nodes {
		if err := l.StartAgent(n, args...); err != nil {
			t.Fatalf("round %d: start agent %s: %v", round, n, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := l.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatalf("round %d: %v", round, err)
	}
}

// podLinks returns link id and program id of every pinned pod_ingress link of a
// node, by interface, cross-checked against what the kernel runs at the
// interface's tcx ingress.
func podLinks(t *testing.T, l *testenv.Lab, node string) map[string][2]uint32 {
	t.Helper()
	pinned, err := datapath.ListLinks(l.PinDir(node))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]uint32{}
	for _, p := range pinned {
		if p.Hook != datapath.HookPodIngress {
			continue
		}
		info := linkInfo(t, p.Path)
		out[p.Ifname] = [2]uint32{uint32(info.ID), uint32(info.Program)}
		ifindex := linkAt(t, l.NodeNS(node), p.Ifname).Attrs().Index
		if tcx := info.TCX(); tcx == nil || int(tcx.Ifindex) != ifindex {
			t.Errorf("%s %s: pinned link %d is not a tcx link on ifindex %d: %+v", node, p.Ifname, info.ID, ifindex, tcx)
		}
		// What the kernel runs at the interface's tcx ingress (bpftool 7.1 here
		// predates tcx and shows none of it).
		var res *link.QueryResult
		err := testenv.Do(l.NodeNS(node), func() error {
			var err error
			res, err = link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
			return err
		})
		if err != nil {
			t.Fatalf("%s %s: query tcx ingress: %v", node, p.Ifname, err)
		}
		var attached []string
		for _, ap := range res.Programs {
			lid, _ := ap.LinkID()
			attached = append(attached, fmt.Sprintf("program %d link %d", ap.ID, lid))
		}
		if len(res.Programs) != 1 || res.Programs[0].ID != info.Program {
			t.Errorf("%s %s: tcx ingress runs %v, want only program %d of pinned link %d", node, p.Ifname, attached, info.Program, info.ID)
		} else if lid, ok := res.Programs[0].LinkID(); ok && lid != info.ID {
			t.Errorf("%s %s: tcx ingress runs %v, want it through pinned link %d", node, p.Ifname, attached, info.ID)
		}
	}
	for _, pod := range l.Scenario.Pods() {
		if pod.Node == node {
			if _, ok := out[l.HostVeth(pod.Name)]; !ok {
				t.Errorf("%s: no pinned pod_ingress link for %s (pinned: %v)", node, l.HostVeth(pod.Name), pinned)
			}
		}
	}
	return out
}

// TestRestartWithoutLoss: UDP datagrams every 2ms from a1-p1 to b1-p1 and back
// keep arriving, every one of them, while the agents of a1 and b1 are stopped and
// started three times. Each restart swaps the program behind the pinned links:
// the program ids on the pod interfaces change, the link ids stay. The pods are
// the CNI plugin's: their reservations stay as they were, and the restarted
// IPAM serves again.
func TestRestartWithoutLoss(t *testing.T) {
	l := upDefault(t)
	restarted := []string{"a1", "b1"}
	reserved := map[string][]netip.Addr{}
	for _, n := range restarted {
		reserved[n] = reservedAddrs(t, l, n)
	}
	// Warm the path so neighbour resolution is not part of the measurement.
	for _, pr := range [][2]string{{"a1-p1", "b1-p1"}, {"b1-p1", "a1-p1"}} {
		if err := testenv.Ping(l.PodNS(pr[0]), l.PodAddr(pr[1]), 2*time.Second); err != nil {
			t.Fatalf("ping %s -> %s before the restarts: %v", pr[0], pr[1], err)
		}
	}
	before := map[string]map[string][2]uint32{}
	for _, n := range restarted {
		before[n] = podLinks(t, l, n)
	}

	const interval = 2 * time.Millisecond
	streams := []*stream{
		startStream(t, l, "a1-p1", "b1-p1", interval),
		startStream(t, l, "b1-p1", "a1-p1", interval),
	}
	time.Sleep(300 * time.Millisecond)

	for round := 1; round <= 3; round++ {
		restartAgents(t, l, round, restarted)
		for _, n := range restarted {
			after := podLinks(t, l, n)
			checkLinksUpdated(t, fmt.Sprintf("round %d: %s", round, n), "restart", before[n], after)
			before[n] = after
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)

	checkNoLoss(t, streams, interval, "restarts")
	for _, n := range restarted {
		if got := reservedAddrs(t, l, n); !slices.Equal(got, reserved[n]) || len(got) == 0 {
			t.Errorf("%s: reservations %v after the restarts, want %v as before", n, got, reserved[n])
		}
		waitIPAM(t, l, n, 10*time.Second, "after the restarts", func(st ipam.Status) bool { return st.Ready && len(st.Outside) == 0 })
	}
	if t.Failed() {
		for _, n := range restarted {
			t.Logf("counters of %s:\n%s\nagent log:\n%s", n, formatMetrics(nodeMetrics(t, l, n)), tailFile(l.AgentLog(n)))
		}
	}
}

// sendScript puts count GENEVE frames (as a Linux geneve device sends them,
// inner ICMP echo) on iface of the namespace it runs in.
const sendScript = `
import sys
from scapy.all import Ether, IP, UDP, ICMP, Raw, sendp
from scapy.contrib.geneve import GENEVE
iface, src_mac, dst_mac, outer_src, outer_dst, vni, inner_src, inner_dst, count = sys.argv[1:10]
frame = (Ether(src=src_mac, dst=dst_mac)
         / IP(src=outer_src, dst=outer_dst, ttl=64, flags="DF")
         / UDP(sport=50123, dport=6081, chksum=0)
         / GENEVE(version=0, proto=0x6558, vni=int(vni))
         / Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
         / IP(src=inner_src, dst=inner_dst, ttl=64)
         / ICMP(type=8, id=0x1d, seq=1)
         / Raw(b"isthmus drop probe"))
sendp(frame, iface=iface, count=int(count), inter=0.05, verbose=False)
`

// TestDropCounted: GENEVE that decapsulation must refuse is dropped and counted
// exactly: a frame with our VNI from an address that is no peer moves
// DROP_UNKNOWN_PEER, and a frame from a real peer (b1) whose inner source lies
// outside b1's podCIDR moves DROP_INNER_SRC_DENIED, by the number of frames sent,
// at a1's underlay TC hook; nothing of either is decapsulated.
func TestDropCounted(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	a1, _ := l.Node("a1")
	b1, _ := l.Node("b1")
	stranger := netip.MustParseAddr("172.16.9.99")
	for _, n := range l.Scenario.Nodes() {
		if n.Address == stranger {
			t.Fatalf("%s is node %s; pick another stranger", stranger, n.Name)
		}
		if n.Site.Subnet.Contains(stranger) {
			t.Fatalf("%s is inside site %s's subnet %s", stranger, n.Site.Name, n.Site.Subnet)
		}
	}
	a1MAC := linkAt(t, l.NodeNS("a1"), testenv.UnderlayDev).Attrs().HardwareAddr.String()
	b1MAC := linkAt(t, l.NodeNS("b1"), testenv.UnderlayDev).Attrs().HardwareAddr.String()
	b1Gw := routerPortMAC(t, l, "b1")
	deniedSrc := l.PodAddr("b2-p1") // in site-b, but b2's podCIDR, not b1's
	if b1.PodCIDR.Contains(deniedSrc) {
		t.Fatalf("%s is inside b1's podCIDR %s", deniedSrc, b1.PodCIDR)
	}

	for _, tc := range []struct {
		name   string
		ns     string // where scapy runs
		args   []string
		count  int
		reason string
	}{
		{"non-peer", l.RouterNS(), []string{testenv.RouterPort("a1"), routerPortMAC(t, l, "a1"), a1MAC,
			stranger.String(), a1.Address.String(), strconv.Itoa(vni), l.PodAddr("b1-p1").String(), l.PodAddr("a1-p1").String()},
			5, "DROP_UNKNOWN_PEER"},
		{"inner source outside the peer's podCIDR", l.NodeNS("b1"), []string{testenv.UnderlayDev, b1MAC, b1Gw,
			b1.Address.String(), a1.Address.String(), strconv.Itoa(vni), deniedSrc.String(), l.PodAddr("a1-p1").String()},
			4, "DROP_INNER_SRC_DENIED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code := dropCode(t, tc.reason)
			before := nodeMetrics(t, l, "a1")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			argv := append([]string{"/usr/bin/python3", "-c", sendScript}, tc.args...)
			argv = append(argv, strconv.Itoa(tc.count))
			if out, err := l.Exec(ctx, tc.ns, argv...); err != nil {
				t.Fatalf("send with scapy: %v\n%s", err, out)
			}
			// The frames are on the wire when sendp returns; give the receiver a moment.
			var after map[maps.MetricKey]maps.Counter
			deadline := time.Now().Add(2 * time.Second)
			for {
				after = nodeMetrics(t, l, "a1")
				got := packets(after, code, maps.HookUnderlayTC) - packets(before, code, maps.HookUnderlayTC)
				if got >= uint64(tc.count) || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // let any extra count show up too
			after = nodeMetrics(t, l, "a1")
			got := packets(after, code, maps.HookUnderlayTC) - packets(before, code, maps.HookUnderlayTC)
			if got != uint64(tc.count) {
				t.Errorf("%s at underlay_tc moved by %d, want exactly the %d frames sent\nbefore:\n%s\nafter:\n%s",
					tc.reason, got, tc.count, formatMetrics(before), formatMetrics(after))
			}
			for _, h := range []maps.Hook{maps.HookUnderlayTC, maps.HookUnderlayXDP} {
				if d := packets(after, metricDecap, h) - packets(before, metricDecap, h); d != 0 {
					t.Errorf("METRIC_DECAP at %s moved by %d: a refused frame was decapsulated", h, d)
				}
			}
		})
	}
}

// checkLinksUpdated compares a node's pinned pod_ingress links (podLinks) before
// and after its agent was replaced ("restart", "upgrade"): every link is still
// there with the same ID, and runs a new program, swapped in through the link.
func checkLinksUpdated(t *testing.T, where, what string, before, after map[string][2]uint32) {
	t.Helper()
	for ifname, b := range before {
		a, ok := after[ifname]
		switch {
		case !ok:
			t.Errorf("%s %s: pinned pod_ingress link gone after the %s", where, ifname, what)
		case a[0] != b[0]:
			t.Errorf("%s %s: link id %d became %d: the %s replaced the link instead of updating it", where, ifname, b[0], a[0], what)
		case a[1] == b[1]:
			t.Errorf("%s %s: program id still %d: the new agent did not swap in its program", where, ifname, a[1])
		default:
			t.Logf("%s %s: link %d, program %d -> %d", where, ifname, a[0], b[1], a[1])
		}
	}
}

// checkNoLoss ends the streams and requires that they covered the agent
// replacements (what: "restarts", "upgrades") and lost nothing.
func checkNoLoss(t *testing.T, streams []*stream, interval time.Duration, what string) {
	t.Helper()
	for _, s := range streams {
		sent, received, dups, sendErrs, mean := s.finish(500 * time.Millisecond)
		lost := sent - received
		t.Logf("%s: sent %d datagrams (ticker %s, mean interval %s), received %d, lost %d, duplicated %d, send errors %d",
			s.name, sent, interval, mean.Round(10*time.Microsecond), received, lost, dups, sendErrs)
		if sent < 500 {
			t.Errorf("%s: only %d datagrams sent; the stream did not cover the %s", s.name, sent, what)
		}
		if lost != 0 {
			t.Errorf("%s: %d of %d datagrams lost across agent %s", s.name, lost, sent, what)
		}
	}
}
