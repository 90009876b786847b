package main

// Kernel test: needs root and network namespaces; run it under the shared
// kernel lock (flock /tmp/isthmus-kernel.lock go test ./cmd/isthmus-cni/).
// The plugin is driven by the reference client cnitool (built from the CNI
// module), a real agent IPAM server (loader/ipamd) runs in the test process,
// and every pod is a network namespace. The node is a namespace too, so the
// host sides of the veths never touch the machine's own.

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/loader/ipamd"
	"github.com/isthmus-dev/isthmus/loader/ipamd/ipamdtest"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// fixture is one node namespace with the plugin, cnitool, a conflist and an
// IPAM server.
type fixture struct {
	t                 *testing.T
	prefix            string // of every namespace the test creates
	node              string // the node's namespace
	bin, conf, data   string
	sock, objectsFile string
	stopServer        func()
	srv               *ipamd.Server
}

func newFixture(t *testing.T) *fixture {
	if os.Geteuid() != 0 {
		t.Fatal("cnitool test: needs root (network namespaces, veths); run as root under flock /tmp/isthmus-kernel.lock")
	}
	f := &fixture{t: t, prefix: fmt.Sprintf("iscni%d-", os.Getpid()%100000), bin: t.TempDir(), conf: t.TempDir(),
		data: t.TempDir(), sock: filepath.Join(t.TempDir(), "ipam.sock"), objectsFile: filepath.Join(t.TempDir(), "objects.yaml")}
	f.node = f.prefix + "node"
	t.Cleanup(f.cleanup)
	build(t, filepath.Join(f.bin, cniinstall.PluginName), "./")
	// The conflist chains portmap after the plugin (hostPort).
	build(t, filepath.Join(f.bin, cniinstall.PortmapName), "github.com/containernetworking/plugins/plugins/meta/portmap")
	build(t, filepath.Join(f.bin, "cnitool"), "github.com/containernetworking/cni/cnitool")
	run(t, "ip", "netns", "add", f.node)
	f.inNode("ip", "link", "set", "lo", "up")
	// The node's InternalIP, so its ARP requests to pods have a source.
	f.inNode("ip", "addr", "add", "172.16.1.10/32", "dev", "lo")
	f.inNode("sysctl", "-qw", "net.ipv4.ip_forward=1")
	if err := cniinstall.WriteConflist(f.conf, f.sock, f.data); err != nil {
		t.Fatal(err)
	}
	return f
}

func build(t *testing.T, out, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	b, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
	return string(b)
}

func (f *fixture) inNode(args ...string) string {
	f.t.Helper()
	return run(f.t, "nsenter", append([]string{"--net=/run/netns/" + f.node}, args...)...)
}

// cnitool runs cnitool VERB on the pod's namespace from the node's namespace.
// env adds variables (CAP_ARGS=...) to cnitool's environment.
func (f *fixture) cnitool(verb, pod string, env ...string) (string, error) {
	cmd := exec.Command("nsenter", "--net=/run/netns/"+f.node, filepath.Join(f.bin, "cnitool"), verb, cniinstall.NetworkName, "/run/netns/"+f.prefix+pod)
	cmd.Env = append(append(os.Environ(), "CNI_PATH="+f.bin, "NETCONFPATH="+f.conf), env...)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

func (f *fixture) mustCNI(verb, pod string) string {
	f.t.Helper()
	return f.mustCNIEnv(verb, pod)
}

func (f *fixture) mustCNIEnv(verb, pod string, env ...string) string {
	f.t.Helper()
	out, err := f.cnitool(verb, pod, env...)
	if err != nil {
		f.t.Fatalf("cnitool %s %s: %v\n%s", verb, pod, err, out)
	}
	return out
}

func (f *fixture) addPodNS(pod string) { run(f.t, "ip", "netns", "add", f.prefix+pod) }

// addPod creates the pod's namespace, ADDs it and returns its IPv4 address.
func (f *fixture) addPod(pod string) netip.Addr {
	f.t.Helper()
	f.addPodNS(pod)
	return resultAddr(f.t, f.mustCNI("add", pod))
}

func resultAddr(t *testing.T, out string) netip.Addr {
	t.Helper()
	var res struct {
		CNIVersion string `json:"cniVersion"`
		IPs        []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.IPs) == 0 {
		t.Fatalf("ADD result %s: %v", out, err)
	}
	for _, ip := range res.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err != nil || p.Addr().Is4() && p.Bits() != 32 || p.Addr().Is6() && p.Bits() != 128 {
			t.Fatalf("ADD result address %q: %v, want a host prefix", ip.Address, err)
		}
		if p.Addr().Is4() {
			return p.Addr()
		}
	}
	t.Fatalf("ADD result %s: no IPv4 address", out)
	return netip.Addr{}
}

