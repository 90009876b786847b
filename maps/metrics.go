package maps

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// Hook is where a program runs: the hook field of a metrics key (enum hook).
type Hook uint8

// The hooks of enum hook in bpf/lib/types.h.
const (
	HookPodIngress    Hook = 0
	HookOverlayEgress Hook = 1
	HookUnderlayTC    Hook = 2
	HookUnderlayXDP   Hook = 3
	// HookUnderlayEgress is TC egress on the underlay device (egress masquerade).
	HookUnderlayEgress Hook = 4
)

func (h Hook) String() string {
	switch h {
	case HookPodIngress:
		return "pod_ingress"
	case HookOverlayEgress:
		return "overlay_egress"
	case HookUnderlayTC:
		return "underlay_tc"
	case HookUnderlayXDP:
		return "underlay_xdp"
	case HookUnderlayEgress:
		return "underlay_egress"
	}
	return fmt.Sprintf("hook_%d", uint8(h))
}

// The accounted verdicts of enum metric in bpf/lib/types.h, by code.
var metricNames = map[uint16]string{
	1:  "encap",
	2:  "decap",
	3:  "deliver_pod",
	4:  "deliver_host",
	5:  "frag_needed_sent",
	6:  "deliver_fabric",
	7:  "snat",
	8:  "snat_reverse",
	9:  "snat_new",
	10: "fabric_ingress",
	11: "transit",
	12: "time_exceeded_sent",
	13: "no_path_unreach_sent",
	14: "health_answered",
	15: "health_expired",
	16: "masq",
	17: "masq_reverse",
	18: "ct_fast",
}

// MetricKey identifies one counter: a code (METRIC_* or -DROP_*) at a hook.
type MetricKey struct {
	Code uint16
	Hook Hook
}

// Name returns the counter's code as a short name: a verdict such as "encap" or a
// drop reason such as "unknown_peer".
func (k MetricKey) Name() string {
	if n, ok := metricNames[k.Code]; ok {
		return n
	}
	if r, ok := DropReasonByCode(-int32(k.Code)); ok {
		return r.Name
	}
	return fmt.Sprintf("code_%d", k.Code)
}

// IsDrop reports whether the counter counts drops.
func (k MetricKey) IsDrop() bool {
	_, ok := DropReasonByCode(-int32(k.Code))
	return ok
}

// Counter is a packet and byte count summed over every CPU.
type Counter struct {
	Packets, Bytes uint64
}

// ReadMetrics returns every counter of the per-CPU metrics map m, summed over CPUs.
func ReadMetrics(m *ebpf.Map) (map[MetricKey]Counter, error) {
	return readCounters(m, MapMetrics, func(k MetricsKey) MetricKey {
		return MetricKey{Code: k.Code, Hook: Hook(k.Hook)}
	})
}

// readCounters returns every entry of the per-CPU map m (called n), whose values
// are MetricsValue, summed over CPUs under the key conv gives its raw key K.
func readCounters[K, O comparable](m *ebpf.Map, n Name, conv func(K) O) (map[O]Counter, error) {
	out := map[O]Counter{}
	var (
		k  K
		vs []MetricsValue
	)
	it := m.Iterate()
	for it.Next(&k, &vs) {
		var c Counter
		for _, v := range vs {
			c.Packets += v.Packets
			c.Bytes += v.Bytes
		}
		out[conv(k)] = c
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read map %s: %w", n, err)
	}
	return out, nil
}
