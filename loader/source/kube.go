package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// The resources of the isthmus kinds.
var (
	SitesResource                      = v1alpha1.GroupVersion.WithResource("sites")
	SitePeeringsResource               = v1alpha1.GroupVersion.WithResource("sitepeerings")
	GatewayPoolsResource               = v1alpha1.GroupVersion.WithResource("gatewaypools")
	SiteGatewayPoolAssignmentsResource = v1alpha1.GroupVersion.WithResource("sitegatewaypoolassignments")
)

// DefaultResync is the informers' resync period: every cached object is
// handed to the event handlers again, so Changed fires at least this often.
const DefaultResync = 5 * time.Minute

// RESTConfig returns the client configuration from the kubeconfig file at
// path, or the in-cluster configuration (service account, KUBERNETES_SERVICE_HOST)
// when path is empty. Built-in objects (Nodes) travel as protobuf, which
// costs a fraction of JSON to decode: with 5,000 Nodes heartbeating every
// 10 s the agent receives 500 a second (docs/benchmarks.md). The dynamic
// client, for the isthmus resources, sets JSON for itself.
func RESTConfig(path string) (*rest.Config, error) {
	var c *rest.Config
	var err error
	if path == "" {
		if c, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("load in-cluster config: %w", err)
		}
	} else if c, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", path, err)
	}
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return c, nil
}

// KubernetesConfig configures a Kubernetes source.
type KubernetesConfig struct {
	// Client reads Nodes; Dynamic reads the isthmus resources.
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Resync is the informers' resync period (0: DefaultResync).
	Resync time.Duration
	// Debounce is the quiet time a burst of events must leave before Changed
	// fires (0: DefaultDebounce); a lone event fires Settle after it.
	Debounce time.Duration
	// Log (nil: slog.Default) gets conversion problems and watch errors.
	Log *slog.Logger
	// Rules are checked on every Snapshot besides the objects' own rules.
	Rules objects.Rules
}

// Kubernetes is the source of Kubernetes mode: client-go informers on Nodes
// and the four isthmus resources. Snapshot reads the informers' caches, so
// when the API server goes away it keeps returning the last objects seen;
// the reflectors relist when it returns, and Changed fires for what differs.
// Nothing here clears a cache on an error.
type Kubernetes struct {
	log *slog.Logger
	// validator keeps what it found in unchanged Nodes from one Snapshot
	// to the next.
	validator *objects.Validator
	n         *notifier
	synced    atomic.Bool
	cancel    context.CancelFunc
	factory   informers.SharedInformerFactory
	dynamic   dynamicinformer.DynamicSharedInformerFactory
	nodes     cache.SharedIndexInformer
	isthmus   map[schema.GroupVersionResource]cache.SharedIndexInformer
}

