package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cluster"
	"github.com/isthmus-dev/isthmus/testenv/cri"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// kubeletNamespace holds the test's Pods.
const kubeletNamespace = "kubelet-test"

// TestKubeletPods: a real kubelet (k8s.io/kubernetes at the API server's
// release) on a node of each site turns Pod objects into sandboxes through
// isthmus-cni. The lab runs on the API server (its agents serve IPAM and wrote
// the conflist after verifying the podCIDRs); on a1 and b1 a private
// containerd and a kubelet registered as the lab's Node start. Pods created in
// the API with spec.nodeName become Running; status.podIP lies in the node's
// podCIDR, is on the sandbox's eth0 and is reserved in the node's IPAM store
// for that sandbox; the probe client in each pod reaches the other site's pod
// across isthmus (GENEVE on the wire) with its own address. Deleting the Pods
// makes the kubelet stop the sandboxes: DEL frees the reservations and the
// host interfaces.
func TestKubeletPods(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	start := time.Now()
	// The first run on a machine builds kube-apiserver, kubelet and crictl.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	kubelet, err := kubebin.Kubelet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntimeWork(ctx, t, "iskl-")
	work, crictl, pauseTar, probeTar := rt.dir, rt.crictl, rt.pause, rt.probe
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	l := upLab(ctx, t, sc, testenv.Options{Source: testenv.SourceKube, ReadyTimeout: time.Minute})
	cs, err := kubernetes.NewForConfig(l.Kube().RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	// No controller manager runs: the namespace's service account is made by
	// hand, as its admission wants one.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeletNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(kubeletNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labReady := time.Now()
	sysctlsBefore := readSysctls(t)

	var nodes []*runtimeNode
	kubelets := map[string]*cri.Kubelet{}
	for _, name := range []string{"a1", "b1"} {
		n, _ := l.Node(name)
		if len(n.PodCIDRs) != 1 {
			t.Fatalf("node %s has podCIDRs %v, want one", name, n.PodCIDRs)
		}
		rn := &runtimeNode{name: name, ipam: ipam.Store{Dir: l.IPAMDir(name)}, net: n.PodCIDRs[0], agent: l.AgentLog(name)}
		nodes = append(nodes, rn)
		dir := filepath.Join(work, name)
		// Cleanups run last first: the kubelet stops before its runtime.
		rn.cd = startNodeRuntime(ctx, t, l, name, cri.Config{Dir: filepath.Join(dir, "ctd"),
			CNIBinDir: l.CNIBinDir(name), CNIConfDir: l.CNIConfDir(name), Crictl: crictl}, pauseTar, probeTar)
		if err := rn.cd.WaitNetworkReady(ctx, 30*time.Second); err != nil {
			t.Fatalf("%v\nagent log:\n%s", err, tailFile(rn.agent))
		}
		kl, err := cri.StartKubelet(ctx, cri.KubeletConfig{Dir: filepath.Join(dir, "kubelet"), NetNS: testenv.NSPath(l.NodeNS(name)),
			NodeName: name, NodeIP: n.Address, Kubeconfig: l.Kubeconfig(), Runtime: rn.cd, Binary: kubelet})
		if kl != nil {
			t.Cleanup(func() {
				if err := kl.Stop(); err != nil {
					t.Error(err)
				}
			})
			kubelets[name] = kl
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := cluster.WaitNodeReady(ctx, cs, n.name, 30*time.Second); err != nil {
			t.Fatalf("%v\nkubelet log:\n%s", err, kubelets[n.name].LogTail())
		}
	}
	// A kubelet sets these machine-wide at start; ours write files of their
	// own (cri.StartKubelet).
	if now := readSysctls(t); now != sysctlsBefore {
		t.Errorf("the kubelets changed the machine's sysctls: %s, before %s", now, sysctlsBefore)
	}
	t.Logf("lab on the API server after %s; two containerds and kubelets, Nodes Ready, after %s",
		labReady.Sub(start).Round(time.Millisecond), time.Since(labReady).Round(time.Millisecond))

	podsStart := time.Now()
	for _, n := range nodes {
		if _, err := cs.CoreV1().Pods(kubeletNamespace).Create(ctx, probePod("web-"+n.name, n.name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pods := make([]cri.Pod, len(nodes))
	servers := make([]string, len(nodes))
	for i, n := range nodes {
		obj, err := waitPodRunning(ctx, cs, "web-"+n.name, 60*time.Second)
		if err != nil {
			t.Fatalf("%v\nkubelet log:\n%s\ncontainerd log:\n%s", err, kubelets[n.name].LogTail(), n.cd.LogTail())
		}
		p, err := n.cd.ReadyPod(ctx, kubeletNamespace, obj.Name)
		if err != nil {
			t.Fatal(err)
		}
		if p.IP != obj.Status.PodIP {
			t.Errorf("%s: Pod %s status.podIP %s, its sandbox has %s", n.name, obj.Name, obj.Status.PodIP, p.IP)
		}
		if len(obj.Status.PodIPs) != 1 || obj.Status.PodIPs[0].IP != obj.Status.PodIP {
			t.Errorf("%s: Pod %s status.podIPs %v, want [%s]", n.name, obj.Name, obj.Status.PodIPs, obj.Status.PodIP)
		}
		// The kernel and the node's disk, not the runtime, say what the
		// plugin did: eth0 holds the address, reserved for this sandbox.
		checkRuntimePod(t, l, n, p)
		pods[i] = p
		if servers[i], err = n.cd.Container(ctx, p, "probe"); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("Pods Running with their addresses %s after %s", []string{pods[0].IP, pods[1].IP}, time.Since(podsStart).Round(time.Millisecond))

	probeAcross(t, ctx, l, nodes, pods, servers)

	// Deleting the Pods: each kubelet stops its sandbox (DEL frees the
	// reservation and the host interface), then lets the API remove the
	// object.
	delStart := time.Now()
	for _, n := range nodes {
		if err := cs.CoreV1().Pods(kubeletNamespace).Delete(ctx, "web-"+n.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range nodes {
		if err := waitPodGone(ctx, cs, "web-"+n.name, 30*time.Second); err != nil {
			t.Fatalf("%v\nkubelet log:\n%s", err, kubelets[n.name].LogTail())
		}
		res, err := n.ipam.List()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.ContainerID == pods[i].ID || r.Addr.String() == pods[i].IP {
				t.Errorf("%s: reservation %+v left after the Pod was deleted", n.name, r)
			}
		}
		checkOnlyLabPodLinks(t, l, n.name)
	}
	t.Logf("Pods deleted, reservations released, after %s; TestKubeletPods took %s",
		time.Since(delStart).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// readSysctls returns the machine-wide settings a kubelet changes at start
// (vm.overcommit_memory to 1, kernel.panic to 10, kernel.panic_on_oops to 1).
func readSysctls(t *testing.T) string {
	t.Helper()
	var vals []string
	for _, s := range []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, s+"="+strings.TrimSpace(string(b)))
	}
	return strings.Join(vals, " ")
}

// probePod is a Pod on node running the probe image's server on port 8080:
// the image is imported (pull policy Never), and nothing needs a service
// account token or service environment, which no controller here provides.
func probePod(name, node string) *corev1.Pod {
	no := false
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeletNamespace},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "probe",
				Image:           cri.ProbeImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/probe", "serve", ":8080"},
			}},
		},
	}
}

// waitPodRunning waits until the Pod is Running with an address.
func waitPodRunning(ctx context.Context, cs kubernetes.Interface, name string, timeout time.Duration) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := cluster.Poll(ctx, timeout, func() (bool, error) {
		p, err := cs.CoreV1().Pods(kubeletNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	}, func() string { return fmt.Sprintf("pod %s not Running with an address: status %+v", name, pod.Status) })
	return pod, err
}

// waitPodGone waits until the Pod object is gone from the API.
func waitPodGone(ctx context.Context, cs kubernetes.Interface, name string, timeout time.Duration) error {
	return cluster.Poll(ctx, timeout, func() (bool, error) {
		_, err := cs.CoreV1().Pods(kubeletNamespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, func() string { return fmt.Sprintf("pod %s still in the API", name) })
}
