package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/testenv"
)

// What TestDualStackStream sends and how fast it must arrive.
const (
	// streamDefaultSize crosses the lab as it is built, where every device keeps
	// its offloads; streamWireSize crosses with a router port that cuts every
	// tunnelled frame in software (slower, and its frames are captured whole).
	streamDefaultSize = 512 << 20
	streamWireSize    = 256 << 20
	// streamFloorMbps is the least goodput a stream may have. Measured on the
	// project's 2-core machine over seven runs (Gbit/s, both ways): TC decap
	// 4.8-13.2 with the lab's offloads and 2.3-4.7 with the router cutting the
	// frames; XDP decap 1.9-4.0 either way (a veth whose peer runs XDP has no
	// TSO, so the router cuts every frame before XDP sees it); with two busy
	// loops on the two cores beside it, no stream below 2.0. Broken segmentation
	// is three orders of magnitude below, stalling in retransmission timeouts:
	// with every frame larger than the underlay MTU dropped on the router (what
	// a GSO packet no device will cut comes to) iperf3 moved 0.2 Mbit/s; with
	// overlay_egress built without BPF_F_ADJ_ROOM_ENCAP_L4_UDP (the kernel then
	// frees most GSO packets it cannot segment) this test's first stream moved
	// 0.1-0.2 Mbit/s, two thirds of it retransmitted. 300 Mbit/s is well below a
	// loaded machine's slowest stream and far above any retransmission storm.
	streamFloorMbps = 300
	// streamChunk is the most one write or one read of a stream moves.
	streamChunk = 256 << 10
	// superFramesMin is how many packets larger than the tunnel MTU (GSO
	// packets, cut only later) a capture must hold before we believe GSO
	// happened; a few hundred are captured, and with TSO on most data packets
	// of a bulk flow are that large.
	superFramesMin = 10
	// wireFramesMin is how many data-carrying frames of the flow the capture on
	// the cutting router port must have checked.
	wireFramesMin = 200
)

// TestDualStackStream: IPv6 TCP segmentation offload through isthmus. On the
// dualstack scenario, with TC and with XDP decapsulation, a TCP connection
// between the IPv6 addresses of a1-p1 and b1-p1 carries its bytes whole and in
// order (a pseudorandom pattern the receiver checks byte for byte, then the FIN)
// at no less than streamFloorMbps, each way, with the offloads on that make the
// kernel hand isthmus GSO packets: TSO (IPv6 too) and GSO on both pods' eth0,
// and those and UDP tunnel segmentation on both nodes' underlay device (the
// test fails if one is off). Each way, two streams:
//
//   - over the lab as it is built. tshark on the sending pod's host veth sees
//     IPv6 packets longer than the tunnel MTU (the pod's TSO packets, which
//     overlay_egress encapsulates whole), and on the sending node's router port
//     GENEVE frames longer than the underlay MTU: the tunnel GSO packets isthmus
//     built, left whole for the device to cut (the lab's veths take them as a
//     NIC with UDP tunnel segmentation offload does). Every frame of the flow
//     there decodes as GENEVE with our VNI, inner Ethernet, IPv6 and TCP of the
//     flow, nothing malformed, a good outer IPv4 checksum and one encapsulation
//     overhead. Their inner TCP checksums are not judged: a GSO packet carries
//     only the pseudo-header sum until it is cut (CHECKSUM_PARTIAL; tshark
//     calls it bad). With TC decapsulation these frames reach the receiving
//     node whole; with XDP the router's port toward the receiver, a veth whose
//     peer runs XDP, has no TSO and cuts them first.
//   - with the router's port toward the receiving node stripped of checksum and
//     segmentation offload (ethtool -K tx off tx-udp_tnl-segmentation off ...),
//     so that the kernel cuts each tunnel GSO packet there, by the headers,
//     offsets and GSO type isthmus left in it, and completes every checksum, as
//     a NIC's tunnel TSO would, and as the wire between real sites carries
//     them. Every GENEVE frame of the flow tshark sees leave that port is at
//     most the underlay MTU, decodes as above, and has a TCP checksum tshark
//     finds good over the inner IPv6 pseudo-header.
//
// tshark, not the code under test, decodes; its code for a good checksum is read
// from the tshark at hand (`tshark -G values`), not assumed. Each stream's
// goodput and the sender's TCP_INFO (MSS, segments, retransmissions) are logged.
// GRO is logged, not required: every veth of the lab leaves it off (the
// default), and no stream here needs it: a receiving node gets the GSO packets
// whole, or the frames the router cut, and decapsulates either.
func TestDualStackStream(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testDualStackStream)
}

