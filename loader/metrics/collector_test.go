package metrics

import (
	"errors"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isthmus-dev/isthmus/loader/buildinfo"
	"github.com/isthmus-dev/isthmus/loader/health"
	"github.com/isthmus-dev/isthmus/maps"
)

// fakeSource returns fixed counters and levels, or errors.
type fakeSource struct {
	counters   map[maps.MetricKey]maps.Counter
	levels     []MapLevel
	counterErr error
	levelErr   error
}

func (f fakeSource) Counters() (map[maps.MetricKey]maps.Counter, error) {
	return f.counters, f.counterErr
}
func (f fakeSource) MapLevels() ([]MapLevel, error) { return f.levels, f.levelErr }

func TestCollectorExposition(t *testing.T) {
	buildinfo.Release, buildinfo.Commit = "v0.0.0-test", "1a2b3c4d"
	t.Cleanup(func() { buildinfo.Release, buildinfo.Commit = "", "" })
	src := fakeSource{
		counters: map[maps.MetricKey]maps.Counter{
			{Code: 1, Hook: maps.HookPodIngress}:      {Packets: 5, Bytes: 490},
			{Code: 2, Hook: maps.HookUnderlayTC}:      {Packets: 3, Bytes: 450},
			{Code: 11, Hook: maps.HookUnderlayXDP}:    {Packets: 1, Bytes: 100},
			{Code: 137, Hook: maps.HookUnderlayTC}:    {Packets: 7, Bytes: 1050}, // DROP_UNKNOWN_PEER
			{Code: 145, Hook: maps.HookOverlayEgress}: {Packets: 2, Bytes: 168},  // DROP_NO_OVERLAY_ROUTE
		},
		levels: []MapLevel{
			{Map: maps.MapRoutes, Entries: 4, Capacity: 1024},
			{Map: maps.MapNat, Entries: 2, Capacity: 65536},
		},
	}
	peers := func() []health.PeerState {
		return []health.PeerState{
			{Name: "b1", Tracked: true, Up: true, Ups: 1, Downs: 1},
			{Name: "b2", Tracked: true, Up: false, Downs: 1},
			{Name: "gone", Ups: 2, Downs: 2},
			{Name: "gw1", Site: "east", Tracked: true, Up: false, Downs: 1},
			{Name: "gw1", Site: "north", Tracked: true, Up: true},
		}
	}
	want := `
# HELP isthmus_build_info Always 1; the labels say which build runs: its release, its git commit and its Go version (buildinfo.Get).
# TYPE isthmus_build_info gauge
isthmus_build_info{commit="1a2b3c4d",go_version="` + runtime.Version() + `",version="v0.0.0-test"} 1
# HELP isthmus_datapath_bytes_total Bytes of the packets counted in isthmus_datapath_packets_total, as the hook saw them.
# TYPE isthmus_datapath_bytes_total counter
isthmus_datapath_bytes_total{event="decap",hook="underlay_tc"} 450
isthmus_datapath_bytes_total{event="encap",hook="pod_ingress"} 490
isthmus_datapath_bytes_total{event="transit",hook="underlay_xdp"} 100
# HELP isthmus_datapath_dropped_bytes_total Bytes of the packets counted in isthmus_datapath_drops_total.
# TYPE isthmus_datapath_dropped_bytes_total counter
isthmus_datapath_dropped_bytes_total{hook="overlay_egress",reason="no_overlay_route"} 168
isthmus_datapath_dropped_bytes_total{hook="underlay_tc",reason="unknown_peer"} 1050
# HELP isthmus_datapath_drops_total Packets the datapath dropped, by reason and hook.
# TYPE isthmus_datapath_drops_total counter
isthmus_datapath_drops_total{hook="overlay_egress",reason="no_overlay_route"} 2
isthmus_datapath_drops_total{hook="underlay_tc",reason="unknown_peer"} 7
# HELP isthmus_datapath_packets_total Packets the datapath handled, by event (what it did) and hook (where).
# TYPE isthmus_datapath_packets_total counter
isthmus_datapath_packets_total{event="decap",hook="underlay_tc"} 3
isthmus_datapath_packets_total{event="encap",hook="pod_ingress"} 5
isthmus_datapath_packets_total{event="transit",hook="underlay_xdp"} 1
# HELP isthmus_map_capacity Maximum entries of a datapath map (max_entries).
# TYPE isthmus_map_capacity gauge
isthmus_map_capacity{map="nat"} 65536
isthmus_map_capacity{map="routes"} 1024
# HELP isthmus_map_entries Entries in use in a datapath map (nexthop_groups: groups with a member; nat, masq_nat, nat_sources, ct_close, ct_close6: counted by iterating them at scrape time).
# TYPE isthmus_map_entries gauge
isthmus_map_entries{map="nat"} 2
isthmus_map_entries{map="routes"} 4
# HELP isthmus_peer_transitions_total Health state changes of a peer for a remote site since the agent started (state: the state entered).
# TYPE isthmus_peer_transitions_total counter
isthmus_peer_transitions_total{peer="b1",site="",state="down"} 1
isthmus_peer_transitions_total{peer="b1",site="",state="up"} 1
isthmus_peer_transitions_total{peer="b2",site="",state="down"} 1
isthmus_peer_transitions_total{peer="b2",site="",state="up"} 0
isthmus_peer_transitions_total{peer="gone",site="",state="down"} 2
isthmus_peer_transitions_total{peer="gone",site="",state="up"} 2
isthmus_peer_transitions_total{peer="gw1",site="east",state="down"} 1
isthmus_peer_transitions_total{peer="gw1",site="east",state="up"} 0
isthmus_peer_transitions_total{peer="gw1",site="north",state="down"} 0
isthmus_peer_transitions_total{peer="gw1",site="north",state="up"} 0
# HELP isthmus_peer_up 1 if the peer answers its health checks and, for a remote site (site label), reaches that site; 0 if not. Only next-hop group members are health-checked.
# TYPE isthmus_peer_up gauge
isthmus_peer_up{peer="b1",site=""} 1
isthmus_peer_up{peer="b2",site=""} 0
isthmus_peer_up{peer="gw1",site="east"} 0
isthmus_peer_up{peer="gw1",site="north"} 1
`
	if err := testutil.CollectAndCompare(NewCollector(src, peers), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestCollectorErrors: a source that fails reports the error in the scrape
// rather than a silent zero.
func TestCollectorErrors(t *testing.T) {
	src := fakeSource{counterErr: errors.New("open pinned map metrics: no such file"), levelErr: errors.New("open pinned map nat: gone")}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(src, nil))
	_, err := reg.Gather()
	if err == nil || !strings.Contains(err.Error(), "pinned map metrics") || !strings.Contains(err.Error(), "pinned map nat") {
		t.Errorf("Gather: %v, want both source errors", err)
	}
}

// TestCollectorLint: the metrics follow the naming conventions promlint checks.
func TestCollectorLint(t *testing.T) {
	src := fakeSource{
		counters: map[maps.MetricKey]maps.Counter{{Code: 1}: {Packets: 1, Bytes: 1}, {Code: 137}: {Packets: 1, Bytes: 1}},
		levels:   []MapLevel{{Map: maps.MapRoutes, Entries: 1, Capacity: 2}},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src, func() []health.PeerState { return []health.PeerState{{Name: "b1", Tracked: true}} }))
	NewSync(reg).Observe(0, 0, time.Unix(0, 0), nil)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestSyncMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewSync(reg)
	s.Observe(2*time.Millisecond, 7, time.Unix(1700000000, 500000000), nil)
	s.Observe(30*time.Millisecond, 2, time.Unix(1700000100, 0), errors.New("write routes: boom"))
	var nilSync *Sync
	nilSync.Observe(time.Second, 1, time.Now(), nil) // records nothing, does not panic
	want := `
# HELP isthmus_sync_entries_written_total Map entries written (updated or deleted) by syncs.
# TYPE isthmus_sync_entries_written_total counter
isthmus_sync_entries_written_total 9
# HELP isthmus_sync_last_success_timestamp_seconds Unix time of the end of the last successful sync (0: none yet).
# TYPE isthmus_sync_last_success_timestamp_seconds gauge
isthmus_sync_last_success_timestamp_seconds 1.7000000005e+09
# HELP isthmus_syncs_total Syncs, by result (ok or error).
# TYPE isthmus_syncs_total counter
isthmus_syncs_total{result="error"} 1
isthmus_syncs_total{result="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"isthmus_sync_entries_written_total", "isthmus_sync_last_success_timestamp_seconds", "isthmus_syncs_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(s.duration); n != 1 {
		t.Errorf("duration histogram: %d series, want 1", n)
	}
	// Both observations landed in the histogram, the 2ms one at or below 8ms.
	mf, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range mf {
		if f.GetName() != "isthmus_sync_duration_seconds" {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != 2 {
			t.Errorf("sync duration count %d, want 2", h.GetSampleCount())
		}
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == 0.008 && b.GetCumulativeCount() != 1 {
				t.Errorf("bucket le=0.008 holds %d, want 1", b.GetCumulativeCount())
			}
		}
	}
}

// TestEventToMaps: each applied change is one observation of its own
// duration, in the bucket it belongs to; a nil Sync records nothing.
func TestEventToMaps(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewSync(reg)
	s.EventToMaps(12 * time.Millisecond)
	s.EventToMaps(700 * time.Millisecond)
	var nilSync *Sync
	nilSync.EventToMaps(time.Second)
	mf, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range mf {
		if f.GetName() != "isthmus_event_to_maps_seconds" {
			continue
		}
		found = true
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != 2 || math.Abs(h.GetSampleSum()-0.712) > 1e-9 {
			t.Errorf("count %d, sum %v; want 2, 0.712", h.GetSampleCount(), h.GetSampleSum())
		}
		for _, b := range h.GetBucket() {
			want := uint64(0)
			switch {
			case b.GetUpperBound() >= 0.7:
				want = 2
			case b.GetUpperBound() >= 0.012:
				want = 1
			}
			if b.GetCumulativeCount() != want {
				t.Errorf("bucket le=%v holds %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
			}
		}
	}
	if !found {
		t.Error("isthmus_event_to_maps_seconds not registered")
	}
}

// redirectSource is a fakeSource that also has the kfree_skb tracer's counters.
type redirectSource struct {
	fakeSource
	drops    map[maps.RedirectDrop]maps.Counter
	attached bool
}

func (r redirectSource) RedirectDrops() (map[maps.RedirectDrop]maps.Counter, bool, error) {
	return r.drops, r.attached, nil
}

// TestCollectorRedirectDrops: the tracer's counters carry the kernel's reason
// names (from the kernel's BTF, as the tracepoint prints them) and the program's
// hook, and the tracer gauge says whether they can be trusted.
func TestCollectorRedirectDrops(t *testing.T) {
	names := map[uint32]string{2: "NOT_SPECIFIED", 58: "NEIGH_FAILED"}
	src := redirectSource{
		drops: map[maps.RedirectDrop]maps.Counter{
			{Reason: 58, Hook: maps.HookPodIngress}:  {Packets: 3, Bytes: 300},
			{Reason: 2, Hook: maps.HookUnderlayTC}:   {Packets: 7, Bytes: 700},
			{Reason: 999, Hook: maps.HookUnderlayTC}: {Packets: 1, Bytes: 60},
		},
		attached: true,
	}
	c := NewCollector(src, nil)
	c.kernelReasons = func() map[uint32]string { return names }
	want := `
# HELP isthmus_datapath_redirect_drop_tracer 1 if the kfree_skb tracer is attached; 0 if not, and then isthmus_datapath_redirect_drops_total misses every drop.
# TYPE isthmus_datapath_redirect_drop_tracer gauge
isthmus_datapath_redirect_drop_tracer 1
# HELP isthmus_datapath_redirect_drops_total Packets the kernel freed after a datapath program redirected them, by the kernel's drop reason and the program's hook.
# TYPE isthmus_datapath_redirect_drops_total counter
isthmus_datapath_redirect_drops_total{hook="pod_ingress",reason="NEIGH_FAILED"} 3
isthmus_datapath_redirect_drops_total{hook="underlay_tc",reason="NOT_SPECIFIED"} 7
isthmus_datapath_redirect_drops_total{hook="underlay_tc",reason="reason_999"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"isthmus_datapath_redirect_drop_tracer", "isthmus_datapath_redirect_drops_total"); err != nil {
		t.Error(err)
	}
	src.attached = false
	c.src = src
	if got := testutil.ToFloat64(gaugeOnly{c}); got != 0 {
		t.Errorf("tracer gauge %v with the tracer detached, want 0", got)
	}
}

