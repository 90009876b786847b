package e2e

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/isthmus-dev/isthmus/testenv"
)

var (
	binary   string // the isthmus binary under test
	setupErr error
)

func TestMain(m *testing.M) {
	code := func() int {
		if err := initBeside(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if os.Geteuid() != 0 {
			setupErr = fmt.Errorf("end-to-end tests build network namespaces and load BPF programs: run them as root")
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "isthmus-e2e-")
		if err != nil {
			setupErr = err
			return m.Run()
		}
		defer os.RemoveAll(dir)
		// The agents install isthmus-cni from beside the binary, and the lab
		// runs cnitool from there.
		binary, setupErr = testenv.BuildBinaries(context.Background(), dir)
		code := m.Run()
		// Labs shared between tests go now, while the binary is still here.
		if !downSharedLabs() && code == 0 {
			code = 1
		}
		return code
	}()
	os.Exit(code)
}

// vni is the VNI of the default scenario, which the agents are started with.
const vni = 4242

func requireSetup(t *testing.T) {
	t.Helper()
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

// labName returns a lab name unique to this run.
func labName() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := []byte("e")
	for range 7 {
		b = append(b, letters[rand.IntN(len(letters))])
	}
	return string(b)
}

// upLab brings sc up as a lab with a fresh name, the test's binary and opts, and
// takes it down when the test ends, checking that nothing is left; when sc
// names a decapsulation mode (tc or xdp) it first checks that the mode was in
// effect (checkDecapMode). Every bring-up of the package goes through it,
// except upShared's, whose labs live as long as the package's tests.
func upLab(ctx context.Context, t *testing.T, sc *testenv.Scenario, opts testenv.Options) *testenv.Lab {
	t.Helper()
	requireSetup(t)
	opts.Name, opts.Binary = labName(), binary
	l, err := testenv.Up(ctx, sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Error(err)
		}
		assertGone(t, opts.Name)
	})
	if sc.Decap == "tc" || sc.Decap == "xdp" {
		// Cleanups run last first: this one while the lab is still up.
		t.Cleanup(func() { checkDecapMode(t, l) })
	}
	return l
}

// upScenario builds a built-in scenario with agents and removes it when the
// test ends, checking that nothing is left.
func upScenario(t *testing.T, scenario string) *testenv.Lab {
	t.Helper()
	return upScenarioDecap(t, scenario, "")
}

// upScenarioDecap is upScenario with every agent started with --decap decap
// (the agent's default when empty); with tc or xdp, upLab checks the mode was in
// effect when the test ends (checkDecapMode).
func upScenarioDecap(t *testing.T, scenario, decap string) *testenv.Lab {
	t.Helper()
	requireSetup(t)
	sc, err := testenv.LoadScenario(scenario)
	if err != nil {
		t.Fatal(err)
	}
	sc.Decap = decap
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return upLab(ctx, t, sc, testenv.Options{})
}

// loadDefault returns the default scenario, failing the test unless it has the
// VNI these tests expect on the wire.
func loadDefault(t *testing.T) *testenv.Scenario {
	t.Helper()
	requireSetup(t)
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	if sc.VNI != vni {
		t.Fatalf("default scenario VNI %d, these tests expect %d", sc.VNI, vni)
	}
	return sc
}

// upDefault builds the default scenario with agents and removes it when the
// test ends, checking that nothing is left.
func upDefault(t *testing.T) *testenv.Lab {
	t.Helper()
	return upWith(t)
}

// upWith builds the default scenario like upDefault, with agentArgs appended to
// every agent's command line, and removes it when the test ends.
func upWith(t *testing.T, agentArgs ...string) *testenv.Lab {
	t.Helper()
	sc := loadDefault(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return upLab(ctx, t, sc, testenv.Options{AgentArgs: agentArgs})
}

func assertGone(t *testing.T, lab string) {
	t.Helper()
	ents, _ := os.ReadDir(testenv.NetnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), testenv.NSName(lab, "")) {
			t.Errorf("namespace %s left after down", e.Name())
		}
	}
	for _, dir := range []string{filepath.Join(testenv.PinRoot, lab), testenv.StateDir(lab)} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s left after down (stat: %v)", dir, err)
		}
	}
}

