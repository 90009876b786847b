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
