package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cluster"
	"github.com/isthmus-dev/isthmus/testenv/cri"
	isthmusimage "github.com/isthmus-dev/isthmus/testenv/image"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// TestOtherCNISite: seed 003's shape on real kubelets, with the cloud site's
// pods owned by another CNI (testenv/scenarios/seed003cni.yaml). The cloud
// nodes' containerd runs the reference bridge plugin (cni0, ipMasq,
// host-local on the node's podCIDR: cri.BridgeCNI) and carry flannel's
// MASQUERADE as the seed quotes it; the edge nodes' runtime has isthmus-cni
// once the agent installs it. isthmus comes from deploy/ through the lab's
// overlay, plus the operator's --pod-interfaces for the bridge's veths. The
// agents on the cloud nodes leave the bridge's conflist in charge (no
// isthmus conflist or plugin there); Pods created through the API get their
// address from their node's own CNI (host-local's reservation on the cloud,
// the isthmus IPAM's on the edge); every pod reaches every other pod by
// TCP and UDP, both ways, and the server sees the client's own pod address
// (docs/unmanaged-sites.md: returnPath Fabric keeps sources; seed 003: the
// gateway's MASQUERADE never sees forwarded traffic). Every node's host
// namespace reaches every other node's pod and every other node's host from
// an address of its own, the cloud gateway's tunnel address included, which
// is its cni0's too (the answers must reach the node, not a pod behind the
// bridge). Across the sites the firewall passes only what the gateways' own
// addresses send each other; captures on the member
// master-02's underlay port show its pod's flows leaving as GENEVE to
// master-gw and the answers coming back plain through the cloud's fabric.
// Strict rp_filter stays on in every node, and its drop counter stays zero.
func TestOtherCNISite(t *testing.T) {
	requireSetup(t)
	beside(t, weightCluster)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	kubelet, err := kubebin.Kubelet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kcmBin, schedBin, err := kubebin.ControlPlane(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntimeWork(ctx, t, "isoc-")
	const image = "isthmus:lab1"
	img, err := isthmusimage.Build(ctx, isthmusimage.Options{Version: "lab1", Out: filepath.Join(rt.dir, "isthmus.oci.tar"), Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := testenv.LoadScenario("seed003cni")
	if err != nil {
		t.Fatal(err)
	}
	l := upLab(ctx, t, sc, testenv.Options{Source: testenv.SourceKube, NoAgents: true})
	srv := l.Kube()
	cs, err := kubernetes.NewForConfig(srv.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	kcm, sched, err := srv.StartControlPlane(kcmBin, schedBin)
	t.Cleanup(func() {
		if err := sched.Stop(); err != nil {
			t.Error(err)
		}
		if err := kcm.Stop(); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}

	// Every node's runtime and kubelet; the cloud's with the bridge plugin
	// as its CNI, as such a node has it before isthmus comes.
	nodes := map[string]*runtimeNode{}
	kubelets := map[string]*cri.Kubelet{}
	hostLocal := map[string]string{}
	var names []string
	for _, n := range sc.Nodes() {
		names = append(names, n.Name)
		dir := filepath.Join(rt.dir, n.Name)
		rn := &runtimeNode{name: n.Name, ipam: ipam.Store{Dir: l.IPAMDir(n.Name)}, net: n.PodCIDRs[0]}
		nodes[n.Name] = rn
		cfg := cri.Config{Dir: filepath.Join(dir, "ctd"), CNIBinDir: l.CNIBinDir(n.Name), CNIConfDir: l.CNIConfDir(n.Name), Crictl: rt.crictl}
		if !n.Site.ManagesCNI() {
			hostLocal[n.Name] = filepath.Join(dir, "host-local")
			cfg.Bridge = &cri.BridgeCNI{Subnet: n.PodCIDRs[0], MTU: sc.Underlay.MTU - 50, IPMasq: true, DataDir: hostLocal[n.Name]}
		}
		rn.cd = startNodeRuntime(ctx, t, l, n.Name, cfg, rt.pause, rt.probe, img.Path)
		kl, err := cri.StartKubelet(ctx, cri.KubeletConfig{Dir: filepath.Join(dir, "kubelet"), NetNS: testenv.NSPath(l.NodeNS(n.Name)),
			NodeName: n.Name, NodeIP: n.Address, Kubeconfig: l.Kubeconfig(), Runtime: rn.cd, Binary: kubelet})
		if kl != nil {
			kubelets[n.Name] = kl
			t.Cleanup(func() {
				if err := kl.Stop(); err != nil {
					t.Error(err)
				}
			})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	diag := func(node string) string {
		return fmt.Sprintf("kubelet %s log:\n%s\ncontainerd log:\n%s\n%s", node, kubelets[node].LogTail(), nodes[node].cd.LogTail(), isthmusPodLogs(rt.dir))
	}
	t.Logf("lab, control plane, %d containerds and kubelets after %s", len(names), time.Since(start).Round(time.Millisecond))

	// The install: deploy/ through the lab's overlay, with the operator's
	// --pod-interfaces.
	overlay := filepath.Join(rt.dir, "overlay")
	if err := l.DeployOperatorOverlay(overlay, image, testenv.OtherCNIPodInterfaces); err != nil {
		t.Fatal(err)
	}
	kubectl := kubectlFor(ctx, t, l.Kubeconfig())
	if err := kubectl("apply", "-k", overlay); err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	err = cluster.Poll(ctx, 4*time.Minute, func() (bool, error) {
		ds, err = cs.AppsV1().DaemonSets(cluster.Namespace).Get(ctx, "isthmus-agent", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st := ds.Status
		return st.DesiredNumberScheduled == int32(len(names)) && st.NumberReady == st.DesiredNumberScheduled, nil
	}, func() string { return fmt.Sprintf("DaemonSet isthmus-agent status %+v", ds.Status) })
	if err != nil {
		t.Fatalf("%v\n%s\n%s\n%s", err, agentPodsState(ctx, cs), controllerState(ctx, cs), diag(names[0]))
	}
	for _, n := range sc.Nodes() {
		if err := nodes[n.Name].cd.WaitNetworkReady(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := cluster.WaitNodeReady(ctx, cs, n.Name, time.Minute); err != nil {
			t.Fatalf("%v\n%s", err, diag(n.Name))
		}
		// Each node's CNI is its site's: the agent wrote isthmus' conflist
		// and plugin on the edge, and left the bridge's alone on the cloud.
		conf, _ := os.ReadDir(l.CNIConfDir(n.Name))
		var files []string
		for _, f := range conf {
			files = append(files, f.Name())
		}
		_, pluginErr := os.Stat(filepath.Join(l.CNIBinDir(n.Name), cniinstall.PluginName))
		want := []string{cniinstall.ConflistName}
		if !n.Site.ManagesCNI() {
			want = []string{cri.BridgeConflistName}
		}
		if strings.Join(files, " ") != strings.Join(want, " ") || (pluginErr == nil) != n.Site.ManagesCNI() {
			t.Errorf("%s (site %s): CNI configurations %v, want %v; isthmus-cni installed: %v", n.Name, n.Site.Name, files, want, pluginErr == nil)
		}
	}
	t.Logf("installed: %d agent pods Ready, Nodes Ready, after %s", len(names), time.Since(start).Round(time.Millisecond))

	// A Pod through the API on every node.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeletNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := cs.CoreV1().Pods(kubeletNamespace).Create(ctx, probePod("web-"+n, n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type runPod struct {
		node, site string
		pod        cri.Pod
		container  string
	}
	var pods []runPod
	for _, n := range sc.Nodes() {
		rn := nodes[n.Name]
		obj, err := waitPodRunning(ctx, cs, "web-"+n.Name, 90*time.Second)
		if err != nil {
			t.Fatalf("%v\n%s", err, diag(n.Name))
		}
		p, err := rn.cd.ReadyPod(ctx, kubeletNamespace, obj.Name)
		if err != nil {
			t.Fatal(err)
		}
		if p.IP != obj.Status.PodIP {
			t.Errorf("%s: Pod %s status.podIP %s, its sandbox has %s", n.Name, obj.Name, obj.Status.PodIP, p.IP)
		}
		if n.Site.ManagesCNI() {
			checkRuntimePod(t, l, rn, p)
		} else {
			checkBridgePod(t, l, rn, p, hostLocal[n.Name])
		}
		c, err := rn.cd.Container(ctx, p, "probe")
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, runPod{node: n.Name, site: n.Site.Name, pod: p, container: c})
	}

	// Every pod to every other, TCP and UDP, both ways (each pair is asked
	// from both ends).
	run := func(from runPod, argv ...string) (string, error) {
		var out string
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			out, err = nodes[from.node].cd.Exec(ctx, from.container, argv...)
			if err == nil || time.Now().After(deadline) {
				return out, err
			}
		}
	}
	for _, from := range pods {
		for _, to := range pods {
			if from.node == to.node {
				continue
			}
			// The probe's server answers with the source address it saw.
			want := "source " + from.pod.IP + "\n"
			if got, err := run(from, "/probe", "get", "http://"+to.pod.IP+":8080/"); err != nil || got != want {
				t.Errorf("%s (%s) -> %s (%s): TCP get = %q, %v; want %q", from.node, from.pod.IP, to.node, to.pod.IP, got, err, want)
			}
			if got, err := run(from, "/probe", "udp", to.pod.IP+":8080"); err != nil || got != want {
				t.Errorf("%s (%s) -> %s (%s): UDP = %q, %v; want %q", from.node, from.pod.IP, to.node, to.pod.IP, got, err, want)
			}
			// A datagram longer than the pod's MTU leaves in fragments; behind the
			// bridge its netfilter reassembles them before pod_ingress.
			if got, err := run(from, "/probe", "udp-large", to.pod.IP+":8080"); err != nil || got != want {
				t.Errorf("%s (%s) -> %s (%s): UDP of 2000 bytes = %q, %v; want %q", from.node, from.pod.IP, to.node, to.pod.IP, got, err, want)
			}
		}
	}
	// Every node's host namespace to every pod of another node, TCP and UDP:
	// what the API server's proxy and a kubelet's probes do. The server sees
	// one of the node's own addresses. On the cloud's nodes the tunnel
	// address is cni0's too, so the answers to it are the node's own and
	// never a pod's behind the bridge (main alone routes it to cni0). The
	// cloud member's host too: its packets to the edge's pods leave from the
	// tunnel address over the fabric and must pass the other CNI's
	// MASQUERADE unchanged, and the gateway's pods answer its own address
	// over the fabric, never through the tunnel (docs/gateways.md, "Members
	// of a site whose pods another CNI owns").
	for _, n := range sc.Nodes() {
		own := map[string]bool{n.Address.String(): true, tunnelAddr(t, l, n.Name).String(): true}
		for _, to := range pods {
			if to.node == n.Name {
				continue
			}
			for _, proto := range []string{"tcp", "udp"} {
				before, _ := l.RPFilterDrops()
				out, err := askFromHost(testenv.NSPath(l.NodeNS(n.Name)), proto, to.pod.IP+":8080")
				after, _ := l.RPFilterDrops()
				for node, d := range after {
					if d != before[node] {
						t.Logf("%s's host -> %s (%s) %s: %d packets dropped by rp_filter on %s", n.Name, to.node, to.pod.IP, proto, d-before[node], node)
					}
				}
				src, ok := strings.CutPrefix(strings.TrimSpace(out), "source ")
				if err != nil || !ok || !own[src] {
					t.Errorf("%s's host -> %s (%s): %s = %q, %v; want the source to be one of the node's own %v", n.Name, to.node, to.pod.IP, proto, out, err, own)
				}
			}
		}
	}
	// Every node's host to every other node's InternalIP, TCP and UDP: what
	// a host-network client asks of a hostNetwork server (the conformance
	// suite's "service endpoints using hostNetwork"). Across the sites a
	// member's packets go through the gateways from its tunnel address; the
	// two gateways reach each other on the underlay, from their InternalIPs
	// (underlayReachesNodes: false). Either way the server sees one of the
	// sender's own addresses.
	hostServers := map[string]*testenv.EchoServer{}
	for _, n := range sc.Nodes() {
		srv, err := testenv.StartEchoServer(l.NodeNS(n.Name))
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		hostServers[n.Name] = srv
	}
	for _, n := range sc.Nodes() {
		own := map[netip.Addr]bool{n.Address: true, tunnelAddr(t, l, n.Name): true}
		for _, to := range sc.Nodes() {
			if to.Name == n.Name {
				continue
			}
			srv := hostServers[to.Name]
			saw, err := testenv.TCPEcho(l.NodeNS(n.Name), netip.AddrPortFrom(to.Address, srv.TCPPort), 5*time.Second)
			if err != nil || !own[saw] {
				t.Errorf("%s's host -> %s's host (%s) tcp: saw %v, %v; want one of %v", n.Name, to.Name, to.Address, saw, err, own)
			}
			saw, err = testenv.UDPEcho(l.NodeNS(n.Name), netip.AddrPortFrom(to.Address, srv.UDPPort), 5*time.Second)
			if err != nil || !own[saw] {
				t.Errorf("%s's host -> %s's host (%s) udp: saw %v, %v; want one of %v", n.Name, to.Name, to.Address, saw, err, own)
			}
		}
	}
	// master-02's pod's flows to the edge leave master-02 as GENEVE to its
	// gateway master-gw (tshark on master-02's router port, asked again
	// while it captures). The answers come back as master-gw hands them to
	// the cloud's fabric: plain, on master-02's underlay, from the edge
	// pod's own address (docs/gateways.md, "Members of a site whose pods
	// another CNI owns").
	var m02, e01 runPod
	for _, p := range pods {
		switch p.node {
		case "master-02":
			m02 = p
		case "edge-01":
			e01 = p
		}
	}
	addrOf := func(node string) string {
		for _, n := range sc.Nodes() {
			if n.Name == node {
				return n.Address.String()
			}
		}
		return ""
	}
	gw, m02Addr := addrOf("master-gw"), addrOf("master-02")
	wait := capture(t, l.RouterNS(), testenv.RouterPort("master-02"), 10*time.Second)
	for _, to := range pods {
		if to.site != m02.site {
			run(m02, "/probe", "get", "http://"+to.pod.IP+":8080/")
			run(m02, "/probe", "udp", to.pod.IP+":8080")
		}
	}
	seen := map[string]int{}
	for _, f := range wait() {
		if len(f.ipSrc) != 2 || len(f.ipDst) != 2 || f.ipSrc[0] != m02Addr || f.ipDst[0] != gw || f.ipSrc[1] != m02.pod.IP {
			continue
		}
		_, inner, _ := strings.Cut(f.protocols, ":geneve:")
		for _, proto := range []string{"tcp", "udp"} {
			if strings.Contains(inner, ":"+proto) {
				seen[proto]++
			}
		}
	}
	t.Logf("GENEVE from master-02 to master-gw carrying its pod's flows to the edge: %v", seen)
	for _, proto := range []string{"tcp", "udp"} {
		if seen[proto] == 0 {
			t.Errorf("no GENEVE frame from master-02 to master-gw carrying %s of master-02's pod (%v)", proto, seen)
		}
	}
	// tshark stops by itself (-a duration) when nothing comes: killed, its
	// dumpcap would keep the output open and the capture would never end.
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	out, err := testenv.Capture(cctx, l.RouterNS(), []string{"-i", testenv.RouterPort("master-02"),
		"-f", fmt.Sprintf("udp and not port 6081 and src host %s and dst host %s", e01.pod.IP, m02.pod.IP),
		"-c", "1", "-a", "duration:15", "-T", "fields", "-e", "ip.src"}, func() {
		run(m02, "/probe", "udp", e01.pod.IP+":8080")
	})
	ccancel()
	if back := strings.Fields(out); err != nil || len(back) != 1 || back[0] != e01.pod.IP {
		t.Errorf("edge-01's answer to master-02's pod on master-02's underlay: sources %q (%v), want %s, plain from the fabric", out, err, e01.pod.IP)
	}
	// Strict rp_filter everywhere, and it dropped nothing of this.
	if loose, err := l.RPFilterNotStrict(); err != nil || len(loose) > 0 {
		t.Errorf("rp_filter not strict: %v (%v)", loose, err)
	}
	if drops, err := l.RPFilterDrops(); err != nil {
		t.Error(err)
	} else {
		for n, d := range drops {
			if d != 0 {
				t.Errorf("%s: %d packets dropped by rp_filter", n, d)
			}
		}
	}
	for _, n := range names {
		if err := cs.CoreV1().Pods(kubeletNamespace).Delete(ctx, "web-"+n, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
	for _, n := range names {
		if err := waitPodGone(ctx, cs, "web-"+n, time.Minute); err != nil {
			t.Errorf("%v\n%s", err, diag(n))
		}
	}
	// isthmus' own pods go while the kubelets run, so that no runtime stops
	// under containers of the others (they share the CRI cgroups).
	if err := kubectl("delete", "-k", overlay, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	if err := waitNamespaceGone(ctx, cs, cluster.Namespace, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, agentPodsState(ctx, cs))
	}
}

// checkBridgePod checks a pod the bridge plugin made on node n: its eth0
// holds one address, inside the node's podCIDR, which host-local reserved
// (a file named by it under dataDir/<network>, holding the sandbox's ID),
// and its host veth is a port of cni0.
func checkBridgePod(t *testing.T, l *testenv.Lab, n *runtimeNode, p cri.Pod, dataDir string) {
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
	b, err := os.ReadFile(filepath.Join(dataDir, cri.BridgeNetwork, p.IP))
	if err != nil || !strings.HasPrefix(string(b), p.ID) {
		t.Errorf("%s: pod %s: host-local's reservation of %s: %q, %v; want the sandbox %s", n.name, p.Name, p.IP, b, err, p.ID)
	}
	// The host side: eth0's peer in the node, a port of cni0.
	host := handleAt(t, testenv.NSPath(l.NodeNS(n.name)))
	peer, err := host.LinkByIndex(eth0.Attrs().ParentIndex)
	if err != nil {
		t.Fatalf("%s: pod %s: host side of eth0: %v", n.name, p.Name, err)
	}
	br, err := host.LinkByName("cni0")
	if err != nil || peer.Attrs().MasterIndex != br.Attrs().Index || !strings.HasPrefix(peer.Attrs().Name, "veth") {
		t.Errorf("%s: pod %s: host side %s (master %d), want a veth* port of cni0 (%v)", n.name, p.Name, peer.Attrs().Name, peer.Attrs().MasterIndex, err)
	}
	if n.ipam.Dir != "" {
		if res, err := n.ipam.List(); err == nil && len(res) > 0 {
			t.Errorf("%s: the isthmus IPAM holds %v on a node of another CNI", n.name, res)
		}
	}
}
