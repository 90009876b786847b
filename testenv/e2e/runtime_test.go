package e2e

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cri"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// runtimeNode is a lab node whose agent is the node's CNI and whose pods a
// private containerd creates.
type runtimeNode struct {
	name  string
	ipam  ipam.Store
	cd    *cri.Containerd
	net   netip.Prefix // the node's podCIDR
	agent string       // the agent's log
}

// TestContainerdPods: containerd (with runc, driven through CRI by crictl)
// creates pod sandboxes through isthmus-cni on a node of each site, with the
// conflist and plugin the agent installed after verifying the podCIDRs, and
// none before. The
// test image's client in each pod fetches from the server in the other site's
// pod across isthmus (GENEVE on the underlay, decoded by tshark) and sees the
// other pod's own address as the source; removing the pods through the runtime
// runs DEL, which frees the reservations and the host interfaces.
func TestContainerdPods(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rt := newRuntimeWork(ctx, t, "isrt-")
	work, crictl, pauseTar, probeTar := rt.dir, rt.crictl, rt.pause, rt.probe
	plugin := filepath.Join(work, "isthmus-cni")
	if out, err := exec.Command("go", "build", "-o", plugin, "github.com/isthmus-dev/isthmus/cmd/isthmus-cni").CombinedOutput(); err != nil {
		t.Fatalf("build isthmus-cni: %v\n%s", err, out)
	}

	l := upDefault(t)
	var nodes []*runtimeNode
	for _, name := range []string{"a1", "b1"} {
		n, _ := l.Node(name)
		dir := filepath.Join(work, name)
		if len(n.PodCIDRs) != 1 {
			t.Fatalf("node %s has podCIDRs %v, want one", name, n.PodCIDRs)
		}
		rn := &runtimeNode{name: name, ipam: ipam.Store{Dir: filepath.Join(dir, "ipam")}, net: n.PodCIDRs[0], agent: l.AgentLog(name)}
		nodes = append(nodes, rn)
		if err := os.MkdirAll(filepath.Join(dir, "cni-conf"), 0o755); err != nil {
			t.Fatal(err)
		}
		rn.cd = startNodeRuntime(ctx, t, l, name, cri.Config{Dir: filepath.Join(dir, "ctd"),
			CNIBinDir: filepath.Join(dir, "cni-bin"), CNIConfDir: filepath.Join(dir, "cni-conf"), Crictl: crictl}, pauseTar, probeTar)
		// No conflist yet (the agent is not the node's CNI): the runtime
		// creates no sandbox.
		if p, err := rn.cd.RunPod(ctx, "early-"+name); err == nil {
			t.Errorf("%s: the runtime created pod %+v before any network configuration was written", name, p)
		} else if !strings.Contains(err.Error(), "cni plugin not initialized") {
			t.Errorf("%s: pod before the conflist failed, but not for want of a network: %v", name, err)
		}
		// The node becomes a CNI node: its agent restarts (the datapath stays)
		// serving IPAM, installing the plugin and writing the conflist once
		// the podCIDR verifies.
		if err := l.StopAgent(name); err != nil {
			t.Fatal(err)
		}
		if err := l.StartAgent(name, "--ipam-socket", filepath.Join(dir, "ipam.sock"), "--ipam-dir", rn.ipam.Dir,
			"--cni-bin-dir", filepath.Join(dir, "cni-bin"), "--cni-conf-dir", filepath.Join(dir, "cni-conf"),
			"--cni-plugin", plugin); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := n.cd.WaitNetworkReady(ctx, 30*time.Second); err != nil {
			t.Fatalf("%v\nagent log:\n%s", err, tailFile(n.agent))
		}
	}
	t.Logf("lab, agents with IPAM and two containerds ready after %s", time.Since(start).Round(time.Millisecond))

	pods := make([]cri.Pod, len(nodes))
	servers := make([]string, len(nodes))
	for i, n := range nodes {
		p, err := n.cd.RunPod(ctx, "web-"+n.name)
		if err != nil {
			t.Fatalf("run pod on %s: %v\n%s", n.name, err, n.cd.LogTail())
		}
		pods[i] = p
		checkRuntimePod(t, l, n, p)
		servers[i], err = n.cd.StartContainer(ctx, p, "probe", cri.ProbeImage, "/probe", "serve", ":8080")
		if err != nil {
			t.Fatalf("start probe on %s: %v\n%s", n.name, err, n.cd.LogTail())
		}
	}

	probeAcross(t, ctx, l, nodes, pods, servers)

	// The runtime removes the pods: DEL frees each reservation and the host
	// side of the veth.
	for i, n := range nodes {
		if err := n.cd.RemovePod(ctx, pods[i]); err != nil {
			t.Fatalf("remove pod on %s: %v\n%s", n.name, err, n.cd.LogTail())
		}
		if res, err := n.ipam.List(); err != nil || len(res) != 0 {
			t.Errorf("%s: reservations after the runtime removed its pod: %+v, %v; want none", n.name, res, err)
		}
		checkOnlyLabPodLinks(t, l, n.name)
	}
	t.Logf("TestContainerdPods took %s", time.Since(start).Round(time.Millisecond))
}

