package cpbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/agent"
	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/metrics"
	"github.com/isthmus-dev/isthmus/loader/source"
)

// EventToMapsShapes are the fleets whose event to maps `isthmus-lab bench
// --control-plane` measures through a running agent: 5,000 nodes, mesh and hub.
var EventToMapsShapes = []fleet.Shape{
	{Sites: 50, NodesPerSite: 100, Topology: fleet.Mesh},
	{Sites: 50, NodesPerSite: 100, Topology: fleet.Hub},
}

// EventToMapsRounds is how often MeasureEventToMaps goes through its changes.
const EventToMapsRounds = 5

// The agent's metrics MeasureEventToMaps reads.
const (
	metricEventToMaps = "isthmus_event_to_maps_seconds"
	metricWritten     = "isthmus_sync_entries_written_total"
	metricSyncs       = "isthmus_syncs_total"
)

// Sample is one change as a running agent applied it.
type Sample struct {
	Change string
	// EventToMaps is the agent's own figure (isthmus_event_to_maps_seconds):
	// from the informer event of the change reaching the agent's source to
	// the last map write of the sync that applied it.
	EventToMaps time.Duration
	// Wall bounds it from outside: from just before the API write (the
	// client call) until the agent's metric showed the observation.
	Wall time.Duration
	// Writes are the map entries the agent wrote for the change
	// (isthmus_sync_entries_written_total).
	Writes int
}

// Latency is event to maps of one fleet seen from one node, measured
// through a running agent.
type Latency struct {
	Shape   fleet.Shape
	Node    string
	Gateway bool
	Samples []Sample
	// Min, Median and Max are over the samples' EventToMaps.
	Min, Median, Max time.Duration
}

// MeasureEventToMaps runs the agent (agent.Start and Agent.Run, as the
// DaemonSet does) for a member of site 1 of sh and, in a hub, for a gateway
// of site 1, each in a network namespace of its own with its real BPF maps
// and routes, fed by the Kubernetes source (source.NewKubernetes: informers,
// the event filter, the debounce) over client-go fakes that hold the fleet.
// It then makes one-Node changes in a remote site through the fake API, one
// at a time with a quiet time between them (each a lone change, as the
// debounce treats it), rounds times, and reads each change's
// isthmus_event_to_maps_seconds from the agent's metrics. It needs root and
// bpffs. The agent logs its errors to log (nil: nowhere); its warnings are
// left out: a generated fleet's nodeCidrs hold peer endpoints, which draws
// a plan warning per endpoint.
func MeasureEventToMaps(ctx context.Context, sh fleet.Shape, rounds int, log io.Writer) ([]Latency, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("measure event to maps: needs root (the agent loads its BPF maps in a network namespace of its own)")
	}
	if err := datapath.CheckBPFFS("/sys/fs/bpf"); err != nil {
		return nil, fmt.Errorf("measure event to maps: %w (mount -t bpf bpf /sys/fs/bpf)", err)
	}
	if log == nil {
		log = io.Discard
	}
	// Node indexes in site 1: a member, and a gateway in a hub.
	nodes := []int{fleet.GatewaysPerSite}
	if sh.Topology == fleet.Hub {
		nodes = append(nodes, 0)
	}
	var out []Latency
	for _, n := range nodes {
		l, err := measureEventToMaps(ctx, sh, n, rounds, log)
		if err != nil {
			return nil, fmt.Errorf("measure event to maps, %s %dx%d, %s: %w", sh.Topology, sh.Sites, sh.NodesPerSite, fleet.NodeName(1, n), err)
		}
		out = append(out, l)
	}
	return out, nil
}

// change is one API write of the changes MeasureEventToMaps makes.
type change struct {
	name string
	do   func(ctx context.Context) error
}

// fakeAPI is the fleet in client-go fakes, and the changes made through
// them. Every write gives the Node a new resourceVersion, as the API server
// does (the fakes keep the one they are handed), so the source's Validator
// parses it again.
type fakeAPI struct {
	client  *fake.Clientset
	dynamic *dynamicfake.FakeDynamicClient
	version int
}