func testDualStackStream(t *testing.T, decap string) {
	began := time.Now()
	l := upScenarioDecap(t, "dualstack", decap)
	t.Logf("decap %s: lab up in %s", decap, time.Since(began).Round(time.Millisecond))
	began = time.Now()
	defer func() {
		t.Logf("decap %s: offload checks, captures and streams in %s", decap, time.Since(began).Round(time.Millisecond))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pods := [2]string{"a1-p1", "b1-p1"}
	requireStreamOffloads(ctx, t, l, pods[:])
	good := tsharkGoodChecksum(ctx, t, l)
	// The MTUs as the devices have them: the pod's eth0 has the tunnel's.
	tunnelMTU := ifaceMTU(t, l.PodNS(pods[0]), "eth0")
	underlayMTU := ifaceMTU(t, l.NodeNS("a1"), testenv.UnderlayDev)
	if tunnelMTU >= underlayMTU {
		t.Fatalf("pod MTU %d, underlay MTU %d: the pods' packets would not need the tunnel's headroom", tunnelMTU, underlayMTU)
	}
	t.Logf("decap %s: tunnel MTU %d, underlay MTU %d, tshark's code for a good checksum %d", decap, tunnelMTU, underlayMTU, good)

	// Each way, two streams on their own server ports: over the lab as it is
	// built, then with the router's port toward the receiver cutting the frames.
	// Every capture starts now, each filtered to its stream (tshark takes seconds
	// to start; once is enough), and stops at its count.
	type direction struct {
		src, dst         testenv.PodRef
		srcAddr, dstAddr netip.Addr // the nodes' underlay addresses
		what             string
		lab, cut         streamFlow
	}
	var dirs []direction
	var caps []streamCapture
	for i, d := range [][2]string{{pods[0], pods[1]}, {pods[1], pods[0]}} {
		src, _ := l.Pod(d[0])
		dst, _ := l.Pod(d[1])
		srcNode, _ := l.Node(src.Node)
		dstNode, _ := l.Node(dst.Node)
		dir := direction{src: src, dst: dst, srcAddr: srcNode.Address, dstAddr: dstNode.Address, what: src.Name + " -> " + dst.Name,
			lab: streamFlow{src: src.Address6, dst: dst.Address6, dport: uint16(5410 + 2*i), vni: l.Scenario.VNI}}
		dir.cut = dir.lab
		dir.cut.dport++
		dirs = append(dirs, dir)
		caps = append(caps,
			streamCapture{what: dir.what + ": the sending pod's host veth " + l.HostVeth(src.Name) + " on " + src.Node,
				ns: l.NodeNS(src.Node), args: []string{"-i", l.HostVeth(src.Name), "-B", "32", "-s", "256",
					"-f", fmt.Sprintf("ip6 and tcp and src host %s and dst host %s and dst port %d", src.Address6, dst.Address6, dir.lab.dport),
					"-c", "200", "-a", "duration:120", "-T", "fields", "-E", "separator=/t", "-e", "ipv6.plen", "-e", "tcp.len"}},
			streamCapture{what: dir.what + ": router port " + testenv.RouterPort(src.Node) + " from " + src.Node,
				ns: l.RouterNS(), args: geneveCaptureArgs(testenv.RouterPort(src.Node), dir.srcAddr, dir.dstAddr, dir.lab.dport, 300, true)},
			streamCapture{what: dir.what + ": router port " + testenv.RouterPort(dst.Node) + " to " + dst.Node + ", cutting",
				ns: l.RouterNS(), args: geneveCaptureArgs(testenv.RouterPort(dst.Node), dir.srcAddr, dir.dstAddr, dir.cut.dport, 400, false)})
	}
	outs := startCaptures(ctx, t, caps)
	cutOffloads := []string{"tx", "tx-udp_tnl-segmentation", "tx-udp_tnl-csum-segmentation"}
	for _, dir := range dirs {
		res, err := stream6(ctx, l.PodNS(dir.src.Name), l.PodNS(dir.dst.Name), netip.AddrPortFrom(dir.dst.Address6, dir.lab.dport), streamDefaultSize)
		checkStream(t, l, dir.what+", the lab's offloads", res, err, caps, outs)

		rport := testenv.RouterPort(dir.dst.Node)
		setOffloads(ctx, t, l, rport, cutOffloads, "off")
		res, err = stream6(ctx, l.PodNS(dir.src.Name), l.PodNS(dir.dst.Name), netip.AddrPortFrom(dir.dst.Address6, dir.cut.dport), streamWireSize)
		checkStream(t, l, dir.what+", "+rport+" cutting", res, err, caps, outs)
		setOffloads(ctx, t, l, rport, cutOffloads, "on")
	}
	out := outs()
	for i, dir := range dirs {
		checkSuperPackets(t, caps[3*i].what, out[3*i], tunnelMTU)
		checkGeneveFrames(t, caps[3*i+1].what, out[3*i+1], dir.lab, good, underlayMTU, false)
		checkGeneveFrames(t, caps[3*i+2].what, out[3*i+2], dir.cut, good, underlayMTU, true)
	}
}

// requireStreamOffloads fails the test unless the pods' eth0 and their nodes'
// underlay device have the offloads that make GSO packets: without them the
// test would measure nothing of segmentation. It logs GRO too.
func requireStreamOffloads(ctx context.Context, t *testing.T, l *testenv.Lab, pods []string) {
	t.Helper()
	want := map[string][]string{
		"pod":  {"tcp-segmentation-offload", "tx-tcp6-segmentation", "generic-segmentation-offload"},
		"node": {"tcp-segmentation-offload", "tx-tcp6-segmentation", "generic-segmentation-offload", "tx-udp_tnl-segmentation"},
	}
	for _, pod := range pods {
		p, _ := l.Pod(pod)
		for _, dev := range []struct{ kind, name, ns, iface string }{
			{"pod", pod, l.PodNS(pod), "eth0"},
			{"node", p.Node, l.NodeNS(p.Node), testenv.UnderlayDev},
		} {
			out, err := l.Exec(ctx, dev.ns, "ethtool", "-k", dev.iface)
			if err != nil {
				t.Fatalf("%s %s: ethtool -k %s: %v\n%s", dev.kind, dev.name, dev.iface, err, out)
			}
			feat := ethtoolFeatures(out)
			var state []string
			for _, f := range append(want[dev.kind], "generic-receive-offload") {
				state = append(state, f+" "+feat[f])
			}
			t.Logf("%s %s %s: %s", dev.kind, dev.name, dev.iface, strings.Join(state, ", "))
			for _, f := range want[dev.kind] {
				if feat[f] != "on" {
					t.Fatalf("%s %s: %s of %s is %q, want on: the test is about segmentation offload", dev.kind, dev.name, f, dev.iface, feat[f])
				}
			}
		}
	}
}

// ethtoolFeatures reads `ethtool -k`: feature name -> on or off.
func ethtoolFeatures(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if f := strings.Fields(val); len(f) > 0 {
			m[name] = f[0]
		}
	}
	return m
}

