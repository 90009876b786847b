package kube_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/controller"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/source"
	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// The sites of these tests: a managed site whose nodes get /24s of
// 10.244.0.0/16, and an unmanaged one (another CNI owns the pods) whose nodes
// get tunnel addresses instead.
var (
	managedSite = map[string]any{
		"nodeCidrs": []any{"172.16.1.0/24"},
		"podCidrAssignments": []any{map[string]any{
			"cidrBlocks":     []any{"10.244.0.0/16"},
			"nodeBlockSizes": map[string]any{"ipv4": int64(24)},
		}},
	}
	unmanagedSite = map[string]any{
		"nodeCidrs":          []any{"172.16.3.0/24"},
		"manageCniPlugin":    false,
		"podCidrAssignments": []any{map[string]any{"cidrBlocks": []any{"10.0.2.0/23"}}},
	}
)

func createSite(t *testing.T, s *kube.Server, name string, spec map[string]any) {
	t.Helper()
	if _, err := dynClient(t, s).Resource(siteGVR).Create(context.Background(), newSite(name, spec), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Site %s: %v", name, err)
	}
}

// createNode creates a Node with an InternalIP (written through the status
// subresource, as a kubelet does) and, if given, podCIDRs.
func createNode(t *testing.T, cs kubernetes.Interface, name, internalIP string, podCIDRs ...string) {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDRs[0], podCIDRs
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: internalIP},
		{Type: corev1.NodeHostName, Address: name},
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of node %s: %v", name, err)
	}
}

// eventually polls cond every 100ms until it returns nil or the timeout ends,
// then fails with its last error.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runController runs the controller in-process (no leader election) until the
// test ends, and fails the test if it returns early with an error.
func runController(t *testing.T, s *kube.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cs := clientset(t, s)
	go func() {
		done <- controller.Run(ctx, controller.Config{
			Client:  cs,
			Dynamic: dynClient(t, s),
			Log:     testLogger(t, "controller"),
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("controller: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("controller did not return within 30s of its context's end")
		}
	})
}

// startSource starts the agent's Kubernetes object source until the test ends.
func startSource(t *testing.T, s *kube.Server) *source.Kubernetes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := source.NewKubernetes(ctx, source.KubernetesConfig{
		Client:  clientset(t, s),
		Dynamic: dynClient(t, s),
		Log:     testLogger(t, "source"),
	})
	if err != nil {
		t.Fatalf("start kubernetes source: %v", err)
	}
	t.Cleanup(func() {
		if err := src.Close(); err != nil {
			t.Errorf("close source: %v", err)
		}
	})
	return src
}

func testLogger(t testing.TB, who string) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil)).With("who", who)
	}
	return slog.New(slog.DiscardHandler)
}

// snapshotNode returns the node as the source's current snapshot has it.
func snapshotNode(src source.Source, name string) (*corev1.Node, *objects.Set, error) {
	set, _, err := src.Snapshot()
	if err != nil {
		return nil, nil, err
	}
	n := set.Node(name)
	if n == nil {
		return nil, set, errors.New("node " + name + " not in the snapshot")
	}
	return n, set, nil
}

// drain empties a Changed channel.
func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func waitChanged(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("Changed did not fire after %s", what)
	}
}

