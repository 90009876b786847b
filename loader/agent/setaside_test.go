package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isthmus-dev/isthmus/loader/metrics"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/testenv/syncbuf"
)

// fakeSource hands out the Set of a directory of YAML, read with the same
// setting aside as source.Files, and a Changed channel the test pokes.
type fakeSource struct {
	dir     string
	changed chan struct{}
}

func (f *fakeSource) Snapshot() (*objects.Set, []objects.Warning, error) {
	return objects.LoadDirSettingAside(f.dir)
}
func (f *fakeSource) Changed() <-chan struct{} { return f.changed }
func (f *fakeSource) Close() error             { return nil }

func writeObjects(t *testing.T, dir, name, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// twoSitesDir returns a new directory holding testdata/two-sites.yaml as a.yaml.
func twoSitesDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	two, err := os.ReadFile("testdata/two-sites.yaml")
	if err != nil {
		t.Fatal(err)
	}
	writeObjects(t, dir, "a.yaml", string(two))
	return dir
}

const conflictingNode = `apiVersion: v1
kind: Node
metadata: {name: b9}
spec: {podCIDRs: [10.20.1.0/25]}
status: {addresses: [{type: InternalIP, address: 172.16.2.19}]}
`

// TestLoadSetsAsideOthers: another node's invalid object leaves this node's
// plan (and readiness) alone, is logged once however many resyncs find it
// again, and is counted in isthmus_objects_rejected; this node's own object
// set aside fails its plan with the reason.
func TestLoadSetsAsideOthers(t *testing.T) {
	dir := twoSitesDir(t)
	writeObjects(t, dir, "z.yaml", conflictingNode)
	var logs syncbuf.Buffer
	reg := prometheus.NewRegistry()
	a := &Agent{
		cfg: Config{Node: "a1", Planner: DefaultPlanner, Metrics: metrics.NewSync(reg)},
		log: slog.New(slog.NewTextHandler(&logs, nil)), src: &fakeSource{dir: dir}, st: NewStatus(),
		reported: map[string]map[string]bool{},
	}
	for range 3 {
		p, _, err := a.load()
		if err != nil || p == nil {
			t.Fatalf("load with another node set aside: %v", err)
		}
		for _, r := range p.Routes {
			if r.Prefix == netip.MustParsePrefix("10.20.1.0/25") {
				t.Errorf("the plan routes the set-aside node's podCIDR: %+v", r)
			}
		}
	}
	if n := strings.Count(logs.String(), "object set aside"); n != 1 {
		t.Errorf("three loads logged the set-aside node %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `Node \"b9\"`) || !strings.Contains(logs.String(), "overlaps") {
		t.Errorf("log does not name b9 and the overlap:\n%s", logs.String())
	}
	if got := rejectedGauge(t, reg, "Node"); got != 1 {
		t.Errorf(`isthmus_objects_rejected{kind="Node"} = %v, want 1`, got)
	}

	// Fixed: the metric goes back to 0; broken again: logged again.
	writeObjects(t, dir, "z.yaml", "")
	if _, _, err := a.load(); err != nil {
		t.Fatal(err)
	}
	if got := rejectedGauge(t, reg, "Node"); got != 0 {
		t.Errorf("after the fix isthmus_objects_rejected{kind=\"Node\"} = %v, want 0", got)
	}
	writeObjects(t, dir, "z.yaml", conflictingNode)
	if _, _, err := a.load(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "object set aside"); n != 2 {
		t.Errorf("a problem that came back was logged %d times in all, want 2", n)
	}

	// This node's own object set aside: its plan fails, naming why.
	writeObjects(t, dir, "0.yaml", strings.ReplaceAll(strings.ReplaceAll(conflictingNode, "b9", "a1"), "172.16.2.19", "172.16.1.11"))
	if _, _, err := a.load(); err == nil || !strings.Contains(err.Error(), "set aside") || !strings.Contains(err.Error(), "duplicate name") {
		t.Errorf("load with this node's object set aside: %v, want the reason", err)
	}
}

// TestStartWaitsForItsSite: an agent whose Node is in no Site waits, reports
// why once (not once per change event) in its log and /readyz, stays live, and
// stops when its context ends, without touching the kernel.
func TestStartWaitsForItsSite(t *testing.T) {
	dir := twoSitesDir(t)
	src := &fakeSource{dir: dir, changed: make(chan struct{})}
	var logs syncbuf.Buffer
	st := NewStatus()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := start(ctx, Config{Node: "lost", Source: src, Status: st, Resync: time.Hour,
			Log: slog.New(slog.NewTextHandler(&logs, nil))}, true)
		done <- err
	}()
	for range 3 {
		src.changed <- struct{}{} // each is a reload, after the first one
	}
	if n := strings.Count(logs.String(), "cannot be planned yet"); n != 1 {
		t.Errorf("four loads logged the wait %d times, want once:\n%s", n, logs.String())
	}
	if err := st.Ready(); err == nil || !strings.Contains(err.Error(), `"lost"`) {
		t.Errorf("/readyz while waiting: %v, want the reason naming the node", err)
	}
	if err := st.Live(); err != nil {
		t.Errorf("/healthz while waiting: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err == nil || ctx.Err() == nil {
			t.Errorf("start after cancel: %v, want the context's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("start did not return after its context ended")
	}
}

// rejectedGauge reads isthmus_objects_rejected{kind} from reg.
func rejectedGauge(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "isthmus_objects_rejected" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("isthmus_objects_rejected{kind=%q} not registered", kind)
	return 0
}

// genSource is fakeSource counting changes, as source.Files does.
type genSource struct {
	fakeSource
	gen uint64
}

func (g *genSource) Generation() uint64 { return g.gen }

// TestResyncReusesPlan: after a successful load, a resync with no change in
// the source reuses the plan (unchanged); a change, or a failed load, makes
// the next resync load again.
func TestResyncReusesPlan(t *testing.T) {
	dir := twoSitesDir(t)
	src := &genSource{fakeSource: fakeSource{dir: dir}}
	a := &Agent{cfg: Config{Node: "a1", Planner: DefaultPlanner}, log: slog.New(slog.DiscardHandler), src: src,
		st: NewStatus(), reported: map[string]map[string]bool{}}
	if a.unchanged() {
		t.Error("unchanged before any load")
	}
	if _, _, err := a.load(); err != nil {
		t.Fatal(err)
	}
	if !a.unchanged() {
		t.Error("not unchanged right after a load")
	}
	src.gen++
	if a.unchanged() {
		t.Error("unchanged after the source counted a change")
	}
	a.cfg.Node = "nobody"
	if _, _, err := a.load(); err == nil {
		t.Fatal("load of an unknown node succeeded")
	}
	if a.unchanged() {
		t.Error("unchanged after a failed load")
	}
}