// setOffloads turns features of the router's port iface on or off.
func setOffloads(ctx context.Context, t *testing.T, l *testenv.Lab, iface string, features []string, state string) {
	t.Helper()
	argv := []string{"ethtool", "-K", iface}
	for _, f := range features {
		argv = append(argv, f, state)
	}
	if out, err := l.Exec(ctx, l.RouterNS(), argv...); err != nil {
		t.Fatalf("router: %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	if state == "off" {
		out, err := l.Exec(ctx, l.RouterNS(), "ethtool", "-k", iface)
		if err != nil {
			t.Fatalf("router: ethtool -k %s: %v\n%s", iface, err, out)
		}
		feat := ethtoolFeatures(out)
		for _, f := range []string{"tx-checksumming", "tx-tcp6-segmentation", "tx-udp_tnl-segmentation"} {
			if feat[f] != "off" {
				t.Fatalf("router: %s of %s is %q after ethtool -K ... off: the port would not cut the frames", f, iface, feat[f])
			}
		}
	}
}

// tsharkGoodChecksum returns the number tshark prints in ip.checksum.status
// and tcp.checksum.status for a good checksum, as this tshark lists it in
// `tshark -G values` (1 in tshark 4.0: 0 is bad, 2 unverified).
func tsharkGoodChecksum(ctx context.Context, t *testing.T, l *testenv.Lab) int {
	t.Helper()
	out, err := testenv.Command(ctx, l.RouterNS(), "tshark", "-G", "values").Output()
	if err != nil {
		t.Fatalf("tshark -G values: %v", err)
	}
	code := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) == 4 && f[0] == "V" && (f[1] == "ip.checksum.status" || f[1] == "tcp.checksum.status") && f[3] == "Good" {
			n, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatalf("tshark -G values: %q", sc.Text())
			}
			code[f[1]] = n
		}
	}
	ip, okIP := code["ip.checksum.status"]
	tcp, okTCP := code["tcp.checksum.status"]
	if !okIP || !okTCP || ip != tcp {
		t.Fatalf("tshark -G values: the codes of a good checksum are %v; this test wants one for ip.checksum.status and tcp.checksum.status", code)
	}
	return tcp
}

