// Package cpbench measures the agent's control plane on generated fleets
// (loader/fleet). Measure runs the agent's planning path without a kernel
// (objects.ValidateSettingAside and plan.Compute or, for a change, an
// objects.Validator and a plan.Cache; mapstate.FromPlan, maps.Diff): the
// CPU time to validate the objects and plan one node, the map entries the
// plan needs, the CPU time and the map writes of a sync after a change of
// one Node, and the heap an agent holds for it. MeasureEventToMaps runs the
// agent itself, with real BPF maps, fed by its Kubernetes source, and reads
// how long changes took from the object event to the last map write (the
// agent's isthmus_event_to_maps_seconds). `isthmus-lab bench --control-plane`
// prints both; docs/benchmarks.md records them.
package cpbench

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/mapstate"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/maps"
)

// DefaultShapes are the fleets Measure reports: 500, 5,000 and 20,000 nodes
// of 100 per site, mesh and hub.
var DefaultShapes = []fleet.Shape{
	{Sites: 5, NodesPerSite: 100, Topology: fleet.Mesh},
	{Sites: 5, NodesPerSite: 100, Topology: fleet.Hub},
	{Sites: 50, NodesPerSite: 100, Topology: fleet.Mesh},
	{Sites: 50, NodesPerSite: 100, Topology: fleet.Hub},
	{Sites: 200, NodesPerSite: 100, Topology: fleet.Mesh},
	{Sites: 200, NodesPerSite: 100, Topology: fleet.Hub},
}

// cpuTime is the CPU time the process used so far (user and system, every
// thread, the garbage collector's included). Durations are CPU time, not
// wall time: on a machine shared with other work, wall time measures the
// others too; the agent's cost is its CPU.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Rounds is how often each change is measured; the fastest counts.
const Rounds = 3

// Change is one kind of one-Node change.
type Change struct {
	Name string
	// SyncCPU is the CPU time of validating and planning again, building
	// the map state and diffing it against the one before, the fastest of
	// Rounds: the part of event to maps (MeasureEventToMaps) that is the
	// agent's own work. Writes are the map entries that differ.
	SyncCPU time.Duration
	Writes  int
}

// Result is the measurement of one fleet, seen from one node.
type Result struct {
	Shape fleet.Shape
	Nodes int
	// Node is the node planned: a member of site 1 (in a hub, gateways are
	// measured too: Gateway).
	Node    string
	Gateway bool
	// Plan is the CPU time of validating every object and planning the
	// node, the work of a sync that reloads.
	Plan time.Duration
	// Routes, Peers and PeerSources are the node's map entries.
	Routes, Peers, PeerSources int
	Changes                    []Change
	// HeapBytes is the live heap with the objects, the plan and the map state
	// held, after a GC: what an agent keeps for this fleet.
	HeapBytes uint64
}

