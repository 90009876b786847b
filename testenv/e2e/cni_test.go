package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/testenv"
)

// reservedAddrs lists the addresses a node's IPAM holds, from its store.
func reservedAddrs(t *testing.T, l *testenv.Lab, node string) []netip.Addr {
	t.Helper()
	rs, err := l.Reservations(node)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, r := range rs {
		out = append(out, r.Addr)
	}
	return out
}

// waitIPAM polls a node's IPAM status until ok accepts it, and fails the test
// with the last status after timeout.
func waitIPAM(t *testing.T, l *testenv.Lab, node string, timeout time.Duration, what string, ok func(ipam.Status) bool) ipam.Status {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := l.IPAMStatus(ctx, node)
		cancel()
		if err == nil && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: IPAM of %s after %s: %+v (err %v)", what, node, timeout, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pingBoth pings b from a and a from b, pods of the lab.
func pingBoth(t *testing.T, l *testenv.Lab, a, b string) {
	t.Helper()
	for _, pr := range [][2]string{{a, b}, {b, a}} {
		if err := testenv.Ping(l.PodNS(pr[0]), l.PodAddr(pr[1]), 2*time.Second); err != nil {
			t.Errorf("ping %s (%s) -> %s (%s): %v", pr[0], l.PodAddr(pr[0]), pr[1], l.PodAddr(pr[1]), err)
		}
	}
}

// TestLabPodsThroughPlugin: the lab's managed pods are the plugin's: each holds
// a reservation on its node's disk for the attachment cnitool made, with the
// scenario's address, the host side of its veth is the plugin's name, and
// `cnitool check` passes for it. A pod added to a running lab gets the next
// address the node's IPAM chooses, and talks to the other site.
func TestLabPodsThroughPlugin(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	for _, p := range l.Scenario.Pods() {
		rs, err := l.Reservations(p.Node)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(rs, func(r ipam.Reservation) bool { return r.Addr == p.Address })
		if i < 0 {
			t.Errorf("pod %s: no reservation of %s on %s (have %v)", p.Name, p.Address, p.Node, rs)
			continue
		}
		r := rs[i]
		if r.NetNS != testenv.NSPath(l.PodNS(p.Name)) || r.ContainerID != testenv.CNIToolContainerID(r.NetNS) || r.HostIface != l.HostVeth(p.Name) {
			t.Errorf("pod %s: reservation %+v, want netns %s, cnitool's container ID and host side %s", p.Name, r, testenv.NSPath(l.PodNS(p.Name)), l.HostVeth(p.Name))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// CHECK with the prevResult libcni cached at ADD, as a runtime does.
	if out, err := l.CNITool(ctx, "check", "a1-p1"); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
	a, err := l.AddPod(ctx, "b2", "b2-p3")
	if err != nil {
		t.Fatal(err)
	}
	// The scenario's pods asked for .10 and .11; allocation goes on after the
	// last address handed out in the range.
	if want := netip.MustParseAddr("10.245.2.12"); a != want {
		t.Errorf("b2-p3 got %s, want %s", a, want)
	}
	pingBoth(t, l, "b2-p3", "a1-p1")

	// DEL with the node's agent down, twice: the pod's interface and its
	// reservation go, the other pod of the node keeps its own.
	if err := l.StopAgent("b1"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if out, err := l.CNITool(ctx, "del", "b1-p2"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	if got := reservedAddrs(t, l, "b1"); !slices.Equal(got, []netip.Addr{l.PodAddr("b1-p1")}) {
		t.Errorf("b1 reserves %v after DEL of b1-p2, want only b1-p1's %s", got, l.PodAddr("b1-p1"))
	}
	if out, err := l.Exec(ctx, l.NodeNS("b1"), "ip", "-o", "link", "show"); err != nil || strings.Contains(out, l.HostVeth("b1-p2")) || !strings.Contains(out, l.HostVeth("b1-p1")) {
		t.Errorf("b1's links after DEL of b1-p2 (%v):\n%s\nwant %s gone and %s kept", err, out, l.HostVeth("b1-p2"), l.HostVeth("b1-p1"))
	}

	// Down is the runtime's DEL of every pod still there, b2-p3 too: libcni
	// removes what it cached at each ADD only then, so its cache tells.
	cached := func() []string {
		var out []string
		for _, p := range l.Scenario.Pods() {
			f := filepath.Join(libcniCache, "results", "isthmus-"+testenv.CNIToolContainerID(testenv.NSPath(l.PodNS(p.Name)))+"-eth0")
			if _, err := os.Stat(f); err == nil {
				out = append(out, p.Name)
			}
		}
		return out
	}
	if got := cached(); len(got) != len(l.Scenario.Pods())-1 || slices.Contains(got, "b1-p2") {
		t.Fatalf("libcni caches ADD results of %v, want every pod but the deleted b1-p2", got)
	}
	if err := testenv.Down(l.Name, testenv.DownOptions{Binary: binary}); err != nil {
		t.Fatal(err)
	}
	if got := cached(); len(got) != 0 {
		t.Errorf("after down libcni still caches ADD results of %v: no DEL for them", got)
	}
}

// libcniCache is libcni's default cache directory, which cnitool uses.
const libcniCache = "/var/lib/cni"

// TestLabLeakedPodCollected: a pod the runtime loses without DEL (its network
// namespace deleted, which takes its veth along) leaves a reservation; the
// node's agent finds and releases it on its own, and keeps the others. A new
// pod still gets an address and talks.
func TestLabLeakedPodCollected(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	// A leak collector that looks every 200 ms at reservations older than 1 s,
	// instead of the minutes a node uses.
	if err := l.StopAgent("a2"); err != nil {
		t.Fatal(err)
	}
	if err := l.StartAgent("a2", "--ipam-leak-interval", "200ms", "--ipam-leak-grace", "1s"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := l.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	lost, kept := l.PodAddr("a2-p2"), l.PodAddr("a2-p1")
	if got := reservedAddrs(t, l, "a2"); !slices.Contains(got, lost) || !slices.Contains(got, kept) {
		t.Fatalf("a2 reserves %v, want %s and %s", got, kept, lost)
	}
	if out, err := exec.Command("ip", "netns", "del", l.PodNS("a2-p2")).CombinedOutput(); err != nil {
		t.Fatalf("delete a2-p2's namespace: %v: %s", err, out)
	}
	// The kernel destroys a namespace, and with it the veth, from a work queue
	// that runs behind the teardown of earlier tests' labs (seconds under load):
	// take the host side away now, as that cleanup will.
	if out, err := exec.Command("ip", "-n", l.NodeNS("a2"), "link", "del", l.HostVeth("a2-p2")).CombinedOutput(); err != nil &&
		!strings.Contains(string(out), "Cannot find device") {
		t.Fatalf("delete a2-p2's host interface: %v: %s", err, out)
	}
	start := time.Now()
	for slices.Contains(reservedAddrs(t, l, "a2"), lost) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("a2-p2's %s still reserved 10 s after its pod went; agent log:\n%s", lost, tailFile(l.AgentLog("a2")))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the leaked reservation of %s went %s after its pod", lost, time.Since(start).Round(10*time.Millisecond))
	if got := reservedAddrs(t, l, "a2"); !slices.Contains(got, kept) {
		t.Fatalf("a2 reserves %v: the running a2-p1's %s went too", got, kept)
	}
	pingBoth(t, l, "a2-p1", "b1-p1")
	if _, err := l.AddPod(ctx, "a2", "a2-p3"); err != nil {
		t.Fatal(err)
	}
	pingBoth(t, l, "a2-p3", "b1-p1")
	// The runtime's DEL of the lost pod comes late, its namespace gone: it
	// succeeds, and clears what libcni cached for it at ADD.
	if out, err := l.CNITool(ctx, "del", "a2-p2"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestLabSiteEditMovesPools: site-a's pools move from 10.244.0.0/16 to
// 10.246.0.0/16 and its nodes get podCIDRs from the new pool, as the
// controller would give them. Each node's IPAM then serves only its new range
// and reports the running pods' addresses as outside it; new pods get
// addresses from the new ranges and talk to each other across a1 and a2 and
// to a pod of the other site, so every agent routes the new podCIDRs.
//
// The nodes run without the CNI leftover rules: their FORWARD policy DROP
// accepts only the pod blocks the lab knew at `up`, as another CNI's rules
// would, so they would drop the new pool's traffic between a1 and a2.
func TestLabSiteEditMovesPools(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	sc.Defaults.CNILeftovers = testenv.Leftovers{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := upLab(ctx, t, sc, testenv.Options{})
	edited, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	site := &edited.Sites[0]
	if site.Name != "site-a" || len(site.Nodes) != 2 {
		t.Fatalf("default scenario: want site-a with two nodes first, have %s", site.Name)
	}
	spec, _ := json.Marshal(map[string]any{
		"nodeCidrs":          []string{"172.16.1.0/24"},
		"podCidrAssignments": []map[string]any{{"cidrBlocks": []string{"10.246.0.0/16"}, "nodeBlockSizes": map[string]int{"ipv4": 24}}},
	})
	site.Spec = spec
	newCIDR := map[string]netip.Prefix{}
	for i := range site.Nodes {
		n := &site.Nodes[i]
		newCIDR[n.Name] = netip.MustParsePrefix(fmt.Sprintf("10.246.%d.0/24", i+1))
		n.PodCIDRs, n.Pods = []netip.Prefix{newCIDR[n.Name]}, nil // pods are no objects
	}
	if err := edited.WriteObjects(l.ObjectsDir()); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"a1", "a2"} {
		var old []netip.Addr
		for _, p := range l.Scenario.Pods() {
			if p.Node == node {
				old = append(old, p.Address)
			}
		}
		slices.SortFunc(old, netip.Addr.Compare)
		st := waitIPAM(t, l, node, 15*time.Second, "after the edit", func(st ipam.Status) bool {
			return st.Ready && slices.Equal(st.Ranges, []netip.Prefix{newCIDR[node]}) && slices.Equal(st.Outside, old)
		})
		t.Logf("%s's IPAM after the edit: ranges %v, outside (the running pods) %v", node, st.Ranges, st.Outside)
		pod := node + "-p3"
		a, err := l.AddPod(ctx, node, pod)
		if err != nil {
			t.Fatal(err)
		}
		if want := newCIDR[node].Addr().Next().Next(); a != want {
			t.Errorf("%s got %s, want %s, the first pod address of the new range", pod, a, want)
		}
	}
	// The other agents learn the new podCIDRs from the Node objects and route
	// them; allow them a moment.
	deadline := time.Now().Add(10 * time.Second)
	for testenv.Ping(l.PodNS("b1-p1"), l.PodAddr("a1-p3"), time.Second) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("b1-p1 cannot reach a1-p3 (%s) 10 s after the edit", l.PodAddr("a1-p3"))
		}
	}
	pingBoth(t, l, "a1-p3", "b1-p1")
	pingBoth(t, l, "a1-p3", "a2-p3")
}

// flannelConflist is flannel's cni-conf.json (kube-flannel.yml), which its
// DaemonSet writes as /etc/cni/net.d/10-flannel.conflist.
const flannelConflist = `{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// TestLabAnotherCNIKeepsNode: another plugin's conflist appears on a1 (a node
// of a managed Site) and a1's agent restarts without --cni-take-over. The
// agent takes its own conflist away, leaves flannel's as it is, keeps the
// plugin (a1's pods hold reservations and their DEL runs it), says so in its
// log and metrics, is Ready, and a1's pods keep talking across the sites.
func TestLabAnotherCNIKeepsNode(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	conf, bin := l.CNIConfDir("a1"), l.CNIBinDir("a1")
	flannel := filepath.Join(conf, "10-flannel.conflist")
	if err := l.StopAgent("a1"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flannel, []byte(flannelConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := l.StartAgent("a1"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(conf, "00-isthmus.conflist")); !os.IsNotExist(err) {
		t.Errorf("a1 still has 00-isthmus.conflist beside flannel's (%v)", err)
	}
	if b, err := os.ReadFile(flannel); err != nil || string(b) != flannelConflist {
		t.Errorf("flannel's conflist changed: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(bin, "isthmus-cni")); err != nil {
		t.Errorf("the plugin is gone while a1's pods hold reservations: %v", err)
	}
	m := scrapeMetrics(t, l, "a1")
	if m[`isthmus_cni_state{state="foreign_config"}`] != 1 || m[`isthmus_cni_foreign_config{file="10-flannel.conflist"}`] != 1 {
		t.Errorf("a1's metrics: isthmus_cni_state foreign_config %v, isthmus_cni_foreign_config 10-flannel.conflist %v, want 1 and 1",
			m[`isthmus_cni_state{state="foreign_config"}`], m[`isthmus_cni_foreign_config{file="10-flannel.conflist"}`])
	}
	if log, _ := os.ReadFile(l.AgentLog("a1")); !strings.Contains(string(log), "isthmus is not this node's CNI") || !strings.Contains(string(log), "10-flannel.conflist") {
		t.Errorf("a1's log does not say flannel's conflist keeps isthmus off:\n%s", log)
	}
	pingBoth(t, l, "a1-p1", "b1-p1")
	// b1 has no other CNI: its conflist stays.
	if _, err := os.Stat(filepath.Join(l.CNIConfDir("b1"), "00-isthmus.conflist")); err != nil {
		t.Errorf("b1 lost its conflist: %v", err)
	}

	// flannel's conflist goes: the running agent makes isthmus a1's CNI again
	// at a following verification (so the lab's DEL finds its network).
	if err := os.Remove(flannel); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(conf, "00-isthmus.conflist")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 00-isthmus.conflist on a1 10s after flannel's went")
		}
	}
	if m := scrapeMetrics(t, l, "a1"); m[`isthmus_cni_state{state="installed"}`] != 1 {
		t.Errorf("a1's isthmus_cni_state installed = %v, want 1", m[`isthmus_cni_state{state="installed"}`])
	}
	if _, err := l.AddPod(ctx, "a1", "a1-p3"); err != nil {
		t.Fatal(err)
	}
	pingBoth(t, l, "a1-p3", "b1-p1")
}
