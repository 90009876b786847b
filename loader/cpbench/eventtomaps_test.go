package cpbench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/source"
)

// testLog hands the agent's warnings and errors to t.Log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestEventToMapsSmall runs the agent on small fleets of each topology (as
// root: real maps, in network namespaces; run it under the kernel lock) and
// checks every change it measured against bounds that come from outside the
// agent's figure:
//
//   - at least source.Settle: the source holds a lone change that long
//     before it tells the agent (TestNotifierTiming checks that timer);
//   - at most the wall time from the API write to the metric showing it:
//     the figure cannot be longer than what contains it;
//   - the median under source.DefaultDebounce (100 ms): each change came
//     after a quiet time, so the source must treat it as a lone change (10
//     ms) and not wait for a storm to go quiet. A sync of 40 nodes is a few
//     milliseconds of CPU; 90 ms is the room left for a shared, busy
//     2-core machine to schedule the agent's goroutines late, and it is
//     the median, so a few changes delayed by other work do not fail it;
//   - every change under MaxWaitFactor debounce times (1 s): nothing waited
//     for the end of a storm, nor for a periodic resync (30 s);
//
// and that the changes that move a route or a peer wrote map entries, so
// what was timed is the change reaching the maps.
func TestEventToMapsSmall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs the agent with real BPF maps in network namespaces and needs root (flock -o /tmp/isthmus-kernel.lock go test ./loader/cpbench -run EventToMaps)")
	}
	const rounds = 2
	for _, topo := range []fleet.Topology{fleet.Mesh, fleet.Hub} {
		sh := fleet.Shape{Sites: 4, NodesPerSite: 10, Topology: topo}
		ls, err := MeasureEventToMaps(context.Background(), sh, rounds, testLog{t})
		if err != nil {
			t.Fatal(err)
		}
		wantNodes := 1
		if topo == fleet.Hub {
			wantNodes = 2
		}
		if len(ls) != wantNodes {
			t.Fatalf("%s: %d nodes measured, want %d", topo, len(ls), wantNodes)
		}
		t.Logf("\n%s", EventToMapsTable(ls))
		for _, l := range ls {
			perRound := 3
			if topo == fleet.Hub {
				perRound = 5
			}
			if len(l.Samples) != rounds*perRound {
				t.Errorf("%s %s: %d changes measured, want %d", topo, l.Node, len(l.Samples), rounds*perRound)
			}
			for _, s := range l.Samples {
				t.Logf("%s %s: %s: event to maps %v, wall %v, %d writes", topo, l.Node, s.Change, s.EventToMaps, s.Wall, s.Writes)
				if s.EventToMaps < source.Settle {
					t.Errorf("%s %s: %s: event to maps %v, under the source's settle time %v", topo, l.Node, s.Change, s.EventToMaps, source.Settle)
				}
				if s.EventToMaps > s.Wall {
					t.Errorf("%s %s: %s: event to maps %v, over the %v from the API write to the metric", topo, l.Node, s.Change, s.EventToMaps, s.Wall)
				}
				if maxWait := source.MaxWaitFactor * source.DefaultDebounce; s.EventToMaps >= maxWait {
					t.Errorf("%s %s: %s: event to maps %v, not under %v", topo, l.Node, s.Change, s.EventToMaps, maxWait)
				}
				if !strings.Contains(s.Change, "label") && s.Writes == 0 {
					t.Errorf("%s %s: %s wrote no map entry", topo, l.Node, s.Change)
				}
			}
			if l.Min > l.Median || l.Median > l.Max || l.Min == 0 {
				t.Errorf("%s %s: min %v, median %v, max %v out of order", topo, l.Node, l.Min, l.Median, l.Max)
			}
			if l.Median >= source.DefaultDebounce {
				t.Errorf("%s %s: median event to maps %v, not under the debounce time %v: lone changes waited as bursts", topo, l.Node, l.Median, source.DefaultDebounce)
			}
		}
	}
	// Nothing stays behind: the namespaces are gone.
	out, err := os.ReadDir("/run/netns")
	if err == nil {
		for _, e := range out {
			if strings.HasPrefix(e.Name(), "isthmus-cpb-") {
				t.Errorf("network namespace %s left behind", e.Name())
			}
		}
	}
}
