package datapath

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestPodTableThrowRoute: in the pods' table, a throw route for an address
// inside a transit-only prefix sends a pod's lookup on to main (the
// underlay), while the rest of the prefix goes into the overlay device; the
// sync reads the throw route back as it wrote it. The pods' rule passes over
// a packet carrying UnderlayFlowMark (main routes it: the underlay), and a rule of
// an older agent, without that selector, is replaced by the sync. The kernel's
// own route lookup is the oracle. Needs root and the kernel lock (a network
// namespace).
func TestPodTableThrowRoute(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test creates a network namespace and needs root (flock -o /tmp/isthmus-kernel.lock sudo go test ./loader/datapath -run TestPodTableThrowRoute)")
	}
	under := inNewNetns(t, "thr-und")
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "thr-ist"}, PeerName: "thr-pod"}); err != nil {
		t.Fatal(err)
	}
	link := func(name string) netlink.Link {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	ist, pod, und := link("thr-ist"), link("thr-pod"), link("thr-und")
	for _, a := range []struct {
		l    netlink.Link
		addr string
	}{{und, "172.16.0.1/16"}, {ist, "10.10.1.1/32"}} {
		addr, _ := netlink.ParseAddr(a.addr)
		if err := netlink.AddrAdd(a.l, addr); err != nil {
			t.Fatalf("address %s: %v", a.addr, err)
		}
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	desired := append(OverlayRoutes([]netip.Prefix{p("172.16.2.0/24")}, ist.Attrs().Index, netip.MustParseAddr("10.10.1.1")),
		ThrowRoutes([]netip.Prefix{p("172.16.2.10/32"), p("fd00::1/128")})...)
	table := KernelRoutes{Table: PodTable}
	if _, err := SyncRoutes(table, desired); err != nil {
		t.Fatal(err)
	}
	if err := (KernelRules{}).Add(p("10.10.1.0/24")); err != nil {
		t.Fatal(err)
	}
	got, err := table.List()
	if err != nil {
		t.Fatal(err)
	}
	has := func(r Route) bool { return slices.ContainsFunc(got, r.Equal) }
	if len(got) != 3 || !has(desired[2]) || !has(desired[1]) || !has(desired[0]) {
		t.Errorf("table %d reads back %v, want %v", PodTable, got, desired)
	}
	if res, err := SyncRoutes(table, desired); err != nil || res != (RouteResult{}) {
		t.Errorf("second sync changed %+v (%v), want nothing", res, err)
	}
	via := func(dst string) int {
		rs, err := netlink.RouteGetWithOptions(net.ParseIP(dst), &netlink.RouteGetOptions{SrcAddr: net.ParseIP("10.10.1.7"), Iif: pod.Attrs().Name})
		if err != nil || len(rs) != 1 {
			t.Fatalf("route get %s from a pod: %v (%v)", dst, rs, err)
		}
		return rs[0].LinkIndex
	}
	if got := via("172.16.2.5"); got != ist.Attrs().Index {
		t.Errorf("a pod's 172.16.2.5 leaves by ifindex %d, want the overlay %d", got, ist.Attrs().Index)
	}
	if got := via("172.16.2.10"); got != under {
		t.Errorf("a pod's 172.16.2.10 (the throw route) leaves by ifindex %d, want the underlay %d", got, under)
	}
	marked, err := netlink.RouteGetWithOptions(net.ParseIP("172.16.2.5"), &netlink.RouteGetOptions{SrcAddr: net.ParseIP("10.10.1.7"), Iif: pod.Attrs().Name, Mark: UnderlayFlowMark | OverlayMark})
	if err != nil || len(marked) != 1 || marked[0].LinkIndex != under {
		t.Errorf("a pod's 172.16.2.5 in a flow that entered on the underlay: %v (%v), want the underlay %d", marked, err, under)
	}

	// An older agent's rule (no fwmark selector) for another source: the sync
	// removes it and keeps its own.
	old := netlink.NewRule()
	old.Family, old.Table, old.Priority = netlink.FAMILY_V4, PodTable, RulePriority
	old.Src = &net.IPNet{IP: net.ParseIP("10.10.1.0").To4(), Mask: net.CIDRMask(24, 32)}
	if err := netlink.RuleAdd(old); err != nil {
		t.Fatal(err)
	}
	if res, err := SyncRules(KernelRules{}, []netip.Prefix{p("10.10.1.0/24")}); err != nil || res.Deleted != 1 {
		t.Errorf("sync over an older rule: %+v (%v), want 1 deleted", res, err)
	}
	rs, err := netlink.RuleListFiltered(netlink.FAMILY_V4, &netlink.Rule{Priority: RulePriority}, netlink.RT_FILTER_PRIORITY)
	if err != nil || len(rs) != 1 || !(KernelRules{}).hasSelector(rs[0]) {
		t.Errorf("rules at priority %d after the sync: %v (%v), want one with fwmark 0/%#x", RulePriority, rs, err, UnderlayFlowMark)
	}
}
