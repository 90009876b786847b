package testenv

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests build real labs and need root; none of them needs the agent.

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test builds network namespaces and needs root; run it as root (sudo go test ./testenv/)")
	}
}

// uniqueLab returns a lab name no other test uses.
func uniqueLab(t *testing.T) string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := []byte("u")
	for range 7 {
		b = append(b, letters[rand.IntN(len(letters))])
	}
	return string(b)
}

// upLab builds the default scenario with datapath dp and no agents.
func upLab(t *testing.T, dp Datapath) *Lab {
	t.Helper()
	return upNamed(t, "default", dp)
}

// upNamed builds the built-in scenario name with datapath dp and no agents.
func upNamed(t *testing.T, name string, dp Datapath) *Lab {
	t.Helper()
	requireRoot(t)
	sc, err := LoadScenario(name)
	if err != nil {
		t.Fatal(err)
	}
	return upScenario(t, sc, dp, time.Minute)
}

// upScenario builds sc with datapath dp and no agents (the binary does not
// exist, so nothing can start one), and takes it down, checking nothing is
// left, when the test ends.
func upScenario(t *testing.T, sc *Scenario, dp Datapath, timeout time.Duration) *Lab {
	t.Helper()
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l, err := Up(ctx, sc, Options{Name: uniqueLab(t), Datapath: dp, Binary: "/nonexistent/isthmus"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Error(err)
		}
		assertGone(t, l.Name)
	})
	return l
}

// assertGone fails unless nothing of the lab is left.
func assertGone(t *testing.T, lab string) {
	t.Helper()
	if left, _ := listNS(NSPrefix + lab + "-"); len(left) > 0 {
		t.Errorf("namespaces left after down: %v", left)
	}
	for _, dir := range []string{filepath.Join(PinRoot, lab), StateDir(lab)} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s left after down (stat: %v)", dir, err)
		}
	}
}

// TestPlainLab checks the lab itself: with native routes instead of isthmus,
// every pod reaches every other with its own address, through the leftover
// rules (pod-to-pod is exempted from MASQUERADE in this datapath only).
func TestPlainLab(t *testing.T) {
	l := upLab(t, DatapathPlain)
	m, err := l.Check(context.Background())
	if err != nil {
		t.Fatalf("%v\n%s", err, m)
	}
	if want := 8 * 7 * 3; len(m.Probes) != want {
		t.Fatalf("%d probes, want %d", len(m.Probes), want)
	}
	for _, p := range m.Probes {
		if p.Proto != ICMP && p.Saw != l.PodAddr(p.Src) {
			t.Errorf("%s -> %s %s: server saw %s, want %s", p.Src, p.Dst, p.Proto, p.Saw, l.PodAddr(p.Src))
		}
	}
}

// TestCheckFailsRetriedProbe: on the plain lab, the destination pod drops
// every UDP datagram for the first 300 ms; the check's UDP probe, sent at once,
// loses its first datagram and passes on its second attempt a second later.
// The check fails that pair anyway, and the matrix names the probe with its
// attempts and its first error, while ICMP and TCP pass on the first.
func TestCheckFailsRetriedProbe(t *testing.T) {
	l := upLab(t, DatapathPlain)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, dst := "a1-p1", "b1-p1"
	drop := []string{"INPUT", "-p", "udp", "-m", "comment", "--comment", "test: lose the first datagram", "-j", "DROP"}
	if out, err := l.Exec(ctx, l.PodNS(dst), append([]string{"iptables", "-I"}, drop...)...); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lift := time.AfterFunc(300*time.Millisecond, func() {
		if out, err := l.Exec(ctx, l.PodNS(dst), append([]string{"iptables", "-D"}, drop...)...); err != nil {
			t.Errorf("lift the drop: %v: %s", err, out)
		}
	})
	defer lift.Stop()
	m, err := l.CheckPairs(ctx, [][2]string{{src, dst}}, CheckOptions{})
	if m == nil {
		t.Fatal(err)
	}
	t.Logf("matrix:\n%s", m)
	if err == nil || !strings.Contains(err.Error(), "1 of 3 probes passed only after a retry") {
		t.Errorf("check error %v, want 1 of 3 probes passed only after a retry", err)
	}
	for _, proto := range Protos {
		p, ok := m.Get(src, dst, proto)
		want := 1
		if proto == UDP {
			want = 2
		}
		if !ok || !p.OK || p.Attempts != want {
			t.Errorf("%s: probed %v, passed %v after %d attempts (%v), want passed after %d", proto, ok, p.OK, p.Attempts, p.Errs, want)
		}
	}
	if !strings.Contains(m.String(), "passed only after a retry: a1-p1->b1-p1 udp on attempt 2 (first: read reply:") {
		t.Errorf("the matrix does not name the retried probe with its attempt and first error:\n%s", m)
	}
}