func newFakeAPI(sh fleet.Shape) (*fakeAPI, error) {
	in, err := fleet.Objects(sh)
	if err != nil {
		return nil, err
	}
	nodes := make([]k8sruntime.Object, 0, len(in.Nodes))
	for i := range in.Nodes {
		nodes = append(nodes, &in.Nodes[i])
	}
	var isthmus []k8sruntime.Object
	add := func(kind string, obj any) error {
		m, err := k8sruntime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return fmt.Errorf("convert %s: %w", kind, err)
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion(v1alpha1.GroupVersion.String())
		u.SetKind(kind)
		isthmus = append(isthmus, u)
		return nil
	}
	for i := range in.Sites {
		if err := add(v1alpha1.KindSite, &in.Sites[i]); err != nil {
			return nil, err
		}
	}
	for i := range in.SitePeerings {
		if err := add(v1alpha1.KindSitePeering, &in.SitePeerings[i]); err != nil {
			return nil, err
		}
	}
	for i := range in.GatewayPools {
		if err := add(v1alpha1.KindGatewayPool, &in.GatewayPools[i]); err != nil {
			return nil, err
		}
	}
	for i := range in.SiteGatewayPoolAssignments {
		if err := add(v1alpha1.KindSiteGatewayPoolAssignment, &in.SiteGatewayPoolAssignments[i]); err != nil {
			return nil, err
		}
	}
	return &fakeAPI{
		client: fake.NewClientset(nodes...),
		dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(k8sruntime.NewScheme(), map[schema.GroupVersionResource]string{
			source.SitesResource: "SiteList", source.SitePeeringsResource: "SitePeeringList",
			source.GatewayPoolsResource: "GatewayPoolList", source.SiteGatewayPoolAssignmentsResource: "SiteGatewayPoolAssignmentList",
		}, isthmus...),
		version: 1,
	}, nil
}

// watching reports whether all five informers watch: the fakes deliver only
// the writes made after a watch began.
func (f *fakeAPI) watching() bool {
	seen := map[string]bool{}
	for _, a := range slices.Concat(f.client.Actions(), f.dynamic.Actions()) {
		if a.GetVerb() == "watch" {
			seen[a.GetResource().Resource] = true
		}
	}
	return len(seen) == 5
}

func (f *fakeAPI) nextVersion() string {
	f.version++
	return strconv.Itoa(f.version)
}

// editNode writes the Node name changed by edit.
func (f *fakeAPI) editNode(ctx context.Context, name string, edit func(*corev1.Node)) error {
	n, err := f.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	n = n.DeepCopy()
	edit(n)
	n.ResourceVersion = f.nextVersion()
	_, err = f.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	return err
}

// changes returns one round of changes in site 7 (a remote site of site 1's
// nodes), which leaves the fleet as it found it: add a Node, change its
// podCIDR, remove it; in a hub also label a member so its site's pool
// selects it, and take the label away. (In a mesh no selector reads the
// label: the source drops such an update, as it should, and nothing syncs.)
func (f *fakeAPI) changes(sh fleet.Shape) []change {
	remote := 7 % sh.Sites
	added := fleet.NodeName(remote, sh.NodesPerSite)
	member := fleet.NodeName(remote, fleet.GatewaysPerSite)
	cs := []change{
		{"add a Node", func(ctx context.Context) error {
			n := fleet.Node(sh, remote, sh.NodesPerSite)
			n.ResourceVersion = f.nextVersion()
			_, err := f.client.CoreV1().Nodes().Create(ctx, &n, metav1.CreateOptions{})
			return err
		}},
		{"change a podCIDR", func(ctx context.Context) error {
			return f.editNode(ctx, added, func(n *corev1.Node) {
				pod := fleet.PodCIDR(remote, 250).String()
				n.Spec.PodCIDR, n.Spec.PodCIDRs = pod, []string{pod}
			})
		}},
		{"remove a Node", func(ctx context.Context) error {
			return f.client.CoreV1().Nodes().Delete(ctx, added, metav1.DeleteOptions{})
		}},
	}
	if sh.Topology == fleet.Hub {
		cs = append(cs,
			change{"label a gateway", func(ctx context.Context) error {
				return f.editNode(ctx, member, func(n *corev1.Node) { n.Labels[fleet.LabelGateway] = fleet.SiteName(remote) })
			}},
			change{"unlabel a gateway", func(ctx context.Context) error {
				return f.editNode(ctx, member, func(n *corev1.Node) { delete(n.Labels, fleet.LabelGateway) })
			}})
	}
	return cs
}

