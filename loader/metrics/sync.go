package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sync holds the metrics of the agent's syncs. A nil *Sync records nothing.
type Sync struct {
	duration    prometheus.Histogram
	eventToMaps prometheus.Histogram
	written     prometheus.Counter
	syncs       *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	rejected    *prometheus.GaugeVec
	wireGuard   *prometheus.GaugeVec
}

// WireGuard implementations, the values of isthmus_wireguard_device's kind.
var wireGuardKinds = []string{"kernel", "userspace"}

// NewSync returns the sync metrics, registered with reg.
func NewSync(reg prometheus.Registerer) *Sync {
	s := &Sync{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "isthmus_sync_duration_seconds",
			Help: "Time a sync took: objects read (on reload), maps diffed and written, routes synced.",
			// A sync of a small site takes about a millisecond; of a large one, with
			// the Kubernetes objects re-read, up to seconds.
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9),
		}),
		eventToMaps: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "isthmus_event_to_maps_seconds",
			Help: "Time from the first object change of a read (its file event or informer event reaching the agent's source) to the last map write of the sync that applied it.",
			// A lone change waits source.Settle (10 ms) and a sync; a change
			// within a burst up to the burst's maximum wait (1 s) and a sync.
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 11),
		}),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isthmus_sync_entries_written_total",
			Help: "Map entries written (updated or deleted) by syncs.",
		}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isthmus_syncs_total",
			Help: "Syncs, by result (ok or error).",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isthmus_sync_last_success_timestamp_seconds",
			Help: "Unix time of the end of the last successful sync (0: none yet).",
		}),
		rejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isthmus_objects_rejected",
			Help: "Objects set aside by validation at the last read, by kind (unnamed: a document that does not decode); the agent logs the reasons.",
		}, []string{"kind"}),
		wireGuard: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isthmus_wireguard_device",
			Help: "1 for the implementation of the node's WireGuard device (kind kernel, or userspace: wireguard-go, where the kernel has no wireguard module; it costs more CPU per packet), 0 for the other; both 0 while the node has no device.",
		}, []string{"kind"}),
	}
	for _, k := range wireGuardKinds {
		s.wireGuard.WithLabelValues(k)
	}
	// Both results exist from the start, so rate() sees the first error.
	s.syncs.WithLabelValues("ok")
	s.syncs.WithLabelValues("error")
	reg.MustRegister(s.duration, s.eventToMaps, s.written, s.syncs, s.lastSuccess, s.rejected, s.wireGuard)
	return s
}

// Observe records one sync that took d, wrote written entries and ended at end
// with err.
func (s *Sync) Observe(d time.Duration, written int, end time.Time, err error) {
	if s == nil {
		return
	}
	s.duration.Observe(d.Seconds())
	s.written.Add(float64(written))
	if err != nil {
		s.syncs.WithLabelValues("error").Inc()
		return
	}
	s.syncs.WithLabelValues("ok").Inc()
	s.lastSuccess.Set(float64(end.UnixNano()) / 1e9)
}

// EventToMaps records that the objects changed d before the last map write
// of the sync that applied the change.
func (s *Sync) EventToMaps(d time.Duration) {
	if s == nil {
		return
	}
	s.eventToMaps.Observe(d.Seconds())
}

// Rejected records the objects set aside at the last read, by kind; kinds
// not in byKind read 0.
func (s *Sync) Rejected(byKind map[string]int) {
	if s == nil {
		return
	}
	s.rejected.Reset()
	for _, k := range []string{"Site", "SitePeering", "GatewayPool", "SiteGatewayPoolAssignment", "Node"} {
		s.rejected.WithLabelValues(k)
	}
	for k, n := range byKind {
		s.rejected.WithLabelValues(k).Set(float64(n))
	}
}

// WireGuardDevice records the implementation of the node's WireGuard device:
// "kernel" or "userspace"; "" for none.
func (s *Sync) WireGuardDevice(kind string) {
	if s == nil {
		return
	}
	setOneOf(s.wireGuard, wireGuardKinds, kind)
}

// setOneOf sets g's series of label value on to 1 and those of the other values
// to 0: a state gauge, one series per possible state.
func setOneOf(g *prometheus.GaugeVec, values []string, on string) {
	for _, v := range values {
		x := 0.0
		if v == on {
			x = 1
		}
		g.WithLabelValues(v).Set(x)
	}
}
