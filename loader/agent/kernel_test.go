package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/health"
	"github.com/isthmus-dev/isthmus/loader/mapstate"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv/testns"
)

// needRootAndBPFFS fails the test unless it runs as root, and mounts bpffs on
// /sys/fs/bpf if nothing is mounted there.
func needRootAndBPFFS(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test creates network namespaces and BPF links and needs root (sudo go test ./loader/agent)")
	}
	if err := datapath.CheckBPFFS("/sys/fs/bpf"); err != nil {
		if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, ""); err != nil {
			t.Fatalf("mount bpffs on /sys/fs/bpf: %v", err)
		}
	}
}

// The names of this package's network namespaces and pin directories (see
// testns).
const (
	netnsPrefix = "isthmus-at"
	pinPrefix   = "isthmus-test"
)

// enterNewNetns moves the calling goroutine's thread into a fresh named network
// namespace for the rest of the test. The thread is never unlocked, so Go retires
// it with the goroutine instead of reusing it elsewhere.
func enterNewNetns(t *testing.T) (netns.NsHandle, string) {
	t.Helper()
	runtime.LockOSThread()
	testns.Leftovers(t, netnsPrefix)
	name := testns.Name(netnsPrefix)
	ns, err := netns.NewNamed(name)
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		ns.Close()
		netns.DeleteNamed(name)
	})
	return ns, name
}

func mustVeth(t *testing.T, name, peer string) netlink.Link {
	t.Helper()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		t.Fatalf("create veth %s: %v", name, err)
	}
	for _, n := range []string{peer, name} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustAddr(t *testing.T, l netlink.Link, cidr string) {
	t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
}

type testEnv struct {
	cfg     Config
	pinDir  string
	ns      netns.NsHandle
	nsName  string // under /run/netns
	under   netlink.Link
	pod     netlink.Link
	objects string
}