// gaugeOnly collects only isthmus_datapath_redirect_drop_tracer of a Collector.
type gaugeOnly struct{ c *Collector }

func (g gaugeOnly) Describe(ch chan<- *prometheus.Desc) { ch <- descTracer }
func (g gaugeOnly) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 64)
	go func() { g.c.Collect(all); close(all) }()
	for m := range all {
		if m.Desc() == descTracer {
			ch <- m
		}
	}
}

// TestWireGuardDeviceKind: the gauge names the implementation in use, both
// kinds exist from the start at 0, and a nil Sync records nothing.
func TestWireGuardDeviceKind(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewSync(reg)
	kinds := func() map[string]float64 {
		t.Helper()
		mf, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range mf {
			if f.GetName() != "isthmus_wireguard_device" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "kind" {
						out[l.GetValue()] = m.GetGauge().GetValue()
					}
				}
			}
		}
		return out
	}
	if got, want := kinds(), map[string]float64{"kernel": 0, "userspace": 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("before a device: %v, want %v", got, want)
	}
	s.WireGuardDevice("userspace")
	if got, want := kinds(), map[string]float64{"kernel": 0, "userspace": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("userspace device: %v, want %v", got, want)
	}
	s.WireGuardDevice("kernel")
	if got, want := kinds(), map[string]float64{"kernel": 1, "userspace": 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("kernel device: %v, want %v", got, want)
	}
	var nilSync *Sync
	nilSync.WireGuardDevice("kernel")
}
