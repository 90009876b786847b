package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
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
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// Defaults of Config.
const (
	DefaultNamespace     = "isthmus-system"
	LeaseName            = "isthmus-controller"
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	DefaultResync        = 10 * time.Minute
	DefaultPatchWorkers  = 8
	// DefaultQPS and DefaultBurst are the controller's client rate limits:
	// client-go's own (5 and 10) make 5,000 node patches take over 15 minutes.
	DefaultQPS   = 50
	DefaultBurst = 100
)

// SiteResource is the Site resource the controller reads and whose status it
// writes.
var SiteResource = schema.GroupVersionResource{Group: v1alpha1.Group, Version: v1alpha1.GroupVersion.Version, Resource: "sites"}

// Config configures Run. Client and Dynamic are required; every other zero
// field takes its default.
type Config struct {
	// Client reads and patches Nodes and holds the leader Lease.
	Client kubernetes.Interface
	// Dynamic reads Sites and updates their status subresource.
	Dynamic dynamic.Interface
	// TunnelCIDR is the IPv4 prefix tunnel addresses come from
	// (DefaultTunnelCIDR).
	TunnelCIDR netip.Prefix
	// Namespace holds the leader Lease (DefaultNamespace).
	Namespace string
	// LeaderElection makes Run wait for the Lease before acting. Without it
	// Run acts at once: for tests, or a single replica by choice.
	LeaderElection bool
	// Identity names this replica in the Lease (the hostname, which is the
	// pod name in a pod, plus a random suffix so two replicas on one host
	// differ).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election
	// (15s, 10s, 2s, as kube-controller-manager).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Resync is how often every object is looked at again even without a
	// change (DefaultResync).
	Resync time.Duration
	// PatchWorkers is how many Node patches are in flight at once
	// (DefaultPatchWorkers): bootstrapping 5,000 nodes one round trip at a
	// time takes minutes. The client's QPS and burst still bound the rate.
	PatchWorkers int
	// Log receives what the controller does (slog.Default()).
	Log *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Client == nil || c.Dynamic == nil {
		return errors.New("configure controller: Client and Dynamic are required")
	}
	if !c.TunnelCIDR.IsValid() {
		c.TunnelCIDR = DefaultTunnelCIDR
	}
	if !c.TunnelCIDR.Addr().Is4() || c.TunnelCIDR.Bits() > 30 {
		return fmt.Errorf("configure controller: tunnel CIDR %s: want an IPv4 prefix of /30 or larger", c.TunnelCIDR)
	}
	c.TunnelCIDR = c.TunnelCIDR.Masked()
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("configure controller: hostname for the leader identity: %w", err)
		}
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.Identity = host + "_" + hex.EncodeToString(b)
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = DefaultRenewDeadline
	}
	if c.RetryPeriod == 0 {
		c.RetryPeriod = DefaultRetryPeriod
	}
	if c.Resync == 0 {
		c.Resync = DefaultResync
	}
	if c.PatchWorkers <= 0 {
		c.PatchWorkers = DefaultPatchWorkers
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// Run runs the controller until ctx is done, and returns nil then. With
// LeaderElection it first waits to hold the Lease isthmus-controller in
// Namespace, acts only while it does, and returns an error when it loses it
// (the caller should exit, as every Kubernetes controller does, so the new
// leader alone acts); on ctx's end it releases the Lease so a standby takes
// over at once.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	log := cfg.Log.With("identity", cfg.Identity)
	if !cfg.LeaderElection {
		return newController(cfg, log).run(ctx)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: cfg.Namespace},
		Client:     cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	done := make(chan error, 1)
	var started atomic.Bool
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            LeaseName,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				started.Store(true)
				log.Info("leading", "lease", cfg.Namespace+"/"+LeaseName)
				done <- newController(cfg, log).run(lctx)
			},
			OnStoppedLeading: func() { log.Info("stopped leading") },
			OnNewLeader:      func(id string) { log.Info("leader", "holder", id) },
		},
	})
	if err != nil {
		return fmt.Errorf("configure leader election: %w", err)
	}
	le.Run(ctx)
	// le.Run starts OnStartedLeading in a goroutine and cancels its context
	// on return; wait for it, so nothing is patched after Run returns. (Were
	// the goroutine scheduled only now, it finds its context done and
	// returns at once.)
	if started.Load() {
		if err := <-done; err != nil && ctx.Err() == nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("run controller: lost the lease %s/%s", cfg.Namespace, LeaseName)
}