// NewKubernetes starts the informers and waits until their caches hold a full
// list, or ctx is done (an API server that is not there yet keeps it
// waiting; the caller's datapath stays as it is meanwhile).
func NewKubernetes(ctx context.Context, cfg KubernetesConfig) (*Kubernetes, error) {
	if cfg.Client == nil || cfg.Dynamic == nil {
		return nil, errors.New("start kubernetes source: a client and a dynamic client are required")
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	k := &Kubernetes{
		log:       cfg.Log,
		validator: objects.NewValidator(cfg.Rules),
		n:         newNotifier(cfg.Debounce),
		factory:   informers.NewSharedInformerFactory(cfg.Client, cfg.Resync),
		dynamic:   dynamicinformer.NewDynamicSharedInformerFactory(cfg.Dynamic, cfg.Resync),
		isthmus:   make(map[schema.GroupVersionResource]cache.SharedIndexInformer),
	}
	k.nodes = k.factory.Core().V1().Nodes().Informer()
	// Keep what the plan reads; drop what only costs memory.
	if err := k.nodes.SetTransform(trimNode); err != nil {
		return nil, fmt.Errorf("start kubernetes source: %w", err)
	}
	if _, err := k.nodes.AddEventHandler(k.handler(k.nodeChanged)); err != nil {
		return nil, fmt.Errorf("start kubernetes source: %w", err)
	}
	for _, gvr := range []schema.GroupVersionResource{SitesResource, SitePeeringsResource, GatewayPoolsResource, SiteGatewayPoolAssignmentsResource} {
		inf := k.dynamic.ForResource(gvr).Informer()
		if err := inf.SetTransform(trimManagedFields); err != nil {
			return nil, fmt.Errorf("start kubernetes source: %w", err)
		}
		if _, err := inf.AddEventHandler(k.handler(objectChanged)); err != nil {
			return nil, fmt.Errorf("start kubernetes source: %w", err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(k.watchError(gvr.Resource)); err != nil {
			return nil, fmt.Errorf("start kubernetes source: %w", err)
		}
		k.isthmus[gvr] = inf
	}
	if err := k.nodes.SetWatchErrorHandlerWithContext(k.watchError("nodes")); err != nil {
		return nil, fmt.Errorf("start kubernetes source: %w", err)
	}

	run, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	k.factory.Start(run.Done())
	k.dynamic.Start(run.Done())
	syncs := []cache.InformerSynced{k.nodes.HasSynced}
	for _, inf := range k.isthmus {
		syncs = append(syncs, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		k.Close()
		return nil, fmt.Errorf("sync kubernetes caches: %w", context.Cause(ctx))
	}
	k.synced.Store(true)
	return k, nil
}

// watchError logs a failed list or watch; the reflector retries with backoff
// and keeps its cache meanwhile.
func (k *Kubernetes) watchError(what string) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() == nil {
			k.log.Warn("watch kubernetes objects; retrying, the last objects stay in use", "resource", what, "err", err)
		}
	}
}

// handler pokes the notifier for every add and delete after the caches
// synced, and for updates that changed reports as relevant.
func (k *Kubernetes) handler(changed func(old, new any) bool) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) {
			if k.synced.Load() {
				k.n.poke()
			}
		},
		UpdateFunc: func(old, new any) {
			if k.synced.Load() && changed(old, new) {
				k.n.poke()
			}
		},
		DeleteFunc: func(any) {
			if k.synced.Load() {
				k.n.poke()
			}
		},
	}
}

// nodeChanged reports whether an update changed what objects and the plan
// read of a Node: its annotations of v1alpha1.NodeAnnotations (the tunnel
// address, the WireGuard public key), a label some GatewayPool's selector
// reads, podCIDRs and addresses. Kubelet status heartbeats, other
// annotations and other labels change none of these: at 5,000 Nodes they
// would otherwise wake every agent many times a second.
func (k *Kubernetes) nodeChanged(old, new any) bool {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := new.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	for _, a := range v1alpha1.NodeAnnotations {
		if o.Annotations[a] != n.Annotations[a] {
			return true
		}
	}
	if o.Spec.PodCIDR != n.Spec.PodCIDR || !slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs) ||
		!equality.Semantic.DeepEqual(o.Status.Addresses, n.Status.Addresses) {
		return true
	}
	if maps.Equal(o.Labels, n.Labels) {
		return false
	}
	keys := k.selectorKeys()
	for key := range keys {
		if o.Labels[key] != n.Labels[key] {
			return true
		}
		_, had := o.Labels[key]
		if _, has := n.Labels[key]; had != has {
			return true
		}
	}
	return false
}

// selectorKeys returns the label keys the GatewayPools' nodeSelectors read,
// from the pool cache (a handful of pools: cheap to walk per event).
func (k *Kubernetes) selectorKeys() map[string]bool {
	keys := make(map[string]bool)
	inf, ok := k.isthmus[GatewayPoolsResource]
	if !ok {
		return keys
	}
	for _, obj := range inf.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		ml, _, _ := unstructured.NestedStringMap(u.Object, "spec", "nodeSelector", "matchLabels")
		for key := range ml {
			keys[key] = true
		}
		exprs, _, _ := unstructured.NestedSlice(u.Object, "spec", "nodeSelector", "matchExpressions")
		for _, e := range exprs {
			if m, ok := e.(map[string]any); ok {
				if key, ok := m["key"].(string); ok {
					keys[key] = true
				}
			}
		}
	}
	return keys
}

