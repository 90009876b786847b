package cpbench

import (
	"testing"

	"github.com/isthmus-dev/isthmus/loader/fleet"
)

// TestMeasureSmall runs the measurement on a small fleet of each topology
// and checks what it must find: every peer or site reached, a change of one
// Node written as a handful of entries, not the whole table.
func TestMeasureSmall(t *testing.T) {
	for _, topo := range []fleet.Topology{fleet.Mesh, fleet.Hub} {
		rs, err := Measure(fleet.Shape{Sites: 4, NodesPerSite: 10, Topology: topo})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			t.Logf("\n%s", Table([]Result{r}))
			if r.Routes == 0 || r.Peers == 0 || r.PeerSources == 0 {
				t.Errorf("%s %s: empty tables %+v", topo, r.Node, r)
			}
			for _, c := range r.Changes {
				if c.SyncCPU <= 0 {
					t.Errorf("%s %s: %s: sync CPU %v, want some", topo, r.Node, c.Name, c.SyncCPU)
				}
				// A label no selector reads (mesh) writes nothing. A remote node
				// becoming a gateway changes nothing for a hub member either: its
				// pods already reach that node's address through the member's own
				// gateways, as they reach every remote node's. Anything else
				// writes a few entries.
				label := c.Name == "label a gateway"
				switch {
				case label && topo == fleet.Mesh:
					if c.Writes != 0 {
						t.Errorf("%s %s: a label no selector reads wrote %d entries", topo, r.Node, c.Writes)
					}
				case label && !r.Gateway:
					if c.Writes > 12 {
						t.Errorf("%s %s: %s wrote %d entries, want at most a few", topo, r.Node, c.Name, c.Writes)
					}
				case c.Writes == 0 || c.Writes > 12:
					t.Errorf("%s %s: %s wrote %d entries, want a few", topo, r.Node, c.Name, c.Writes)
				}
			}
		}
	}
}