// counterSum reads the counter called name, summed over its labels.
func counterSum(g prometheus.Gatherer, name string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, fmt.Errorf("gather metrics: %w", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum, nil
		}
	}
	return 0, fmt.Errorf("gather metrics: no counter %s", name)
}

// histogramTotals reads the count and sum of the histogram called name.
func histogramTotals(g prometheus.Gatherer, name string) (uint64, float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, 0, fmt.Errorf("gather metrics: %w", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum(), nil
		}
	}
	return 0, 0, fmt.Errorf("gather metrics: no histogram %s", name)
}

// quietAfterChange is the time left between two changes: more than the
// source's debounce, so that each change is a lone one (source.Settle), as
// the debounce has it.
const quietAfterChange = 2 * source.DefaultDebounce

// changeTimeout bounds the wait for one change to reach the maps.
const changeTimeout = 30 * time.Second

// measureEventToMaps measures node idx of site 1 (see MeasureEventToMaps).
func measureEventToMaps(ctx context.Context, sh fleet.Shape, idx, rounds int, log io.Writer) (Latency, error) {
	node := fleet.NodeName(1, idx)
	api, err := newFakeAPI(sh)
	if err != nil {
		return Latency{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelError}))
	src, err := source.NewKubernetes(ctx, source.KubernetesConfig{Client: api.client, Dynamic: api.dynamic, Log: logger})
	if err != nil {
		return Latency{}, err
	}
	defer src.Close()
	if err := waitFor(ctx, 10*time.Second, api.watching); err != nil {
		return Latency{}, fmt.Errorf("informers watching: %w", err)
	}

	reg := prometheus.NewRegistry()
	cfg := agent.Config{
		Node: node, Source: src, PinDir: "/sys/fs/bpf/isthmus-cpbench-" + randHex(6),
		Decap: datapath.DecapAuto, VNI: 1, Log: logger, Metrics: metrics.NewSync(reg),
		// The fleet's other nodes do not exist: health checks of the
		// gateways would mark them down a few seconds in and rewrite the
		// groups in the middle of the measurement, a sync of another cause.
		HealthInterval: time.Hour,
	}
	// The Site's nodeCidrs are the /20 of its InternalIPs.
	underlay := netip.PrefixFrom(fleet.InternalIP(1, idx), 20)
	started := make(chan error, 1)
	ran := make(chan error, 1)
	go func() { ran <- runAgent(ctx, cfg, underlay, started) }()
	select {
	case err := <-started:
		if err != nil {
			<-ran // its namespace and pins are removed
			return Latency{}, err
		}
	case err := <-ran:
		return Latency{}, fmt.Errorf("agent stopped before it started: %w", err)
	}
	stop := func() error {
		cancel()
		return <-ran
	}

	// Start syncs once, Run once more when it begins; a change made during
	// that second sync would wait for it. Begin once the syncs have been
	// quiet for a second.
	last, quietSince := -1.0, time.Now()
	if err := waitFor(ctx, changeTimeout, func() bool {
		n, err := counterSum(reg, metricSyncs)
		if err != nil || n != last {
			last, quietSince = n, time.Now()
		}
		return n >= 2 && time.Since(quietSince) >= time.Second
	}); err != nil {
		return Latency{}, errors.Join(fmt.Errorf("agent quiet after start: %w", err), stop())
	}
	res := Latency{Shape: sh, Node: node, Gateway: sh.Topology == fleet.Hub && idx < fleet.GatewaysPerSite}
	count, sum, err := histogramTotals(reg, metricEventToMaps)
	if err != nil {
		return Latency{}, errors.Join(err, stop())
	}
	for range rounds {
		for _, c := range api.changes(sh) {
			time.Sleep(quietAfterChange)
			syncs, err := counterSum(reg, metricSyncs)
			if err != nil {
				return Latency{}, errors.Join(err, stop())
			}
			written, err := counterSum(reg, metricWritten)
			if err != nil {
				return Latency{}, errors.Join(err, stop())
			}
			start := time.Now()
			if err := c.do(ctx); err != nil {
				return Latency{}, errors.Join(fmt.Errorf("%s: %w", c.name, err), stop())
			}
			// Read the metric until the change was observed; every 2 ms
			// (a gather is microseconds), so the wall bound is close.
			deadline := start.Add(changeTimeout)
			for {
				n, s, err := histogramTotals(reg, metricEventToMaps)
				if err != nil {
					return Latency{}, errors.Join(err, stop())
				}
				if n > count {
					if n != count+1 {
						return Latency{}, errors.Join(fmt.Errorf("%s: %d observations for one change", c.name, n-count), stop())
					}
					wall := time.Since(start)
					res.Samples = append(res.Samples, Sample{Change: c.name,
						EventToMaps: time.Duration((s - sum) * float64(time.Second)), Wall: wall})
					count, sum = n, s
					break
				}
				select {
				case err := <-ran:
					return Latency{}, fmt.Errorf("%s: agent stopped: %w", c.name, err)
				default:
				}
				if time.Now().After(deadline) {
					return Latency{}, errors.Join(fmt.Errorf("%s: not in the maps after %v", c.name, changeTimeout), stop())
				}
				time.Sleep(2 * time.Millisecond)
			}
			// The sync counts its writes when it ends, after the routes.
			var ended bool
			if err := waitFor(ctx, changeTimeout, func() bool {
				n, err := counterSum(reg, metricSyncs)
				ended = err == nil && n > syncs
				return ended || err != nil
			}); err != nil || !ended {
				return Latency{}, errors.Join(fmt.Errorf("%s: the sync did not end: %v", c.name, err), stop())
			}
			w, err := counterSum(reg, metricWritten)
			if err != nil {
				return Latency{}, errors.Join(err, stop())
			}
			res.Samples[len(res.Samples)-1].Writes = int(w - written)
		}
	}
	if err := stop(); err != nil {
		return Latency{}, err
	}
	ds := make([]time.Duration, 0, len(res.Samples))
	for _, s := range res.Samples {
		ds = append(ds, s.EventToMaps)
	}
	slices.Sort(ds)
	if len(ds) > 0 {
		res.Min, res.Median, res.Max = ds[0], median(ds), ds[len(ds)-1]
	}
	return res, nil
}