// ifaceMTU returns the MTU of iface in the namespace ns.
func ifaceMTU(t *testing.T, ns, iface string) int {
	t.Helper()
	var mtu int
	if err := testenv.Do(ns, func() error {
		i, err := net.InterfaceByName(iface)
		if err == nil {
			mtu = i.MTU
		}
		return err
	}); err != nil {
		t.Fatalf("%s: %s: %v", ns, iface, err)
	}
	return mtu
}

// geneveFields are what geneveCaptureArgs has tshark print for each frame, in
// this order.
var geneveFields = []string{"frame.len", "frame.protocols", "ip.len", "ip.checksum.status", "geneve.vni", "geneve.proto_type",
	"ipv6.src", "ipv6.dst", "ipv6.plen", "tcp.dstport", "tcp.len", "tcp.checksum.status"}

// geneveCaptureArgs captures count frames of one stream on the router's port
// iface: GENEVE from the underlay address src to dst whose inner packet is
// IPv6 and TCP to port dport. The capture filter reads the inner headers at
// the offsets of a GENEVE header without options and an IPv6 header without
// extension headers, which is what isthmus sends (a frame with options, or
// other offsets, is not captured, and the count checks then fail). tshark
// decodes UDP 6081 as GENEVE and verifies the IPv4 and TCP checksums (the inner
// TCP one over the inner IPv6 pseudo-header). With headers, only the first 256
// bytes of each frame are kept (enough for every header; the frames of GSO
// packets are up to 64 KiB).
func geneveCaptureArgs(iface string, src, dst netip.Addr, dport uint16, count int, headers bool) []string {
	// From the UDP header: GENEVE at 8 (its option length in the low 6 bits of
	// the first byte), inner Ethernet at 16 (EtherType at 28), IPv6 at 30 (next
	// header at 36), TCP at 70 (destination port at 72).
	filter := fmt.Sprintf("udp dst port 6081 and src host %s and dst host %s and udp[8] & 0x3f = 0 and udp[28:2] = 0x86dd and udp[36] = 6 and udp[72:2] = %d",
		src, dst, dport)
	args := []string{"-i", iface, "-B", "32", "-f", filter, "-c", strconv.Itoa(count), "-a", "duration:120",
		"-d", "udp.port==6081,geneve", "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
		"-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,"}
	if headers {
		args = append(args, "-s", "256")
	}
	for _, f := range geneveFields {
		args = append(args, "-e", f)
	}
	return args
}

