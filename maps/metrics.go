package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/bpf"
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
	// HookWireGuardIngress is TC ingress on the WireGuard device (decrypted GENEVE
	// of encrypted peers).
	HookWireGuardIngress Hook = 5
	// HookOutOfRange is no hook: the hook of the metrics slot that counts a hook
	// the array has no row for (METRIC_HOOKS in enum metric_slots).
	HookOutOfRange Hook = Hook(bpf.IsthmusMetricSlotsMETRIC_HOOKS)
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
	case HookWireGuardIngress:
		return "wireguard_ingress"
	case HookOutOfRange:
		return "out_of_range"
	}
	return fmt.Sprintf("hook_%d", uint8(h))
}

// The accounted verdicts of enum metric in bpf/lib/types.h, by code.
var metricNames = map[uint16]string{
	0:  "out_of_range",
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
	19: "wireguard_sent",
}

// MetricKey identifies one counter: a code (METRIC_* or -DROP_*) at a hook, as
// struct metrics_key does; the metrics map holds it at MetricSlot.
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

// The shape of the metrics array (enum metric_slots in bpf/lib/types.h): a slot per
// (hook, code) below (MetricHooks, MetricCodes), and one last slot for a hook out
// of range.
const (
	MetricCodes = uint32(bpf.IsthmusMetricSlotsMETRIC_CODES)
	MetricHooks = uint32(bpf.IsthmusMetricSlotsMETRIC_HOOKS)
	// MetricSlots is the number of entries of the metrics map.
	MetricSlots = uint32(bpf.IsthmusMetricSlotsMETRIC_SLOTS)
	// MetricCodeOutOfRange (METRIC_OUT_OF_RANGE) counts, at its hook, a code the
	// array has no slot for.
	MetricCodeOutOfRange = uint16(bpf.IsthmusMetricMETRIC_OUT_OF_RANGE)
)

// MetricSlot returns the index of the metrics slot that counts k, as metrics_slot
// in bpf/lib/metrics.h computes it: a code or hook out of range gives the slot that
// counts it as out of range.
func MetricSlot(k MetricKey) uint32 {
	if uint32(k.Hook) >= MetricHooks {
		return uint32(bpf.IsthmusMetricSlotsMETRIC_SLOT_HOOK_OUT_OF_RANGE)
	}
	code := uint32(k.Code)
	if code >= MetricCodes {
		code = uint32(MetricCodeOutOfRange)
	}
	return uint32(k.Hook)*MetricCodes + code
}

// MetricKeyOfSlot returns what slot i of the metrics map counts (the inverse of
// MetricSlot on the keys it does not fold): the last slot reads as
// MetricCodeOutOfRange at HookOutOfRange.
func MetricKeyOfSlot(i uint32) MetricKey {
	return MetricKey{Code: uint16(i % MetricCodes), Hook: Hook(i / MetricCodes)}
}

// ReadMetrics returns every non-zero counter of the per-CPU metrics map m (an
// array indexed by MetricSlot), summed over CPUs. A counter that never moved is
// absent. The array is read in batches (Linux 5.6; a lookup per slot would cost
// about 10 ms a read).
func ReadMetrics(m *ebpf.Map) (map[MetricKey]Counter, error) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("read map %s: %w", MapMetrics, err)
	}
	out := map[MetricKey]Counter{}
	add := func(i uint32, vs []MetricsValue) {
		var c Counter
		for _, v := range vs {
			c.Packets += v.Packets
			c.Bytes += v.Bytes
		}
		if c != (Counter{}) {
			out[MetricKeyOfSlot(i)] = c
		}
	}
	n := int(m.MaxEntries())
	keys, vals := make([]uint32, n), make([]MetricsValue, n*ncpu)
	var cursor ebpf.MapBatchCursor
	for {
		got, err := m.BatchLookup(&cursor, keys, vals, nil)
		for j := range got {
			add(keys[j], vals[j*ncpu:(j+1)*ncpu])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return out, nil // past the last slot
		case err != nil:
			return nil, fmt.Errorf("read map %s: %w", MapMetrics, err)
		case got == 0:
			return out, nil
		}
	}
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
