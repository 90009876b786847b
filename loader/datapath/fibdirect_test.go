package datapath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func rule(prio, table int, edit func(*netlink.Rule)) netlink.Rule {
	r := netlink.NewRule()
	r.Family, r.Priority, r.Table, r.Type = unix.AF_INET, prio, table, unix.FR_ACT_TO_TBL
	if edit != nil {
		edit(r)
	}
	return *r
}

func from(cidr string) func(*netlink.Rule) {
	return func(r *netlink.Rule) {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			panic(err)
		}
		r.Src = n
	}
}

// TestDirectFIBRules: only the kernel's three rules and isthmus' own (whose sources
// never hold the underlay address) let the fast path skip the rule walk; any other
// selector, action, table or priority keeps it.
func TestDirectFIBRules(t *testing.T) {
	underlay := netip.MustParseAddr("172.16.1.11")
	kernel := []netlink.Rule{rule(0, unix.RT_TABLE_LOCAL, nil), rule(32766, unix.RT_TABLE_MAIN, nil), rule(32767, unix.RT_TABLE_DEFAULT, nil)}
	mark := uint32(UnderlayFlowMark)
	ours := rule(RulePriority, PodTable, func(r *netlink.Rule) { from("10.244.1.0/24")(r); r.Mask = &mark })
	fabric := rule(FabricRulePriority, FabricTable, from("10.100.0.0/16"))
	for _, tc := range []struct {
		name  string
		extra []netlink.Rule
		want  bool
	}{
		{"the kernel's rules alone", nil, true},
		{"with isthmus' rules", []netlink.Rule{ours, fabric}, true},
		{"an operator's source rule", []netlink.Rule{rule(100, 150, from("10.9.9.0/24"))}, false},
		{"an isthmus table at another priority", []netlink.Rule{rule(150, PodTable, from("10.244.1.0/24"))}, false},
		{"isthmus' priority, another table", []netlink.Rule{rule(RulePriority, 150, from("10.244.1.0/24"))}, false},
		{"isthmus' rule with no source", []netlink.Rule{rule(RulePriority, PodTable, nil)}, false},
		{"isthmus' rule whose source holds the underlay", []netlink.Rule{rule(RulePriority, PodTable, from("172.16.0.0/16"))}, false},
		{"isthmus' rule with an input device", []netlink.Rule{rule(RulePriority, PodTable, func(r *netlink.Rule) { from("10.244.1.0/24")(r); r.IifName = "eth0" })}, false},
		{"a VRF's l3mdev rule", []netlink.Rule{rule(1000, 0, nil)}, false},
		{"a blackhole", []netlink.Rule{rule(500, 0, func(r *netlink.Rule) { r.Type = unix.FR_ACT_BLACKHOLE })}, false},
		{"a mark rule before main", []netlink.Rule{rule(32000, 100, func(r *netlink.Rule) { r.Mark = 0x10 })}, false},
		{"main with a selector", []netlink.Rule{rule(32766, unix.RT_TABLE_MAIN, from("10.0.0.0/8"))}, false},
		{"a destination rule", []netlink.Rule{rule(300, 150, func(r *netlink.Rule) { _, r.Dst, _ = net.ParseCIDR("10.0.0.0/8") })}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := append(append([]netlink.Rule{}, kernel...), tc.extra...)
			got, why := DirectFIBRules(rs, underlay)
			if got != tc.want {
				t.Fatalf("DirectFIBRules = %v (%q), want %v", got, why, tc.want)
			}
			if !got && why == "" {
				t.Error("no reason given")
			}
		})
	}
}
