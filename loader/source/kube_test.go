package source

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

func kubeNode(name, ip, podCIDR string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}},
	}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	return n
}

func kubeSite(name string, nodeCIDRs ...v1alpha1.CIDR) *v1alpha1.Site {
	return &v1alpha1.Site{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindSite},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.SiteSpec{NodeCIDRs: nodeCIDRs},
	}
}

func unstructuredOf(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

type fakes struct {
	client  *fake.Clientset
	dynamic *dynamicfake.FakeDynamicClient
}

// newFakes holds sites a and b, their peering, node a1 (with a podCIDR), b1
// (without) and cp, a control plane node in no site.
func newFakes(t *testing.T) fakes {
	// An empty scheme: the dynamic fake cannot list unstructured objects of
	// a kind whose typed form it knows.
	scheme := runtime.NewScheme()
	peering := &v1alpha1.SitePeering{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindSitePeering},
		ObjectMeta: metav1.ObjectMeta{Name: "a-b"},
		Spec:       v1alpha1.SitePeeringSpec{Sites: []string{"a", "b"}},
	}
	return fakes{
		client: fake.NewClientset(kubeNode("a1", "10.1.0.1", "10.10.1.0/24"), kubeNode("b1", "10.2.0.1", ""), kubeNode("cp", "192.168.0.1", "")),
		dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
			SitesResource:                      "SiteList",
			SitePeeringsResource:               "SitePeeringList",
			GatewayPoolsResource:               "GatewayPoolList",
			SiteGatewayPoolAssignmentsResource: "SiteGatewayPoolAssignmentList",
		}, unstructuredOf(t, kubeSite("a", "10.1.0.0/24")), unstructuredOf(t, kubeSite("b", "10.2.0.0/24")), unstructuredOf(t, peering)),
	}
}

