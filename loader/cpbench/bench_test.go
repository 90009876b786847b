package cpbench

import (
	"context"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/maps"
)

// BenchmarkOneNodeChange is the sync after adding a Node to a remote site of
// the 5,000-node fleets, as Measure times it (a Validator that saw the
// snapshot before, a plan.Cache that planned it, map state, diff), for
// profiling with -cpuprofile: cpu-ms/op is the process's CPU time per sync, garbage collection included.
func BenchmarkOneNodeChange(b *testing.B) {
	for _, topo := range []fleet.Topology{fleet.Mesh, fleet.Hub} {
		sh := fleet.Shape{Sites: 50, NodesPerSite: 100, Topology: topo}
		in, err := fleet.Objects(sh)
		if err != nil {
			b.Fatal(err)
		}
		nodes := map[string]string{"member": fleet.NodeName(1, fleet.GatewaysPerSite)}
		if topo == fleet.Hub {
			nodes["gateway"] = fleet.NodeName(1, 0)
		}
		changed := cloneObjects(in)
		added := fleet.Node(sh, 7, sh.NodesPerSite)
		added.ResourceVersion = "2"
		changed.Nodes = append(changed.Nodes, added)
		for role, node := range nodes {
			set, _ := objects.ValidateSettingAside(in)
			_, before, err := state(set, node, maps.State{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(string(topo)+"-"+role, func(b *testing.B) {
				var spent time.Duration
				for b.Loop() {
					b.StopTimer()
					v := objects.NewValidator(objects.Rules{})
					prev, _ := v.ValidateSettingAside(in)
					cache := plan.NewCache()
					if _, err := cache.Compute(prev, node); err != nil {
						b.Fatal(err)
					}
					runtime.GC()
					b.StartTimer()
					start := cpuTime()
					// Labelled, so a profile can leave out the priming:
					// go tool pprof -tagfocus sync=change.
					var err error
					pprof.Do(context.Background(), pprof.Labels("sync", "change"), func(context.Context) {
						set, _ := v.ValidateSettingAside(changed)
						var after maps.State
						if _, after, err = state(set, node, before, cache); err == nil {
							maps.Diff(before, after)
						}
					})
					if err != nil {
						b.Fatal(err)
					}
					spent += cpuTime() - start
				}
				b.ReportMetric(float64(spent.Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
	}
}