func getNode(t *testing.T, cs kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestControllerAndSource: the controller and the agent's object source, both
// on real watches. A node of the managed site gets its site label and a /24
// from the site's pool; a node of the unmanaged site gets its label, no
// podCIDR and a tunnel address; the source sees both as the controller left
// them; a deleted node leaves the snapshot and its block is handed out again.
func TestControllerAndSource(t *testing.T) {
	s := startWithCRDs(t)
	cs := clientset(t, s)
	createSite(t, s, "site-a", managedSite)
	createSite(t, s, "site-u", unmanagedSite)
	runController(t, s)
	src := startSource(t, s)
	pool := netip.MustParsePrefix("10.244.0.0/16")
	tunnelCIDR := controller.DefaultTunnelCIDR

	createNode(t, cs, "a1", "172.16.1.11")
	createNode(t, cs, "u1", "172.16.3.11")
	var a1Block netip.Prefix
	eventually(t, 30*time.Second, "a1 labelled with site-a and given a /24 of 10.244.0.0/16", func() error {
		n := getNode(t, cs, "a1")
		if got := n.Labels[controller.LabelSite]; got != "site-a" {
			return errors.New("label " + controller.LabelSite + "=" + got)
		}
		if len(n.Spec.PodCIDRs) != 1 || n.Spec.PodCIDR != n.Spec.PodCIDRs[0] {
			return errors.New("podCIDRs " + n.Spec.PodCIDR + " " + join(n.Spec.PodCIDRs))
		}
		p, err := netip.ParsePrefix(n.Spec.PodCIDR)
		if err != nil {
			return err
		}
		if p.Bits() != 24 || !pool.Contains(p.Addr()) {
			t.Fatalf("a1 got podCIDR %s, want a /24 inside %s", p, pool)
		}
		a1Block = p
		return nil
	})
	eventually(t, 30*time.Second, "u1 labelled with site-u and given a tunnel address", func() error {
		n := getNode(t, cs, "u1")
		if got := n.Labels[controller.LabelSite]; got != "site-u" {
			return errors.New("label " + got)
		}
		a := n.Annotations[v1alpha1.AnnotationTunnelIPv4]
		if a == "" {
			return errors.New("no tunnel address annotation")
		}
		addr, err := netip.ParseAddr(a)
		if err != nil || !tunnelCIDR.Contains(addr) {
			t.Fatalf("u1 tunnel address %q, want one in %s", a, tunnelCIDR)
		}
		if n.Spec.PodCIDR != "" || len(n.Spec.PodCIDRs) != 0 {
			t.Fatalf("u1 of an unmanaged site got podCIDRs %v", n.Spec.PodCIDRs)
		}
		return nil
	})
	u1Tunnel := getNode(t, cs, "u1").Annotations[v1alpha1.AnnotationTunnelIPv4]

	// The source sees what the controller wrote.
	eventually(t, 30*time.Second, "the source sees a1's podCIDR and u1's tunnel address", func() error {
		a1, set, err := snapshotNode(src, "a1")
		if err != nil {
			return err
		}
		if got := objects.PodCIDRs(a1); !slices.Equal(got, []netip.Prefix{a1Block}) {
			return errors.New("a1 podCIDRs in snapshot: " + prefixes(got))
		}
		u1 := set.Node("u1")
		if u1 == nil {
			return errors.New("u1 not in the snapshot")
		}
		if addr, _, ok := objects.TunnelAddr(u1); !ok || addr.String() != u1Tunnel {
			return errors.New("u1 tunnel address in snapshot: " + addr.String())
		}
		if site := set.SiteOf(u1); site == nil || site.Name != "site-u" {
			return errors.New("u1 not in site-u in the snapshot")
		}
		return nil
	})

	// A second managed node gets a different block.
	createNode(t, cs, "a2", "172.16.1.12")
	var a2Block string
	eventually(t, 30*time.Second, "a2 gets its own block", func() error {
		a2Block = getNode(t, cs, "a2").Spec.PodCIDR
		if a2Block == "" {
			return errors.New("no podCIDR yet")
		}
		return nil
	})
	if p := netip.MustParsePrefix(a2Block); p.Overlaps(a1Block) || !pool.Contains(p.Addr()) {
		t.Fatalf("a2 got %s; a1 has %s; pool %s", p, a1Block, pool)
	}

	// Node removal: a1 leaves the snapshot, and a node created after it may
	// have a1's block again (the lowest free one).
	drain(src.Changed())
	if err := cs.CoreV1().Nodes().Delete(context.Background(), "a1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, src.Changed(), "a1 was deleted")
	eventually(t, 30*time.Second, "a1 gone from the snapshot", func() error {
		if _, _, err := snapshotNode(src, "a1"); err == nil {
			return errors.New("a1 still there")
		}
		_, set, _ := snapshotNode(src, "a2")
		if set == nil || set.Node("a2") == nil {
			return errors.New("a2 missing too")
		}
		return nil
	})
	createNode(t, cs, "a3", "172.16.1.13")
	eventually(t, 30*time.Second, "a3 gets the block a1 freed", func() error {
		got := getNode(t, cs, "a3").Spec.PodCIDR
		if got == "" {
			return errors.New("no podCIDR yet")
		}
		if got != a1Block.String() {
			t.Fatalf("a3 got %s, want %s, the lowest free block once a1 is gone", got, a1Block)
		}
		return nil
	})
}

// TestSourceFollowsEdits: the agent's source on real watches, without the
// controller: a node created without a podCIDR is in the snapshot without
// one and gets it when it is assigned later; a Site edit reaches the
// snapshot; each fires Changed.
func TestSourceFollowsEdits(t *testing.T) {
	s := startWithCRDs(t)
	cs := clientset(t, s)
	ctx := context.Background()
	createSite(t, s, "site-a", managedSite)
	createNode(t, cs, "a1", "172.16.1.11", "10.244.1.0/24")
	src := startSource(t, s)
	if _, _, err := snapshotNode(src, "a1"); err != nil {
		t.Fatalf("first snapshot: %v", err)
	}

	drain(src.Changed())
	createNode(t, cs, "late", "172.16.1.20")
	waitChanged(t, src.Changed(), "node late was created")
	eventually(t, 30*time.Second, "late in the snapshot without a podCIDR", func() error {
		n, _, err := snapshotNode(src, "late")
		if err != nil {
			return err
		}
		if got := objects.PodCIDRs(n); len(got) != 0 {
			t.Fatalf("late has podCIDRs %v before any was assigned", got)
		}
		return nil
	})

	// The podCIDR arrives later (as the controller or kube-controller-manager
	// would set it).
	drain(src.Changed())
	patch := []byte(`{"spec":{"podCIDR":"10.244.20.0/24","podCIDRs":["10.244.20.0/24"]}}`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, "late", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("assign podCIDR: %v", err)
	}
	waitChanged(t, src.Changed(), "late's podCIDR was assigned")
	eventually(t, 30*time.Second, "late's podCIDR in the snapshot", func() error {
		n, _, err := snapshotNode(src, "late")
		if err != nil {
			return err
		}
		if got := objects.PodCIDRs(n); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.244.20.0/24")}) {
			return errors.New("podCIDRs " + prefixes(got))
		}
		return nil
	})

	// A Site edit.
	drain(src.Changed())
	editSite(t, s, "site-a", `{"spec":{"localCidrs":["192.168.50.0/24"],"tunnelMTU":1400}}`)
	waitChanged(t, src.Changed(), "site-a was edited")
	eventually(t, 30*time.Second, "site-a's edit in the snapshot", func() error {
		set, _, err := src.Snapshot()
		if err != nil {
			return err
		}
		site := set.Site("site-a")
		if site == nil {
			return errors.New("site-a missing")
		}
		if site.Spec.TunnelMTU != 1400 || len(site.Spec.LocalCIDRs) != 1 || site.Spec.LocalCIDRs[0] != "192.168.50.0/24" {
			return errors.New("site-a spec not updated")
		}
		return nil
	})
}

func editSite(t *testing.T, s *kube.Server, name, mergePatch string) {
	t.Helper()
	if _, err := dynClient(t, s).Resource(siteGVR).Patch(context.Background(), name, types.MergePatchType, []byte(mergePatch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("edit Site %s: %v", name, err)
	}
}

// TestAPIOutage: kube-apiserver stops (etcd stays) and starts again on the
// same port. Meanwhile the source keeps serving its last snapshot; after the
// return it catches up with changes made since, and the controller resumes
// labelling and assigning.
func TestAPIOutage(t *testing.T) {
	s := startWithCRDs(t)
	cs := clientset(t, s)
	createSite(t, s, "site-a", managedSite)
	runController(t, s)
	src := startSource(t, s)
	createNode(t, cs, "a1", "172.16.1.11")
	eventually(t, 30*time.Second, "a1 assigned and seen by the source", func() error {
		n, _, err := snapshotNode(src, "a1")
		if err != nil {
			return err
		}
		if len(objects.PodCIDRs(n)) != 1 || n.Labels[controller.LabelSite] != "site-a" {
			return errors.New("a1 not yet labelled and assigned in the snapshot")
		}
		return nil
	})
	before, _, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}

	if err := s.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Get(context.Background(), "a1", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server still answers after StopAPIServer")
	}
	// A few seconds down: the reflectors' watches break and their relists fail.
	for range 5 {
		time.Sleep(time.Second)
		during, _, err := src.Snapshot()
		if err != nil {
			t.Fatalf("snapshot during the outage: %v", err)
		}
		if !sameNodes(before, during) || len(during.Sites) != len(before.Sites) {
			t.Fatalf("snapshot changed during the outage: nodes %v, want %v", nodeNames(during), nodeNames(before))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}

	// After the return: a new node and a Site edit reach the source, and the
	// controller handles the node.
	createNode(t, cs, "a2", "172.16.1.12")
	editSite(t, s, "site-a", `{"spec":{"tunnelMTU":1380}}`)
	eventually(t, 90*time.Second, "the source catches up after the outage", func() error {
		n, set, err := snapshotNode(src, "a2")
		if err != nil {
			return err
		}
		if set.Site("site-a").Spec.TunnelMTU != 1380 {
			return errors.New("site-a edit not seen")
		}
		if len(objects.PodCIDRs(n)) != 1 || n.Labels[controller.LabelSite] != "site-a" {
			return errors.New("a2 not yet labelled and assigned by the controller")
		}
		if set.Node("a1") == nil {
			return errors.New("a1 lost")
		}
		return nil
	})
	a1 := getNode(t, cs, "a1").Spec.PodCIDR
	a2 := getNode(t, cs, "a2").Spec.PodCIDR
	if a1 == a2 {
		t.Fatalf("a1 and a2 share podCIDR %s after the outage", a1)
	}
}

func sameNodes(a, b *objects.Set) bool {
	if len(a.Nodes) != len(b.Nodes) {
		return false
	}
	for i := range a.Nodes {
		n := b.Node(a.Nodes[i].Name)
		if n == nil || n.Spec.PodCIDR != a.Nodes[i].Spec.PodCIDR {
			return false
		}
	}
	return true
}

func nodeNames(s *objects.Set) []string {
	var names []string
	for _, n := range s.Nodes {
		names = append(names, n.Name)
	}
	return names
}

func join(ss []string) string {
	b, _ := json.Marshal(ss)
	return string(b)
}

func prefixes(ps []netip.Prefix) string {
	b, _ := json.Marshal(ps)
	return string(b)
}
