package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	listersv1 "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func siteObject(t *testing.T, s v1alpha1.Site) *unstructured.Unstructured {
	t.Helper()
	s.APIVersion, s.Kind = v1alpha1.GroupVersion.String(), v1alpha1.KindSite
	if s.UID == "" {
		s.UID = types.UID("uid-site-" + s.Name)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&s)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func newFakes(t *testing.T, sites []v1alpha1.Site, nodes []corev1.Node) (*fake.Clientset, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	var objs []runtime.Object
	for i := range nodes {
		n := nodes[i].DeepCopy()
		n.UID = types.UID("uid-node-" + n.Name)
		objs = append(objs, n)
	}
	cs := fake.NewClientset(objs...)
	var sobjs []runtime.Object
	for _, s := range sites {
		sobjs = append(sobjs, siteObject(t, s))
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{SiteResource: "SiteList", GatewayPoolResource: "GatewayPoolList",
			SitePeeringResource: "SitePeeringList", AssignmentResource: "SiteGatewayPoolAssignmentList"}, sobjs...)
	return cs, dyn
}

// patches returns the node patches recorded by cs as "node: body" lines.
func patches(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "nodes" {
			out = append(out, p.GetName()+": "+string(p.GetPatch()))
		}
	}
	return out
}

func statusUpdates(dyn *dynamicfake.FakeDynamicClient) map[string]int {
	out := make(map[string]int)
	for _, a := range dyn.Actions() {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" {
			out[u.GetObject().(*unstructured.Unstructured).GetName()]++
		}
	}
	return out
}

// eventually polls cond every 20ms for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func getNode(t *testing.T, cs *fake.Clientset, name string) *corev1.Node {
	t.Helper()
	n, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", name)
	if err != nil {
		t.Fatal(err)
	}
	return n.(*corev1.Node)
}