// streamFlow is what the inner headers of a stream's frames must say.
type streamFlow struct {
	src, dst netip.Addr
	dport    uint16
	vni      uint32
}

// checkGeneveFrames checks a GENEVE capture (geneveCaptureArgs' fields) of a
// stream's data direction. Every frame must decode as GENEVE with our VNI,
// inner Ethernet, IPv6 and TCP of flow, nothing malformed, a good outer IPv4
// checksum and one encapsulation overhead throughout. With cut (a port that
// segments in software), every frame must also be at most the underlay MTU with
// a good inner TCP checksum, and at least wireFramesMin carry data; without, at
// least superFramesMin must be larger than the underlay MTU (tunnel GSO packets
// on the wire: the device below isthmus was left to cut them).
func checkGeneveFrames(t *testing.T, what string, out string, flow streamFlow, good, underlayMTU int, cut bool) {
	t.Helper()
	var frames, data, super, bad, maxLen int
	overheads := map[int]int{}
	var problems []string
	problem := func(line, format string, args ...any) {
		bad++
		if len(problems) < 5 {
			problems = append(problems, fmt.Sprintf(format, args...)+": "+line)
		}
	}
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		frames++
		f := strings.Split(line, "\t")
		for len(f) < len(geneveFields) {
			f = append(f, "")
		}
		num := func(i int) int {
			n, err := strconv.ParseInt(f[i], 0, 64)
			if err != nil {
				return -1
			}
			return int(n)
		}
		frameLen, ipLen, plen, tcpLen := num(0), num(2), num(8), num(10)
		maxLen = max(maxLen, frameLen)
		switch {
		case !strings.HasSuffix(f[1], "udp:geneve:eth:ethertype:ipv6:tcp") && !strings.Contains(f[1], "udp:geneve:eth:ethertype:ipv6:tcp:"):
			problem(line, "protocols %q, want udp:geneve:eth:ethertype:ipv6:tcp", f[1])
			continue
		case strings.Contains(f[1], "malformed"):
			problem(line, "malformed")
			continue
		case num(4) != int(flow.vni) || num(5) != 0x6558:
			problem(line, "VNI %s protocol %s, want %d and 0x6558 (Ethernet)", f[4], f[5], flow.vni)
			continue
		case f[6] != flow.src.String() || f[7] != flow.dst.String() || num(9) != int(flow.dport):
			problem(line, "inner %s -> %s port %s, want %s -> %s port %d", f[6], f[7], f[9], flow.src, flow.dst, flow.dport)
			continue
		case num(3) != good:
			problem(line, "outer IPv4 checksum status %s, want %d (good)", f[3], good)
			continue
		case plen < 0 || ipLen < 0 || frameLen != ipLen+14:
			problem(line, "frame length %d, IPv4 length %d, IPv6 payload length %d", frameLen, ipLen, plen)
			continue
		}
		overheads[ipLen-(plen+40)]++
		if tcpLen > 0 {
			data++
		}
		if frameLen > underlayMTU+14 {
			super++
		}
		if cut {
			if ipLen > underlayMTU {
				problem(line, "IPv4 length %d on the wire, above the underlay MTU %d", ipLen, underlayMTU)
			} else if num(11) != good {
				problem(line, "inner TCP checksum status %s, want %d (good)", f[11], good)
			}
		}
	}
	t.Logf("%s: %d GENEVE frames, %d carrying data, %d longer than the underlay MTU (largest %d bytes), encapsulation overheads %v",
		what, frames, data, super, maxLen, overheads)
	if bad > 0 {
		t.Errorf("%s: %d of %d frames fail:\n%s", what, bad, frames, strings.Join(problems, "\n"))
	}
	if len(overheads) != 1 {
		t.Errorf("%s: the IPv4 length less the inner IPv6 packet varies: %v, want one overhead (outer IPv4, UDP, GENEVE, inner Ethernet)", what, overheads)
	}
	for o := range overheads {
		if o < 50 {
			t.Errorf("%s: an encapsulation overhead of %d bytes, less than IPv4, UDP, GENEVE and Ethernet (50)", what, o)
		}
	}
	if cut {
		if data < wireFramesMin {
			t.Errorf("%s: %d data frames checked, want at least %d", what, data, wireFramesMin)
		}
	} else if super < superFramesMin {
		t.Errorf("%s: %d frames longer than the underlay MTU %d, want at least %d: the tunnel GSO packets were cut before the wire (or never made)",
			what, super, underlayMTU, superFramesMin)
	}
}