// TestVXLANLab checks the kernel VXLAN baseline the benchmark compares with.
func TestVXLANLab(t *testing.T) {
	l := upLab(t, DatapathVXLAN)
	m, err := l.Check(context.Background())
	if err != nil {
		t.Fatalf("%v\n%s", err, m)
	}
	out, err := l.Exec(context.Background(), l.NodeNS("a1"), "ip", "-d", "link", "show", VXLANDev)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "vxlan id 4242") || !strings.Contains(out, "dstport 4789") {
		t.Errorf("a1 %s is not VXLAN 4242 on 4789:\n%s", VXLANDev, out)
	}
}

// TestTopology checks the underlay (node to router to node), the pod wiring
// and the node settings, and that without a datapath the check fails the way it
// must: remote pods unreachable, same-node traffic masqueraded by the leftovers.
func TestTopology(t *testing.T) {
	l := upLab(t, DatapathNone)
	for _, pair := range [][2]string{{"a1", "a2"}, {"a1", "b2"}, {"b1", "a2"}} {
		dst, _ := l.Node(pair[1])
		if err := Ping(l.NodeNS(pair[0]), dst.Address, 2*time.Second); err != nil {
			t.Errorf("node %s -> node %s (%s): %v", pair[0], pair[1], dst.Address, err)
		}
	}
	a1, _ := l.Node("a1")
	if err := Ping(l.PodNS("a1-p1"), a1.Address, 2*time.Second); err != nil {
		t.Errorf("pod a1-p1 -> its node: %v", err)
	}
	ctx := context.Background()
	for _, cmd := range []struct {
		ns, want string
		argv     []string
	}{
		{l.PodNS("a1-p1"), "mtu 1450", []string{"ip", "link", "show", "eth0"}},
		{l.PodNS("a1-p1"), "169.254.1.1 dev eth0 lladdr", []string{"ip", "neigh", "show", "169.254.1.1"}},
		{l.PodNS("a1-p1"), "PERMANENT", []string{"ip", "neigh", "show", "169.254.1.1"}},
		{l.PodNS("a1-p1"), "default via 169.254.1.1 dev eth0", []string{"ip", "route"}},
		{l.NodeNS("a1"), "10.244.1.10 dev " + l.HostVeth("a1-p1") + " scope link", []string{"ip", "route"}},
		{l.NodeNS("a1"), "mtu 1500", []string{"ip", "link", "show", "eth0"}},
		{l.NodeNS("a1"), "-A POSTROUTING -s 10.245.0.0/16 ! -d 224.0.0.0/4 -j MASQUERADE", []string{"iptables-save", "-t", "nat"}},
		{l.NodeNS("a1"), ":FORWARD DROP", []string{"iptables-save", "-t", "filter"}},
		{l.NodeNS("a1"), "-A FORWARD -m conntrack --ctstate INVALID -j DROP\n-A FORWARD -s 10.244.0.0/16 -j ACCEPT", []string{"iptables-save", "-t", "filter"}},
		{l.NodeNS("a1"), "net.ipv4.conf." + l.HostVeth("a1-p2") + ".rp_filter = 1", []string{"sysctl", "net.ipv4.conf." + l.HostVeth("a1-p2") + ".rp_filter"}},
		{l.NodeNS("a1"), "net.ipv4.conf.eth0.rp_filter = 1", []string{"sysctl", "net.ipv4.conf.eth0.rp_filter"}},
		{l.NodeNS("a1"), "net.ipv4.ip_forward = 1", []string{"sysctl", "net.ipv4.ip_forward"}},
		{l.PodNS("a1-p1"), "tcp-segmentation-offload: on", []string{"ethtool", "-k", "eth0"}},
	} {
		out, err := l.Exec(ctx, cmd.ns, cmd.argv...)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if !strings.Contains(out, cmd.want) {
			t.Errorf("%s: %s: want %q in:\n%s", cmd.ns, strings.Join(cmd.argv, " "), cmd.want, out)
		}
	}

	checkRPFilter(t, l)

	m, err := l.CheckPairs(ctx, [][2]string{{"a1-p1", "a1-p2"}, {"a1-p1", "b1-p1"}}, CheckOptions{Timeout: 300 * time.Millisecond, Attempts: 1})
	if err == nil {
		t.Fatalf("check passed without a datapath:\n%s", m)
	}
	if p, _ := m.Get("a1-p1", "a1-p2", ICMP); !p.OK {
		t.Errorf("same-node ping failed: %s", p.Err)
	}
	if p, _ := m.Get("a1-p1", "a1-p2", TCP); p.OK || p.Saw != a1.Address {
		t.Errorf("same-node tcp: ok=%v saw %s, want a failure with the node address %s (MASQUERADE)", p.OK, p.Saw, a1.Address)
	}
	for _, proto := range Protos {
		if p, _ := m.Get("a1-p1", "b1-p1", proto); p.OK {
			t.Errorf("cross-site %s passed without a datapath", proto)
		}
	}
}