// Measure measures one fleet from a member of site 1 and, for a hub, from a
// gateway of site 1 too.
func Measure(sh fleet.Shape) ([]Result, error) {
	nodes := []string{fleet.NodeName(1, fleet.GatewaysPerSite)}
	if sh.Topology == fleet.Hub {
		nodes = append(nodes, fleet.NodeName(1, 0))
	}
	var out []Result
	for _, n := range nodes {
		r, err := measure(sh, n)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// nodeConfig is a plausible node for mapstate.FromPlan; the values do not
// change what is measured.
var nodeConfig = mapstate.NodeConfig{VNI: 1, UnderlayIfindex: 2, OverlayIfindex: 3,
	OverlayMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, TunnelMTU: 1450, SNATPortMin: 61000, SNATPortMax: 65535}

// state plans node (through c, nil: plan.Compute) and returns the plan and
// its map state.
func state(set *objects.Set, node string, current maps.State, c *plan.Cache) (*plan.NodePlan, maps.State, error) {
	compute := plan.Compute
	if c != nil {
		compute = c.Compute
	}
	p, err := compute(set, node)
	if err != nil {
		return nil, maps.State{}, err
	}
	cfg := nodeConfig
	cfg.CurrentGroups = map[netip.Prefix]uint32{}
	for pfx, r := range current.Routes {
		if r.Group != 0 {
			cfg.CurrentGroups[pfx] = r.Group
		}
	}
	s, _ := mapstate.FromPlan(p, cfg)
	return p, s, nil
}

func measure(sh fleet.Shape, node string) (Result, error) {
	in, err := fleet.Objects(sh)
	if err != nil {
		return Result{}, err
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	start := cpuTime()
	set, _ := objects.ValidateSettingAside(in)
	if len(set.Rejected) > 0 {
		return Result{}, fmt.Errorf("fleet %+v: %d objects set aside, first %s", sh, len(set.Rejected), set.Rejected[0])
	}
	p, st, err := state(set, node, maps.State{}, nil)
	if err != nil {
		return Result{}, err
	}
	res := Result{Shape: sh, Nodes: len(in.Nodes), Node: node, Gateway: p.Gateway, Plan: cpuTime() - start,
		Routes: len(st.Routes), Peers: len(st.Peers), PeerSources: len(st.PeerSources)}

	runtime.GC()
	var held runtime.MemStats
	runtime.ReadMemStats(&held)
	res.HeapBytes = held.HeapAlloc - min(held.HeapAlloc, before.HeapAlloc)
	runtime.KeepAlive(set)
	runtime.KeepAlive(p)

	// Each change starts from the fleet as generated, in site 7 (a remote
	// site of node's), as a Kubernetes source would hand it: a new snapshot.
	remote := 7 % sh.Sites
	changes := []struct {
		name string
		edit func(in *objects.Objects)
	}{
		{"add a Node", func(in *objects.Objects) {
			in.Nodes = append(in.Nodes, fleet.Node(sh, remote, sh.NodesPerSite))
		}},
		{"remove a Node", func(in *objects.Objects) {
			in.Nodes = slices.DeleteFunc(in.Nodes, func(n corev1.Node) bool { return n.Name == fleet.NodeName(remote, sh.NodesPerSite-1) })
		}},
		{"change a podCIDR", func(in *objects.Objects) {
			n := nodeNamed(in, fleet.NodeName(remote, sh.NodesPerSite-1))
			pod := fleet.PodCIDR(remote, 250).String()
			n.Spec.PodCIDR, n.Spec.PodCIDRs = pod, []string{pod}
		}},
		{"label a gateway", func(in *objects.Objects) {
			n := nodeNamed(in, fleet.NodeName(remote, fleet.GatewaysPerSite))
			n.Labels = map[string]string{fleet.LabelGateway: fleet.SiteName(remote)}
		}},
	}
	for _, c := range changes {
		changed := cloneObjects(in)
		c.edit(&changed)
		// The API server gives the changed Node a new resourceVersion.
		for i := range changed.Nodes {
			if !equality.Semantic.DeepEqual(&changed.Nodes[i], nodeNamed(&in, changed.Nodes[i].Name)) {
				changed.Nodes[i].ResourceVersion = "2"
			}
		}
		// The fastest of Rounds: on a shared machine the others are noise.
		m := Change{Name: c.name}
		for i := range Rounds {
			// The agent's Validator and plan.Cache saw the snapshot
			// before the change.
			v := objects.NewValidator(objects.Rules{})
			prev, _ := v.ValidateSettingAside(in)
			cache := plan.NewCache()
			if _, err := cache.Compute(prev, node); err != nil {
				return Result{}, err
			}
			// Collecting that priming snapshot's garbage is not this
			// sync's cost; the collections its own allocations bring
			// about are counted.
			runtime.GC()
			start := cpuTime()
			set, _ := v.ValidateSettingAside(changed)
			_, after, err := state(set, node, st, cache)
			if err != nil {
				return Result{}, fmt.Errorf("%s: %w", c.name, err)
			}
			m.Writes = len(maps.Diff(st, after))
			if d := cpuTime() - start; i == 0 || d < m.SyncCPU {
				m.SyncCPU = d
			}
		}
		res.Changes = append(res.Changes, m)
	}
	return res, nil
}

func nodeNamed(in *objects.Objects, name string) *corev1.Node {
	for i := range in.Nodes {
		if in.Nodes[i].Name == name {
			return &in.Nodes[i]
		}
	}
	return &corev1.Node{}
}

// cloneObjects copies the slices of in (the objects themselves are deep
// copied where an edit changes them: the Node edited is replaced).
func cloneObjects(in objects.Objects) objects.Objects {
	out := in
	out.Nodes = make([]corev1.Node, len(in.Nodes))
	for i := range in.Nodes {
		out.Nodes[i] = *in.Nodes[i].DeepCopy()
	}
	return out
}

// Table formats results one row per fleet and node.
func Table(rs []Result) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	var names []string
	if len(rs) > 0 {
		for _, c := range rs[0].Changes {
			names = append(names, c.Name)
		}
	}
	fmt.Fprintf(tw, "FLEET\tNODES\tNODE\tPLAN CPU\tROUTES\tPEERS\tSOURCES\tHEAP")
	for _, n := range names {
		fmt.Fprintf(tw, "\t%s: SYNC CPU (WRITES)", strings.ToUpper(n))
	}
	fmt.Fprintln(tw)
	for _, r := range rs {
		role := "member"
		if r.Gateway {
			role = "gateway"
		}
		fmt.Fprintf(tw, "%s %dx%d\t%d\t%s\t%v\t%d\t%d\t%d\t%.0f MiB", r.Shape.Topology, r.Shape.Sites, r.Shape.NodesPerSite,
			r.Nodes, role, r.Plan.Round(time.Millisecond), r.Routes, r.Peers, r.PeerSources, float64(r.HeapBytes)/(1<<20))
		for _, c := range r.Changes {
			fmt.Fprintf(tw, "\t%v (%d)", c.SyncCPU.Round(time.Millisecond), c.Writes)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	return b.String()
}

// EventToMapsTable formats latencies one row per fleet and node: the
// agent's event to maps over all changes (fastest, median, slowest), then
// each change's, in the order made, with its map writes.
func EventToMapsTable(ls []Latency) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FLEET\tNODES\tNODE\tCHANGES\tEVENT TO MAPS MIN\tMEDIAN\tMAX\tPER CHANGE, MS (WRITES)")
	for _, l := range ls {
		role := "member"
		if l.Gateway {
			role = "gateway"
		}
		var each []string
		for _, s := range l.Samples {
			each = append(each, fmt.Sprintf("%.0f (%d)", float64(s.EventToMaps.Microseconds())/1000, s.Writes))
		}
		fmt.Fprintf(tw, "%s %dx%d\t%d\t%s\t%d\t%v\t%v\t%v\t%s\n", l.Shape.Topology, l.Shape.Sites, l.Shape.NodesPerSite,
			l.Shape.Sites*l.Shape.NodesPerSite, role, len(l.Samples), l.Min.Round(time.Millisecond),
			l.Median.Round(time.Millisecond), l.Max.Round(time.Millisecond), strings.Join(each, " "))
	}
	tw.Flush()
	return b.String()
}