// writeObjects gives the node (and its Site) a podCIDR; "" means none yet.
func (f *fixture) writeObjects(podCIDR string) {
	y := ipamdtest.Objects("[10.10.0.0/16]", true, 0, podCIDR)
	if err := os.WriteFile(f.objectsFile, []byte(y), 0o644); err != nil {
		f.t.Fatal(err)
	}
	if f.srv != nil {
		f.srv.Verify()
	}
}

// startServer starts the agent's IPAM server; its host interfaces are in the
// node's namespace.
func (f *fixture) startServer() {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, done, err := ipamd.Start(ctx, ipamd.Config{
		Node: "n1", Socket: f.sock, Store: ipam.Store{Dir: f.data}, UnderlayMTU: 1500,
		Snapshot:       func() (*objects.Set, []objects.Warning, error) { return objects.LoadDir(filepath.Dir(f.objectsFile)) },
		VerifyInterval: time.Hour, LeakInterval: time.Hour, LeakGrace: time.Nanosecond,
		LinkExists: f.nodeLinkExists,
	})
	if err != nil {
		cancel()
		f.t.Fatalf("start ipam server: %v", err)
	}
	f.srv = srv
	f.stopServer = func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("ipam server: %v", err)
		}
		f.srv, f.stopServer = nil, nil
	}
}

func (f *fixture) nodeLinkExists(name string) bool {
	h, err := netns.GetFromName(f.node)
	if err != nil {
		return false
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return false
	}
	defer nl.Close()
	_, err = nl.LinkByName(name)
	return err == nil
}

func (f *fixture) reservations() []ipam.Reservation {
	f.t.Helper()
	l, err := ipam.Store{Dir: f.data}.List()
	if err != nil {
		f.t.Fatal(err)
	}
	return l
}

func (f *fixture) cleanup() {
	if f.stopServer != nil {
		f.stopServer()
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if name, _, _ := strings.Cut(line, " "); strings.HasPrefix(name, f.prefix) {
			exec.Command("ip", "netns", "del", name).Run()
		}
	}
}

func (f *fixture) ping(from string, to netip.Addr) error {
	b, err := exec.Command("nsenter", "--net=/run/netns/"+f.prefix+from, "ping", "-c1", "-W2", to.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s from %s: %v\n%s", to, from, err, b)
	}
	return nil
}

func TestVersion(t *testing.T) {
	dir := t.TempDir()
	build(t, filepath.Join(dir, cniinstall.PluginName), "./")
	cmd := exec.Command(filepath.Join(dir, cniinstall.PluginName))
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out, &v); err != nil || !strings.Contains(strings.Join(v.Supported, ","), "1.1.0") {
		t.Fatalf("VERSION answered %s (%v), want 1.1.0 among the supported versions", out, err)
	}
}