// TestProxyARPWiring builds the plain-routing lab with its pods wired as Calico
// wires them (PodWiringProxyARP) and asks the kernels: before any traffic the pod
// has no entry for its gateway (nothing permanent), the host veth has Calico's MAC
// and answers by proxy ARP; then every pod pair talks with its own address, and the
// pod's gateway entry is one its own ARP learnt, pointing at the host veth.
func TestProxyARPWiring(t *testing.T) {
	requireRoot(t)
	sc, err := LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	sc.PodWiring = PodWiringProxyARP
	l := upScenario(t, sc, DatapathPlain, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	host := l.HostVeth("a1-p1")
	if out, err := l.Exec(ctx, l.PodNS("a1-p1"), "ip", "neigh", "show", PodGateway); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("a1-p1: neighbour %s before any traffic = %q (%v), want none", PodGateway, out, err)
	}
	for _, cmd := range []struct {
		ns, want string
		argv     []string
	}{
		{l.NodeNS("a1"), "net.ipv4.conf." + host + ".proxy_arp = 1", []string{"sysctl", "net.ipv4.conf." + host + ".proxy_arp"}},
		{l.NodeNS("a1"), "net.ipv4.neigh." + host + ".proxy_delay = 0", []string{"sysctl", "net.ipv4.neigh." + host + ".proxy_delay"}},
		{l.NodeNS("a1"), "link/ether " + ProxyARPMAC, []string{"ip", "link", "show", host}},
		{l.PodNS("a1-p1"), "default via 169.254.1.1 dev eth0", []string{"ip", "route"}},
	} {
		out, err := l.Exec(ctx, cmd.ns, cmd.argv...)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if !strings.Contains(out, cmd.want) {
			t.Errorf("%s: %s: want %q in:\n%s", cmd.ns, strings.Join(cmd.argv, " "), cmd.want, out)
		}
	}
	if out, err := l.Exec(ctx, l.NodeNS("a1"), "ip", "-br", "addr", "show", host); err != nil || strings.Contains(out, "inet ") {
		t.Errorf("a1 %s has an address (%v): %s", host, err, out)
	}
	m, err := l.Check(ctx)
	if err != nil {
		t.Fatalf("%v\n%s", err, m)
	}
	for _, p := range m.Probes {
		if p.Proto != ICMP && p.Saw != l.PodAddr(p.Src) {
			t.Errorf("%s -> %s %s: server saw %s, want %s", p.Src, p.Dst, p.Proto, p.Saw, l.PodAddr(p.Src))
		}
	}
	out, err := l.Exec(ctx, l.PodNS("a1-p1"), "ip", "neigh", "show", PodGateway)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "lladdr "+ProxyARPMAC) || strings.Contains(out, "PERMANENT") {
		t.Errorf("a1-p1: neighbour %s after traffic = %q, want one learnt by ARP with lladdr %s", PodGateway, out, ProxyARPMAC)
	}
}