func start(t *testing.T, f fakes) *Kubernetes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k, err := NewKubernetes(ctx, KubernetesConfig{Client: f.client, Dynamic: f.dynamic, Debounce: 10 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	// The fakes replay nothing to a watch that starts after a change, so
	// wait for every watch before changing anything.
	eventually(t, "every informer watches", func() bool {
		watching := map[string]bool{}
		for _, a := range append(f.client.Actions(), f.dynamic.Actions()...) {
			if a.GetVerb() == "watch" {
				watching[a.GetResource().Resource] = true
			}
		}
		return len(watching) == 5
	})
	return k
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitChanged(t *testing.T, s Source, after string) {
	t.Helper()
	select {
	case <-s.Changed():
	case <-time.After(10 * time.Second):
		t.Fatalf("Changed did not fire after %s", after)
	}
}

func noChange(t *testing.T, s Source, after string) {
	t.Helper()
	select {
	case <-s.Changed():
		t.Fatalf("Changed fired after %s", after)
	case <-time.After(300 * time.Millisecond):
	}
}

// summary is what the tests compare of a Set: each node with its site and
// podCIDRs, and each site with its nodeCidrs.
func summary(t *testing.T, s Source) []string {
	t.Helper()
	set, _, err := s.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return summarize(set)
}

func summarize(set *objects.Set) []string {
	var out []string
	for _, s := range set.Sites {
		var cidrs []string
		for _, c := range s.Spec.NodeCIDRs {
			cidrs = append(cidrs, string(c))
		}
		out = append(out, "site "+s.Name+" "+strings.Join(cidrs, ","))
	}
	for _, n := range set.Nodes {
		out = append(out, "node "+n.Name+"@"+set.SiteOf(&n).Name+" "+strings.Join(n.Spec.PodCIDRs, ","))
	}
	for _, p := range set.SitePeerings {
		out = append(out, "peering "+p.Name)
	}
	for _, p := range set.GatewayPools {
		out = append(out, "pool "+p.Name)
	}
	return out
}

func wantSummary(t *testing.T, s Source, want ...string) {
	t.Helper()
	if diff := cmp.Diff(want, summary(t, s)); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}
}

func TestKubernetesFollowsTheAPI(t *testing.T) {
	f := newFakes(t)
	k := start(t, f)
	ctx := context.Background()

	set, warns, err := k.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"site a 10.1.0.0/24", "site b 10.2.0.0/24", "node a1@a 10.10.1.0/24", "node b1@b ", "peering a-b"}, summarize(set)); diff != "" {
		t.Errorf("first snapshot (-want +got):\n%s", diff)
	}
	if len(warns) != 1 || !strings.Contains(warns[0].String(), `Node "cp"`) {
		t.Errorf("warnings %v, want one for Node cp, in no site", warns)
	}
	noChange(t, k, "the initial sync")

	// A kubelet heartbeat touches nothing the plan reads.
	b1, err := f.client.CoreV1().Nodes().Get(ctx, "b1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b1.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if b1, err = f.client.CoreV1().Nodes().UpdateStatus(ctx, b1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	noChange(t, k, "a heartbeat")

	// Neither does an annotation isthmus does not read, nor a label
	// no GatewayPool selects on (there is no pool yet); the tunnel address
	// and the WireGuard key do.
	b1.Annotations = map[string]string{"example.com/owner": "team-a"}
	b1.Labels = map[string]string{"topology.kubernetes.io/zone": "z1"}
	if b1, err = f.client.CoreV1().Nodes().Update(ctx, b1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	noChange(t, k, "an unread annotation and label")
	b1.Annotations[v1alpha1.AnnotationTunnelIPv4] = "100.64.0.9"
	if b1, err = f.client.CoreV1().Nodes().Update(ctx, b1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "b1's tunnel address")
	b1.Annotations[v1alpha1.AnnotationWireGuardPublicKey] = "QtOtzZh5rjub2WJWLADA6JvtZeCCmfcZ3aYEYjOtjjQ="
	if b1, err = f.client.CoreV1().Nodes().Update(ctx, b1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "b1 published its WireGuard key")

	// b1's podCIDR arrives late.
	b1.Spec.PodCIDR, b1.Spec.PodCIDRs = "10.20.1.0/24", []string{"10.20.1.0/24"}
	if _, err := f.client.CoreV1().Nodes().Update(ctx, b1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "b1's podCIDR arrived")
	wantSummary(t, k, "site a 10.1.0.0/24", "site b 10.2.0.0/24", "node a1@a 10.10.1.0/24", "node b1@b 10.20.1.0/24", "peering a-b")

	// The controller writes a Site's status: nothing the plan reads.
	st := kubeSite("b", "10.2.0.0/24")
	st.Status.Nodes = 1
	st.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonNodesReady, LastTransitionTime: metav1.Now()}}
	if _, err := f.dynamic.Resource(SitesResource).UpdateStatus(ctx, unstructuredOf(t, st), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	noChange(t, k, "a status write")

	// A Site edit: b grows, and a node in the new range joins it.
	b := unstructuredOf(t, kubeSite("b", "10.2.0.0/24", "10.2.1.0/24"))
	if _, err := f.dynamic.Resource(SitesResource).Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "Site b was edited")
	if _, err := f.client.CoreV1().Nodes().Create(ctx, kubeNode("b2", "10.2.1.7", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "Node b2 was created")
	wantSummary(t, k, "site a 10.1.0.0/24", "site b 10.2.0.0/24,10.2.1.0/24",
		"node a1@a 10.10.1.0/24", "node b1@b 10.20.1.0/24", "node b2@b ", "peering a-b")

	// A node goes away.
	if err := f.client.CoreV1().Nodes().Delete(ctx, "a1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "Node a1 was deleted")
	wantSummary(t, k, "site a 10.1.0.0/24", "site b 10.2.0.0/24,10.2.1.0/24", "node b1@b 10.20.1.0/24", "node b2@b ", "peering a-b")

	// A GatewayPool is created.
	pool := &v1alpha1.GatewayPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindGatewayPool},
		ObjectMeta: metav1.ObjectMeta{Name: "gw"},
		Spec: v1alpha1.GatewayPoolSpec{Type: v1alpha1.GatewayPoolInternal,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gw": "yes"}}},
	}
	if _, err := f.dynamic.Resource(GatewayPoolsResource).Create(ctx, unstructuredOf(t, pool), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "GatewayPool gw was created")
	b2n, err := f.client.CoreV1().Nodes().Get(ctx, "b2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b2n.Labels = map[string]string{"gw": "yes"}
	if _, err := f.client.CoreV1().Nodes().Update(ctx, b2n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "b2 got the label pool gw selects on")
	wantSummary(t, k, "site a 10.1.0.0/24", "site b 10.2.0.0/24,10.2.1.0/24", "node b1@b 10.20.1.0/24", "node b2@b ", "peering a-b", "pool gw")

	// An edit that makes Site b invalid sets it aside with its reason, and
	// with it what depended on it (its Nodes, the peering); Site a and the
	// pool stay. The fix brings everything back.
	bad := unstructuredOf(t, kubeSite("b", "10.2.0.0/24", "10.1.0.0/16"))
	if _, err := f.dynamic.Resource(SitesResource).Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "Site b overlapped a")
	if set, _, err := k.Snapshot(); err != nil || !strings.Contains(set.Rejection(`Site "b"`).String(), `Site "b": spec.nodeCidrs[1]: 10.1.0.0/16 overlaps Site "a" spec.nodeCidrs[0] 10.1.0.0/24`) {
		t.Errorf("snapshot of overlapping sites: %v, %v", set, err)
	}
	wantSummary(t, k, "site a 10.1.0.0/24", "pool gw")
	if _, err := f.dynamic.Resource(SitesResource).Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, k, "Site b was fixed")
	wantSummary(t, k, "site a 10.1.0.0/24", "site b 10.2.0.0/24,10.2.1.0/24", "node b1@b 10.20.1.0/24", "node b2@b ", "peering a-b", "pool gw")
}