// key is the one work-queue item: every decision depends on every Node and
// Site (a block one node takes another cannot), so the controller decides
// for the whole cluster at once, and the queue merges bursts of events into
// one pass.
const key = "cluster"

type controller struct {
	cfg   Config
	log   *slog.Logger
	nodes listersv1.NodeLister
	sites cache.GenericLister
	queue workqueue.TypedRateLimitingInterface[string]

	// assumed holds what the API server returned for our own writes until
	// the informers show them: deciding from a cache that misses a podCIDR
	// just set could hand the same block to a second node.
	assumedNodes map[string]assumed[*corev1.Node]
	assumedSites map[string]assumed[*unstructured.Unstructured]
	assumedMu    sync.Mutex // guards assumedNodes while patches run in parallel
	// others are the listers of GatewayPools, SitePeerings and
	// SiteGatewayPoolAssignments by kind; assumedObjects their status writes,
	// by kind and name, as assumedSites.
	others         map[string]cache.GenericLister
	assumedObjects map[string]map[string]assumed[*unstructured.Unstructured]
}

type assumed[T metav1.Object] struct {
	obj T
	at  time.Time
}

// assumeFor is how long a written object stands in for the cache's at most,
// in case the informer never delivers that exact version (a relist after a
// long disconnect shows only the newest).
const assumeFor = time.Minute

func newController(cfg Config, log *slog.Logger) *controller {
	return &controller{
		cfg: cfg,
		log: log,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "isthmus-controller"}),
		assumedNodes: make(map[string]assumed[*corev1.Node]),
		assumedSites: make(map[string]assumed[*unstructured.Unstructured]),
		assumedObjects: map[string]map[string]assumed[*unstructured.Unstructured]{
			v1alpha1.KindGatewayPool: {}, v1alpha1.KindSitePeering: {}, v1alpha1.KindSiteGatewayPoolAssignment: {},
		},
	}
}

func (c *controller) run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if ctx.Err() != nil {
		return nil
	}
	nf := informers.NewSharedInformerFactory(c.cfg.Client, c.cfg.Resync)
	sf := dynamicinformer.NewDynamicSharedInformerFactory(c.cfg.Dynamic, c.cfg.Resync)
	nodeInf := nf.Core().V1().Nodes()
	siteInf := sf.ForResource(SiteResource)
	c.nodes, c.sites = nodeInf.Lister(), siteInf.Lister()

	enqueue := func(any) { c.queue.Add(key) }
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		DeleteFunc: enqueue,
		UpdateFunc: func(o, n any) {
			// Kubelets update their Node's status every few minutes; only
			// what the decisions read is worth a pass. A resync redelivers
			// the same version, and is let through on purpose.
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || on.ResourceVersion == nn.ResourceVersion || nodeRelevantChange(on, nn) {
				c.queue.Add(key)
			}
		},
	}); err != nil {
		return fmt.Errorf("watch nodes: %w", err)
	}
	synced := []cache.InformerSynced{nodeInf.Informer().HasSynced}
	c.others = map[string]cache.GenericLister{}
	for kind, gvr := range map[string]schema.GroupVersionResource{v1alpha1.KindSite: SiteResource,
		v1alpha1.KindGatewayPool: GatewayPoolResource, v1alpha1.KindSitePeering: SitePeeringResource,
		v1alpha1.KindSiteGatewayPoolAssignment: AssignmentResource} {
		inf := sf.ForResource(gvr)
		if kind != v1alpha1.KindSite {
			c.others[kind] = inf.Lister()
		}
		if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: enqueue, DeleteFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) },
		}); err != nil {
			return fmt.Errorf("watch %s: %w", gvr.Resource, err)
		}
		synced = append(synced, inf.Informer().HasSynced)
	}
	nf.Start(ctx.Done())
	sf.Start(ctx.Done())
	defer nf.Shutdown()
	defer sf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended first
	}
	c.log.Info("caches synced; reconciling")
	c.queue.Add(key)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for c.processNext(ctx) {
	}
	return nil
}

