package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cluster"
	isthmusimage "github.com/isthmus-dev/isthmus/testenv/image"
)

// TestDaemonSetWireGuard: the wireguard scenario (two sites, their peering
// encrypted) installed from deploy/ on real kubelets. Every agent publishes
// its own public key on its Node; a1's pod reaches b1's through WireGuard (the
// userspace device the wireguard container runs, here where the kernel has
// no module); and a restart of a1's agent container, while a1's pod streams
// 200 datagrams a second to b1's and back, loses none: the device and its
// sessions stay with the wireguard container, which does not restart, and
// the new agent adopts the device.
func TestDaemonSetWireGuard(t *testing.T) {
	requireSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const image = "isthmus:labwg"
	work := tempWork(t, "iswg-")
	a, err := isthmusimage.Build(ctx, isthmusimage.Options{Version: "labwg", Out: filepath.Join(work, "isthmus.oci.tar"), Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := testenv.LoadScenario("wireguard")
	if err != nil {
		t.Fatal(err)
	}
	c := upCluster(ctx, t, cluster.Options{Scenario: sc, Work: work, Image: image, Archives: []string{a.Path}})
	cs := c.Client

	// Keys: each agent published its own.
	keys := map[string]string{}
	for _, n := range c.Nodes {
		err := cluster.Poll(ctx, time.Minute, func() (bool, error) {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			keys[n.Name] = node.Annotations[v1alpha1.AnnotationWireGuardPublicKey]
			return keys[n.Name] != "", nil
		}, func() string { return "Node " + n.Name + " has no WireGuard public key" })
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]string{}
	for n, k := range keys {
		if other, dup := seen[k]; dup {
			t.Errorf("nodes %s and %s publish the same key %s", n, other, k)
		}
		seen[k] = n
	}

	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeletNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := map[string]podRef{}
	for _, n := range []string{"a1", "b1"} {
		if _, err := cs.CoreV1().Pods(kubeletNamespace).Create(ctx, probePod("web-"+n, n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, node := range c.Nodes {
		if node.Name != "a1" && node.Name != "b1" {
			continue
		}
		obj, err := waitPodRunning(ctx, cs, "web-"+node.Name, 90*time.Second)
		if err != nil {
			t.Fatalf("%v\n%s", err, c.Diagnose(node.Name))
		}
		p, err := node.Containerd.ReadyPod(ctx, kubeletNamespace, obj.Name)
		if err != nil {
			t.Fatal(err)
		}
		pods[node.Name] = podRef{netns: p.NetNS, ip: p.IP}
	}
	// Through the tunnel: the first datagrams may wait for the handshake.
	stream, err := startPodStream(pods["a1"].netns, pods["b1"].ip+":8080", 200)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if _, echoed, _ := stream.stop(); echoed == 0 {
		t.Fatalf("a1's pod gets no echo from b1's pod through WireGuard\n%s", c.Diagnose("a1"))
	}

	a1 := c.Nodes[0]
	for _, n := range c.Nodes {
		if n.Name == "a1" {
			a1 = n
		}
	}
	restarts := func() (agent, wg int32) {
		t.Helper()
		list, err := cs.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: cluster.AgentSelector, FieldSelector: "spec.nodeName=a1"})
		if err != nil || len(list.Items) != 1 {
			t.Fatalf("a1's agent pod: %v (%d pods)", err, len(list.Items))
		}
		for _, st := range list.Items[0].Status.ContainerStatuses {
			switch st.Name {
			case "agent":
				agent = st.RestartCount
			case "wireguard":
				wg = st.RestartCount
			}
		}
		return agent, wg
	}
	agentBefore, wgBefore := restarts()
	stream, err = startPodStream(pods["a1"].netns, pods["b1"].ip+":8080", 200)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	id, err := a1.Containerd.Crictl(ctx, "ps", "--name", "^agent$", "--quiet")
	if err != nil || strings.TrimSpace(id) == "" {
		t.Fatalf("a1's agent container: %q, %v", id, err)
	}
	if out, err := a1.Containerd.Crictl(ctx, "stop", strings.TrimSpace(id)); err != nil {
		t.Fatalf("crictl stop the agent on a1: %v\n%s", err, out)
	}
	err = cluster.Poll(ctx, 2*time.Minute, func() (bool, error) {
		agent, _ := restarts()
		list, err := cs.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: cluster.AgentSelector, FieldSelector: "spec.nodeName=a1"})
		return err == nil && agent > agentBefore && len(list.Items) == 1 && cluster.PodReady(&list.Items[0]), err
	}, func() string { return "a1's agent container did not come back Ready" })
	time.Sleep(2 * time.Second)
	sent, echoed, missing := stream.stop()
	if err != nil {
		t.Fatalf("%v\n%s", err, cluster.PodsState(ctx, cs, cluster.Namespace, cluster.AgentSelector))
	}
	agentAfter, wgAfter := restarts()
	t.Logf("agent container restarts %d -> %d, wireguard container %d -> %d; stream: %d sent, %d echoed", agentBefore, agentAfter, wgBefore, wgAfter, sent, echoed)
	if wgAfter != wgBefore {
		t.Errorf("the wireguard container restarted with the agent's (%d -> %d)", wgBefore, wgAfter)
	}
	if sent < 400 || len(missing) > 0 {
		t.Errorf("across the agent container's restart %d of %d datagrams were lost (sequence numbers %v)", len(missing), sent, head(missing, 20))
	}
	list, err := cs.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: cluster.AgentSelector, FieldSelector: "spec.nodeName=a1"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("a1's agent pod: %v", err)
	}
	logs, err := c.Kubectl(ctx, "logs", "-n", cluster.Namespace, list.Items[0].Name, "-c", "agent")
	if err != nil || !strings.Contains(logs, "wireguard device adopted") {
		t.Errorf("the restarted agent did not adopt the WireGuard device (%v):\n%s", err, logs)
	}

	// Rotation as docs/agent.md tells it, in the agent's container: the agent
	// publishes the new key on its Node, b1's agent (which reads it from the
	// API server) re-keys its peer, and the stream loses nothing.
	stream, err = startPodStream(pods["a1"].netns, pods["b1"].ip+":8080", 200)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	stateDir := filepath.Join(filepath.Dir(c.Lab.CNIBinDir("a1")), "state")
	out, err := c.Kubectl(ctx, "exec", "-n", cluster.Namespace, list.Items[0].Name, "-c", "agent", "--",
		"isthmus", "wireguard-key", "--rotate", "--state-dir", stateDir)
	if err != nil {
		t.Fatalf("rotate a1's key: %v", err)
	}
	newKey := strings.TrimSpace(out)
	if newKey == keys["a1"] || len(newKey) != 44 {
		t.Fatalf("wireguard-key --rotate printed %q (old key %s)", newKey, keys["a1"])
	}
	err = cluster.Poll(ctx, 30*time.Second, func() (bool, error) {
		node, err := cs.CoreV1().Nodes().Get(ctx, "a1", metav1.GetOptions{})
		return err == nil && node.Annotations[v1alpha1.AnnotationWireGuardPublicKey] == newKey, err
	}, func() string { return "a1's agent did not publish its new key " + newKey })
	time.Sleep(3 * time.Second)
	sent, _, missing = stream.stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("key rotation on a1: stream %d sent, %d lost", sent, len(missing))
	if sent < 400 || len(missing) > 0 {
		t.Errorf("across a1's key rotation %d of %d datagrams were lost (sequence numbers %v)", len(missing), sent, head(missing, 20))
	}
}

// podRef is a pod's network namespace path and address.
type podRef struct{ netns, ip string }
