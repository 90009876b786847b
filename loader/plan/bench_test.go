package plan

import (
	"fmt"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

func fleetSet(b testing.TB, sh fleet.Shape) *objects.Set {
	b.Helper()
	in, err := fleet.Objects(sh)
	if err != nil {
		b.Fatal(err)
	}
	set, _, err := objects.Validate(in)
	if err != nil {
		b.Fatal(err)
	}
	return set
}

// benchNodes returns the nodes the benchmarks plan in a fleet of shape sh,
// by benchmark name: a member of site 3 and, in a hub, a gateway of it.
func benchNodes(sh fleet.Shape) map[string]string {
	prefix := fmt.Sprintf("%s-%dx%d-", sh.Topology, sh.Sites, sh.NodesPerSite)
	nodes := map[string]string{prefix + "member": fleet.NodeName(3, 50)}
	if sh.Topology == fleet.Hub {
		nodes[prefix+"gateway"] = fleet.NodeName(3, 0)
	}
	return nodes
}

// BenchmarkCompute plans one member of fleets of 50 Sites of 100 Nodes (the
// fleet of issue 12), mesh and hub; make bench runs it.
func BenchmarkCompute(b *testing.B) {
	for _, topo := range []fleet.Topology{fleet.Mesh, fleet.Hub} {
		sh := fleet.Shape{Sites: 50, NodesPerSite: 100, Topology: topo}
		set := fleetSet(b, sh)
		for name, node := range benchNodes(sh) {
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					p, err := Compute(set, node)
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(len(p.Routes)), "routes")
				}
			})
		}
	}
}

// BenchmarkValidate validates the same fleets.
func BenchmarkValidate(b *testing.B) {
	for _, topo := range []fleet.Topology{fleet.Mesh, fleet.Hub} {
		sh := fleet.Shape{Sites: 50, NodesPerSite: 100, Topology: topo}
		in, err := fleet.Objects(sh)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%s-%dx%d", topo, sh.Sites, sh.NodesPerSite), func(b *testing.B) {
			for b.Loop() {
				if _, _, err := objects.Validate(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCacheOneChange plans the nodes of BenchmarkCompute after a Node
// was added to a remote site, with a Cache that planned the fleet before:
// what an agent's sync pays for a one-Node change.
func BenchmarkCacheOneChange(b *testing.B) {
	for _, topo := range []fleet.Topology{fleet.Mesh, fleet.Hub} {
		sh := fleet.Shape{Sites: 50, NodesPerSite: 100, Topology: topo}
		in, err := fleet.Objects(sh)
		if err != nil {
			b.Fatal(err)
		}
		before := fleetSet(b, sh)
		in.Nodes = append(in.Nodes, fleet.Node(sh, 7, sh.NodesPerSite))
		after, _, err := objects.Validate(in)
		if err != nil {
			b.Fatal(err)
		}
		for name, node := range benchNodes(sh) {
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					c := NewCache()
					if _, err := c.Compute(before, node); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if _, err := c.Compute(after, node); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