func nodeRelevantChange(o, n *corev1.Node) bool {
	return o.Labels[LabelSite] != n.Labels[LabelSite] ||
		o.Annotations[v1alpha1.AnnotationTunnelIPv4] != n.Annotations[v1alpha1.AnnotationTunnelIPv4] ||
		o.Spec.PodCIDR != n.Spec.PodCIDR || !slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs) ||
		!slices.Equal(o.Status.Addresses, n.Status.Addresses)
}

func (c *controller) processNext(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	if err := c.reconcile(ctx); err != nil {
		if ctx.Err() != nil {
			return false
		}
		c.log.Error("reconcile", "err", err)
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

// reconcile decides from the caches (with our own writes laid over them)
// and applies the Decision: podCIDRs first, since the tunnel decisions
// assumed they land; then labels and annotations; then Site statuses.
func (c *controller) reconcile(ctx context.Context) error {
	in, raw, err := c.observe()
	if err != nil {
		return err
	}
	rawObjects, err := c.observeOthers(&in)
	if err != nil {
		return err
	}
	d := Decide(in)
	if d.Empty() {
		return nil
	}
	errs := c.parallel(sortedKeys(d.PodCIDRs), func(name string) error {
		ps := d.PodCIDRs[name]
		s := make([]string, len(ps))
		for i, p := range ps {
			s[i] = p.String()
		}
		patch := map[string]any{"spec": map[string]any{"podCIDR": s[0], "podCIDRs": s}}
		if err := c.patchNode(ctx, name, patch); err != nil {
			return fmt.Errorf("assign podCIDRs %v to node %s: %w", s, name, err)
		}
		c.log.Info("assigned podCIDRs", "node", name, "podCIDRs", s)
		return nil
	})
	meta := make(map[string]map[string]any)
	for name, v := range d.Labels {
		var val any = v
		if v == "" {
			val = nil // null deletes the key in a merge patch
		}
		metaOf(meta, name)["labels"] = map[string]any{LabelSite: val}
	}
	for name, a := range d.TunnelAddrs {
		metaOf(meta, name)["annotations"] = map[string]any{v1alpha1.AnnotationTunnelIPv4: a.String()}
	}
	errs = append(errs, c.parallel(sortedKeys(meta), func(name string) error {
		if err := c.patchNode(ctx, name, map[string]any{"metadata": meta[name]}); err != nil {
			return fmt.Errorf("label node %s: %w", name, err)
		}
		c.log.Info("labeled node", "node", name, "site", d.Labels[name], "tunnelAddress", d.TunnelAddrs[name])
		return nil
	})...)
	for _, name := range sortedKeys(d.Statuses) {
		if err := c.updateSiteStatus(ctx, raw[name], d.Statuses[name]); err != nil {
			errs = append(errs, fmt.Errorf("update status of site %s: %w", name, err))
			continue
		}
		if err := c.invalidEvent(ctx, raw[name], d.Statuses[name]); err != nil {
			errs = append(errs, fmt.Errorf("record event for site %s: %w", name, err))
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(d.ObjectStatuses), func(a, b ObjectKey) int {
		return cmpString(a.Kind+"/"+a.Name, b.Kind+"/"+b.Name)
	}) {
		if err := c.updateObjectStatus(ctx, k, rawObjects[k], d.ObjectStatuses[k]); err != nil {
			errs = append(errs, fmt.Errorf("update status of %s %s: %w", k.Kind, k.Name, err))
		}
	}
	for _, e := range d.Exhausted {
		c.log.Warn("pool exhausted", "site", e.Site, "node", e.Node, "missing", e.Missing)
	}
	return errors.Join(errs...)
}

// parallel runs f for each name with up to PatchWorkers at once and returns
// the errors in the order of names.
func (c *controller) parallel(names []string, f func(name string) error) []error {
	errs := make([]error, len(names))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(c.cfg.PatchWorkers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				errs[i] = f(names[i])
			}
		}()
	}
	for i := range names {
		work <- i
	}
	close(work)
	wg.Wait()
	return slices.DeleteFunc(errs, func(err error) bool { return err == nil })
}

func metaOf(m map[string]map[string]any, name string) map[string]any {
	if m[name] == nil {
		m[name] = make(map[string]any)
	}
	return m[name]
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (c *controller) patchNode(ctx context.Context, name string, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encode patch: %w", err)
	}
	n, err := c.cfg.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		return err
	}
	c.assumedMu.Lock() // patches run in parallel
	c.assumedNodes[name] = assumed[*corev1.Node]{n, time.Now()}
	c.assumedMu.Unlock()
	return nil
}