// median of sorted ds.
func median(ds []time.Duration) time.Duration {
	n := len(ds)
	if n%2 == 1 {
		return ds[n/2]
	}
	return (ds[n/2-1] + ds[n/2]) / 2
}

// runAgent runs the agent of cfg until ctx is done, in a new network
// namespace with a veth holding the node's underlay address, and removes
// its pins after. started receives Start's result. The goroutine's thread is
// never unlocked: Go retires it with the goroutine rather than reuse it in
// another namespace, and the namespace (its devices and routes) goes with
// it once its name is deleted.
func runAgent(ctx context.Context, cfg agent.Config, underlay netip.Prefix, started chan<- error) (err error) {
	runtime.LockOSThread()
	name := "isthmus-cpb-" + randHex(4)
	ns, err := netns.NewNamed(name)
	if err != nil {
		started <- fmt.Errorf("create netns: %w", err)
		return err
	}
	defer func() {
		ns.Close()
		if derr := netns.DeleteNamed(name); derr != nil {
			err = errors.Join(err, fmt.Errorf("delete netns %s: %w", name, derr))
		}
	}()
	if err := addUnderlay(underlay); err != nil {
		started <- err
		return err
	}
	defer func() {
		if uerr := datapath.Uninstall(cfg.PinDir); uerr != nil {
			err = errors.Join(err, uerr)
		}
		os.RemoveAll(cfg.PinDir)
	}()
	a, err := agent.Start(cfg)
	started <- err
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx)
}

// addUnderlay creates a veth pair ul0/ul0p, both up, with addr on ul0.
func addUnderlay(addr netip.Prefix) error {
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0"}, PeerName: "ul0p"}); err != nil {
		return fmt.Errorf("create underlay veth: %w", err)
	}
	for _, n := range []string{"ul0p", "ul0"} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			return fmt.Errorf("underlay veth %s: %w", n, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", n, err)
		}
		if n == "ul0" {
			a, err := netlink.ParseAddr(addr.String())
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, a); err != nil {
				return fmt.Errorf("address %s on ul0: %w", addr, err)
			}
		}
	}
	return nil
}

// waitFor polls cond every 10 ms until it holds, timeout passes or ctx is
// done.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