func setup(t *testing.T) *testEnv {
	needRootAndBPFFS(t)
	ns, name := enterNewNetns(t)
	e := &testEnv{ns: ns, nsName: name}
	e.under = mustVeth(t, "ul0", "ul0p")
	mustAddr(t, e.under, "172.16.1.10/24")
	e.pod = mustVeth(t, "pod-a", "pa-peer")
	testns.Leftovers(t, pinPrefix)
	e.pinDir = filepath.Join(testns.PinRoot, testns.Name(pinPrefix))
	t.Cleanup(func() {
		if err := datapath.Uninstall(e.pinDir); err != nil {
			t.Errorf("cleanup: uninstall: %v", err)
		}
		os.RemoveAll(e.pinDir)
	})
	e.objects = t.TempDir()
	data, err := os.ReadFile("testdata/two-sites.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.objects, "objects.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	e.cfg = Config{
		Node: "a1", ObjectsDir: e.objects, UnderlayDev: "", PinDir: e.pinDir,
		PodPatterns: []string{"pod-*"}, Decap: datapath.DecapAuto, VNI: 5,
		ReadyFile: filepath.Join(t.TempDir(), "ready"),
		Log:       slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	return e
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// linkInfo opens a pinned link and returns its id, program id and target ifindex.
func linkInfo(t *testing.T, pinDir, ifname string, h datapath.Hook) (link.ID, ebpf.ProgramID, uint32) {
	t.Helper()
	l, err := link.LoadPinnedLink(datapath.LinkPin(pinDir, ifname, h), nil)
	if err != nil {
		t.Fatalf("open pinned link %s.%s: %v", ifname, h, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	var ifindex uint32
	if x := info.TCX(); x != nil {
		ifindex = x.Ifindex
	} else if x := info.XDP(); x != nil {
		ifindex = x.Ifindex
	}
	return info.ID, info.Program, ifindex
}

// tcxCount is how many programs are attached at tcx ingress or egress of ifindex,
// asked in the calling thread's namespace.
func tcxCount(t *testing.T, ifindex int, at ebpf.AttachType) int {
	t.Helper()
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		t.Fatalf("query tcx programs on #%d: %v", ifindex, err)
	}
	return len(res.Programs)
}

func readMaps(t *testing.T, pinDir string) maps.State {
	t.Helper()
	s, err := maps.OpenPinned(pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (e *testEnv) wantState(t *testing.T, a *Agent, pods ...netlink.Link) maps.State {
	t.Helper()
	ov, err := netlink.LinkByName(datapath.OverlayDev)
	if err != nil {
		t.Fatal(err)
	}
	set, _, err := objects.LoadDir(e.objects)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := DefaultPlanner(set, "a1")
	if err != nil {
		t.Fatal(err)
	}
	node := mapstate.NodeConfig{VNI: 5, UnderlayIfindex: e.under.Attrs().Index, OverlayIfindex: ov.Attrs().Index,
		OverlayMAC: ov.Attrs().HardwareAddr, TunnelMTU: 1450,
		SNATPortMin: DefaultSNATPortMin, SNATPortMax: DefaultSNATPortMax}
	for _, l := range pods {
		node.PodIfindexes = append(node.PodIfindexes, l.Attrs().Index)
	}
	s, _ := mapstate.FromPlan(p, node)
	return s
}

func eventually(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAgentKernel(t *testing.T) {
	e := setup(t)
	a, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	firstHandle := nftTableHandle(t)

	// isthmus0: veth, ARP off, MTU 1500-50, the tunnel address.
	ov, err := netlink.LinkByName(datapath.OverlayDev)
	if err != nil {
		t.Fatalf("isthmus0 missing: %v", err)
	}
	if ov.Type() != "veth" || ov.Attrs().RawFlags&unix.IFF_NOARP == 0 || ov.Attrs().RawFlags&unix.IFF_UP == 0 {
		t.Errorf("isthmus0: type %s flags %#x, want an up veth with NOARP", ov.Type(), ov.Attrs().RawFlags)
	}
	if ov.Attrs().MTU != 1450 {
		t.Errorf("isthmus0 MTU = %d, want 1450", ov.Attrs().MTU)
	}
	addrs, _ := netlink.AddrList(ov, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.10.1.1/32" {
		t.Errorf("isthmus0 addresses = %v, want 10.10.1.1/32", addrs)
	}
	// Routes with proto 201.
	routes, err := datapath.KernelRoutes{}.List()
	if err != nil {
		t.Fatal(err)
	}
	wantRoutes := []datapath.Route{{Prefix: netip.MustParsePrefix("10.20.1.0/24"), Ifindex: ov.Attrs().Index, Src: netip.MustParseAddr("10.10.1.1")}}
	if !slices.EqualFunc(routes, wantRoutes, datapath.Route.Equal) {
		t.Errorf("proto 201 routes = %v, want %v", routes, wantRoutes)
	}
	// The pods' table: the peer's own address, and the rule for this node's pods.
	podRoutes, err := datapath.KernelRoutes{Table: datapath.PodTable}.List()
	if err != nil {
		t.Fatal(err)
	}
	wantPodRoutes := []datapath.Route{{Prefix: netip.MustParsePrefix("172.16.2.11/32"), Ifindex: ov.Attrs().Index, Src: netip.MustParseAddr("10.10.1.1")}}
	if !slices.EqualFunc(podRoutes, wantPodRoutes, datapath.Route.Equal) {
		t.Errorf("table %d routes = %v, want %v", datapath.PodTable, podRoutes, wantPodRoutes)
	}
	if rules, err := (datapath.KernelRules{}).List(); err != nil || !slices.Equal(rules, []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")}) {
		t.Errorf("rules to table %d from %v (%v), want from 10.10.1.0/24", datapath.PodTable, rules, err)
	}
	// The kernel takes it for a pod's source only: the host's own traffic to the
	// peer's address stays on the underlay.
	if rs, err := netlink.RouteGetWithOptions(net.ParseIP("172.16.2.11"), &netlink.RouteGetOptions{SrcAddr: net.ParseIP("10.10.1.7"), Iif: "pod-a"}); err != nil || len(rs) != 1 || rs[0].LinkIndex != ov.Attrs().Index {
		t.Errorf("route get 172.16.2.11 from 10.10.1.7 iif pod-a = %v (%v), want dev isthmus0", rs, err)
	}
	if rs, err := netlink.RouteGet(net.ParseIP("172.16.2.11")); err == nil && len(rs) > 0 && rs[0].LinkIndex == ov.Attrs().Index {
		t.Errorf("route get 172.16.2.11 = %v: the host's own traffic goes into isthmus0", rs)
	}
	if b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(string(b)) != "1" {
		t.Errorf("ip_forward = %q, want 1", b)
	}
	// Links pinned and attached where they should be; TC decap on a veth, no XDP.
	type pin struct {
		dev string
		h   datapath.Hook
		idx int
		at  ebpf.AttachType
	}
	pins := []pin{
		{"ul0", datapath.HookUnderlayIngress, e.under.Attrs().Index, ebpf.AttachTCXIngress},
		{"ul0", datapath.HookUnderlayEgress, e.under.Attrs().Index, ebpf.AttachTCXEgress},
		{datapath.OverlayDev, datapath.HookOverlayEgress, ov.Attrs().Index, ebpf.AttachTCXEgress},
		{"pod-a", datapath.HookPodIngress, e.pod.Attrs().Index, ebpf.AttachTCXIngress},
	}
	linkIDs := map[string]link.ID{}
	progIDs := map[string]ebpf.ProgramID{}
	for _, p := range pins {
		id, prog, ifindex := linkInfo(t, e.pinDir, p.dev, p.h)
		if int(ifindex) != p.idx {
			t.Errorf("link %s.%s targets ifindex %d, want %d", p.dev, p.h, ifindex, p.idx)
		}
		if n := tcxCount(t, p.idx, p.at); n != 1 {
			t.Errorf("%s: %d tcx programs attached, want 1", p.dev, n)
		}
		linkIDs[p.dev+string(p.h)] = id
		progIDs[p.dev+string(p.h)] = prog
	}
	if _, err := os.Stat(datapath.LinkPin(e.pinDir, "ul0", datapath.HookUnderlayXDP)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("auto decap on a veth must not attach XDP (stat: %v)", err)
	}
	// The kfree_skb tracer runs (this kernel has BTF), its link pinned.
	var tracerLink link.ID
	if tl, err := link.LoadPinnedLink(datapath.TracerPin(e.pinDir), nil); err != nil {
		t.Errorf("kfree_skb tracer not attached by the agent: %v", err)
	} else {
		info, err := tl.Info()
		if err != nil {
			t.Fatal(err)
		}
		tracerLink = info.ID
		tl.Close()
	}
	// Maps equal the plan.
	if got, want := readMaps(t, e.pinDir), e.wantState(t, a, e.pod); !got.Equal(want) {
		t.Fatalf("maps hold\n%+v\nwant\n%+v", got, want)
	}
	if _, err := os.Stat(e.cfg.ReadyFile); err != nil {
		t.Errorf("ready file: %v", err)
	}
	if got := a.PodInterfaces(); !slices.Equal(got, []string{"pod-a"}) {
		t.Errorf("pod interfaces = %q", got)
	}

	// Restart: a counter survives, link ids stay, program ids change.
	ms, err := maps.OpenPinned(e.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	ncpu, _ := ebpf.PossibleCPU()
	survivor := make([]maps.MetricsValue, ncpu)
	survivor[0] = maps.MetricsValue{Packets: 1, Bytes: 100} // a zero counter reads as absent
	if err := ms.Map(maps.MapMetrics).Put(maps.MetricSlot(maps.MetricKey{Code: 2, Hook: maps.HookUnderlayTC}), survivor); err != nil {
		t.Fatal(err)
	}
	ms.Close()
	a.Close()
	a, err = Start(e.cfg)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Cleanup(a.Close) // after the cleanup that stops Run
	for _, p := range pins {
		id, prog, _ := linkInfo(t, e.pinDir, p.dev, p.h)
		if id != linkIDs[p.dev+string(p.h)] {
			t.Errorf("restart replaced link %s.%s (id %d -> %d); want it updated in place", p.dev, p.h, linkIDs[p.dev+string(p.h)], id)
		}
		if prog == progIDs[p.dev+string(p.h)] {
			t.Errorf("restart kept program %d on %s; want the new program swapped in", prog, p.dev)
		}
		if n := tcxCount(t, p.idx, p.at); n != 1 {
			t.Errorf("%s after restart: %d tcx programs attached, want 1", p.dev, n)
		}
	}
	ms, err = maps.OpenPinned(e.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	counters, err := maps.ReadMetrics(ms.Map(maps.MapMetrics))
	ms.Close()
	if _, ok := counters[maps.MetricKey{Code: 2, Hook: maps.HookUnderlayTC}]; err != nil || !ok {
		t.Errorf("metrics after restart = %v (%v): the pinned map was not reused", counters, err)
	}
	if got, want := readMaps(t, e.pinDir), e.wantState(t, a, e.pod); !got.Equal(want) {
		t.Fatalf("maps after restart hold\n%+v\nwant\n%+v", got, want)
	}

	// The loop, on a thread in the same namespace.
	stop := e.run(t, a)

	// A pod interface that appears later is attached within a second...
	podB := mustVeth(t, "pod-b", "pb-peer")
	// ...and listed in pod_ifaces before pod_ingress runs on it: replies to the
	// first packets it redirects are delivered by pod_ifaces (through a stack
	// that never saw the requests, they would be conntrack INVALID).
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if tcxCount(t, podB.Attrs().Index, ebpf.AttachTCXIngress) == 0 {
			continue
		}
		if _, ok := readMaps(t, e.pinDir).PodIfaces[uint32(podB.Attrs().Index)]; !ok {
			t.Errorf("pod-b: pod_ingress attached before its ifindex is in pod_ifaces")
		}
		break
	}
	eventually(t, time.Second, "pod-b attached and in pod_ifaces", func() bool {
		_, ok := readMaps(t, e.pinDir).PodIfaces[uint32(podB.Attrs().Index)]
		return ok && tcxCount(t, podB.Attrs().Index, ebpf.AttachTCXIngress) == 1
	})
	if _, err := os.Stat(datapath.LinkPin(e.pinDir, "pod-b", datapath.HookPodIngress)); err != nil {
		t.Errorf("pod-b link not pinned: %v", err)
	}
	// ...and one that goes away is forgotten.
	if err := netlink.LinkDel(podB); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "pod-b forgotten", func() bool {
		_, inMap := readMaps(t, e.pinDir).PodIfaces[uint32(podB.Attrs().Index)]
		_, err := os.Stat(datapath.LinkPin(e.pinDir, "pod-b", datapath.HookPodIngress))
		return !inMap && errors.Is(err, os.ErrNotExist)
	})

	// A new node in the objects directory shows up within a second.
	f, err := os.OpenFile(filepath.Join(e.objects, "objects.yaml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(f, "---\napiVersion: v1\nkind: Node\nmetadata: {name: b2}\nspec: {podCIDRs: [10.20.2.0/24]}\nstatus: {addresses: [{type: InternalIP, address: 172.16.2.12}]}\n")
	f.Close()
	b2 := netip.MustParsePrefix("10.20.2.0/24")
	eventually(t, time.Second, "route and map entry for b2", func() bool {
		r, ok := readMaps(t, e.pinDir).Routes[b2]
		rs, _ := datapath.KernelRoutes{}.List()
		return ok && r.Peer == netip.MustParseAddr("172.16.2.12") && len(rs) == 2
	})
	before := readMaps(t, e.pinDir)

	// A broken objects directory keeps the last good state.
	if err := os.WriteFile(filepath.Join(e.objects, "broken.yaml"), []byte("kind: Site\n  : ]["), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if got := readMaps(t, e.pinDir); !got.Equal(before) {
		t.Fatalf("a bad objects file changed the maps:\n%+v\nwant\n%+v", got, before)
	}
	if rs, _ := (datapath.KernelRoutes{}).List(); len(rs) != 2 {
		t.Fatalf("a bad objects file changed the routes: %v", rs)
	}

	// One bad object stops nothing else: b3 overlaps b2 and is set aside, b4
	// in the same file is planned and applied, b2 keeps its route.
	if err := os.WriteFile(filepath.Join(e.objects, "zz-more.yaml"), []byte(
		"apiVersion: v1\nkind: Node\nmetadata: {name: b3}\nspec: {podCIDRs: [10.20.2.0/25]}\nstatus: {addresses: [{type: InternalIP, address: 172.16.2.13}]}\n"+
			"---\napiVersion: v1\nkind: Node\nmetadata: {name: b4}\nspec: {podCIDRs: [10.20.4.0/24]}\nstatus: {addresses: [{type: InternalIP, address: 172.16.2.14}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "route for b4 beside a set-aside b3", func() bool {
		st := readMaps(t, e.pinDir)
		r4, ok4 := st.Routes[netip.MustParsePrefix("10.20.4.0/24")]
		r2 := st.Routes[b2]
		_, ok3 := st.Routes[netip.MustParsePrefix("10.20.2.0/25")]
		return ok4 && r4.Peer == netip.MustParseAddr("172.16.2.14") && r2.Peer == netip.MustParseAddr("172.16.2.12") && !ok3
	})
	if err := a.st.Ready(); err != nil {
		t.Errorf("ready with another node set aside: %v", err)
	}

	// The nat exemption is in place in both tables, iptables' and nftables', and
	// the many syncs since Start left the nft table alone (same handle): a resync
	// that finds it current does not replace it.
	if h := nftTableHandle(t); h != firstHandle {
		t.Errorf("nft table ip %s has handle %s after the syncs, %s after Start: replaced", datapath.ExemptTable, h, firstHandle)
	}
	for _, family := range []string{"ip", "ip6"} {
		if out, err := exec.Command("nft", "list", "table", family, datapath.ExemptTable).CombinedOutput(); err != nil || !strings.Contains(string(out), "snat to "+family+" saddr") {
			t.Errorf("nft table %s %s after a sync: %v\n%s", family, datapath.ExemptTable, err, out)
		}
	}
	for _, cmd := range []string{"iptables", "ip6tables"} {
		out, err := exec.Command(cmd, "-w", "-t", "nat", "-S", "POSTROUTING").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "-A POSTROUTING -j "+datapath.ExemptChain+"\n") {
			t.Errorf("%s nat POSTROUTING after a sync (want a jump to %s): %v\n%s", cmd, datapath.ExemptChain, err, out)
		}
		if out, err := exec.Command(cmd, "-w", "-t", "nat", "-S", datapath.ExemptChain).CombinedOutput(); err != nil ||
			!strings.Contains(string(out), "--mark 0x1000/0x5000") || !strings.Contains(string(out), "-o "+datapath.OverlayDev) {
			t.Errorf("%s nat chain %s after a sync: %v\n%s", cmd, datapath.ExemptChain, err, out)
		}
	}
	// The flow marks: the mangle chain first in PREROUTING, and src_valid_mark
	// on both devices a flow to the node can enter on.
	if out, err := exec.Command("iptables", "-w", "-t", "mangle", "-S", "PREROUTING").CombinedOutput(); err != nil || !strings.Contains(string(out), "-A PREROUTING -j "+datapath.FlowMarkChain+"\n") {
		t.Errorf("iptables mangle PREROUTING after a sync (want a jump to %s): %v\n%s", datapath.FlowMarkChain, err, out)
	}
	if out, err := exec.Command("iptables", "-w", "-t", "mangle", "-S", datapath.FlowMarkChain).CombinedOutput(); err != nil || strings.Count(string(out), "CONNMARK") != 3 {
		t.Errorf("iptables mangle chain %s after a sync (want 3 CONNMARK rules): %v\n%s", datapath.FlowMarkChain, err, out)
	}
	for _, dev := range []string{e.under.Attrs().Name, datapath.OverlayDev} {
		if b, _ := os.ReadFile("/proc/sys/net/ipv4/conf/" + dev + "/src_valid_mark"); strings.TrimSpace(string(b)) != "1" {
			t.Errorf("%s src_valid_mark = %q, want 1", dev, b)
		}
	}

	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	// Exit leaves everything in place.
	if n := tcxCount(t, e.pod.Attrs().Index, ebpf.AttachTCXIngress); n != 1 {
		t.Errorf("after exit pod-a has %d programs, want 1", n)
	}
	a.Close()

	// Uninstall removes it all, twice without error.
	for i := range 2 {
		if err := datapath.Uninstall(e.pinDir); err != nil {
			t.Fatalf("uninstall #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(e.pinDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir still there: %v", err)
	}
	// The tracer's link goes with its pin (the kernel frees it a moment later).
	for deadline := time.Now().Add(2 * time.Second); tracerLink != 0; {
		l, err := link.NewFromID(tracerLink)
		if err != nil {
			break
		}
		l.Close()
		if time.Now().After(deadline) {
			t.Error("kfree_skb tracer link still in the kernel after uninstall")
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := netlink.LinkByName(datapath.OverlayDev); err == nil {
		t.Error("isthmus0 still there")
	}
	if rules, err := (datapath.KernelRules{}).List(); err != nil || len(rules) != 0 {
		t.Errorf("rules to table %d after uninstall: %v (%v)", datapath.PodTable, rules, err)
	}
	for _, p := range pins[:2] {
		if n := tcxCount(t, p.idx, p.at); n != 0 {
			t.Errorf("%s still has %d programs after uninstall", p.dev, n)
		}
	}
	if n := tcxCount(t, e.pod.Attrs().Index, ebpf.AttachTCXIngress); n != 0 {
		t.Errorf("pod-a still has %d programs after uninstall", n)
	}
	for _, family := range []string{"ip", "ip6"} {
		if out, err := exec.Command("nft", "list", "table", family, datapath.ExemptTable).CombinedOutput(); err == nil {
			t.Errorf("nft table %s %s still there after uninstall:\n%s", family, datapath.ExemptTable, out)
		}
	}
	for _, cmd := range []string{"iptables", "ip6tables"} {
		if _, err := exec.Command(cmd, "-w", "-t", "nat", "-S", datapath.ExemptChain).CombinedOutput(); err == nil {
			t.Errorf("%s nat chain %s still there after uninstall", cmd, datapath.ExemptChain)
		}
	}
	if _, err := exec.Command("iptables", "-w", "-t", "mangle", "-S", datapath.FlowMarkChain).CombinedOutput(); err == nil {
		t.Errorf("iptables mangle chain %s still there after uninstall", datapath.FlowMarkChain)
	}
	_ = net.IPv4len
}

// nftTableHandle returns the handle nft gives the agent's nat table in this
// namespace ("table ip isthmus { # handle N").
func nftTableHandle(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "-a", "list", "table", "ip", datapath.ExemptTable).CombinedOutput()
	first, _, _ := strings.Cut(string(out), "\n")
	_, h, ok := strings.Cut(first, "# handle ")
	if err != nil || !ok {
		t.Fatalf("nft -a list table ip %s: %v\n%s", datapath.ExemptTable, err, out)
	}
	return strings.TrimSpace(h)
}

// withGroups wraps the default planner: a1 routes 10.0.2.0/23 to a group of two
// members of an unmanaged site (x: 172.16.1.20, tunnel 10.77.0.1; y: 172.16.1.21,
// tunnel 10.77.0.2), hands 10.0.10.0/23 to its fabric and translates pod sources
// outside its podCIDR to its tunnel address. (Until plan.Compute fills these, the
// test makes them by hand.)
func withGroups(set *objects.Set, node string) (*plan.NodePlan, []string, error) {
	p, warns, err := DefaultPlanner(set, node)
	if err != nil {
		return nil, nil, err
	}
	x := plan.Peer{Name: "x", Site: "u", Underlay: netip.MustParseAddr("172.16.1.20"), TunnelAddr: netip.MustParseAddr("10.77.0.1"),
		AllowedSources: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/23")}}
	y := plan.Peer{Name: "y", Site: "u", Underlay: netip.MustParseAddr("172.16.1.21"), TunnelAddr: netip.MustParseAddr("10.77.0.2"),
		AllowedSources: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/23")}}
	p.Peers = append(p.Peers, x, y)
	p.Routes = append(p.Routes, plan.Route{Prefix: netip.MustParsePrefix("10.0.2.0/23"),
		Group: []plan.NextHop{{Peer: "x", Via: x.Underlay}, {Peer: "y", Via: y.Underlay}}})
	p.FabricPrefixes = []netip.Prefix{netip.MustParsePrefix("10.0.10.0/23")}
	p.SNAT = plan.SNATPolicy{Addr: p.TunnelAddr, Exempt: []plan.ExemptSource{{Prefix: netip.MustParsePrefix("10.10.1.0/24"), Origin: "podCIDR"}}}
	return p, warns, nil
}

// TestAgentKernelGroups: the new maps from the plan and the flags, the nat size at
// load, and health checks driving nexthop_groups: a member that does not answer
// loses its slots, and with no member left the group entry is zero while its route
// stays.
func TestAgentKernelGroups(t *testing.T) {
	e := setup(t)
	// x's tunnel address is local here, with a responder the test controls; y's
	// goes into the tunnel and is never answered.
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	mustAddr(t, lo, "10.77.0.1/32")
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	resp, err := health.Start(health.Config{Addr: netip.MustParseAddr("10.77.0.1"), Port: 9997, Interval: time.Hour})
	if err != nil {
		t.Fatalf("start x's responder: %v", err)
	}
	defer resp.Close()

	e.cfg.Planner = withGroups
	e.cfg.NatEntries = 1024
	e.cfg.SNATPortMin, e.cfg.SNATPortMax = 62000, 62999
	e.cfg.HealthInterval = 50 * time.Millisecond
	a, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { a.Close() }) // after the cleanup that stops Run
	x, y := netip.MustParseAddr("172.16.1.20"), netip.MustParseAddr("172.16.1.21")
	grouped := netip.MustParsePrefix("10.0.2.0/23")

	st := readMaps(t, e.pinDir)
	if r := st.Routes[grouped]; r.Group != 1 {
		t.Fatalf("route %v = %+v, want group 1", grouped, r)
	}
	if g := st.Groups[1]; g != maps.Rendezvous([]netip.Addr{x, y}) {
		t.Fatalf("group 1 at start = %+v, want both members (they start up)", g)
	}
	if _, ok := st.FabricPrefixes[netip.MustParsePrefix("10.0.10.0/23")]; !ok || len(st.FabricPrefixes) != 1 {
		t.Errorf("fabric_prefixes = %v", st.FabricPrefixes)
	}
	if _, ok := st.SNATExempt[netip.MustParsePrefix("10.10.1.0/24")]; !ok || len(st.SNATExempt) != 1 {
		t.Errorf("snat_exempt = %v", st.SNATExempt)
	}
	if c := st.Config; c.TunnelIP != netip.MustParseAddr("10.10.1.1") || c.SNATPortMin != 62000 || c.SNATPortMax != 62999 {
		t.Errorf("config tunnel_ip=%v snat ports %d-%d", c.TunnelIP, c.SNATPortMin, c.SNATPortMax)
	}
	nat, err := ebpf.LoadPinnedMap(filepath.Join(e.pinDir, "nat"), nil)
	if err != nil {
		t.Fatalf("open pinned nat: %v", err)
	}
	if n := nat.MaxEntries(); n != 1024 {
		t.Errorf("nat has %d entries, want --snat-table-size 1024", n)
	}
	nat.Close()

	stop := e.run(t, a) // stopped by the test's cleanup too, if it ends early

	// y never answers: within interval x multiplier + 1s every slot is x's.
	eventually(t, 1500*time.Millisecond, "y down: group 1 all on x", func() bool {
		return readMaps(t, e.pinDir).Groups[1] == maps.Rendezvous([]netip.Addr{x})
	})
	// x stops answering too: the group has no live member, its route stays.
	resp.Close()
	eventually(t, 1500*time.Millisecond, "x down: group 1 zero", func() bool {
		st := readMaps(t, e.pinDir)
		_, ok := st.Groups[1]
		return !ok && st.Routes[grouped].Group == 1
	})
	// x answers again: back after --health-rise (3) answers in a row.
	resp, err = health.Start(health.Config{Addr: netip.MustParseAddr("10.77.0.1"), Port: 9997, Interval: time.Hour})
	if err != nil {
		t.Fatalf("restart x's responder: %v", err)
	}
	eventually(t, time.Second, "x up again", func() bool {
		return readMaps(t, e.pinDir).Groups[1] == maps.Rendezvous([]netip.Addr{x})
	})
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
	a.Close()

	// Another table size migrates the pinned nat map: the agent starts, nat has
	// the new size and the maps the agent owns are intact.
	e.cfg.NatEntries = 2048
	b, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start with another --snat-table-size: %v", err)
	}
	defer b.Close()
	nat, err = ebpf.LoadPinnedMap(filepath.Join(e.pinDir, "nat"), nil)
	if err != nil {
		t.Fatalf("open pinned nat after the migration: %v", err)
	}
	defer nat.Close()
	if n := nat.MaxEntries(); n != 2048 {
		t.Errorf("nat has %d entries after the migration, want 2048", n)
	}
	if r := readMaps(t, e.pinDir).Routes[grouped]; r.Group != 1 {
		t.Errorf("route %v after the migration = %+v, want group 1", grouped, r)
	}
}

// TestAgentKernelUnderlayMoves: when this node's InternalIP moves to another
// device, the running agent attaches its underlay program there, points the
// config entry at it and removes the old device's link, within a second.
func TestAgentKernelUnderlayMoves(t *testing.T) {
	e := setup(t)
	a, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(a.Close) // after the cleanup that stops Run
	stop := e.run(t, a)

	moved := mustVeth(t, "ul1", "ul1p")
	addr, err := netlink.ParseAddr("172.16.1.10/24")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrDel(e.under, addr); err != nil {
		t.Fatal(err)
	}
	mustAddr(t, moved, "172.16.1.10/24")
	eventually(t, time.Second, "datapath on ul1", func() bool {
		_, errNew := os.Stat(datapath.LinkPin(e.pinDir, "ul1", datapath.HookUnderlayIngress))
		_, errOld := os.Stat(datapath.LinkPin(e.pinDir, "ul0", datapath.HookUnderlayIngress))
		return errNew == nil && errors.Is(errOld, os.ErrNotExist) &&
			readMaps(t, e.pinDir).Config.UnderlayIfindex == uint32(moved.Attrs().Index)
	})
	if _, _, ifindex := linkInfo(t, e.pinDir, "ul1", datapath.HookUnderlayIngress); ifindex != uint32(moved.Attrs().Index) {
		t.Errorf("ul1's underlay link targets ifindex %d, want %d", ifindex, moved.Attrs().Index)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// run runs a's loop on a thread in the test's namespace until the returned
// stop is called (or the test ends) and returns Run's error from stop.
func (e *testEnv) run(t *testing.T, a *Agent) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread() // never unlocked: the thread leaves with the goroutine
		if err := netns.Set(e.ns); err != nil {
			runErr = err
			return
		}
		runErr = a.Run(ctx)
	}()
	var once sync.Once
	stop = func() error {
		once.Do(func() { cancel(); wg.Wait() })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	time.Sleep(200 * time.Millisecond) // let Run subscribe
	return stop
}

// TestAgentKernelDirectFIB: the agent lets the fast path's FIB lookups go straight to
// the main table only while the node's policy rules are the kernel's and its own, and
// takes that back as soon as anyone adds another rule (and gives it again once the
// rule is gone), without waiting for a resync.
func TestAgentKernelDirectFIB(t *testing.T) {
	e := setup(t)
	e.cfg.Resync = time.Hour // only the rule watch may notice
	a, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(a.Close) // after the cleanup that stops Run
	if readMaps(t, e.pinDir).Config.Flags&maps.ConfigFlagFIBDirect != 0 {
		t.Fatal("FIB lookups go direct before the rules are watched")
	}
	stop := e.run(t, a)
	direct := func() bool { return readMaps(t, e.pinDir).Config.Flags&maps.ConfigFlagFIBDirect != 0 }
	eventually(t, 2*time.Second, "fib-direct with the kernel's and isthmus' rules", direct)

	foreign := netlink.NewRule()
	foreign.Family, foreign.Priority, foreign.Table = unix.AF_INET, 100, 150
	foreign.Src = &net.IPNet{IP: net.IPv4(10, 9, 9, 0), Mask: net.CIDRMask(24, 32)}
	if err := netlink.RuleAdd(foreign); err != nil {
		t.Fatalf("add a foreign rule: %v", err)
	}
	eventually(t, 2*time.Second, "no fib-direct once another rule exists", func() bool { return !direct() })
	if err := netlink.RuleDel(foreign); err != nil {
		t.Fatalf("delete the foreign rule: %v", err)
	}
	eventually(t, 2*time.Second, "fib-direct again once the rule is gone", direct)
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
}