func (c *controller) updateSiteStatus(ctx context.Context, cur *unstructured.Unstructured, st v1alpha1.SiteStatus) error {
	m, err := statusMap(st)
	if err != nil {
		return err
	}
	obj := cur.DeepCopy()
	obj.Object["status"] = m
	out, err := c.cfg.Dynamic.Resource(SiteResource).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	c.assumedSites[out.GetName()] = assumed[*unstructured.Unstructured]{out, time.Now()}
	return nil
}

// EventNamespace holds the Events about Sites: Sites are cluster-scoped, and
// kubectl describe looks for their Events in "default".
const EventNamespace = metav1.NamespaceDefault

// invalidEvent records a Warning Event on the Site when its new status makes
// it Invalid with a message it did not have before: objects set aside show in
// `kubectl describe site` and `kubectl get events`, once per change.
func (c *controller) invalidEvent(ctx context.Context, cur *unstructured.Unstructured, st v1alpha1.SiteStatus) error {
	now := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionInvalid)
	if now == nil || now.Status != metav1.ConditionTrue {
		return nil
	}
	var old v1alpha1.SiteStatus
	if m, ok := cur.Object["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(m, &old)
	}
	if was := meta.FindStatusCondition(old.Conditions, v1alpha1.ConditionInvalid); was != nil &&
		was.Status == metav1.ConditionTrue && was.Message == now.Message {
		return nil
	}
	t := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: cur.GetName() + ".", Namespace: EventNamespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindSite,
			Name: cur.GetName(), UID: cur.GetUID(), ResourceVersion: cur.GetResourceVersion()},
		Reason: v1alpha1.ReasonInvalid, Message: "objects set aside: " + now.Message, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "isthmus-controller"},
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
	}
	_, err := c.cfg.Client.CoreV1().Events(EventNamespace).Create(ctx, ev, metav1.CreateOptions{})
	return err
}

// statusMap encodes a status struct, given by value, for an unstructured
// object (the converter takes only pointers).
func statusMap(st any) (map[string]any, error) {
	v := reflect.ValueOf(st)
	if v.Kind() != reflect.Pointer {
		p := reflect.New(v.Type())
		p.Elem().Set(v)
		v = p
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v.Interface())
	if err != nil {
		return nil, fmt.Errorf("encode status: %w", err)
	}
	return m, nil
}

// updateObjectStatus writes st as the status of the object cur.
func (c *controller) updateObjectStatus(ctx context.Context, k ObjectKey, cur *unstructured.Unstructured, st any) error {
	if cur == nil {
		return nil // gone meanwhile
	}
	m, err := statusMap(st)
	if err != nil {
		return err
	}
	obj := cur.DeepCopy()
	obj.Object["status"] = m
	out, err := c.cfg.Dynamic.Resource(objectStatusResource[k.Kind]).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	c.assumedObjects[k.Kind][out.GetName()] = assumed[*unstructured.Unstructured]{out, time.Now()}
	return nil
}

// observeOthers lists GatewayPools, SitePeerings and
// SiteGatewayPoolAssignments into in, each replaced by our own newer status
// write where the cache lags, and returns the objects their status updates
// start from.
func (c *controller) observeOthers(in *Input) (map[ObjectKey]*unstructured.Unstructured, error) {
	raw := make(map[ObjectKey]*unstructured.Unstructured)
	for _, kind := range []string{v1alpha1.KindGatewayPool, v1alpha1.KindSitePeering, v1alpha1.KindSiteGatewayPoolAssignment} {
		lister, ok := c.others[kind]
		if !ok {
			continue // not watched (a controller built by hand in a test)
		}
		objs, err := lister.List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", kind, err)
		}
		seen := make(map[string]bool)
		for _, o := range objs {
			u, ok := o.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			seen[u.GetName()] = true
			u = newer(c.assumedObjects[kind], u, sameStatus)
			var err error
			switch kind {
			case v1alpha1.KindGatewayPool:
				err = appendConverted(u, &in.GatewayPools)
			case v1alpha1.KindSitePeering:
				err = appendConverted(u, &in.SitePeerings)
			default:
				err = appendConverted(u, &in.Assignments)
			}
			if err != nil {
				c.log.Error("decode object", "kind", kind, "name", u.GetName(), "err", err)
				continue
			}
			raw[ObjectKey{kind, u.GetName()}] = u
		}
		prune(c.assumedObjects[kind], seen)
	}
	return raw, nil
}

