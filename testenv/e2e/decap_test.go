package e2e

import (
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// decapModes are the underlay decapsulation modes every scenario test runs in:
// tc is what `--decap auto` picks on the lab's veths, xdp what it picks on a
// physical NIC, so a site on real hardware runs the second.
var decapModes = []string{"tc", "xdp"}

// eachDecap runs body once per decapsulation mode, as subtests named after the
// mode. body brings its lab up with the scenario's Decap set to the mode it is
// given; upLab then checks, when the subtest ends, that the mode was in effect
// (checkDecapMode).
func eachDecap(t *testing.T, body func(t *testing.T, decap string)) {
	t.Helper()
	for _, d := range decapModes {
		t.Run(d, func(t *testing.T) { body(t, d) })
	}
}

// checkDecapMode fails the test unless the lab decapsulated in the mode its
// scenario names, judged on what the test's traffic did to the counters and on
// what the kernel has attached:
//
//   - xdp: every node's eth0 has underlay_xdp attached in driver mode through
//     the agent's pinned link (bpftool net show and the link agree), and the
//     lab's METRIC_DECAP on the XDP hook is larger than on the TC hook.
//     underlay_xdp leaves transit, expiring TTLs and UDP to the tunnel address
//     (a health probe or its answer) to TC, so a node that receives only
//     health answers (a member behind its site's gateways) decapsulates at TC
//     alone; but pod traffic outweighs them in every scenario.
//   - tc: no node has an XDP program on eth0, METRIC_DECAP on the XDP hook is 0
//     everywhere, and the lab's METRIC_DECAP on the TC hook is not 0.
//
// It logs each node's decapsulations per hook.
func checkDecapMode(t *testing.T, l *testenv.Lab) {
	t.Helper()
	mode := l.Scenario.Decap
	var labXDP, labTC uint64
	var report []string
	for _, n := range l.Scenario.Nodes() {
		node := n.Name
		c := nodeMetrics(t, l, node)
		xdp, tc := packets(c, metricDecap, maps.HookUnderlayXDP), packets(c, metricDecap, maps.HookUnderlayTC)
		labXDP += xdp
		labTC += tc
		report = append(report, node+" xdp "+strconv.FormatUint(xdp, 10)+" tc "+strconv.FormatUint(tc, 10))

		var xdpID uint32
		var xdpMode string
		for _, e := range bpftoolNetShow(t, l, l.NodeNS(node), testenv.UnderlayDev) {
			for _, x := range e.XDP {
				if x.Devname == testenv.UnderlayDev {
					xdpID, xdpMode = x.ID, x.Mode
				}
			}
		}
		switch mode {
		case "xdp":
			if xdpID == 0 {
				t.Errorf("decap xdp: %s: bpftool net show finds no XDP program on %s", node, testenv.UnderlayDev)
				continue
			}
			if xdpMode != "driver" {
				t.Errorf("decap xdp: %s: XDP on %s in mode %q, want driver (native)", node, testenv.UnderlayDev, xdpMode)
			}
			info := linkInfo(t, datapath.LinkPin(l.PinDir(node), testenv.UnderlayDev, datapath.HookUnderlayXDP))
			if info.Type != link.XDPType || uint32(info.Program) != xdpID {
				t.Errorf("decap xdp: %s: pinned XDP link is type %v with program %d, bpftool shows program %d on %s",
					node, info.Type, info.Program, xdpID, testenv.UnderlayDev)
			}
		case "tc":
			if xdpID != 0 {
				t.Errorf("decap tc: %s: XDP program %d (mode %s) attached to %s", node, xdpID, xdpMode, testenv.UnderlayDev)
			}
			if xdp != 0 {
				t.Errorf("decap tc: %s: METRIC_DECAP on underlay_xdp is %d", node, xdp)
			}
		}
	}
	t.Logf("decap %s: METRIC_DECAP per node: %s", mode, strings.Join(report, ", "))
	switch {
	case mode == "xdp" && labXDP <= labTC:
		t.Errorf("decap xdp: the nodes decapsulated %d packets in XDP and %d at TC: XDP popped less than TC", labXDP, labTC)
	case mode == "tc" && labTC == 0:
		t.Errorf("decap tc: no node decapsulated anything at TC: the test sent nothing through a tunnel")
	}
}