// TestCNIToolVerbs walks seed 001's validation with cnitool: a node whose
// podCIDR arrives late, allocation, CHECK, restart of the agent with pods
// running, CHECK and DEL with the agent down, STATUS, and DEL idempotence.
func TestCNIToolVerbs(t *testing.T) {
	f := newFixture(t)
	f.writeObjects("")
	f.startServer()

	// Delayed podCIDR: STATUS is not ready and says why; ADD fails.
	f.addPodNS("a")
	if out, err := f.cnitool("status", "a"); err == nil || !strings.Contains(out, "no podCIDR yet") {
		t.Fatalf("STATUS before the podCIDR: %v %s, want not ready: no podCIDR yet", err, out)
	}
	if out, err := f.cnitool("add", "a"); err == nil || !strings.Contains(out, "not ready") {
		t.Fatalf("ADD before the podCIDR: %v %s, want a failure", err, out)
	}
	if n := len(f.reservations()); n != 0 {
		t.Fatalf("%d reservations after a refused ADD", n)
	}

	f.writeObjects("10.10.1.0/26")
	f.mustCNI("status", "a")
	a := resultAddr(t, f.mustCNI("add", "a"))
	b := f.addPod("b")
	if a != netip.MustParseAddr("10.10.1.2") || b != netip.MustParseAddr("10.10.1.3") {
		t.Fatalf("addresses %v %v, want 10.10.1.2 and .3 (.0 network, .1 the node's)", a, b)
	}
	if err := f.ping("a", b); err != nil {
		t.Fatal(err)
	}
	// The runtime may ask for an address (the `ips` capability, which the
	// conflist declares): it gets it when free and in the verified range, and
	// is refused otherwise, with nothing left behind.
	f.addPodNS("w")
	if out, err := f.cnitool("add", "w", `CAP_ARGS={"ips":["`+b.String()+`/32"]}`); err == nil || !strings.Contains(out, "held by another attachment") {
		t.Fatalf("ADD asking for b's %s: %v %s, want refused", b, err, out)
	}
	if out, err := f.cnitool("add", "w", `CAP_ARGS={"ips":["10.10.2.20"]}`); err == nil || !strings.Contains(out, "outside the node's ranges") {
		t.Fatalf("ADD asking for 10.10.2.20 outside the podCIDR: %v %s, want refused", err, out)
	}
	if w := resultAddr(t, f.mustCNIEnv("add", "w", `CAP_ARGS={"ips":["10.10.1.20/32"]}`)); w != netip.MustParseAddr("10.10.1.20") {
		t.Fatalf("ADD asking for 10.10.1.20 got %s", w)
	}
	if err := f.ping("w", a); err != nil {
		t.Fatal(err)
	}
	f.mustCNI("del", "w")
	// The pod's interface: its address, the tunnel MTU, the routes.
	link := run(t, "nsenter", "--net=/run/netns/"+f.prefix+"a", "ip", "-o", "link", "show", "eth0")
	if !strings.Contains(link, "mtu 1450") {
		t.Errorf("pod interface: %s, want mtu 1450", link)
	}
	routes := run(t, "nsenter", "--net=/run/netns/"+f.prefix+"a", "ip", "route")
	if !strings.Contains(routes, "default via 169.254.1.1 dev eth0") {
		t.Errorf("pod routes:\n%s\nwant the default route via 169.254.1.1", routes)
	}
	host := ipam.HostIface(cnitoolContainerID(f.prefix+"a"), "eth0")
	if got := f.inNode("ip", "route", "show", a.String()+"/32"); !strings.Contains(got, "dev "+host) {
		t.Errorf("host route to %s: %q, want dev %s", a, got, host)
	}
	f.mustCNI("check", "a")
	// ADD again is idempotent in the store: the same address.
	if got := f.reservations(); len(got) != 2 {
		t.Fatalf("reservations %v, want 2", got)
	}

	// Agent restart with pods running: reservations and wiring stay, and a
	// pod's traffic loses nothing meanwhile (60 pings over 3 seconds).
	var pingOut strings.Builder
	pinger := exec.Command("nsenter", "--net=/run/netns/"+f.prefix+"a", "ping", "-q", "-i", "0.05", "-c", "60", "-W", "1", "172.16.1.10")
	pinger.Stdout, pinger.Stderr = &pingOut, &pingOut
	if err := pinger.Start(); err != nil {
		t.Fatal(err)
	}
	f.stopServer()
	if out, err := f.cnitool("status", "a"); err == nil || !strings.Contains(out, "unreachable") {
		t.Fatalf("STATUS with the agent down: %v %s, want unreachable", err, out)
	}
	// CHECK and DEL work with the agent down.
	f.mustCNI("check", "a")
	f.mustCNI("del", "b")
	f.mustCNI("del", "b")
	if got := f.reservations(); len(got) != 1 || got[0].Addr != a {
		t.Fatalf("reservations after offline DEL of b: %v, want only %v", got, a)
	}
	f.startServer()
	if err := pinger.Wait(); err != nil || !strings.Contains(pingOut.String(), " 0% packet loss") {
		t.Fatalf("ping across the agent restart: %v\n%s", err, pingOut.String())
	}
	c := f.addPod("c")
	if c == b || c == a {
		t.Fatalf("c got %v, a held or just-freed address", c)
	}

	// CHECK notices a missing route.
	run(t, "nsenter", "--net=/run/netns/"+f.prefix+"a", "ip", "route", "del", "default")
	if out, err := f.cnitool("check", "a"); err == nil {
		t.Fatalf("CHECK passed without the default route: %s", out)
	}
	f.mustCNI("del", "a")
	f.mustCNI("del", "c")
	if got := f.reservations(); len(got) != 0 {
		t.Fatalf("reservations after DEL: %v", got)
	}
	if links := f.inNode("ip", "-o", "link", "show"); strings.Contains(links, "pod-") {
		t.Fatalf("host veths left after DEL:\n%s", links)
	}
}