// runtimeWork is what the container runtime tests share: a directory, crictl
// and the two image archives.
type runtimeWork struct {
	dir, crictl, pause, probe string
}

// newRuntimeWork builds crictl (once, into the cache) and the images into a
// new temporary directory named prefix..., removed when the test ends. The
// name is short: the unix sockets under it must fit in 108 bytes.
func newRuntimeWork(ctx context.Context, t *testing.T, prefix string) runtimeWork {
	t.Helper()
	crictl, err := kubebin.Crictl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	pause, probe, err := cri.BuildImages(ctx, work)
	if err != nil {
		t.Fatal(err)
	}
	return runtimeWork{dir: work, crictl: crictl, pause: pause, probe: probe}
}

// startNodeRuntime starts a private containerd (cfg, in the node's network
// namespace) with the reference loopback plugin beside isthmus-cni in
// cfg.CNIBinDir, stopped when the test ends (before the lab goes: cleanups
// run last first, and the pods' DEL needs the node's namespace), and imports
// the image archives.
func startNodeRuntime(ctx context.Context, t *testing.T, l *testenv.Lab, node string, cfg cri.Config, images ...string) *cri.Containerd {
	t.Helper()
	if err := cri.BuildLoopback(ctx, cfg.CNIBinDir); err != nil {
		t.Fatal(err)
	}
	cfg.NetNS = testenv.NSPath(l.NodeNS(node))
	cd, err := cri.Start(ctx, cfg)
	if cd != nil {
		t.Cleanup(func() {
			if err := cd.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range images {
		if err := cd.Import(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	return cd
}

// probeAcross has the probe client in each of two runtime pods (a1's and
// b1's) fetch from the server in the other, while tshark watches a1's
// underlay port on the router: each server must answer with the client pod's
// own address, and the TCP between the pods must be GENEVE on the wire, both
// ways.
func probeAcross(t *testing.T, ctx context.Context, l *testenv.Lab, nodes []*runtimeNode, pods []cri.Pod, containers []string) {
	t.Helper()
	wait := capture(t, l.RouterNS(), testenv.RouterPort("a1"), 6*time.Second)
	for i, n := range nodes {
		peer := pods[1-i]
		url := "http://" + peer.IP + ":8080/"
		var got string
		var err error
		for deadline := time.Now().Add(15 * time.Second); ; {
			got, err = n.cd.Exec(ctx, containers[i], "/probe", "get", url)
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if want := "source " + pods[i].IP + "\n"; err != nil || got != want {
			t.Errorf("%s: probe get %s = %q, %v; want %q (the pod's own address, across isthmus)", n.name, url, got, err, want)
		}
	}
	frames := wait()
	var out, back int
	for _, f := range frames {
		if len(f.ipSrc) != 2 || len(f.ipDst) != 2 || !strings.Contains(f.protocols, ":tcp") {
			continue
		}
		checkGeneve(t, f)
		switch {
		case f.ipSrc[1] == pods[0].IP && f.ipDst[1] == pods[1].IP:
			out++
		case f.ipSrc[1] == pods[1].IP && f.ipDst[1] == pods[0].IP:
			back++
		}
	}
	t.Logf("%d GENEVE frames on a1's underlay, %d TCP a1 pod -> b1 pod, %d back", len(frames), out, back)
	if out == 0 || back == 0 {
		t.Errorf("want GENEVE frames carrying TCP between the runtime's pods both ways on a1's underlay; got %d and %d of %d frames", out, back, len(frames))
	}
}

// checkRuntimePod checks a pod the runtime made against what the plugin was
// to do, read from the kernel and the node's disk, not from the runtime: an
// address of the node's podCIDR on eth0 in the pod's namespace, reserved
// for the sandbox, and a host side that the agent's pattern matches.
func checkRuntimePod(t *testing.T, l *testenv.Lab, n *runtimeNode, p cri.Pod) {
	t.Helper()
	addr, err := netip.ParseAddr(p.IP)
	if err != nil || !n.net.Contains(addr) {
		t.Fatalf("%s: pod %s has address %q (%v), want one in the node's podCIDR %s", n.name, p.Name, p.IP, err, n.net)
	}
	nl := handleAt(t, p.NetNS)
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatalf("%s: pod %s: no eth0: %v", n.name, p.Name, err)
	}
	addrs, err := nl.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IP.String() != p.IP {
		t.Errorf("%s: pod %s eth0 addresses %v (%v), want %s alone", n.name, p.Name, addrs, err, p.IP)
	}
	res, err := n.ipam.List()
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, r := range res {
		if r.ContainerID == p.ID && r.Addr == addr {
			held = append(held, r.HostIface)
		}
	}
	if len(held) != 1 {
		t.Fatalf("%s: reservations %+v: want one of %s for sandbox %s", n.name, res, addr, p.ID)
	}
	if links := podLinksIn(t, l.NodeNS(n.name)); !strings.Contains(strings.Join(links, " "), held[0]) {
		t.Errorf("%s: host side %s of pod %s not among the node's pod interfaces %v", n.name, held[0], p.Name, links)
	}
}

// checkOnlyLabPodLinks checks that the plugin's host interfaces left on a
// node are those of the lab's own pods (cnitool made them through the plugin
// too) after a runtime removed its pods.
func checkOnlyLabPodLinks(t *testing.T, l *testenv.Lab, node string) {
	t.Helper()
	labs := map[string]bool{}
	for _, p := range l.Scenario.Pods() {
		if p.Node == node {
			labs[l.HostVeth(p.Name)] = true
		}
	}
	links := slices.DeleteFunc(podLinksIn(t, l.NodeNS(node)), func(name string) bool { return labs[name] })
	if len(links) != 0 {
		t.Errorf("%s: pod interfaces after the runtime removed its pods: %v; want only the lab's", node, links)
	}
}

// podLinksIn lists the host sides of the plugin's veths in a node's
// namespace.
func podLinksIn(t *testing.T, node string) []string {
	t.Helper()
	links, err := handleAt(t, testenv.NSPath(node)).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, lk := range links {
		name := lk.Attrs().Name
		// The plugin's host sides are pod- and 11 hex digits; the lab's are
		// pod-<pod name>.
		if hex, ok := strings.CutPrefix(name, "pod-"); ok && len(hex) == 11 && strings.Trim(hex, "0123456789abcdef") == "" {
			out = append(out, name)
		}
	}
	return out
}

// handleAt returns a netlink handle in the network namespace at path, closed
// when the test ends.
func handleAt(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open network namespace %s: %v", path, err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netlink in %s: %v", path, err)
	}
	t.Cleanup(nl.Close)
	return nl
}