func getSite(t *testing.T, dyn *dynamicfake.FakeDynamicClient, name string) v1alpha1.Site {
	t.Helper()
	o, err := dyn.Tracker().Get(SiteResource, "", name)
	if err != nil {
		t.Fatal(err)
	}
	var s v1alpha1.Site
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.(*unstructured.Unstructured).Object, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func startController(t *testing.T, cfg Config) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, cfg) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				err = fmt.Errorf("Run did not return")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// TestRunSeed000 runs the controller against fake clients holding seed 000
// with three Flex nodes, flex-1's podCIDR already set: every patch is issued
// exactly once, flex-1's spec is never patched, and the Site statuses settle
// after two updates (the first pass, and the one that sees the patches).
func TestRunSeed000(t *testing.T) {
	sites, nodes := seed000(t, mkNode("flex-2", "192.168.10.11", ""), mkNode("flex-3", "192.168.10.12", ""))
	for i := range nodes {
		if nodes[i].Name == "flex-1" {
			nodes[i].Spec.PodCIDR = "192.168.20.0/25"
			nodes[i].Spec.PodCIDRs = []string{"192.168.20.0/25"}
		}
	}
	cs, dyn := newFakes(t, sites, nodes)
	stop := startController(t, Config{Client: cs, Dynamic: dyn, Log: quiet})

	eventually(t, "cluster Ready", func() bool {
		s := getSite(t, dyn, "cluster")
		return meta.IsStatusConditionTrue(s.Status.Conditions, v1alpha1.ConditionReady)
	})
	eventually(t, "flex-site counts", func() bool {
		return getSite(t, dyn, "flex-site").Status.PodCIDRsAssigned == 2
	})
	// Another pass, forced by a Site edit that changes nothing the
	// controller reads, must not patch anything again.
	u, err := dyn.Resource(SiteResource).Get(context.Background(), "cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.SetLabels(map[string]string{"touched": "yes"})
	if _, err := dyn.Resource(SiteResource).Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	got := patches(cs)
	slices.Sort(got)
	want := []string{
		`aks-nodepool1-0: {"metadata":{"annotations":{"isthmus.dev/tunnel-ipv4":"100.64.0.1"},"labels":{"isthmus.dev/site":"cluster"}}}`,
		`aks-nodepool1-1: {"metadata":{"annotations":{"isthmus.dev/tunnel-ipv4":"100.64.0.2"},"labels":{"isthmus.dev/site":"cluster"}}}`,
		`flex-1: {"metadata":{"labels":{"isthmus.dev/site":"flex-site"}}}`,
		`flex-2: {"metadata":{"labels":{"isthmus.dev/site":"flex-site"}}}`,
		`flex-2: {"spec":{"podCIDR":"192.168.20.128/25","podCIDRs":["192.168.20.128/25"]}}`,
		`flex-3: {"metadata":{"annotations":{"isthmus.dev/tunnel-ipv4":"100.64.0.3"},"labels":{"isthmus.dev/site":"flex-site"}}}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("node patches:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := getNode(t, cs, "flex-2"); !slices.Equal(n.Spec.PodCIDRs, []string{"192.168.20.128/25"}) || n.Labels[LabelSite] != "flex-site" {
		t.Errorf("flex-2 = %v %v", n.Spec.PodCIDRs, n.Labels)
	}
	if diff := statusUpdates(dyn); diff["cluster"] != 2 || diff["flex-site"] != 2 || len(diff) != 2 {
		t.Errorf("status updates = %v, want 2 per Site", diff)
	}
	flex := getSite(t, dyn, "flex-site")
	c := meta.FindStatusCondition(flex.Status.Conditions, v1alpha1.ConditionPoolExhausted)
	if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "flex-3") {
		t.Errorf("flex-site PoolExhausted = %+v", c)
	}
}

// TestReconcileStaleCache decides twice from caches that never see the
// controller's own patches: the second pass must not patch again, and a node
// that appears meanwhile gets the next block, not the one already given.
func TestReconcileStaleCache(t *testing.T) {
	sites := []v1alpha1.Site{mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16"))}
	nodes := []corev1.Node{labeled(mkNode("b", "10.0.0.2", ""), "s")}
	cs, dyn := newFakes(t, sites, nodes)

	nodeIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	siteIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		stored := getNode(t, cs, n.Name)
		if err := nodeIdx.Add(stored); err != nil {
			t.Fatal(err)
		}
	}
	o, err := dyn.Tracker().Get(SiteResource, "", "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := siteIdx.Add(o); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Client: cs, Dynamic: dyn, Log: quiet}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	c := newController(cfg, quiet)
	c.nodes = listersv1.NewNodeLister(nodeIdx)
	c.sites = cache.NewGenericLister(siteIdx, SiteResource.GroupResource())

	ctx := context.Background()
	if err := c.reconcile(ctx); err != nil {
		t.Fatalf("first pass: %v", err)
	}
	if err := c.reconcile(ctx); err != nil {
		t.Fatalf("second pass: %v", err)
	}
	// A node that sorts first arrives; the cache still shows b without a
	// podCIDR.
	a := mkNode("a", "10.0.0.1", "")
	a.UID = "uid-node-a"
	if err := cs.Tracker().Add(&a); err != nil {
		t.Fatal(err)
	}
	if err := nodeIdx.Add(getNode(t, cs, "a")); err != nil {
		t.Fatal(err)
	}
	if err := c.reconcile(ctx); err != nil {
		t.Fatalf("third pass: %v", err)
	}
	want := []string{
		`b: {"spec":{"podCIDR":"10.1.0.0/24","podCIDRs":["10.1.0.0/24"]}}`,
		`a: {"spec":{"podCIDR":"10.1.1.0/24","podCIDRs":["10.1.1.0/24"]}}`,
		`a: {"metadata":{"labels":{"isthmus.dev/site":"s"}}}`,
	}
	if got := patches(cs); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("patches:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Pass 1: b pending; pass 2: b ready (seen through its own write, not
	// the cache); pass 3: a pending.
	if n := statusUpdates(dyn)["s"]; n != 3 {
		t.Errorf("status updates of s = %d, want 3", n)
	}
}

func TestNewer(t *testing.T) {
	mk := func(uid, rv string) *corev1.Node {
		n := &corev1.Node{}
		n.Name, n.UID, n.ResourceVersion = "n", types.UID(uid), rv
		return n
	}
	written := mk("u1", "10")
	written.Spec.PodCIDRs = []string{"10.1.0.0/24"}
	withPodCIDR := func(n *corev1.Node) *corev1.Node {
		n.Spec.PodCIDRs = []string{"10.1.0.0/24"}
		return n
	}
	tests := []struct {
		name   string
		cached *corev1.Node
		at     time.Time
		want   *corev1.Node
		kept   bool
	}{
		{"cache behind", mk("u1", "9"), time.Now(), written, true},
		{"cache caught up", mk("u1", "10"), time.Now(), nil, false},
		{"cache ahead", mk("u1", "11"), time.Now(), nil, false},
		{"node recreated", mk("u2", "5"), time.Now(), nil, false},
		{"written long ago", mk("u1", "9"), time.Now().Add(-2 * assumeFor), nil, false},
		{"opaque versions, cache without the write", mk("u1", ""), time.Now(), written, true},
		{"opaque versions, cache shows the write", withPodCIDR(mk("u1", "")), time.Now(), nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := map[string]assumed[*corev1.Node]{"n": {written, tt.at}}
			want := tt.want
			if want == nil {
				want = tt.cached
			}
			if got := newer(m, tt.cached, sameNode); got != want {
				t.Errorf("newer = %s, want %s", got.ResourceVersion, want.ResourceVersion)
			}
			if _, ok := m["n"]; ok != tt.kept {
				t.Errorf("kept = %v, want %v", ok, tt.kept)
			}
		})
	}
}

// sharedClientset returns a clientset that records its own actions but reads
// and writes the objects of base, as a second replica talking to the same
// API server would.
func sharedClientset(base *fake.Clientset) *fake.Clientset {
	cs := &fake.Clientset{}
	cs.AddReactor("*", "*", k8stesting.ObjectReaction(base.Tracker()))
	cs.AddWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if w, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := base.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		return err == nil, w, err
	})
	return cs
}

func leaseHolder(cs *fake.Clientset) string {
	l, err := cs.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestLeaderElection runs two replicas against one API server: only the
// Lease holder patches; when it stops, it releases the Lease and the other
// takes over and acts.
func TestLeaderElection(t *testing.T) {
	sites := []v1alpha1.Site{mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16"))}
	base, dyn := newFakes(t, sites, []corev1.Node{mkNode("n1", "10.0.0.1", "")})
	clients := map[string]*fake.Clientset{"one": sharedClientset(base), "two": sharedClientset(base)}
	stops := make(map[string]func() error)
	for _, id := range []string{"one", "two"} {
		stops[id] = startController(t, Config{
			Client: clients[id], Dynamic: dyn, LeaderElection: true, Identity: id, Log: quiet,
			LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond,
		})
	}
	eventually(t, "n1 assigned", func() bool { return len(getNode(t, base, "n1").Spec.PodCIDRs) == 1 })
	leader := leaseHolder(base)
	follower := map[string]string{"one": "two", "two": "one"}[leader]
	if follower == "" {
		t.Fatalf("lease holder %q", leader)
	}
	time.Sleep(300 * time.Millisecond)
	if p := patches(clients[follower]); len(p) != 0 {
		t.Errorf("follower %s patched: %v", follower, p)
	}
	if p := patches(clients[leader]); len(p) != 2 {
		t.Errorf("leader %s patches = %v, want podCIDR and label of n1", leader, p)
	}

	if err := stops[leader](); err != nil {
		t.Fatalf("stop leader: %v", err)
	}
	eventually(t, "handover", func() bool { return leaseHolder(base) == follower })
	n2 := mkNode("n2", "10.0.0.2", "")
	n2.UID = "uid-node-n2"
	if _, err := base.CoreV1().Nodes().Create(context.Background(), &n2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n2 assigned by the new leader", func() bool {
		return slices.Equal(getNode(t, base, "n2").Spec.PodCIDRs, []string{"10.1.1.0/24"})
	})
	// The label patch follows the podCIDR patch in the same pass.
	eventually(t, "the new leader's two patches of n2", func() bool {
		var byFollower []string
		for _, p := range patches(clients[follower]) {
			if strings.HasPrefix(p, "n2: ") {
				byFollower = append(byFollower, p)
			}
		}
		return len(byFollower) == 2
	})
	if p := patches(clients[leader]); len(p) != 2 {
		t.Errorf("old leader patched after it stopped: %v", p)
	}
	if err := stops[follower](); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	cs, dyn := newFakes(t, nil, nil)
	cfg := Config{Client: cs, Dynamic: dyn}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.TunnelCIDR != netip.MustParsePrefix("100.64.0.0/16") || cfg.Namespace != "isthmus-system" || cfg.Identity == "" {
		t.Errorf("defaults = %+v", cfg)
	}
	for _, bad := range []string{"fd00::/64", "100.64.0.0/31"} {
		cfg := Config{Client: cs, Dynamic: dyn, TunnelCIDR: netip.MustParsePrefix(bad)}
		if err := cfg.setDefaults(); err == nil {
			t.Errorf("tunnel CIDR %s accepted", bad)
		}
	}
	if err := Run(context.Background(), Config{}); err == nil {
		t.Error("Run without clients succeeded")
	}
}

// TestRunInvalidEvent: a Node whose podCIDR overlaps an older Node's makes its
// Site Invalid naming the newer one (the older wins), with one Warning Event
// on the Site; a later pass that finds the same problem records no other.
func TestRunInvalidEvent(t *testing.T) {
	older := labeled(mkNode("z-old", "10.0.0.2", "", "10.1.1.0/24"), "s")
	older.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	newer := labeled(mkNode("a-new", "10.0.0.3", "", "10.1.1.0/25"), "s")
	newer.CreationTimestamp = metav1.NewTime(older.CreationTimestamp.Add(time.Hour))
	sites := []v1alpha1.Site{mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16"))}
	cs, dyn := newFakes(t, sites, []corev1.Node{older, newer})
	stop := startController(t, Config{Client: cs, Dynamic: dyn, Log: quiet})
	eventually(t, "Site s Invalid", func() bool {
		return meta.IsStatusConditionTrue(getSite(t, dyn, "s").Status.Conditions, v1alpha1.ConditionInvalid)
	})
	c := meta.FindStatusCondition(getSite(t, dyn, "s").Status.Conditions, v1alpha1.ConditionInvalid)
	if !strings.Contains(c.Message, `Node "a-new"`) || !strings.Contains(c.Message, "overlaps") {
		t.Errorf("Invalid message %q, want the newer node a-new and the overlap", c.Message)
	}
	// Another pass, forced by an edit the controller does not read.
	u, err := dyn.Resource(SiteResource).Get(context.Background(), "s", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.SetLabels(map[string]string{"touched": "yes"})
	if _, err := dyn.Resource(SiteResource).Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	evs, err := cs.CoreV1().Events(EventNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 {
		t.Fatalf("%d Events, want 1: %+v", len(evs.Items), evs.Items)
	}
	ev := evs.Items[0]
	if ev.InvolvedObject.Kind != v1alpha1.KindSite || ev.InvolvedObject.Name != "s" || ev.Type != corev1.EventTypeWarning ||
		ev.Reason != v1alpha1.ReasonInvalid || !strings.Contains(ev.Message, `Node "a-new"`) {
		t.Errorf("Event %+v, want a Warning Invalid on Site s naming a-new", ev)
	}
}

// TestParallel: parallel runs every name once, with more than one and at
// most PatchWorkers in flight, and returns the errors in the order of names.
// (The client-go fake serializes its calls, so this is checked here, not
// through Run.)
func TestParallel(t *testing.T) {
	c := &controller{cfg: Config{PatchWorkers: 4}}
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf("n%02d", i))
	}
	var inFlight, most atomic.Int32
	var mu sync.Mutex
	done := map[string]int{}
	errs := c.parallel(names, func(name string) error {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(2 * time.Millisecond)
		inFlight.Add(-1)
		mu.Lock()
		done[name]++
		mu.Unlock()
		if name == "n07" || name == "n03" {
			return fmt.Errorf("boom %s", name)
		}
		return nil
	})
	if m := most.Load(); m < 2 || m > 4 {
		t.Errorf("at most %d in flight, want 2 to 4", m)
	}
	for _, n := range names {
		if done[n] != 1 {
			t.Errorf("%s ran %d times", n, done[n])
		}
	}
	if len(errs) != 2 || errs[0].Error() != "boom n03" || errs[1].Error() != "boom n07" {
		t.Errorf("errors %v, want boom n03 then boom n07", errs)
	}
}

// TestRunManyNodes: 40 new nodes, patched by parallel workers, each get a
// distinct block.
func TestRunManyNodes(t *testing.T) {
	var nodes []corev1.Node
	for i := range 40 {
		nodes = append(nodes, mkNode(fmt.Sprintf("n%02d", i), fmt.Sprintf("10.0.0.%d", i+2), ""))
	}
	sites := []v1alpha1.Site{mkSite("s", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16"))}
	cs, dyn := newFakes(t, sites, nodes)
	stop := startController(t, Config{Client: cs, Dynamic: dyn, Log: quiet, PatchWorkers: 4})
	eventually(t, "every node has a podCIDR", func() bool {
		for _, n := range nodes {
			if len(getNode(t, cs, n.Name).Spec.PodCIDRs) == 0 {
				return false
			}
		}
		return true
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		p := getNode(t, cs, n.Name).Spec.PodCIDRs[0]
		if seen[p] {
			t.Errorf("podCIDR %s given twice", p)
		}
		seen[p] = true
	}
}

// TestRunObjectStatuses: the controller writes the statuses of the other
// kinds, not only of Sites: a SitePeering between two sites becomes Ready, a
// GatewayPool counts the nodes it selects, and each records the generation it
// saw.
func TestRunObjectStatuses(t *testing.T) {
	sites := []v1alpha1.Site{
		mkSite("a", []string{"10.0.0.0/24"}, nil, assign("10.1.0.0/16")),
		mkSite("b", []string{"10.0.1.0/24"}, nil, assign("10.2.0.0/16")),
	}
	gw := labeled(mkNode("a1", "10.0.0.2", "", "10.1.1.0/24"), "a")
	gw.Labels["role"] = "gateway"
	nodes := []corev1.Node{gw, labeled(mkNode("b1", "10.0.1.2", "", "10.2.1.0/24"), "b")}
	cs, dyn := newFakes(t, sites, nodes)

	peering := v1alpha1.SitePeering{Spec: v1alpha1.SitePeeringSpec{Sites: []string{"a", "b"}}}
	peering.APIVersion, peering.Kind = v1alpha1.GroupVersion.String(), v1alpha1.KindSitePeering
	peering.Name, peering.Generation = "a-b", 3
	pool := v1alpha1.GatewayPool{Spec: v1alpha1.GatewayPoolSpec{Type: v1alpha1.GatewayPoolInternal,
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "gateway"}}}}
	pool.APIVersion, pool.Kind = v1alpha1.GroupVersion.String(), v1alpha1.KindGatewayPool
	pool.Name, pool.Generation = "gws", 2
	for _, o := range []struct {
		gvr schema.GroupVersionResource
		obj any
	}{{SitePeeringResource, &peering}, {GatewayPoolResource, &pool}} {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o.obj)
		if err != nil {
			t.Fatal(err)
		}
		if err := dyn.Tracker().Add(&unstructured.Unstructured{Object: m}); err != nil {
			t.Fatal(err)
		}
	}
	startController(t, Config{Client: cs, Dynamic: dyn, Log: quiet})

	get := func(gvr schema.GroupVersionResource, name string, into any) {
		t.Helper()
		o, err := dyn.Tracker().Get(gvr, "", name)
		if err != nil {
			t.Fatal(err)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.(*unstructured.Unstructured).Object, into); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "SitePeering a-b Ready", func() bool {
		var p v1alpha1.SitePeering
		get(SitePeeringResource, "a-b", &p)
		return meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionReady) && p.Status.ObservedGeneration == 3
	})
	eventually(t, "GatewayPool gws counts its gateway", func() bool {
		var p v1alpha1.GatewayPool
		get(GatewayPoolResource, "gws", &p)
		return p.Status.Gateways == 1 && p.Status.ObservedGeneration == 2 &&
			meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionReady)
	})
}