// checkRPFilter: every node of the lab is strict everywhere, an interface set
// loose is reported, and RPFilterDrops counts what the kernel drops: the router
// sends a1 an echo request from the address of a1's pod a1-p1, which a1 routes
// to the pod's veth, so strict rp_filter on a1's eth0 drops it.
func checkRPFilter(t *testing.T, l *Lab) {
	t.Helper()
	ctx := context.Background()
	if loose, err := l.RPFilterNotStrict(); err != nil || len(loose) > 0 {
		t.Errorf("rp_filter not strict: %v (%v)", loose, err)
	}
	if err := writeSysctls(l.NodeNS("b2"), map[string]string{"net/ipv4/conf/eth0/rp_filter": "2"}); err != nil {
		t.Fatal(err)
	}
	loose, err := l.RPFilterNotStrict()
	if err != nil || len(loose) != 1 || !strings.HasPrefix(loose[0], "b2 eth0=2 ") {
		t.Errorf("with b2's eth0 loose: RPFilterNotStrict = %q (%v), want b2 eth0 alone", loose, err)
	}
	if err := writeSysctls(l.NodeNS("b2"), map[string]string{"net/ipv4/conf/eth0/rp_filter": "1"}); err != nil {
		t.Fatal(err)
	}

	before, err := l.RPFilterDrops()
	if err != nil {
		t.Fatal(err)
	}
	a1, _ := l.Node("a1")
	spoofed := l.PodAddr("a1-p1").String()
	if out, err := l.Exec(ctx, l.RouterNS(), "ip", "addr", "add", spoofed+"/32", "dev", "lo"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// No reply comes: a1 drops the request (ping exits 1 when none of its
	// requests is answered).
	if out, err := l.Exec(ctx, l.RouterNS(), "ping", "-c", "3", "-i", "0.2", "-W", "1", "-I", spoofed, a1.Address.String()); err == nil || !strings.Contains(out, " 0 received") {
		t.Errorf("ping from the spoofed %s to a1: err %v, want no reply:\n%s", spoofed, err, out)
	}
	if out, err := l.Exec(ctx, l.RouterNS(), "ip", "addr", "del", spoofed+"/32", "dev", "lo"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	after, err := l.RPFilterDrops()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Scenario.Nodes() {
		want := before[n.Name]
		if n.Name == "a1" {
			want += 3
		}
		if after[n.Name] != want {
			t.Errorf("node %s: %s %d -> %d, want %d", n.Name, RPFilterCounter, before[n.Name], after[n.Name], want)
		}
	}
}

// TestFailedUpCleansUp starts agents from a binary that does not exist: Up must
// fail, name the agent, and leave nothing behind.
func TestFailedUpCleansUp(t *testing.T) {
	requireRoot(t)
	sc, err := LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueLab(t)
	t.Cleanup(func() { Down(name, DownOptions{}) })
	_, err = Up(context.Background(), sc, Options{Name: name, Binary: "/nonexistent/isthmus", ReadyTimeout: 10 * time.Second})
	// The exec check refuses the first agent before it starts ("start agent on
	// a1: program not installed"); were it to start, whichever exits first is named.
	if err == nil || !regexp.MustCompile(`agent on (a1|a2|b1|b2)(: | exited)`).MatchString(err.Error()) ||
		!strings.Contains(err.Error(), "/nonexistent/isthmus") {
		t.Fatalf("Up with a missing binary = %v, want an error naming an agent and the binary", err)
	}
	assertGone(t, name)
	if err := Down(name, DownOptions{}); err != nil {
		t.Errorf("second down: %v", err)
	}
}

// TestDownAfterInterruptedUp leaves what an interrupted up leaves (namespaces,
// pins, a running agent, state) and checks that Down finds and removes it all
// from the name alone.
func TestDownAfterInterruptedUp(t *testing.T) {
	requireRoot(t)
	name := uniqueLab(t)
	t.Cleanup(func() { Down(name, DownOptions{}) })
	for _, member := range []string{"rt", "n1", "n1-p1"} {
		if err := createNS(NSName(name, member)); err != nil {
			t.Fatal(err)
		}
	}
	pin := filepath.Join(PinRoot, name, "n1")
	if err := ensureBPFFS(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(pin, "links"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(StateDir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	// A stand-in agent: its command line names the pin dir as a real one does.
	// The script must not end in its only command: dash would exec sleep in its
	// place, whose command line no longer names the pin dir, and Down (which
	// checks it before signalling) would then rightly leave it running.
	agentCmd := exec.Command("sh", "-c", "sleep 600; exit 0", pin)
	agentCmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { agentCmd.Wait(); close(exited) }()
	t.Cleanup(func() { agentCmd.Process.Kill() })
	if err := os.WriteFile(pidFile(name, "n1"), []byte(strconv.Itoa(agentCmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := Down(name, DownOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Error("agent still running after down")
	}
	assertGone(t, name)
	if err := Down(name, DownOptions{}); err != nil {
		t.Errorf("second down: %v", err)
	}
}
