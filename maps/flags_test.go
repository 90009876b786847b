package maps

import (
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestConfigFlagsMatchHeader: the Go mirrors of the CFG_F_*, HEALTH_F_*, PEER_F_* and ROUTE_F_*
// defines carry the values bpf/lib/types.h gives them.
func TestConfigFlagsMatchHeader(t *testing.T) {
	src, err := os.ReadFile("../bpf/lib/types.h")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint32{"CFG_F_TRANSIT": ConfigFlagTransit, "CFG_F_TRACE": ConfigFlagTrace,
		"CFG_F_MASQUERADE": ConfigFlagMasquerade, "CFG_F_FABRIC_EGRESS": ConfigFlagFabricEgress,
		"CFG_F_FIB_DIRECT": ConfigFlagFIBDirect,
		"HEALTH_F_REACHES": HealthFlagReaches, "ROUTE_F_VIA_FABRIC": RouteFlagViaFabric, "ROUTE_F_UNDERLAY": RouteFlagUnderlay,
		"ROUTE_F_NOT_FOR_PODS": RouteFlagNotForPods,
		"PEER_F_WIREGUARD":     PeerFlagWireGuard, "PEER_F_WIREGUARD_NO_KEY": PeerFlagWireGuardNoKey,
		"PEER_F_UNDERLAY6": PeerFlagUnderlay6}
	re := regexp.MustCompile(`#define\s+((?:CFG|HEALTH|PEER|ROUTE)_F_\w+)\s+\(1 << (\d+)\)`)
	found := map[string]uint32{}
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		bit, _ := strconv.Atoi(m[2])
		found[m[1]] = 1 << bit
	}
	if len(found) != len(want) {
		t.Errorf("types.h defines %v, Go mirrors %v", found, want)
	}
	for name, v := range want {
		if found[name] != v {
			t.Errorf("%s: types.h %#x, Go %#x", name, found[name], v)
		}
	}
}

// TestDescribeException: a routes entry with ROUTE_F_UNDERLAY reads as the
// exception it is in a transcript, not as a route to 0.0.0.0.
func TestDescribeException(t *testing.T) {
	got := Describe(MapRoutes, RouteKey{Prefixlen: 32, Addr: AddrToBE32(netip.MustParseAddr("172.16.3.10"))}, RouteValue{Flags: RouteFlagUnderlay})
	if want := "routes 172.16.3.10/32 -> underlay (exception) flags=0x2"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
}