// checkPaths runs the lab's CheckPaths (rp_filter strict on every node, every
// pod pair both ways with ICMP, TCP and UDP and the source each receiver saw,
// TcpExtIPReversePathFilter 0 on every node before and after) and fails the
// test, without stopping it, on anything it found, with the agent logs of
// logNodes. It logs the report: the pairs, the counters, the matrix and the
// probes that needed more than one attempt. When the test ends it reads the
// counters again, so the rest of the test must keep them at 0 as well. It
// returns the matrix.
func checkPaths(t *testing.T, l *testenv.Lab, logNodes ...string) *testenv.Matrix {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := l.CheckPaths(ctx)
	if c == nil {
		t.Fatal(err)
	}
	t.Logf("paths of scenario %s:\n%s", l.Scenario.Name, c)
	if err != nil {
		var logs strings.Builder
		// The nodes of every pair that lost a packet too: their agents saw it.
		for pair := range c.Lost {
			for _, pod := range pair {
				if p, ok := l.Pod(pod); ok && !slices.Contains(logNodes, p.Node) {
					logNodes = append(logNodes, p.Node)
				}
			}
		}
		for _, n := range logNodes {
			fmt.Fprintf(&logs, "\nagent log of %s:\n%s", n, tailFile(l.AgentLog(n)))
			// An encrypted pair's first packets wait in the device for a
			// handshake: when did it happen?
			if wg := l.WireGuardStatus(n); wg != "" {
				fmt.Fprintf(&logs, "\n%s", wg)
			}
		}
		t.Errorf("%v%s", err, logs.String())
	}
	v6, _ := l.Scenario.Expectations6()
	if want := (len(l.Scenario.Expectations()) + len(v6)) * len(testenv.Protos); len(c.Matrix.Probes) != want {
		t.Errorf("%d probes, want %d", len(c.Matrix.Probes), want)
	}
	for _, n := range l.Scenario.Nodes() {
		if got := c.Before[n.Name]; got != 0 {
			t.Errorf("node %s: %s %d before the paths were checked: strict rp_filter dropped packets since the lab came up", n.Name, testenv.RPFilterCounter, got)
		}
	}
	t.Cleanup(func() {
		after, err := l.RPFilterDrops()
		if err != nil {
			t.Error(err)
			return
		}
		for _, n := range l.Scenario.Nodes() {
			if got := after[n.Name]; got > c.After[n.Name] {
				t.Errorf("node %s: %s %d after the paths were checked, %d when the test ended: strict rp_filter dropped packets of what the test did since",
					n.Name, testenv.RPFilterCounter, c.After[n.Name], got)
			}
		}
	})
	return c.Matrix
}

// requireOwnSources fails the test unless every server that answered saw the
// sending pod's own address: for scenarios where nothing is translated.
func requireOwnSources(t *testing.T, l *testenv.Lab, m *testenv.Matrix) {
	t.Helper()
	for _, p := range m.Probes {
		if p.Proto != testenv.ICMP && p.OK && p.Saw != l.PodAddr(p.Src) {
			t.Errorf("%s -> %s %s: server saw %s, want the pod's own %s", p.Src, p.Dst, p.Proto, p.Saw, l.PodAddr(p.Src))
		}
	}
}

// TestMatrix: every pod reaches every other over ICMP, TCP and UDP, every
// server saw the sending pod's own address, so neither the leftover
// MASQUERADE nor FORWARD DROP touched isthmus traffic, and strict rp_filter
// dropped nothing on any node.
func TestMatrix(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	m := checkPaths(t, l, "a1", "b1")
	pods := l.Scenario.Pods()
	if want := len(pods) * (len(pods) - 1) * len(testenv.Protos); len(m.Probes) != want {
		t.Fatalf("%d probes, want %d: every pod of the default scenario talks to every other", len(m.Probes), want)
	}
	requireOwnSources(t, l, m)
}

