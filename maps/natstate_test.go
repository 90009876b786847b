package maps

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/isthmus-dev/isthmus/bpf"
)

// TestNatStatesMatchBTF checks the Go NatState* constants and their names against
// enum nat_state in the object's BTF, and that the half-closed states keep the
// established timeout, as ct_timeout in bpf/lib/conntrack.h.
func TestNatStatesMatchBTF(t *testing.T) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("nat_state", &enum); err != nil {
		t.Fatalf("find enum nat_state in BTF: %v", err)
	}
	want := map[string]uint8{
		"NAT_STATE_NEW": NatStateNew, "NAT_STATE_ESTABLISHED": NatStateEstablished,
		"NAT_STATE_CLOSING": NatStateClosing, "NAT_STATE_FIN_ORIG": NatStateFinOrig,
		"NAT_STATE_FIN_REPLY": NatStateFinReply, "NAT_STATE_RST": NatStateRST,
		"NAT_STATE_RST_ORIG": NatStateRSTOrig, "NAT_STATE_RST_REPLY": NatStateRSTReply,
	}
	if len(enum.Values) != len(want) {
		t.Errorf("BTF has %d nat states, Go %d", len(enum.Values), len(want))
	}
	for _, v := range enum.Values {
		g, ok := want[v.Name]
		if !ok || uint64(g) != v.Value {
			t.Errorf("%s = %d in BTF, Go has %d (known %v)", v.Name, v.Value, g, ok)
			continue
		}
		if name := NatStateName(g); strings.HasPrefix(name, "state_") {
			t.Errorf("%s has no name (%q)", v.Name, name)
		}
	}
	for _, s := range []uint8{NatStateFinOrig, NatStateFinReply} {
		if got := NatTimeout(ProtoTCP, s); got != NatTCPEstTimeout {
			t.Errorf("TCP %s times out after %v, want the established %v", NatStateName(s), got, NatTCPEstTimeout)
		}
	}
	for _, s := range []uint8{NatStateRST, NatStateRSTOrig, NatStateRSTReply} {
		if got := NatTimeout(ProtoTCP, s); got != NatTCPClosingTimeout {
			t.Errorf("TCP %s times out after %v, want the closing %v", NatStateName(s), got, NatTCPClosingTimeout)
		}
	}
}
