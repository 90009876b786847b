package maps

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/isthmus-dev/isthmus/bpf"
)

// TestMetricNamesMatchBTF checks metricNames against enum metric in the BTF of the
// compiled object: every enumerator has a name (its C name without METRIC_, lower
// case) under its value, and the table names nothing the object lacks.
func TestMetricNamesMatchBTF(t *testing.T) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("metric", &enum); err != nil {
		t.Fatalf("find enum metric in BTF: %v", err)
	}
	seen := map[uint16]bool{}
	for _, v := range enum.Values {
		code := uint16(v.Value)
		seen[code] = true
		want := strings.ToLower(strings.TrimPrefix(v.Name, "METRIC_"))
		if got, ok := metricNames[code]; !ok {
			t.Errorf("%s = %d is in the object but not in metricNames", v.Name, code)
		} else if got != want {
			t.Errorf("%s = %d: metricNames says %q, want %q", v.Name, code, got, want)
		}
		if _, isDrop := DropReasonByCode(-int32(code)); isDrop {
			t.Errorf("%s = %d collides with a drop reason's counter code", v.Name, code)
		}
	}
	for code, name := range metricNames {
		if !seen[code] {
			t.Errorf("metricNames[%d] = %q is not in the object's enum metric", code, name)
		}
	}
}

// TestMetricSlotsCoverBTF: every enumerator of enum hook, enum metric and enum
// drop_reason in the compiled object has a slot of its own in the metrics array
// (the C side asserts it for the last enumerator of each), and MetricSlot and
// MetricKeyOfSlot are each other's inverse on every slot.
func TestMetricSlotsCoverBTF(t *testing.T) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	enum := func(name string) *btf.Enum {
		var e *btf.Enum
		if err := spec.Types.TypeByName(name, &e); err != nil {
			t.Fatalf("find enum %s in BTF: %v", name, err)
		}
		return e
	}
	for _, v := range enum("hook").Values {
		if v.Value >= uint64(MetricHooks) {
			t.Errorf("%s = %d has no row in metrics (MetricHooks %d)", v.Name, v.Value, MetricHooks)
		}
	}
	for _, v := range enum("metric").Values {
		if v.Value >= uint64(MetricCodes) {
			t.Errorf("%s = %d has no slot in metrics (MetricCodes %d)", v.Name, v.Value, MetricCodes)
		}
	}
	for _, v := range enum("drop_reason").Values {
		if code := -int64(int32(uint32(v.Value))); code <= 0 || code >= int64(MetricCodes) {
			t.Errorf("%s counts as code %d, which has no slot in metrics (MetricCodes %d)", v.Name, code, MetricCodes)
		}
	}
	if ms := spec.Maps[string(MapMetrics)]; ms == nil || ms.MaxEntries != MetricHooks*MetricCodes+1 {
		t.Errorf("metrics spec %+v, want %d hooks of %d codes and the out-of-range slot", ms, MetricHooks, MetricCodes)
	}
	for i := range MetricSlots {
		k := MetricKeyOfSlot(i)
		if got := MetricSlot(k); got != i {
			t.Errorf("slot %d reads as %+v, whose slot is %d", i, k, got)
		}
	}
	for _, c := range []struct {
		k    MetricKey
		want MetricKey
	}{
		{MetricKey{Code: 137, Hook: HookUnderlayXDP}, MetricKey{Code: 137, Hook: HookUnderlayXDP}},
		{MetricKey{Code: 300, Hook: HookPodIngress}, MetricKey{Code: MetricCodeOutOfRange, Hook: HookPodIngress}},
		{MetricKey{Code: 2, Hook: 200}, MetricKey{Code: MetricCodeOutOfRange, Hook: HookOutOfRange}},
	} {
		if got := MetricKeyOfSlot(MetricSlot(c.k)); got != c.want {
			t.Errorf("%+v counts as %+v, want %+v", c.k, got, c.want)
		}
	}
	if n, h := (MetricKey{Code: MetricCodeOutOfRange, Hook: HookOutOfRange}).Name(), HookOutOfRange.String(); n != "out_of_range" || h != "out_of_range" {
		t.Errorf("the out-of-range slot reads as %s at %s", n, h)
	}
}
