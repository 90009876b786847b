package agent

import (
	"bytes"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

// TestRoutesSplitsByTable: the main table gets the routes the host takes
// (from the tunnel address, an UnderlaySource one from the InternalIP), the
// pods' table the TransitOnly ones and a throw route for each Underlay
// exception (so a pod's lookup goes on to main and the underlay), and a node
// without TunnelSources, whose pods no rule sends there, no pods' table.
func TestRoutesSplitsByTable(t *testing.T) {
	p := netip.MustParsePrefix
	tunnel, underlay := netip.MustParseAddr("10.10.1.1"), netip.MustParseAddr("172.16.1.11")
	gw := []plan.NextHop{{Peer: "g", Via: netip.MustParseAddr("172.16.1.10")}}
	a := &Agent{overlay: datapath.Overlay{Ifindex: 9}, plan: &plan.NodePlan{
		TunnelAddr:    tunnel,
		Underlay:      underlay,
		TunnelSources: []netip.Prefix{p("10.10.1.0/24")},
		Routes: []plan.Route{
			{Prefix: p("10.20.0.0/16"), Group: gw, Site: "b"},
			{Prefix: p("172.16.2.0/24"), Group: gw, Site: "b", TransitOnly: true},
			{Prefix: p("172.16.2.10/32"), TransitOnly: true, Underlay: true},
			{Prefix: p("172.16.3.0/24"), Group: gw, Site: "c", UnderlaySource: true},
		},
	}}
	main, pods := a.routes()
	wantMain := []datapath.Route{{Prefix: p("10.20.0.0/16"), Ifindex: 9, Src: tunnel}, {Prefix: p("172.16.3.0/24"), Ifindex: 9, Src: underlay}}
	wantPods := []datapath.Route{{Prefix: p("172.16.2.0/24"), Ifindex: 9, Src: tunnel}, {Prefix: p("172.16.2.10/32"), Throw: true}}
	if !slices.EqualFunc(wantMain, main, datapath.Route.Equal) {
		t.Errorf("main %v, want %v", main, wantMain)
	}
	if !slices.EqualFunc(wantPods, pods, datapath.Route.Equal) {
		t.Errorf("pods' table %v, want %v", pods, wantPods)
	}
	a.plan.TunnelSources = nil
	if main, pods := a.routes(); len(pods) != 0 || len(main) != 2 {
		t.Errorf("without TunnelSources: main %v, pods' table %v; want two routes and none", main, pods)
	}
}

// TestRoutesLeaveIPv6BelowMinimumMTU: with a tunnel MTU below IPv6's 1280 the
// kernel has no IPv6 on isthmus0, so routes leaves the IPv6 routes out (one
// refused route would fail the whole sync, IPv4 included) and says so once per
// MTU; at 1280 they are there.
func TestRoutesLeaveIPv6BelowMinimumMTU(t *testing.T) {
	p := netip.MustParsePrefix
	var logged bytes.Buffer
	a := &Agent{log: slog.New(slog.NewTextHandler(&logged, nil)), overlay: datapath.Overlay{Ifindex: 9, MTU: 1200}, plan: &plan.NodePlan{
		TunnelAddr: netip.MustParseAddr("10.10.1.1"),
		Routes: []plan.Route{
			{Prefix: p("10.20.0.0/16"), Peer: "b"},
			{Prefix: p("fd00:b::/32"), Peer: "b"},
		},
	}}
	for range 2 {
		main, _ := a.routes()
		if len(main) != 1 || main[0].Prefix != p("10.20.0.0/16") {
			t.Errorf("MTU 1200: routes %v, want the IPv4 one alone", main)
		}
	}
	if n := strings.Count(logged.String(), "below IPv6's minimum"); n != 1 {
		t.Errorf("said %d times that IPv6 is not carried, want once:\n%s", n, logged.String())
	}
	a.overlay.MTU = minIPv6MTU
	if main, _ := a.routes(); len(main) != 2 {
		t.Errorf("MTU 1280: routes %v, want both families", main)
	}
}