// checkSuperPackets checks a capture of ipv6.plen and tcp.len on the sending
// pod's host veth: at least superFramesMin IPv6 packets of the stream longer than
// the tunnel MTU, which only GSO makes (the pod's MTU is the tunnel's).
func checkSuperPackets(t *testing.T, what, out string, tunnelMTU int) {
	t.Helper()
	var packets, super, largest int
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		f := strings.Split(line, "\t")
		plen, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		packets++
		largest = max(largest, plen+40)
		if plen+40 > tunnelMTU {
			super++
		}
	}
	t.Logf("%s: %d IPv6 packets, %d longer than the tunnel MTU %d, the largest %d bytes",
		what, packets, super, tunnelMTU, largest)
	if super < superFramesMin {
		t.Errorf("%s: %d of %d IPv6 packets from the pod longer than the tunnel MTU %d, want at least %d: no GSO",
			what, super, packets, tunnelMTU, superFramesMin)
	}
}

// streamCapture is one tshark the streams run under, in the namespace ns: args
// after `tshark -n -l`, with -c and -a duration, so that it ends by itself.
type streamCapture struct {
	what, ns string
	args     []string
}

// startCaptures starts a tshark for each of caps and returns once every one
// listens. The function it returns waits for each to end (at its count; any
// still running 10 s after the call is stopped with SIGINT, on which tshark
// prints what it has and exits) and returns their outputs. Any still running when
// the test ends is stopped the same way. testenv.Capture would do for one
// capture, but stops tshark with SIGKILL, after which Wait lasts until its
// dumpcap's own autostop: a failing stream would hold the test for minutes.
func startCaptures(ctx context.Context, t *testing.T, caps []streamCapture) func() []string {
	t.Helper()
	began := time.Now()
	capCtx, stop := context.WithCancel(ctx)
	outs := make([]strings.Builder, len(caps))
	errs := make([]error, len(caps))
	starts := make([]*tsharkStart, len(caps))
	var exited []chan struct{}
	waitAll := func() {
		for _, e := range exited {
			<-e
		}
	}
	t.Cleanup(func() { stop(); waitAll() })
	for i, c := range caps {
		cmd := testenv.Command(capCtx, c.ns, append([]string{"tshark", "-n", "-l"}, c.args...)...)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
		cmd.WaitDelay = 5 * time.Second
		starts[i] = &tsharkStart{started: make(chan struct{})}
		cmd.Stdout, cmd.Stderr = &outs[i], starts[i]
		if err := cmd.Start(); err != nil {
			t.Fatalf("capture on %s: start tshark: %v", c.what, err)
		}
		e := make(chan struct{})
		exited = append(exited, e)
		go func() {
			errs[i] = cmd.Wait()
			close(e)
		}()
	}
	for i, c := range caps {
		select {
		case <-starts[i].started:
		case <-exited[i]:
			t.Fatalf("capture on %s: tshark ended before it captured: %v\n%s", c.what, errs[i], starts[i].text())
		case <-time.After(30 * time.Second):
			t.Fatalf("capture on %s: tshark did not start capturing within 30 s:\n%s", c.what, starts[i].text())
		}
	}
	// tshark says so a moment before its capture process really listens.
	time.Sleep(time.Second)
	t.Logf("%d captures listening after %s", len(caps), time.Since(began).Round(time.Millisecond))
	return sync.OnceValue(func() []string {
		all := make(chan struct{})
		go func() { waitAll(); close(all) }()
		select {
		case <-all:
		case <-time.After(10 * time.Second):
			stop()
			<-all
		}
		res := make([]string, len(caps))
		for i, c := range caps {
			res[i] = outs[i].String()
			if errs[i] != nil && capCtx.Err() == nil {
				t.Errorf("capture on %s: tshark: %v\n%s", c.what, errs[i], starts[i].text())
			}
		}
		return res
	})
}

