package agent

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/source"
)

func kubeObj(t *testing.T, obj k8sruntime.Object) *unstructured.Unstructured {
	t.Helper()
	m, err := k8sruntime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func kubeNode(name, ip, podCIDR string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	return n
}

// TestAgentKernelKubernetes runs the agent from a Kubernetes source (client-go
// fakes): b1's podCIDR arrives late and gets its route; while the API server is
// away the maps and routes stay, resyncs included; when it returns, a node
// added meanwhile gets its route.
func TestAgentKernelKubernetes(t *testing.T) {
	e := setup(t)
	tm := metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String()}
	site := func(name, nodes, pods string) *unstructured.Unstructured {
		tm.Kind = v1alpha1.KindSite
		return kubeObj(t, &v1alpha1.Site{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.SiteSpec{
			NodeCIDRs: []v1alpha1.CIDR{v1alpha1.CIDR(nodes)}, PodCIDRAssignments: []v1alpha1.PodCIDRAssignment{{CIDRBlocks: []v1alpha1.CIDR{v1alpha1.CIDR(pods)}}}}})
	}
	tm.Kind = v1alpha1.KindSitePeering
	peering := kubeObj(t, &v1alpha1.SitePeering{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: "a-b"}, Spec: v1alpha1.SitePeeringSpec{Sites: []string{"a", "b"}}})
	client := fake.NewClientset(kubeNode("a1", "172.16.1.10", "10.10.1.0/24"), kubeNode("b1", "172.16.2.11", ""))
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(k8sruntime.NewScheme(), map[schema.GroupVersionResource]string{
		source.SitesResource: "SiteList", source.SitePeeringsResource: "SitePeeringList",
		source.GatewayPoolsResource: "GatewayPoolList", source.SiteGatewayPoolAssignmentsResource: "SiteGatewayPoolAssignmentList",
	}, site("a", "172.16.1.0/24", "10.10.0.0/16"), site("b", "172.16.2.0/24", "10.20.0.0/16"), peering)

	// The API server's availability, for nodes: lists and watches fail while
	// it is down, and going down ends the open watches.
	var down atomic.Bool
	var mu sync.Mutex
	var watches []watch.Interface
	refused := errors.New("connect: connection refused")
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		return down.Load(), nil, refused
	})
	client.PrependWatchReactor("nodes", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, refused
		}
		w, err := client.Tracker().Watch(a.GetResource(), "")
		mu.Lock()
		watches = append(watches, w)
		mu.Unlock()
		return true, w, err
	})

	ctx, cancel := context.WithCancel(context.Background())
	src, err := source.NewKubernetes(ctx, source.KubernetesConfig{Client: client, Dynamic: dyn, Debounce: 10 * time.Millisecond, Log: e.cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	eventually(t, 5*time.Second, "every informer watches", func() bool {
		watching := map[string]bool{}
		for _, a := range append(client.Actions(), dyn.Actions()...) {
			if a.GetVerb() == "watch" {
				watching[a.GetResource().Resource] = true
			}
		}
		return len(watching) == 5
	})

	e.cfg.ObjectsDir, e.cfg.Source = "", src
	e.cfg.Resync = 100 * time.Millisecond
	a, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(a.Close) // after the cleanup that stops Run
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		if err := netns.Set(e.ns); err != nil {
			runErr = err
			return
		}
		runErr = a.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	b1, b2 := netip.MustParsePrefix("10.20.1.0/24"), netip.MustParsePrefix("10.20.2.0/24")
	if _, ok := readMaps(t, e.pinDir).Routes[b1]; ok {
		t.Fatalf("route for b1 before it has a podCIDR")
	}
	// b1's podCIDR arrives.
	if _, err := client.CoreV1().Nodes().Update(ctx, kubeNode("b1", "172.16.2.11", "10.20.1.0/24"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "route and map entry for b1", func() bool {
		r, ok := readMaps(t, e.pinDir).Routes[b1]
		rs, _ := datapath.KernelRoutes{}.List()
		return ok && r.Peer == netip.MustParseAddr("172.16.2.11") && len(rs) == 1
	})
	before := readMaps(t, e.pinDir)

	// The API server goes away; b2 joins meanwhile, unseen.
	down.Store(true)
	mu.Lock()
	for _, w := range watches {
		w.Stop()
	}
	mu.Unlock()
	if err := client.Tracker().Add(kubeNode("b2", "172.16.2.12", "10.20.2.0/24")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // several resyncs
	if got := readMaps(t, e.pinDir); !got.Equal(before) {
		t.Fatalf("the maps changed while the API server was away:\n%+v\nwant\n%+v", got, before)
	}
	if rs, _ := (datapath.KernelRoutes{}).List(); len(rs) != 1 {
		t.Fatalf("the routes changed while the API server was away: %v", rs)
	}

	// It returns: the relist brings b2.
	down.Store(false)
	eventually(t, 10*time.Second, "route and map entry for b2", func() bool {
		r, ok := readMaps(t, e.pinDir).Routes[b2]
		rs, _ := datapath.KernelRoutes{}.List()
		return ok && r.Peer == netip.MustParseAddr("172.16.2.12") && len(rs) == 2
	})
	if _, ok := readMaps(t, e.pinDir).Routes[b1]; !ok {
		t.Errorf("route for b1 gone after the API server returned")
	}
	cancel()
	wg.Wait()
	if runErr != nil {
		t.Fatalf("run: %v", runErr)
	}
}
