package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cluster"
	"github.com/isthmus-dev/isthmus/testenv/clusterdns"
	"github.com/isthmus-dev/isthmus/testenv/cri"
	"github.com/isthmus-dev/isthmus/testenv/kube"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// TestClusterDNS: the lab's cluster has a cluster DNS as kubeadm gives one,
// and it works across isthmus. A Kubernetes-mode lab (the default scenario:
// sites a and b) runs kube-controller-manager, kube-scheduler, the real
// kube-proxy on every node, and a containerd and a kubelet (clusterDNS
// kube.ClusterDNSIP, clusterDomain cluster.local) on a1 and b1. CoreDNS,
// built from the module proxy into an image imported on the nodes, is
// deployed from clusterdns' manifest on b1, site b, and reads the API server
// through the kubernetes Service. From a pod on a1, site a, dig (BIND's
// resolver, not CoreDNS) asks the kube-dns Service over UDP and over TCP:
// a Service's name answers its ClusterIP, a headless Service's name the
// address of its pod on b1, kubernetes.default the API server's ClusterIP,
// each authoritatively; a name outside the cluster gets SERVFAIL at once
// (no upstream here, no timeout). The queries cross the sites as GENEVE on
// a1's underlay port, to CoreDNS' pod. Then the pod's own resolver (the
// probe, a Go program reading the resolv.conf the kubelet wrote, with its
// search path) connects to both names by TCP and UDP: the backend sees the
// client pod's own address. Before the Deployment exists nothing answers at
// kube.ClusterDNSIP: the answers come from it.
func TestClusterDNS(t *testing.T) {
	requireSetup(t)
	beside(t, weightCluster)
	if err := programs.Require("dig"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// The first run on a machine builds kube-apiserver, kube-proxy, kubelet,
	// crictl, kube-controller-manager, kube-scheduler and CoreDNS.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	kubelet, err := kubebin.Kubelet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kcmBin, schedBin, err := kubebin.ControlPlane(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntimeWork(ctx, t, "isdns-")
	dnsImage, err := clusterdns.BuildImage(ctx, rt.dir)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	l := upLab(ctx, t, sc, testenv.Options{Source: testenv.SourceKube, ReadyTimeout: time.Minute})
	srv := l.Kube()
	cs, err := kubernetes.NewForConfig(srv.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	kcm, sched, err := srv.StartControlPlane(kcmBin, schedBin)
	t.Cleanup(func() {
		if sched != nil {
			if err := sched.Stop(); err != nil {
				t.Error(err)
			}
		}
		if kcm != nil {
			if err := kcm.Stop(); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.ServeAPIToPods(ctx); err != nil {
		t.Fatal(err)
	}
	// Down stops kube-proxy and removes its rules.
	if err := l.StartKubeProxy(ctx, testenv.ProxyIPTables); err != nil {
		t.Fatal(err)
	}
	labReady := time.Now()

	nodes := map[string]*runtimeNode{}
	kubelets := map[string]*cri.Kubelet{}
	for _, name := range []string{"a1", "b1"} {
		n, _ := l.Node(name)
		rn := &runtimeNode{name: name, ipam: ipam.Store{Dir: l.IPAMDir(name)}, net: n.PodCIDRs[0], agent: l.AgentLog(name)}
		nodes[name] = rn
		dir := filepath.Join(rt.dir, name)
		rn.cd = startNodeRuntime(ctx, t, l, name, cri.Config{Dir: filepath.Join(dir, "ctd"),
			CNIBinDir: l.CNIBinDir(name), CNIConfDir: l.CNIConfDir(name), Crictl: rt.crictl}, rt.pause, rt.probe, dnsImage.Path)
		if err := rn.cd.WaitNetworkReady(ctx, 30*time.Second); err != nil {
			t.Fatalf("%v\nagent log:\n%s", err, tailFile(rn.agent))
		}
		kl, err := cri.StartKubelet(ctx, cri.KubeletConfig{Dir: filepath.Join(dir, "kubelet"), NetNS: testenv.NSPath(l.NodeNS(name)),
			NodeName: name, NodeIP: n.Address, Kubeconfig: l.Kubeconfig(), Runtime: rn.cd, Binary: kubelet,
			ClusterDNS: []netip.Addr{kube.ClusterDNSIP}, ClusterDomain: kube.ClusterDomain})
		if kl != nil {
			kubelets[name] = kl
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
	for name := range nodes {
		if err := cluster.WaitNodeReady(ctx, cs, name, time.Minute); err != nil {
			t.Fatalf("%v\nkubelet log:\n%s", err, kubelets[name].LogTail())
		}
	}
	diag := func(node string) string {
		return fmt.Sprintf("kubelet %s log:\n%s\ncontainerd log:\n%s\nkube-controller-manager log:\n%s\nkube-scheduler log:\n%s\n%s\nCoreDNS logs:\n%s",
			node, kubelets[node].LogTail(), nodes[node].cd.LogTail(), srv.LogTail("kube-controller-manager.log", 20),
			srv.LogTail("kube-scheduler.log", 20), cluster.PodsState(ctx, cs, clusterdns.Namespace, "k8s-app=kube-dns"), podLogs(rt.dir, clusterdns.Namespace))
	}
	t.Logf("lab with control plane and kube-proxy after %s; containerds and kubelets on a1 and b1, Nodes Ready, after %s",
		labReady.Sub(start).Round(time.Millisecond), time.Since(labReady).Round(time.Millisecond))

	// The namespace's default ServiceAccount comes from the controller
	// manager; pods are admitted once it exists.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeletNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Poll(ctx, time.Minute, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(kubeletNamespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}, func() string { return "no default ServiceAccount in " + kubeletNamespace }); err != nil {
		t.Fatal(err)
	}
	// The backend on b1 behind a Service and a headless Service; the client on a1.
	web := probePod("web-b1", "b1")
	web.Labels = map[string]string{"app": "web"}
	client := probePod("client-a1", "a1")
	for _, p := range []*corev1.Pod{web, client} {
		if _, err := cs.CoreV1().Pods(kubeletNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ports := []corev1.ServicePort{
		{Name: "http", Protocol: corev1.ProtocolTCP, Port: 8080, TargetPort: intstr.FromInt32(8080)},
		{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 8080, TargetPort: intstr.FromInt32(8080)},
	}
	svc, err := cs.CoreV1().Services(kubeletNamespace).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: web.Labels, Ports: ports}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services(kubeletNamespace).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-headless"},
		Spec: corev1.ServiceSpec{Selector: web.Labels, ClusterIP: corev1.ClusterIPNone, Ports: ports}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	webObj, err := waitPodRunning(ctx, cs, web.Name, 90*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, diag("b1"))
	}
	clientObj, err := waitPodRunning(ctx, cs, client.Name, 90*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, diag("a1"))
	}
	clientPod, err := nodes["a1"].cd.ReadyPod(ctx, kubeletNamespace, client.Name)
	if err != nil {
		t.Fatal(err)
	}
	clientCtr, err := nodes["a1"].cd.Container(ctx, clientPod, "probe")
	if err != nil {
		t.Fatal(err)
	}
	// Both Services' EndpointSlices (the controller manager's) name the pod.
	for _, name := range []string{"web", "web-headless"} {
		if err := waitSliceHas(ctx, cs, kubeletNamespace, name, webObj.Status.PodIP, time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	dnsAddr := kube.ClusterDNSIP.String()
	// Control: nothing answers at the cluster DNS address yet.
	if r := dig(ctx, clientPod.NetNS, dnsAddr, "udp", "web."+kubeletNamespace+".svc.cluster.local."); r.err == nil {
		t.Errorf("before the cluster DNS was deployed, %s answered: %s", dnsAddr, r.out)
	}

	dnsStart := time.Now()
	if err := clusterdns.DeployClusterDNS(ctx, srv.RESTConfig(), clusterdns.Config{NodeSelector: map[string]string{"kubernetes.io/hostname": "b1"}}, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, diag("b1"))
	}
	dnsPods, err := cs.CoreV1().Pods(clusterdns.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	var dnsIPs []string
	for _, p := range dnsPods.Items {
		if p.Spec.NodeName != "b1" || !cluster.PodReady(&p) {
			t.Errorf("CoreDNS pod %s on %q, Ready %v; want Ready on b1", p.Name, p.Spec.NodeName, cluster.PodReady(&p))
		}
		dnsIPs = append(dnsIPs, p.Status.PodIP)
	}
	if err := waitSliceHas(ctx, cs, clusterdns.Namespace, clusterdns.Service, dnsIPs[0], time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("CoreDNS Ready on b1 (%v) after %s", dnsIPs, time.Since(dnsStart).Round(time.Millisecond))

	// dig from a1's pod, over UDP and TCP, while a1's underlay port is captured.
	wait := capture(t, l.RouterNS(), testenv.RouterPort("a1"), 25*time.Second)
	want := map[string]string{
		"web." + kubeletNamespace + ".svc.cluster.local.":          svc.Spec.ClusterIP,
		"web-headless." + kubeletNamespace + ".svc.cluster.local.": webObj.Status.PodIP,
		"kubernetes.default.svc.cluster.local.":                    kube.APIServiceIP.String(),
	}
	for _, proto := range []string{"udp", "tcp"} {
		for _, name := range slices.Sorted(maps.Keys(want)) {
			r := digEventually(ctx, clientPod.NetNS, dnsAddr, proto, name)
			if r.err != nil || r.status != "NOERROR" || !r.aa || !slices.Equal(r.a, []string{want[name]}) {
				t.Errorf("dig %s %s A from a1's pod: status %q, aa %v, A %v, %v; want NOERROR, authoritative, [%s]\n%s",
					proto, name, r.status, r.aa, r.a, r.err, want[name], r.out)
				continue
			}
			t.Logf("dig %s %s A from a1's pod: %s", proto, name, want[name])
		}
		// Outside the cluster: no forward, a prompt SERVFAIL.
		began := time.Now()
		if r := dig(ctx, clientPod.NetNS, dnsAddr, proto, "example.com."); r.err != nil || r.status != "SERVFAIL" {
			t.Errorf("dig %s example.com. from a1's pod: status %q, %v; want SERVFAIL (no upstream)\n%s", proto, r.status, r.err, r.out)
		} else if d := time.Since(began); d > 2*time.Second {
			t.Errorf("dig %s example.com.: SERVFAIL after %s, want at once", proto, d)
		}
	}
	frames := wait()
	seen := map[string]int{}
	for _, f := range frames {
		if len(f.ipSrc) != 2 || len(f.ipDst) != 2 || f.ipSrc[1] != clientObj.Status.PodIP || !slices.Contains(dnsIPs, f.ipDst[1]) {
			continue
		}
		if len(f.udpDst) == 2 && f.udpDst[1] == "53" {
			seen["udp"]++
		}
		if strings.HasSuffix(f.tcpPorts, ",53") {
			seen["tcp"]++
		}
	}
	t.Logf("%d GENEVE frames on a1's underlay, DNS from a1's pod to CoreDNS on b1: %v", len(frames), seen)
	for _, proto := range []string{"udp", "tcp"} {
		if seen[proto] == 0 {
			t.Errorf("no GENEVE frame on a1's underlay carries a DNS query over %s from a1's pod to CoreDNS (%v)", proto, seen)
		}
	}

	// The pod's own resolver (resolv.conf from the kubelet, search path
	// kubelet-test.svc.cluster.local) finds both names; the backend sees the
	// client's own address.
	wantSource := "source " + clientObj.Status.PodIP + "\n"
	for _, name := range []string{"web", "web-headless"} {
		for _, argv := range [][]string{{"/probe", "get", "http://" + name + ":8080/"}, {"/probe", "udp", name + ":8080"}} {
			var got string
			var err error
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
				got, err = nodes["a1"].cd.Exec(ctx, clientCtr, argv...)
				if (err == nil && got == wantSource) || time.Now().After(deadline) {
					break
				}
			}
			if err != nil || got != wantSource {
				t.Errorf("a1's pod: %s = %q, %v; want %q", strings.Join(argv, " "), got, err, wantSource)
			} else {
				t.Logf("a1's pod: %s: %s", strings.Join(argv, " "), strings.TrimSpace(got))
			}
		}
	}
	// The pods go while the kubelets run, as in TestKubeletPods: the lab's
	// containerds share the k8s.io cgroups, and one that stops while another
	// node's pods still run cannot remove theirs.
	if err := cs.AppsV1().Deployments(clusterdns.Namespace).Delete(ctx, clusterdns.Deployment, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	for _, name := range []string{web.Name, client.Name} {
		if err := cs.CoreV1().Pods(kubeletNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
	for _, name := range []string{web.Name, client.Name} {
		if err := waitPodGone(ctx, cs, name, time.Minute); err != nil {
			t.Error(err)
		}
	}
	if err := cluster.Poll(ctx, time.Minute, func() (bool, error) {
		list, err := cs.CoreV1().Pods(clusterdns.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
		return err == nil && len(list.Items) == 0, err
	}, func() string { return "CoreDNS pods still in the API" }); err != nil {
		t.Error(err)
	}
	t.Logf("TestClusterDNS took %s", time.Since(start).Round(time.Millisecond))
}

// podLogs returns the tail of every container log the kubelets under work
// keep of the pods of a namespace.
func podLogs(work, ns string) string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(work, "*", "kubelet", "pod-logs", ns+"_*", "*", "*.log"))
	for _, f := range logs {
		fmt.Fprintf(&b, "container log %s:\n%s\n", strings.TrimPrefix(f, work), tailFile(f))
	}
	return b.String()
}

// waitSliceHas waits until an EndpointSlice of the Service lists addr as a
// ready endpoint.
func waitSliceHas(ctx context.Context, cs kubernetes.Interface, ns, service, addr string, timeout time.Duration) error {
	return cluster.Poll(ctx, timeout, func() (bool, error) {
		list, err := cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
		if err != nil {
			return false, err
		}
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				if slices.Contains(e.Addresses, addr) && e.Conditions.Ready != nil && *e.Conditions.Ready {
					return true, nil
				}
			}
		}
		return false, nil
	}, func() string { return fmt.Sprintf("no EndpointSlice of %s/%s lists %s ready", ns, service, addr) })
}

// digResult is what dig said: the header's status and aa flag, the A
// records of the answer, its whole output, and an error when dig got no
// answer.
type digResult struct {
	status string
	aa     bool
	a      []string
	out    string
	err    error
}

var (
	digStatus = regexp.MustCompile(`->>HEADER<<- opcode: QUERY, status: ([A-Z]+),`)
	digFlags  = regexp.MustCompile(`;; flags: ([a-z ]*);`)
)

// dig asks server for name's A records over proto ("udp" or "tcp") with
// BIND's dig, in the network namespace at nsPath (a pod's): one try, 3
// seconds.
func dig(ctx context.Context, nsPath, server, proto, name string) digResult {
	tcp := "+notcp"
	if proto == "tcp" {
		tcp = "+tcp"
	}
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+nsPath, "--", "dig", "@"+server, tcp, "+tries=1", "+time=3",
		"+noall", "+comments", "+answer", name, "A").CombinedOutput()
	r := digResult{out: string(out)}
	if err != nil {
		r.err = fmt.Errorf("dig %s %s: %w", proto, name, err)
		return r
	}
	m := digStatus.FindStringSubmatch(r.out)
	if m == nil {
		r.err = fmt.Errorf("dig %s %s: no answer header", proto, name)
		return r
	}
	r.status = m[1]
	if f := digFlags.FindStringSubmatch(r.out); f != nil {
		r.aa = slices.Contains(strings.Fields(f[1]), "aa")
	}
	for _, line := range strings.Split(r.out, "\n") {
		f := strings.Fields(line)
		if len(f) == 5 && !strings.HasPrefix(line, ";") && f[0] == name && f[2] == "IN" && f[3] == "A" {
			r.a = append(r.a, f[4])
		}
	}
	slices.Sort(r.a)
	return r
}

// digEventually is dig retried for 15 seconds until it gets an answer: the
// first query from a pod may meet a neighbour resolution or a kube-proxy
// rule still being written.
func digEventually(ctx context.Context, nsPath, server, proto, name string) digResult {
	var r digResult
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		if r = dig(ctx, nsPath, server, proto, name); r.err == nil || time.Now().After(deadline) {
			return r
		}
	}
}