// objectChanged reports whether an update changed an isthmus object's spec,
// labels or annotations: a resync hands the same object again, and the
// controller's status writes change nothing the plan reads.
func objectChanged(old, new any) bool {
	o, ok1 := old.(*unstructured.Unstructured)
	n, ok2 := new.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return true
	}
	return !equality.Semantic.DeepEqual(o.Object["spec"], n.Object["spec"]) ||
		!maps.Equal(o.GetLabels(), n.GetLabels()) || !maps.Equal(o.GetAnnotations(), n.GetAnnotations())
}

// trimNode keeps the fields of a Node the plan reads, and the metadata.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields = nil
	n.Status = corev1.NodeStatus{Addresses: n.Status.Addresses}
	return n, nil
}

func trimManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// Snapshot lists Nodes and the isthmus objects from the caches, leaves out
// Nodes that belong to no Site (warnings, see objects.WithoutUnsitedNodes)
// and validates the rest with objects.ValidateSettingAside (through a
// Validator, which parses again only the Nodes changed since the last
// Snapshot): an invalid object is set aside in the Set's Rejected, never an
// error. An object the cache holds in a form that does not convert to its
// type fails the snapshot, naming it.
func (k *Kubernetes) Snapshot() (*objects.Set, []objects.Warning, error) {
	var in objects.Objects
	var errs []error
	nodes, err := k.factory.Core().V1().Nodes().Lister().List(labels.Everything())
	if err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	// Preallocated: a Node value is large, and growing a slice of 5,000
	// copies them over and over.
	in.Nodes = make([]corev1.Node, 0, len(nodes))
	for _, n := range nodes {
		in.Nodes = append(in.Nodes, *n)
	}
	errs = append(errs, convertAll(k.isthmus[SitesResource], v1alpha1.KindSite, &in.Sites)...)
	errs = append(errs, convertAll(k.isthmus[SitePeeringsResource], v1alpha1.KindSitePeering, &in.SitePeerings)...)
	errs = append(errs, convertAll(k.isthmus[GatewayPoolsResource], v1alpha1.KindGatewayPool, &in.GatewayPools)...)
	errs = append(errs, convertAll(k.isthmus[SiteGatewayPoolAssignmentsResource], v1alpha1.KindSiteGatewayPoolAssignment, &in.SiteGatewayPoolAssignments)...)
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	in, warns := in.WithoutUnsitedNodes()
	set, more := k.validator.ValidateSettingAside(in)
	return set, append(warns, more...), nil
}

// convertAll converts every object in inf's cache to T, appending to out.
func convertAll[T any](inf cache.SharedIndexInformer, kind string, out *[]T) []error {
	var errs []error
	for _, obj := range inf.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			errs = append(errs, fmt.Errorf("convert %s: unexpected %T in the cache", kind, obj))
			continue
		}
		var t T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t); err != nil {
			errs = append(errs, fmt.Errorf("convert %s %q: %w", kind, u.GetName(), err))
			continue
		}
		*out = append(*out, t)
	}
	return errs
}

// Generation counts the relevant changes the informers delivered (see
// Generations).
func (k *Kubernetes) Generation() uint64 { return k.n.gen.Load() }

// TakeSince returns when the oldest relevant informer event not yet taken
// arrived (see ChangeTimes).
func (k *Kubernetes) TakeSince() time.Time { return k.n.takeSince() }

// Changed fires after an object was added, changed or deleted.
func (k *Kubernetes) Changed() <-chan struct{} { return k.n.ch }

// Close stops the informers.
func (k *Kubernetes) Close() error {
	k.cancel()
	k.n.stop()
	k.factory.Shutdown()
	k.dynamic.Shutdown()
	return nil
}

// NodeAnnotationPublisher returns a function that sets annotation key of Node node
// to a value with a JSON merge patch: the one write the agent makes to the API
// server (its WireGuard public key), on its own Node, touching nothing else.
func NodeAnnotationPublisher(client kubernetes.Interface, node, key string) func(ctx context.Context, value string) error {
	return func(ctx context.Context, value string) error {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
		if err != nil {
			return err
		}
		if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("annotate Node %q with %s: %w", node, key, err)
		}
		return nil
	}
}