// TestKubernetesKeepsObjectsThroughAnOutage: while the API server is away the
// snapshot is the last one seen, and when it returns the relist catches up
// with what changed meanwhile.
func TestKubernetesKeepsObjectsThroughAnOutage(t *testing.T) {
	f := newFakes(t)
	var down atomic.Bool
	var mu sync.Mutex
	var watches []watch.Interface
	refused := errors.New("connect: connection refused")
	f.client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return down.Load(), nil, refused
	})
	f.client.PrependWatchReactor("nodes", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, refused
		}
		w, err := f.client.Tracker().Watch(a.GetResource(), "")
		mu.Lock()
		watches = append(watches, w)
		mu.Unlock()
		return true, w, err
	})
	k := start(t, f)
	want := []string{"site a 10.1.0.0/24", "site b 10.2.0.0/24", "node a1@a 10.10.1.0/24", "node b1@b ", "peering a-b"}
	wantSummary(t, k, want...)

	// The API server goes away: the watch ends, lists fail.
	down.Store(true)
	mu.Lock()
	for _, w := range watches {
		w.Stop()
	}
	mu.Unlock()
	b1 := kubeNode("b1", "10.2.0.1", "10.20.1.0/24")
	if err := f.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), b1, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the informer relisted and failed", func() bool {
		for _, a := range f.client.Actions() {
			if a.GetVerb() == "list" && a.GetResource().Resource == "nodes" && down.Load() {
				// Every list after the first was made during the outage.
				n := 0
				for _, b := range f.client.Actions() {
					if b.GetVerb() == "list" && b.GetResource().Resource == "nodes" {
						n++
					}
				}
				return n >= 2
			}
		}
		return false
	})
	wantSummary(t, k, want...)

	// It returns: the relist brings b1's podCIDR.
	down.Store(false)
	waitChanged(t, k, "the API server returned")
	wantSummary(t, k, "site a 10.1.0.0/24", "site b 10.2.0.0/24", "node a1@a 10.10.1.0/24", "node b1@b 10.20.1.0/24", "peering a-b")
}

func TestKubernetesWaitsForTheAPI(t *testing.T) {
	f := newFakes(t)
	f.client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connect: connection refused")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	k, err := NewKubernetes(ctx, KubernetesConfig{Client: f.client, Dynamic: f.dynamic, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err == nil {
		k.Close()
		t.Fatal("NewKubernetes returned without a node list")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want the context's deadline", err)
	}
}

// TestNodeAnnotationPublisher: the agent's one write sets its annotation on its
// own Node and leaves every other field, annotation and label as it was.
func TestNodeAnnotationPublisher(t *testing.T) {
	n := kubeNode("a1", "10.1.0.1", "10.10.1.0/24")
	n.Annotations = map[string]string{"other": "kept"}
	n.Labels = map[string]string{"l": "v"}
	client := fake.NewClientset(n, kubeNode("b1", "10.2.0.1", ""))
	publish := NodeAnnotationPublisher(client, "a1", v1alpha1.AnnotationWireGuardPublicKey)
	if err := publish(context.Background(), "pubkey="); err != nil {
		t.Fatal(err)
	}
	got, err := client.CoreV1().Nodes().Get(context.Background(), "a1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[v1alpha1.AnnotationWireGuardPublicKey] != "pubkey=" || got.Annotations["other"] != "kept" || got.Labels["l"] != "v" ||
		len(got.Spec.PodCIDRs) != 1 {
		t.Errorf("node after publish: annotations %v labels %v podCIDRs %v", got.Annotations, got.Labels, got.Spec.PodCIDRs)
	}
	other, _ := client.CoreV1().Nodes().Get(context.Background(), "b1", metav1.GetOptions{})
	if _, ok := other.Annotations[v1alpha1.AnnotationWireGuardPublicKey]; ok {
		t.Error("another Node was annotated")
	}
	if err := NodeAnnotationPublisher(client, "gone", "k")(context.Background(), "v"); err == nil {
		t.Error("publishing on a missing Node succeeded")
	}
}
