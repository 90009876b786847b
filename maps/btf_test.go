package maps

import (
	"encoding/binary"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/isthmus-dev/isthmus/bpf"
)

// TestDropReasonsMatchBTF checks the Go table against enum drop_reason in the BTF of
// the compiled object: same enumerators, same values, nothing missing either way.
func TestDropReasonsMatchBTF(t *testing.T) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("drop_reason", &enum); err != nil {
		t.Fatalf("find enum drop_reason in BTF: %v", err)
	}
	inBTF := map[string]int32{}
	for _, v := range enum.Values {
		// Negative values are stored sign-extended (signed enum) or as their 32-bit
		// two's complement (unsigned): truncating to int32 reads both.
		inBTF[v.Name] = int32(v.Value)
	}
	names := map[string]bool{}
	for _, r := range dropReasons {
		got, ok := inBTF[r.Const]
		if !ok {
			t.Errorf("%s is in maps/dropreasons.go but not in the object's drop_reason", r.Const)
			continue
		}
		if got != r.Code {
			t.Errorf("%s: Go table says %d, BTF says %d", r.Const, r.Code, got)
		}
		if want := strings.ToLower(strings.TrimPrefix(r.Const, "DROP_")); r.Name != want {
			t.Errorf("%s: name %q, want %q", r.Const, r.Name, want)
		}
		if names[r.Name] {
			t.Errorf("name %q used twice", r.Name)
		}
		names[r.Name] = true
		if r.Description == "" {
			t.Errorf("%s has no description", r.Const)
		}
	}
	for name, v := range inBTF {
		if _, ok := DropReasonByCode(v); !ok {
			t.Errorf("%s = %d is in the object but not in maps/dropreasons.go", name, v)
		}
	}
}

// TestTypesMatchBTF checks that each map's Go key and value types have the size of
// the BTF types in the spec, and that every named C member sits at the offset of the
// Go field of the same name.
func TestTypesMatchBTF(t *testing.T) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	cases := []struct {
		m          Name
		key, value any
	}{
		{MapRoutes, RouteKey{}, RouteValue{}},
		{MapPeers, uint32(0), PeerValue{}},
		{MapPeerSources, PeerSourceKey{}, PeerSourceValue{}},
		{MapConfig, uint32(0), DatapathConfig{}},
		{MapPodIfaces, uint32(0), PodIfaceValue{}},
		{MapMetrics, uint32(0), MetricsValue{}},
		{MapNexthopGroups, uint32(0), NexthopGroupValue{}},
		{MapFabricPrefixes, RouteKey{}, FabricPrefixValue{}},
		{MapSNATExempt, RouteKey{}, SNATExemptValue{}},
		{MapNat, NatKey{}, NatValue{}},
		{MapHealthReach, HealthKey{}, HealthReachValue{}},
		{MapHealthProbers, HealthProberKey{}, HealthProberValue{}},
		{MapMasqExempt, RouteKey{}, MasqExemptValue{}},
		{MapPodAddrs, PodAddrKey{}, PodAddrValue{}},
		{MapPodAddrs6, PodAddr6Key{}, PodAddrValue{}},
		{MapRedirectLast, uint32(0), RedirectSlot{}},
		{MapRedirectDrops, RedirectDropKey{}, MetricsValue{}},
		{MapMasqNat, NatKey{}, NatValue{}},
		{MapNatSources, NatSourceKey{}, NatSourceValue{}},
		{MapCtClose, CtCloseKey{}, CtCloseValue{}},
		{MapCtClose6, CtClose6Key{}, CtCloseValue{}},
		{MapRoutes6, Route6Key{}, RouteValue{}},
		{MapPeerSources6, PeerSource6Key{}, PeerSourceValue{}},
		{MapPeers6, Peer6Key{}, Peer6Value{}},
	}
	if len(cases) != len(AllMaps) {
		t.Errorf("%d maps checked, AllMaps has %d: add the new one here", len(cases), len(AllMaps))
	}
	if n := len(NexthopGroupValue{}.Slots); n != NHGSlots {
		t.Errorf("struct nexthop_group has %d slots, NHGSlots is %d", n, NHGSlots)
	}
	if ms := spec.Maps[string(MapMetrics)]; ms == nil || ms.MaxEntries != MetricSlots {
		t.Errorf("metrics spec %+v, want %d entries (MetricSlots)", ms, MetricSlots)
	}
	if ms := spec.Maps[string(MapNexthopGroups)]; ms == nil || ms.MaxEntries != MaxGroupID+1 {
		t.Errorf("nexthop_groups spec %+v, want %d entries (MaxGroupID+1)", ms, MaxGroupID+1)
	}
	for _, c := range cases {
		ms, ok := spec.Maps[string(c.m)]
		if !ok {
			t.Errorf("map %s is not in the object", c.m)
			continue
		}
		if ms.Key == nil || ms.Value == nil {
			t.Errorf("map %s has no BTF key or value type", c.m)
			continue
		}
		checkType(t, string(c.m)+" key", ms.Key, c.key)
		checkType(t, string(c.m)+" value", ms.Value, c.value)
		if int(ms.KeySize) != binary.Size(c.key) || int(ms.ValueSize) != binary.Size(c.value) {
			t.Errorf("map %s: spec sizes %d/%d, Go %d/%d", c.m, ms.KeySize, ms.ValueSize, binary.Size(c.key), binary.Size(c.value))
		}
	}
}

func checkType(t *testing.T, what string, bt btf.Type, goValue any) {
	t.Helper()
	size, err := btf.Sizeof(bt)
	if err != nil {
		t.Errorf("%s: size of BTF type: %v", what, err)
		return
	}
	if got := binary.Size(goValue); got != size {
		t.Errorf("%s: Go %T is %d bytes, BTF %s is %d", what, goValue, got, bt, size)
	}
	st, ok := btf.UnderlyingType(bt).(*btf.Struct)
	if !ok {
		return
	}
	rt := reflect.TypeOf(goValue)
	for _, m := range st.Members {
		if m.Name == "" {
			continue
		}
		f, ok := rt.FieldByName(goName(m.Name))
		if !ok {
			t.Errorf("%s: C member %s has no Go field %s in %T", what, m.Name, goName(m.Name), goValue)
			continue
		}
		if off := uint32(m.Offset.Bytes()); uint32(f.Offset) != off {
			t.Errorf("%s: %s at offset %d in C, %d in Go", what, m.Name, off, f.Offset)
		}
	}
}

// goName is bpf2go's field name for a C member: snake_case to CamelCase.
func goName(c string) string {
	var b strings.Builder
	for part := range strings.SplitSeq(c, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}