func appendConverted[T any](u *unstructured.Unstructured, out *[]T) error {
	var t T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t); err != nil {
		return err
	}
	*out = append(*out, t)
	return nil
}

// observe lists Nodes and Sites from the caches, each replaced by our own
// newer write where the cache has not caught up, and converts the Sites.
// raw maps a Site's name to the object its status update starts from.
func (c *controller) observe() (Input, map[string]*unstructured.Unstructured, error) {
	in := Input{TunnelCIDR: c.cfg.TunnelCIDR, Now: metav1.Now()}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return in, nil, fmt.Errorf("list nodes: %w", err)
	}
	seen := make(map[string]bool)
	for _, n := range nodes {
		seen[n.Name] = true
		in.Nodes = append(in.Nodes, *newer(c.assumedNodes, n, sameNode))
	}
	prune(c.assumedNodes, seen)

	objs, err := c.sites.List(labels.Everything())
	if err != nil {
		return in, nil, fmt.Errorf("list sites: %w", err)
	}
	raw := make(map[string]*unstructured.Unstructured)
	seen = make(map[string]bool)
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		seen[u.GetName()] = true
		u = newer(c.assumedSites, u, sameStatus)
		var s v1alpha1.Site
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
			// The CRD's schema makes this rare; one bad Site must not stop
			// the others.
			c.log.Error("decode site", "site", u.GetName(), "err", err)
			continue
		}
		raw[s.Name] = u
		in.Sites = append(in.Sites, s)
	}
	prune(c.assumedSites, seen)
	slices.SortFunc(in.Sites, func(a, b v1alpha1.Site) int { return cmpString(a.Name, b.Name) })
	slices.SortFunc(in.Nodes, func(a, b corev1.Node) int { return cmpString(a.Name, b.Name) })
	return in, raw, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// newer returns our own write of the object while the cache still holds an
// older version of it, else the cached object (and forgets the write).
func newer[T metav1.Object](m map[string]assumed[T], cached T, same func(cached, written T) bool) T {
	a, ok := m[cached.GetName()]
	if !ok {
		return cached
	}
	if a.obj.GetUID() != cached.GetUID() || time.Since(a.at) > assumeFor || caughtUp(cached, a.obj, same) {
		delete(m, cached.GetName())
		return cached
	}
	return a.obj
}

// caughtUp reports whether the cached object is at least as new as the
// written one. Resource versions are opaque, but API servers issue
// increasing integers, so those compare; where they do not parse (client-go's
// fakes leave them empty), the cache has caught up once it shows what we
// wrote.
func caughtUp[T metav1.Object](cached, written T, same func(cached, written T) bool) bool {
	x, err1 := strconv.ParseUint(cached.GetResourceVersion(), 10, 64)
	y, err2 := strconv.ParseUint(written.GetResourceVersion(), 10, 64)
	if err1 == nil && err2 == nil {
		return x >= y
	}
	return same(cached, written)
}

// sameNode reports whether two versions of a Node agree on everything the
// controller writes.
func sameNode(a, b *corev1.Node) bool {
	return !nodeRelevantChange(a, b)
}

// sameStatus reports whether two versions of a Site have the same status.
func sameStatus(a, b *unstructured.Unstructured) bool {
	return equality.Semantic.DeepEqual(a.Object["status"], b.Object["status"])
}

func prune[T any](m map[string]T, seen map[string]bool) {
	for k := range m {
		if !seen[k] {
			delete(m, k)
		}
	}
}