// cnitoolContainerID is the container ID cnitool derives from the path of a
// named namespace (cnitool/cmd/root.go).
func cnitoolContainerID(ns string) string {
	s := sha512.Sum512([]byte("/run/netns/" + ns))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// inNetns runs fn on a thread switched into h.
func inNetns(h netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its namespace changed
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// TestCNIToolConcurrentExhaustionGC: fifty ADDs at once, then ADDs until the
// /26 is full, then leaks collected by the agent and released by GC.
func TestCNIToolConcurrentExhaustionGC(t *testing.T) {
	f := newFixture(t)
	f.writeObjects("10.10.1.0/26")
	f.startServer()

	var wg sync.WaitGroup
	errs := make([]error, 50)
	for i := range 50 {
		f.addPodNS(fmt.Sprint("p", i))
	}
	start := time.Now()
	for i := range 50 {
		wg.Go(func() {
			out, err := f.cnitool("add", fmt.Sprint("p", i))
			if err != nil {
				errs[i] = fmt.Errorf("ADD p%d: %v: %s", i, err, out)
			}
		})
	}
	wg.Wait()
	t.Logf("50 concurrent ADDs took %v", time.Since(start))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	res := f.reservations()
	seen := map[netip.Addr]bool{}
	for _, r := range res {
		seen[r.Addr] = true
	}
	if len(res) != 50 || len(seen) != 50 {
		t.Fatalf("%d reservations, %d distinct addresses, want 50 and 50", len(res), len(seen))
	}
	if links := f.inNode("ip", "-o", "link", "show"); strings.Count(links, "pod-") != 50 {
		t.Fatalf("%d host veths, want 50", strings.Count(links, "pod-"))
	}

	// A /26 has 61 addresses to give (.2 to .62): 11 more fit, the 12th not.
	for i := 50; i < 61; i++ {
		f.addPod(fmt.Sprint("p", i))
	}
	f.addPodNS("full")
	if out, err := f.cnitool("add", "full"); err == nil || !strings.Contains(out, "no free address") {
		t.Fatalf("ADD into a full range: %v %s, want no free address", err, out)
	}

	// Leaks: two pods vanish without DEL (their namespaces and so their veths go).
	for _, p := range []string{"p0", "p1"} {
		run(t, "ip", "netns", "del", f.prefix+p)
	}
	// The kernel destroys a deleted namespace's veths asynchronously.
	for _, p := range []string{"p0", "p1"} {
		host := ipam.HostIface(cnitoolContainerID(f.prefix+p), "eth0")
		for deadline := time.Now().Add(10 * time.Second); f.nodeLinkExists(host); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s still exists 10s after its pod's namespace was deleted", host)
			}
		}
	}
	freed, err := f.srv.CollectLeaks()
	if err != nil || len(freed) != 2 {
		t.Fatalf("agent leak collection freed %v (%v), want the reservations of p0 and p1", freed, err)
	}
	// GC with the runtime's valid attachments: all but p2 and p3.
	var valid []types.GCAttachment
	for i := 4; i < 61; i++ {
		valid = append(valid, types.GCAttachment{ContainerID: cnitoolContainerID(f.prefix + fmt.Sprint("p", i)), IfName: "eth0"})
	}
	list, err := libcni.LoadNetworkConf(f.conf, cniinstall.NetworkName)
	if err != nil {
		t.Fatal(err)
	}
	nodeNS, err := netns.GetFromName(f.node)
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNS.Close()
	gc := libcni.NewCNIConfig([]string{f.bin}, nil)
	if err := inNetns(nodeNS, func() error {
		return gc.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid})
	}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if n := len(f.reservations()); n != 57 {
		t.Fatalf("%d reservations after GC, want 57", n)
	}
	if links := f.inNode("ip", "-o", "link", "show"); strings.Count(links, "pod-") != 57 {
		t.Fatalf("%d host veths after GC, want 57 (GC deletes the host side of what it releases)", strings.Count(links, "pod-"))
	}
	// cnitool gc names no valid attachment: everything goes.
	f.mustCNI("gc", "p4")
	if n := len(f.reservations()); n != 0 {
		t.Fatalf("%d reservations after cnitool gc, want 0", n)
	}
}

