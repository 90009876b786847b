// Package metrics is the agent's Prometheus side: a Collector that reads the
// datapath's pinned maps at scrape time (per-CPU counters, map fill levels) and
// the health checker's peer states, the sync metrics the agent records, and the
// HTTP handler for /metrics, /healthz and /readyz. docs/metrics.md lists every
// metric.
//
// Nothing here polls: every datapath value is read from the kernel when
// Prometheus scrapes.
package metrics

import (
	"cmp"
	stdmaps "maps"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isthmus-dev/isthmus/loader/buildinfo"
	"github.com/isthmus-dev/isthmus/loader/health"
	"github.com/isthmus-dev/isthmus/maps"
)

// MapLevel is how full one map is: Entries in use out of Capacity (max_entries).
type MapLevel struct {
	Map      maps.Name
	Entries  int
	Capacity int
}

// Source is what the Collector reads at scrape time. Its methods are called from
// the HTTP server's goroutines, one scrape at a time or concurrently.
type Source interface {
	// Counters returns the datapath's per-CPU counters, summed over CPUs.
	Counters() (map[maps.MetricKey]maps.Counter, error)
	// MapLevels returns the fill level of the maps listed in LevelMaps.
	MapLevels() ([]MapLevel, error)
}

// RedirectDropSource is a Source that also reads the kfree_skb tracer's counters:
// packets the kernel freed after a datapath program redirected them, per kernel
// drop reason and hook, and whether the tracer is attached (without it those drops
// go uncounted).
type RedirectDropSource interface {
	RedirectDrops() (counts map[maps.RedirectDrop]maps.Counter, attached bool, err error)
}

var (
	descPackets = prometheus.NewDesc("isthmus_datapath_packets_total",
		"Packets the datapath handled, by event (what it did) and hook (where).", []string{"event", "hook"}, nil)
	descBytes = prometheus.NewDesc("isthmus_datapath_bytes_total",
		"Bytes of the packets counted in isthmus_datapath_packets_total, as the hook saw them.", []string{"event", "hook"}, nil)
	descDrops = prometheus.NewDesc("isthmus_datapath_drops_total",
		"Packets the datapath dropped, by reason and hook.", []string{"reason", "hook"}, nil)
	descDroppedBytes = prometheus.NewDesc("isthmus_datapath_dropped_bytes_total",
		"Bytes of the packets counted in isthmus_datapath_drops_total.", []string{"reason", "hook"}, nil)
	descRedirectDrops = prometheus.NewDesc("isthmus_datapath_redirect_drops_total",
		"Packets the kernel freed after a datapath program redirected them, by the kernel's drop reason and the program's hook.", []string{"reason", "hook"}, nil)
	descRedirectDroppedBytes = prometheus.NewDesc("isthmus_datapath_redirect_dropped_bytes_total",
		"Bytes of the packets counted in isthmus_datapath_redirect_drops_total.", []string{"reason", "hook"}, nil)
	descTracer = prometheus.NewDesc("isthmus_datapath_redirect_drop_tracer",
		"1 if the kfree_skb tracer is attached; 0 if not, and then isthmus_datapath_redirect_drops_total misses every drop.", nil, nil)
	descEntries = prometheus.NewDesc("isthmus_map_entries",
		"Entries in use in a datapath map (nexthop_groups: groups with a member; nat, masq_nat, nat_sources, ct_close, ct_close6: counted by iterating them at scrape time).", []string{"map"}, nil)
	descCapacity = prometheus.NewDesc("isthmus_map_capacity",
		"Maximum entries of a datapath map (max_entries).", []string{"map"}, nil)
	descPeerUp = prometheus.NewDesc("isthmus_peer_up",
		"1 if the peer answers its health checks and, for a remote site (site label), reaches that site; 0 if not. Only next-hop group members are health-checked.", []string{"peer", "site"}, nil)
	descPeerTransitions = prometheus.NewDesc("isthmus_peer_transitions_total",
		"Health state changes of a peer for a remote site since the agent started (state: the state entered).", []string{"peer", "site", "state"}, nil)
	descBuildInfo = prometheus.NewDesc("isthmus_build_info",
		"Always 1; the labels say which build runs: its release, its git commit and its Go version (buildinfo.Get).", []string{"version", "commit", "go_version"}, nil)
)