// frame is one captured underlay frame as tshark decoded it.
type frame struct {
	protocols           string   // frame.protocols, e.g. eth:ethertype:ip:udp:geneve:eth:ethertype:ip:icmp:data
	ipSrc, ipDst        []string // outer first, then inner
	udpSrc, udpDst      []string
	version, vni, proto string
	icmpType, icmpIdent []string
	tcpPorts            string // inner TCP source,destination
}

var captureFields = []string{"frame.protocols", "ip.src", "ip.dst", "udp.srcport", "udp.dstport",
	"geneve.version", "geneve.vni", "geneve.proto_type", "icmp.type", "icmp.ident", "tcp.srcport", "tcp.dstport"}

// capture runs tshark on iface in the namespace ns until stop is closed or
// limit passes, decoding UDP 6081 as GENEVE. It returns once tshark captures.
func capture(t *testing.T, ns, iface string, limit time.Duration) (wait func() []frame) {
	t.Helper()
	args := []string{"tshark", "-n", "-l", "-i", iface, "-f", "udp port 6081", "-d", "udp.port==6081,geneve",
		"-a", fmt.Sprintf("duration:%d", int(limit.Seconds())),
		"-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,"}
	for _, f := range captureFields {
		args = append(args, "-e", f)
	}
	cmd := testenv.Command(context.Background(), ns, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tshark: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	started := make(chan struct{})
	var errText strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			errText.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), "Capturing on") {
				once = true
				close(started)
			}
		}
	}()
	lines := make(chan []frame, 1)
	go func() {
		var out []frame
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Split(sc.Text(), "\t")
			for len(f) < len(captureFields) {
				f = append(f, "")
			}
			split := func(s string) []string {
				if s == "" {
					return nil
				}
				return strings.Split(s, ",")
			}
			out = append(out, frame{protocols: f[0], ipSrc: split(f[1]), ipDst: split(f[2]), udpSrc: split(f[3]), udpDst: split(f[4]),
				version: f[5], vni: f[6], proto: f[7], icmpType: split(f[8]), icmpIdent: split(f[9]), tcpPorts: f[10] + "," + f[11]})
		}
		lines <- out
	}()
	select {
	case <-started:
		// tshark reports "Capturing on" a moment before dumpcap really does.
		time.Sleep(time.Second)
	case <-time.After(10 * time.Second):
		t.Fatalf("tshark did not start capturing: %s", errText.String())
	}
	return func() []frame {
		frames := <-lines
		cmd.Wait()
		return frames
	}
}

func parseNum(s string) (uint64, error) { return strconv.ParseUint(s, 0, 32) }

// checkGeneve fails the test unless f is a well-formed GENEVE frame of ours.
func checkGeneve(t *testing.T, f frame) {
	t.Helper()
	checkGeneveVNI(t, f, vni)
}

// checkGeneveVNI is checkGeneve for agents that run with VNI want (those of
// the DaemonSet, with the agent's default).
func checkGeneveVNI(t *testing.T, f frame, want uint64) {
	t.Helper()
	if !strings.Contains(f.protocols, "udp:geneve:eth:ethertype:ip") || strings.Contains(f.protocols, "malformed") {
		t.Errorf("frame protocols %q: want udp:geneve:eth:ethertype:ip and nothing malformed", f.protocols)
	}
	if v, err := parseNum(f.version); err != nil || v != 0 {
		t.Errorf("GENEVE version %q, want 0", f.version)
	}
	if v, err := parseNum(f.vni); err != nil || v != want {
		t.Errorf("GENEVE VNI %q, want %d", f.vni, want)
	}
	if v, err := parseNum(f.proto); err != nil || v != 0x6558 {
		t.Errorf("GENEVE protocol %q, want 0x6558 (Ethernet)", f.proto)
	}
	if len(f.udpDst) == 0 || f.udpDst[0] != "6081" {
		t.Errorf("outer UDP destination %v, want 6081", f.udpDst)
	}
}