// TestCNIToolRepeatedAdd: runtimes retry ADD after their own restarts; a
// second ADD of a wired attachment returns the first result again, with the
// agent up or down, and the pod keeps its interface, address and traffic.
func TestCNIToolRepeatedAdd(t *testing.T) {
	f := newFixture(t)
	f.writeObjects("10.10.1.0/26")
	f.startServer()
	f.addPodNS("a")
	first := f.mustCNI("add", "a")
	a := resultAddr(t, first)
	b := f.addPod("b")

	for _, agent := range []string{"up", "down"} {
		if agent == "down" {
			f.stopServer()
		}
		again, err := f.cnitool("add", "a")
		if err != nil {
			t.Fatalf("second ADD of a (agent %s): %v\n%s", agent, err, again)
		}
		if !sameJSON(t, first, again) {
			t.Errorf("second ADD of a (agent %s) answered\n%s\nwant the first result\n%s", agent, again, first)
		}
		if got := run(t, "nsenter", "--net=/run/netns/"+f.prefix+"a", "ip", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(got, " "+a.String()+"/32 ") {
			t.Fatalf("a's eth0 after the second ADD (agent %s): %q, want %s/32", agent, got, a)
		}
		if err := f.ping("a", b); err != nil {
			t.Fatalf("after the second ADD (agent %s): %v", agent, err)
		}
		if err := f.ping("b", a); err != nil {
			t.Fatalf("after the second ADD (agent %s): %v", agent, err)
		}
		if got := f.reservations(); len(got) != 2 || got[0].Addr != a || got[1].Addr != b {
			t.Fatalf("reservations after the second ADD (agent %s): %v, want %v and %v", agent, got, a, b)
		}
	}
	f.mustCNI("check", "a")
	// Asking for another address than the attachment holds is refused, and
	// a keeps its own.
	f.startServer()
	if out, err := f.cnitool("add", "a", `CAP_ARGS={"ips":["10.10.1.30"]}`); err == nil || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("ADD of a asking for 10.10.1.30: %v\n%s\nwant refused, nothing changed", err, out)
	}
	if err := f.ping("a", b); err != nil {
		t.Fatal(err)
	}
	if again := f.mustCNIEnv("add", "a", `CAP_ARGS={"ips":["`+a.String()+`/32"]}`); !sameJSON(t, first, again) {
		t.Errorf("ADD of a asking for its own %s answered\n%s\nwant the first result", a, again)
	}
}

// sameJSON reports whether two JSON documents hold the same values.
func sameJSON(t *testing.T, x, y string) bool {
	t.Helper()
	var a, b any
	if err := json.Unmarshal([]byte(x), &a); err != nil {
		t.Fatalf("decode %s: %v", x, err)
	}
	if err := json.Unmarshal([]byte(y), &b); err != nil {
		t.Fatalf("decode %s: %v", y, err)
	}
	return reflect.DeepEqual(a, b)
}