// tsharkStart is a tshark's stderr: it keeps the text and closes started once
// tshark says it is capturing.
type tsharkStart struct {
	mu      sync.Mutex
	buf     strings.Builder
	started chan struct{}
	closed  bool
}

func (s *tsharkStart) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	if !s.closed && strings.Contains(s.buf.String(), "Capturing on") {
		s.closed = true
		close(s.started)
	}
	return len(p), nil
}

func (s *tsharkStart) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// streamResult is what one stream did.
type streamResult struct {
	bytes    int64
	duration time.Duration // from the receiver's accept to its last byte
	info     *unix.TCPInfo // the sender's, once everything arrived
}

func (r streamResult) mbps() float64 { return float64(r.bytes) * 8 / r.duration.Seconds() / 1e6 }

func (r streamResult) String() string {
	s := fmt.Sprintf("%d MiB in %s, %.2f Gbit/s", r.bytes>>20, r.duration.Round(time.Millisecond), r.mbps()/1000)
	if i := r.info; i != nil {
		s += fmt.Sprintf("; sender: MSS %d, %d segments out, %d retransmitted (%d bytes, %.3f%% of those sent)",
			i.Snd_mss, i.Data_segs_out, i.Total_retrans, i.Bytes_retrans, 100*float64(i.Bytes_retrans)/float64(max(i.Bytes_sent, 1)))
	}
	return s
}

// checkStream logs a stream's result and fails the test if it failed, with the
// nodes' counters and what the captures (outs) saw, or was slower than
// streamFloorMbps.
func checkStream(t *testing.T, l *testenv.Lab, what string, res streamResult, err error, caps []streamCapture, outs func() []string) {
	t.Helper()
	t.Logf("%s: %s", what, res)
	if err != nil {
		for _, n := range []string{"a1", "b1"} {
			t.Logf("%s: %s", n, countersText(t, l, n))
		}
		for i, out := range outs() {
			lines := strings.SplitN(out, "\n", 11)
			t.Logf("capture on %s, its first lines:\n%s", caps[i].what, strings.Join(lines[:min(len(lines), 10)], "\n"))
		}
		t.Fatalf("%s: %v", what, err)
	}
	if res.mbps() < streamFloorMbps {
		t.Errorf("%s: %.0f Mbit/s, below the floor of %d Mbit/s", what, res.mbps(), streamFloorMbps)
	}
}

