package maps

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/bpf"
)

// Helpers of package maps lent to its external tests (maps_test.go,
// kernel_test.go); they exist only in test builds.

var (
	ConfigFromKernel = configFromKernel
	SlotCounts       = slotCounts
)

// Insert adds one map entry, as Read does.
func (s *State) Insert(m Name, key, value any) error { return s.insert(m, key, value) }

// ResolveHandles names the peers of the IPv6 underlay by their addresses, as Read
// does once every entry is in.
func (s *State) ResolveHandles() { s.resolveHandles() }

// NewKernelSet creates unpinned maps from the object's specs.
func NewKernelSet(t *testing.T) *Set {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test creates BPF maps and needs root; run it as root (sudo go test ./maps)")
	}
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	s := &Set{maps: map[Name]*ebpf.Map{}, own: true}
	t.Cleanup(func() { s.Close() })
	for _, n := range AllMaps {
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create map %s: %v", n, err)
		}
		s.maps[n] = m
	}
	return s
}