// TestCNIToolFailedAddTouchesNothingElse: an ADD that cannot complete removes
// what it made and nothing else. A new container whose host veth name is
// taken by a running pod (a hash collision, made here by renaming that pod's
// host side) is refused and the running pod keeps its interface, route,
// reservation and traffic; an ADD that fails after creating the veth (a pod
// namespace with IPv6 disabled, on a dual-stack node) leaves no veth, host
// route or reservation behind.
func TestCNIToolFailedAddTouchesNothingElse(t *testing.T) {
	f := newFixture(t)
	write := func(y string) {
		if err := os.WriteFile(f.objectsFile, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(ipamdtest.Objects(`["10.10.0.0/16", "fd00:10::/48"]`, true, 0, `"10.10.1.0/26", "fd00:10:0:1::/64"`))
	f.startServer()
	a, c := f.addPod("a"), f.addPod("c")
	if err := f.ping("a", c); err != nil {
		t.Fatal(err)
	}
	before := f.reservations()
	if len(before) != 4 {
		t.Fatalf("reservations %v, want an IPv4 and an IPv6 address for each of a and c", before)
	}
	podRoutes := func() string {
		return f.inNode("ip", "-4", "route", "show") + f.inNode("ip", "-6", "route", "show")
	}

	// The collision: a's host side now bears the name b's ADD will choose.
	f.addPodNS("b")
	hostA := ipam.HostIface(cnitoolContainerID(f.prefix+"a"), "eth0")
	hostB := ipam.HostIface(cnitoolContainerID(f.prefix+"b"), "eth0")
	f.inNode("ip", "link", "set", hostA, "down")
	f.inNode("ip", "link", "set", hostA, "name", hostB)
	f.inNode("ip", "link", "set", hostB, "up")
	f.inNode("ip", "route", "replace", a.String()+"/32", "dev", hostB)
	for _, r := range before {
		if r.Addr.Is6() && r.ContainerID == cnitoolContainerID(f.prefix+"a") {
			f.inNode("ip", "-6", "route", "replace", r.Addr.String()+"/128", "dev", hostB)
		}
	}
	if err := f.ping("a", c); err != nil {
		t.Fatalf("a after the rename, before b's ADD: %v", err)
	}
	routes := podRoutes()
	out, err := f.cnitool("add", "b")
	if err == nil {
		t.Fatalf("ADD of b with its host veth name taken succeeded:\n%s", out)
	}
	if !strings.Contains(out, "nothing was changed") {
		t.Errorf("ADD of b with its host veth name taken: %v\n%s\nwant the error to say nothing was changed", err, out)
	}
	if !f.nodeLinkExists(hostB) {
		t.Fatalf("a's host side %s is gone after b's failed ADD", hostB)
	}
	if err := f.ping("a", c); err != nil {
		t.Fatalf("a after b's failed ADD: %v", err)
	}
	if err := f.ping("c", a); err != nil {
		t.Fatalf("a after b's failed ADD: %v", err)
	}
	if got := run(t, "nsenter", "--net=/run/netns/"+f.prefix+"b", "ip", "-o", "link", "show"); strings.Contains(got, "eth0") {
		t.Errorf("b's namespace after its failed ADD:\n%s", got)
	}
	if got := podRoutes(); got != routes {
		t.Errorf("node routes after b's failed ADD:\n%s\nwant as before:\n%s", got, routes)
	}
	if got := f.reservations(); !reflect.DeepEqual(got, before) {
		t.Errorf("reservations after b's failed ADD: %v, want %v", got, before)
	}

	// A failure after the veth exists: the pod's namespace refuses IPv6
	// addresses, so the plugin fails adding the second one.
	f.addPodNS("v4only")
	run(t, "nsenter", "--net=/run/netns/"+f.prefix+"v4only", "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	if out, err := f.cnitool("add", "v4only"); err == nil || !strings.Contains(out, "add address fd00:10:0:1:") {
		t.Fatalf("ADD into a namespace without IPv6: %v\n%s\nwant a failure adding the IPv6 address", err, out)
	}
	if host := ipam.HostIface(cnitoolContainerID(f.prefix+"v4only"), "eth0"); f.nodeLinkExists(host) {
		t.Errorf("host side %s left after the failed ADD", host)
	}
	if got := run(t, "nsenter", "--net=/run/netns/"+f.prefix+"v4only", "ip", "-o", "link", "show"); strings.Contains(got, "eth0") {
		t.Errorf("pod interface left after the failed ADD:\n%s", got)
	}
	if got := podRoutes(); got != routes {
		t.Errorf("node routes after the failed ADD:\n%s\nwant as before:\n%s", got, routes)
	}
	if got := f.reservations(); !reflect.DeepEqual(got, before) {
		t.Errorf("reservations after the failed ADD: %v, want %v", got, before)
	}
	if err := f.ping("c", a); err != nil {
		t.Fatal(err)
	}
}