// Collector is a prometheus.Collector that reads a Source and the peer states at
// every scrape. It is safe for concurrent use if its Source and Peers are.
type Collector struct {
	src   Source
	peers func() []health.PeerState
	// kernelReasons names the running kernel's drop reasons, read from its BTF
	// at the first scrape that needs them.
	kernelReasons func() map[uint32]string
}

// NewCollector returns a Collector over src. peers returns the health checker's
// peer states; nil means there is none (no isthmus_peer_* series).
func NewCollector(src Source, peers func() []health.PeerState) *Collector {
	return &Collector{src: src, peers: peers, kernelReasons: sync.OnceValue(func() map[uint32]string {
		names, _ := maps.KernelDropReasons() // without BTF: reason_<n>
		return names
	})}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPackets, descBytes, descDrops, descDroppedBytes,
		descRedirectDrops, descRedirectDroppedBytes, descTracer, descEntries, descCapacity, descPeerUp, descPeerTransitions, descBuildInfo} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A map that cannot be read becomes an
// invalid metric: the scrape reports the error and still serves the rest.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	bi := buildinfo.Get()
	ch <- prometheus.MustNewConstMetric(descBuildInfo, prometheus.GaugeValue, 1, bi.Release, bi.Commit, bi.GoVersion)

	if cs, err := c.src.Counters(); err != nil {
		ch <- prometheus.NewInvalidMetric(descPackets, err)
	} else {
		keys := sortedKeys(cs, func(a, b maps.MetricKey) int {
			return cmp.Or(cmp.Compare(a.Code, b.Code), cmp.Compare(a.Hook, b.Hook))
		})
		for _, k := range keys {
			v := cs[k]
			pd, bd := descPackets, descBytes
			if k.IsDrop() {
				pd, bd = descDrops, descDroppedBytes
			}
			ch <- prometheus.MustNewConstMetric(pd, prometheus.CounterValue, float64(v.Packets), k.Name(), k.Hook.String())
			ch <- prometheus.MustNewConstMetric(bd, prometheus.CounterValue, float64(v.Bytes), k.Name(), k.Hook.String())
		}
	}

	if rs, ok := c.src.(RedirectDropSource); ok {
		c.collectRedirectDrops(ch, rs)
	}

	if ls, err := c.src.MapLevels(); err != nil {
		ch <- prometheus.NewInvalidMetric(descEntries, err)
	} else {
		for _, l := range ls {
			ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(l.Entries), string(l.Map))
			ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(l.Capacity), string(l.Map))
		}
	}

	if c.peers == nil {
		return
	}
	for _, p := range c.peers() {
		if p.Tracked {
			up := 0.0
			if p.Up {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(descPeerUp, prometheus.GaugeValue, up, p.Name, p.Site)
		}
		ch <- prometheus.MustNewConstMetric(descPeerTransitions, prometheus.CounterValue, float64(p.Ups), p.Name, p.Site, "up")
		ch <- prometheus.MustNewConstMetric(descPeerTransitions, prometheus.CounterValue, float64(p.Downs), p.Name, p.Site, "down")
	}
}

// collectRedirectDrops reports the kfree_skb tracer's counters and whether it runs.
func (c *Collector) collectRedirectDrops(ch chan<- prometheus.Metric, src RedirectDropSource) {
	cs, attached, err := src.RedirectDrops()
	up := 0.0
	if attached {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descTracer, prometheus.GaugeValue, up)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descRedirectDrops, err)
		return
	}
	keys := sortedKeys(cs, func(a, b maps.RedirectDrop) int {
		return cmp.Or(cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Hook, b.Hook))
	})
	names := c.kernelReasons()
	for _, k := range keys {
		reason := maps.KernelDropReasonName(names, k.Reason)
		ch <- prometheus.MustNewConstMetric(descRedirectDrops, prometheus.CounterValue, float64(cs[k].Packets), reason, k.Hook.String())
		ch <- prometheus.MustNewConstMetric(descRedirectDroppedBytes, prometheus.CounterValue, float64(cs[k].Bytes), reason, k.Hook.String())
	}
}

// sortedKeys returns the keys of m ordered by compare, so a scrape lists the series
// in a stable order.
func sortedKeys[K comparable, V any](m map[K]V, compare func(a, b K) int) []K {
	return slices.SortedFunc(stdmaps.Keys(m), compare)
}