// TestGeneveOnWire: what crosses the underlay between two sites decodes in
// tshark as GENEVE version 0, our VNI, inner Ethernet, with the pods' own
// addresses inside and the nodes' underlay addresses outside.
func TestGeneveOnWire(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	src, dst := "a1-p1", "b1-p1"
	a1, _ := l.Node("a1")
	b1, _ := l.Node("b1")
	srv, err := testenv.StartEchoServer(l.PodNS(dst))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	wait := capture(t, l.RouterNS(), testenv.RouterPort("a1"), 5*time.Second)
	if _, err := testenv.TCPEcho(l.PodNS(src), netip.AddrPortFrom(l.PodAddr(dst), srv.TCPPort), time.Second); err != nil {
		t.Errorf("tcp %s -> %s: %v", src, dst, err)
	}
	for range 3 {
		if err := testenv.Ping(l.PodNS(src), l.PodAddr(dst), time.Second); err != nil {
			t.Errorf("ping %s -> %s: %v", src, dst, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	frames := wait()
	if len(frames) == 0 {
		t.Fatal("no UDP 6081 frames on the underlay while pods pinged across sites")
	}
	var out, back int
	for _, f := range frames {
		checkGeneve(t, f)
		if len(f.ipSrc) != 2 || len(f.ipDst) != 2 {
			t.Errorf("frame with addresses %v -> %v: want outer and inner IPv4", f.ipSrc, f.ipDst)
			continue
		}
		switch {
		case f.ipSrc[0] == a1.Address.String() && f.ipDst[0] == b1.Address.String() &&
			f.ipSrc[1] == l.PodAddr(src).String() && f.ipDst[1] == l.PodAddr(dst).String():
			out++
		case f.ipSrc[0] == b1.Address.String() && f.ipDst[0] == a1.Address.String() &&
			f.ipSrc[1] == l.PodAddr(dst).String() && f.ipDst[1] == l.PodAddr(src).String():
			back++
		}
	}
	t.Logf("%d GENEVE frames, %d %s->%s, %d back", len(frames), out, src, dst, back)
	if out < 3 || back < 3 {
		t.Errorf("want 3 requests a1->b1 and 3 replies b1->a1 carrying the pods' addresses; frames: %+v", frames)
	}
	// The outer source port comes from a hash of the inner flow: every packet
	// of the TCP connection, in each direction, carries the same one.
	ports := map[string]map[string]bool{}
	for _, f := range frames {
		if !strings.Contains(f.protocols, ":tcp") || len(f.udpSrc) == 0 || len(f.ipSrc) == 0 {
			continue
		}
		key := f.ipSrc[0] + " tcp " + f.tcpPorts
		if ports[key] == nil {
			ports[key] = map[string]bool{}
		}
		ports[key][f.udpSrc[0]] = true
	}
	t.Logf("outer UDP source ports per TCP flow: %v", ports)
	if len(ports) != 2 {
		t.Errorf("TCP flows seen (by outer source and inner ports): %v, want one each way", ports)
	}
	for flow, p := range ports {
		if len(p) != 1 {
			t.Errorf("flow %s: outer UDP source ports %v, want exactly one", flow, p)
		}
	}
}

// injectScript builds a frame the way a Linux geneve device (external mode, UDP
// checksum off for IPv4) sends it and puts it on eth0 of the namespace it runs in.
const injectScript = `
import random, sys
from scapy.all import Ether, IP, UDP, ICMP, Raw, sendp, get_if_hwaddr
from scapy.contrib.geneve import GENEVE
gw_mac, outer_src, outer_dst, vni, inner_src, inner_dst, ident = sys.argv[1:8]
frame = (Ether(src=get_if_hwaddr("eth0"), dst=gw_mac)
         / IP(src=outer_src, dst=outer_dst, ttl=64, flags="DF", id=random.randint(0, 65535))
         / UDP(sport=random.randint(49152, 65535), dport=6081, chksum=0)
         / GENEVE(version=0, proto=0x6558, vni=int(vni))
         / Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
         / IP(src=inner_src, dst=inner_dst, ttl=64)
         / ICMP(type=8, id=int(ident), seq=1)
         / Raw(b"isthmus scapy probe"))
sendp(frame, iface="eth0", count=int(sys.argv[8]), inter=0.2, verbose=False)
`

// injected is how many frames TestScapyFrameDelivered injects: each must be
// seen on the wire and answered.
const injected = 3

// TestScapyFrameDelivered: GENEVE frames from a peer node, built by scapy
// rather than by our datapath, are accepted and delivered: the local pod answers
// every one of them and each reply goes back encapsulated.
func TestScapyFrameDelivered(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	a1, _ := l.Node("a1")
	b1, _ := l.Node("b1")
	local, remote := "a1-p1", "b1-p1"
	gwMAC := routerPortMAC(t, l, "b1")
	ident := 1 + rand.IntN(0xfffe)

	// Python has to start and import scapy before the first frame leaves: a
	// second or two on an idle machine, more than five beside the parallel
	// phase's labs, where a 5 s window once closed on an empty wire.
	wait := capture(t, l.RouterNS(), testenv.RouterPort("a1"), 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, err := l.Exec(ctx, l.NodeNS("b1"), "/usr/bin/python3", "-c", injectScript,
		gwMAC, b1.Address.String(), a1.Address.String(), strconv.Itoa(vni),
		l.PodAddr(remote).String(), l.PodAddr(local).String(), strconv.Itoa(ident), strconv.Itoa(injected)); err != nil {
		t.Fatalf("inject with scapy: %v\n%s", err, out)
	}
	frames := wait()
	var requests, replies int
	for _, f := range frames {
		if len(f.icmpIdent) == 0 || len(f.ipSrc) < 2 {
			continue
		}
		if id, err := parseNum(f.icmpIdent[0]); err != nil || id != uint64(ident) {
			continue
		}
		switch {
		case f.icmpType[0] == "8" && f.ipSrc[0] == b1.Address.String() && f.ipSrc[1] == l.PodAddr(remote).String():
			requests++
		case f.icmpType[0] == "0" && f.ipSrc[0] == a1.Address.String() && f.ipDst[0] == b1.Address.String() &&
			f.ipSrc[1] == l.PodAddr(local).String() && f.ipDst[1] == l.PodAddr(remote).String():
			checkGeneve(t, f)
			replies++
		}
	}
	t.Logf("ident %#x: %d injected requests seen, %d encapsulated replies", ident, requests, replies)
	if requests != injected {
		t.Fatalf("%d of the %d injected frames reached a1's underlay port; frames: %+v", requests, injected, frames)
	}
	// Every request is answered: one reply of three would hide a datapath
	// that drops the others.
	if replies != injected {
		t.Errorf("pod %s answered %d of the %d scapy-built GENEVE echo requests (encapsulated replies %s -> %s); agent log of a1:\n%s",
			local, replies, injected, a1.Address, b1.Address, tailFile(l.AgentLog("a1")))
	}
}

// routerPortMAC returns the MAC of a node's router port: the gateway MAC the
// node's frames to other hosts carry.
func routerPortMAC(t *testing.T, l *testenv.Lab, node string) string {
	t.Helper()
	ns, err := netns.GetFromPath(testenv.NSPath(l.RouterNS()))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName(testenv.RouterPort(node))
	if err != nil {
		t.Fatal(err)
	}
	return link.Attrs().HardwareAddr.String()
}

// TestBulkTCP: 1 GiB of TCP from a pod of one site to a pod of the other, with
// the pods' offloads on, arrives whole within the deadline and never stalls.
// A stall is a gap of 3s between two reads: broken GSO shows as retransmission
// timeouts backing off past that, while a loaded 2-core machine shows gaps of
// about a second even on plain routing.
func TestBulkTCP(t *testing.T) {
	l := upDefault(t)
	client, server := "a1-p1", "b1-p1"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, pod := range []string{client, server} {
		out, err := l.Exec(ctx, l.PodNS(pod), "ethtool", "-k", "eth0")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"tcp-segmentation-offload: on", "generic-segmentation-offload: on"} {
			if !strings.Contains(out, want) {
				t.Fatalf("pod %s: %q off; the test is about offloads on", pod, want)
			}
		}
	}
	const size = 1 << 30
	res, err := testenv.BulkTCP(ctx, l.PodNS(client), l.PodNS(server), l.PodAddr(server), size)
	if err != nil {
		t.Fatalf("1 GiB %s -> %s: %v (received %d bytes, longest gap %s)", client, server, err, res.Bytes, res.MaxGap)
	}
	t.Logf("1 GiB %s -> %s in %s: %.2f Gbit/s, longest gap between reads %s",
		client, server, res.Duration.Round(time.Millisecond), res.Gbps(), res.MaxGap.Round(time.Millisecond))
	if res.Bytes != size {
		t.Errorf("received %d bytes, want %d", res.Bytes, size)
	}
	if res.MaxGap > 3*time.Second {
		t.Errorf("the flow stalled for %s", res.MaxGap)
	}
}

// TestDownAfterFailedUp: `isthmus-lab lab up` with an agent binary that does not
// exist fails, and `isthmus-lab lab down` then leaves no namespace and no pin.
func TestDownAfterFailedUp(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	name := labName()
	t.Cleanup(func() { testenv.Down(name, testenv.DownOptions{}) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, testenv.LabBinary(binary), "lab", "up", "default", "--name", name,
		"--binary", "/nonexistent/isthmus", "--ready-timeout", "10s").CombinedOutput()
	if err == nil {
		t.Fatalf("lab up with a missing agent binary succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "agent on") {
		t.Errorf("lab up error does not name the agent:\n%s", out)
	}
	if out, err := exec.CommandContext(ctx, testenv.LabBinary(binary), "lab", "down", "--name", name).CombinedOutput(); err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	assertGone(t, name)
	if out, err := exec.CommandContext(ctx, testenv.LabBinary(binary), "lab", "down", "--name", name).CombinedOutput(); err != nil {
		t.Fatalf("second lab down: %v\n%s", err, out)
	}
}

// TestUpWaitsForPeersUp: a lab is not ready while an agent finds a
// health-checked peer down. The gwfailover scenario gets a third west gateway,
// gw-w3, as a Node object only: nothing answers its probes, so w-1 and the east
// gateways, which probe every west gateway, count it down (within 0.3 s at a
// 100 ms interval, long before the last agent is ready). Up must fail within
// the ready timeout and name it.
func TestUpWaitsForPeersUp(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	sc, err := testenv.LoadScenario("gwfailover")
	if err != nil {
		t.Fatal(err)
	}
	sc.Objects += `---
apiVersion: v1
kind: Node
metadata:
  name: gw-w3
  labels: {isthmus.dev/gateway: "true"}
spec: {podCIDR: 10.60.4.0/24, podCIDRs: [10.60.4.0/24]}
status:
  addresses: [{type: InternalIP, address: 172.21.0.13}]
`
	name := labName()
	t.Cleanup(func() {
		if err := testenv.Down(name, testenv.DownOptions{}); err != nil {
			t.Error(err)
		}
		assertGone(t, name)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const readyTimeout = 30 * time.Second
	start := time.Now()
	l, err := testenv.Up(ctx, sc, testenv.Options{Name: name, Binary: binary, ReadyTimeout: readyTimeout,
		AgentArgs: []string{"--health-interval", "100ms"}})
	if err == nil {
		l.Down()
		t.Fatal("Up succeeded while gw-w3 answers no health probe")
	}
	if !strings.Contains(err.Error(), "health checks still find peers down") ||
		!strings.Contains(err.Error(), `peer="gw-w3"`) {
		t.Fatalf("Up = %v, want the peers found down, gw-w3 among them", err)
	}
	for _, other := range []string{"gw-w1", "gw-w2", "gw-e1", "gw-e2"} {
		if strings.Contains(err.Error(), `peer="`+other+`"`) {
			t.Errorf("Up names %s down, which answers: %v", other, err)
		}
	}
	if took := time.Since(start); took > 2*readyTimeout+30*time.Second {
		t.Errorf("Up gave up after %s, the ready timeout is %s for each wait", took.Round(time.Second), readyTimeout)
	}
}

func tailFile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}
