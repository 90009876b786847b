package metrics

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/bpf"
	"github.com/isthmus-dev/isthmus/maps"
)

// TestLevelMapsCoverDatapath: every map of the datapath that holds entries is
// reported by isthmus_map_entries, and countEntries reads each with the key and
// value types of its C struct (an empty map of the real spec counts 0, without a
// size error). Unpinned maps, arrays whose slots always exist, per-CPU maps (counters, the redirect
// notes) and the ring are not levels.
func TestLevelMapsCoverDatapath(t *testing.T) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	var held []maps.Name
	for name, m := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue // .rodata, .bss: the programs' globals
		}
		if m.Pinning != ebpf.PinByName {
			continue // unpinned (ct_close, ct_clock): no other process can open them
		}
		switch m.Type {
		case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.RingBuf:
			continue
		case ebpf.Array:
			if maps.Name(name) != maps.MapNexthopGroups {
				continue
			}
		}
		held = append(held, maps.Name(name))
		if !slices.Contains(LevelMaps, maps.Name(name)) {
			t.Errorf("map %s (%v) holds entries but is not in LevelMaps", name, m.Type)
		}
	}
	for _, n := range LevelMaps {
		if !slices.Contains(held, n) {
			t.Errorf("LevelMaps lists %s, which the datapath does not have", n)
		}
	}

	if os.Geteuid() != 0 {
		t.Fatalf("creating the datapath's maps to count them needs root (euid %d)", os.Geteuid())
	}
	for _, n := range LevelMaps {
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinNone
		ms.MaxEntries = 64
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create map %s: %v", n, err)
		}
		c, err := countEntries(n, m)
		m.Close()
		if err != nil || c != 0 {
			t.Errorf("countEntries(%s) on an empty map = %d, %v; want 0, nil", n, c, err)
		}
	}
}
