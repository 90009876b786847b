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
// sync reads the throw route back as it wrote it. Needs root and the
// kernel lock (a network namespace).
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
	if len(got) != 2 || !has(desired[1]) || !has(desired[0]) {
		t.Errorf("table %d reads back %v, want %v", PodTable, got, desired[:2])
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
}