// streamPattern is the bytes of a stream: byte i is buf[i%period], a
// pseudorandom period of 1 MiB and 9 bytes (so that no segment, read or write
// boundary lines up with it), buf holding streamChunk bytes more to slice
// across its end.
type streamPattern struct {
	buf    []byte
	period int64
}

func newStreamPattern() streamPattern {
	const period = 1<<20 + 9
	r := rand.New(rand.NewChaCha8([32]byte{'i', 's', 't', 'h', 'm', 'u', 's'}))
	buf := make([]byte, period+streamChunk)
	for i := 0; i+8 <= len(buf); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			buf[i+j] = byte(v >> (8 * j))
		}
	}
	copy(buf[period:], buf[:streamChunk])
	return streamPattern{buf: buf, period: period}
}

// at returns the n bytes (at most streamChunk) of the stream from offset off.
func (p streamPattern) at(off int64, n int) []byte {
	o := off % p.period
	return p.buf[o : o+int64(n)]
}

// stream6 sends size bytes of the stream pattern over one TCP connection from the
// namespace srcNS to a listener it opens on addr (an IPv6 address) in dstNS. The
// receiver checks every byte as it arrives and then the sender's FIN; the result
// holds the sender's TCP_INFO once everything arrived.
func stream6(ctx context.Context, srcNS, dstNS string, addr netip.AddrPort, size int64) (streamResult, error) {
	// At the floor the stream would take size*8/floor: a broken one is cut off
	// a little after that instead of running for minutes.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(float64(size)*8/(streamFloorMbps*1e6)*float64(time.Second))+5*time.Second)
	defer cancel()
	pat := newStreamPattern()
	ln, err := listenIn(dstNS, addr)
	if err != nil {
		return streamResult{}, err
	}
	defer ln.Close()
	stopLn := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopLn()

	recvc := make(chan streamResult, 1)
	errc := make(chan error, 1)
	go func() {
		var r streamResult
		defer func() { recvc <- r }()
		c, err := ln.Accept()
		if err != nil {
			errc <- fmt.Errorf("accept: %w", err)
			return
		}
		defer c.Close()
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
		defer stop()
		start := time.Now()
		last := start
		defer func() { r.duration = last.Sub(start) }()
		buf := make([]byte, streamChunk)
		for r.bytes < size {
			n, err := c.Read(buf[:min(int64(streamChunk), size-r.bytes)])
			last = time.Now()
			if n > 0 && !bytes.Equal(buf[:n], pat.at(r.bytes, n)) {
				errc <- fmt.Errorf("receiver: %d bytes at offset %d are not the ones sent", n, r.bytes)
				return
			}
			r.bytes += int64(n)
			if err != nil {
				errc <- fmt.Errorf("receiver: after %d of %d bytes: %w", r.bytes, size, err)
				return
			}
		}
		if n, err := c.Read(buf[:1]); n != 0 || !errors.Is(err, io.EOF) {
			errc <- fmt.Errorf("receiver: after %d bytes want the sender's FIN, read %d bytes more, %v", size, n, err)
			return
		}
		errc <- nil
	}()

	c, err := dialFrom(ctx, srcNS, addr)
	if err != nil {
		ln.Close()
		<-recvc
		return streamResult{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	var sent int64
	var sendErr error
	for sent < size && sendErr == nil {
		var n int
		n, sendErr = c.Write(pat.at(sent, int(min(int64(streamChunk), size-sent))))
		sent += int64(n)
	}
	if sendErr == nil {
		sendErr = c.(*net.TCPConn).CloseWrite()
	}
	recvErr := <-errc
	r := <-recvc
	if sendErr != nil {
		sendErr = fmt.Errorf("sender: after %d of %d bytes: %w", sent, size, sendErr)
	}
	if raw, err := c.(*net.TCPConn).SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) { r.info, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	}
	return r, errors.Join(recvErr, sendErr)
}
