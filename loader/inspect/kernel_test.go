package inspect

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/bpf"
	"github.com/isthmus-dev/isthmus/loader/mapstate"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/maps"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// now is the fixed CLOCK_MONOTONIC the test ages nat entries against.
const now = uint64(1000 * time.Hour)

// pinTestMaps creates every map of the object pinned in a fresh directory on
// /sys/fs/bpf, removed at the end of the test.
func pinTestMaps(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test pins BPF maps and needs root (sudo go test ./loader/inspect)")
	}
	dir, err := os.MkdirTemp("/sys/fs/bpf", "isthmus-inspect-test-")
	if err != nil {
		t.Fatalf("make pin dir (is bpffs mounted on /sys/fs/bpf?): %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	for _, n := range maps.AllMaps {
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinByName
		m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		if err != nil {
			t.Fatalf("create map %s: %v", n, err)
		}
		m.Close()
	}
	return dir
}

// fillMaps writes the state of seed 000's flex-1 (a route to a group of two, two
// peers, SNAT) with aks-nodepool1-1 down, two nat flows (one live TCP, one UDP
// expired, and a reply half whose forward half is gone) and some counters.
func fillMaps(t *testing.T, dir string) {
	t.Helper()
	set, _, err := objects.LoadDir("../objects/testdata/seed000")
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.Compute(set, "flex-1")
	if err != nil {
		t.Fatal(err)
	}
	st, warnings := mapstate.FromPlan(p, mapstate.NodeConfig{
		VNI: 4242, UnderlayIfindex: 2, OverlayIfindex: 7, OverlayMAC: net.HardwareAddr{2, 0, 0, 0, 0, 7},
		TunnelMTU: 1450, PodIfindexes: []int{11, 12}, SNATPortMin: 40000, SNATPortMax: 40999,
	})
	if len(warnings) != 0 {
		t.Fatalf("FromPlan warnings: %v", warnings)
	}
	applyState(t, dir, st)
	ms, err := maps.OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()

	ap := netip.MustParseAddrPort
	tunnel := netip.MustParseAddr("192.168.20.1")
	nat := func(src, dst netip.AddrPort, proto uint8, to netip.AddrPort, state, flags uint8, idle time.Duration) {
		k := maps.NatKeyFrom(src, dst, proto)
		v := maps.NatValue{Addr: maps.AddrToBE32(to.Addr()), Port: maps.HostToBE16(to.Port()), State: state, Flags: flags,
			LastSeen: now - uint64(idle)}
		if err := ms.Map(maps.MapNat).Update(k, v, ebpf.UpdateAny); err != nil {
			t.Fatalf("write nat entry: %v", err)
		}
	}
	// TCP pod 192.168.20.5:33000 -> 10.0.2.9:443 as 192.168.20.1:40017, established, idle 90 s.
	pod, dst, tr := ap("192.168.20.5:33000"), ap("10.0.2.9:443"), netip.AddrPortFrom(tunnel, 40017)
	nat(pod, dst, maps.ProtoTCP, tr, maps.NatStateEstablished, 0, 90*time.Second)
	nat(dst, tr, maps.ProtoTCP, pod, maps.NatStateEstablished, maps.NatFlagReply, 90*time.Second)
	// UDP pod 192.168.20.6:5353 -> 100.64.0.4:53 on its own port, idle 61 s: expired.
	pod, dst, tr = ap("192.168.20.6:5353"), ap("100.64.0.4:53"), netip.AddrPortFrom(tunnel, 5353)
	nat(pod, dst, maps.ProtoUDP, tr, maps.NatStateEstablished, 0, 61*time.Second)
	nat(dst, tr, maps.ProtoUDP, pod, maps.NatStateEstablished, maps.NatFlagReply, 61*time.Second)
	// A reply half alone (the LRU evicted the forward half): TCP SYN sent 5 s ago.
	nat(ap("10.0.2.10:80"), netip.AddrPortFrom(tunnel, 40500), maps.ProtoTCP, ap("192.168.20.7:41000"), maps.NatStateNew, maps.NatFlagReply, 5*time.Second)

	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	metric := func(code uint16, hook maps.Hook, perCPU ...maps.MetricsValue) {
		vs := make([]maps.MetricsValue, ncpu)
		copy(vs, perCPU)
		if err := ms.Map(maps.MapMetrics).Update(maps.MetricSlot(maps.MetricKey{Code: code, Hook: hook}), vs, ebpf.UpdateAny); err != nil {
			t.Fatalf("write metric: %v", err)
		}
	}
	metric(1, maps.HookPodIngress, maps.MetricsValue{Packets: 10, Bytes: 1000}, maps.MetricsValue{Packets: 5, Bytes: 500}) // encap
	metric(7, maps.HookPodIngress, maps.MetricsValue{Packets: 3, Bytes: 180})                                              // snat
	metric(137, maps.HookUnderlayXDP, maps.MetricsValue{Packets: 2, Bytes: 200})                                           // drop unknown_peer
	metric(150, maps.HookPodIngress)                                                                                       // zero: left out
	// The kfree_skb tracer saw 4 packets of pod_ingress freed with NOT_SPECIFIED
	// (its value differs between kernels: read from the kernel's BTF).
	reasons, err := maps.KernelDropReasons()
	if err != nil {
		t.Fatal(err)
	}
	for code, name := range reasons {
		if name != "NOT_SPECIFIED" {
			continue
		}
		vs := make([]maps.MetricsValue, ncpu)
		vs[0] = maps.MetricsValue{Packets: 4, Bytes: 400}
		if err := ms.Map(maps.MapRedirectDrops).Update(maps.RedirectDropKey{Reason: code, Hook: uint8(maps.HookPodIngress)}, vs, ebpf.UpdateAny); err != nil {
			t.Fatalf("write redirect drop: %v", err)
		}
	}
	// aks-nodepool1-1 (10.0.0.5) goes down: its group keeps only 10.0.0.4.
	down, _ := mapstate.FromPlan(p, mapstate.NodeConfig{
		VNI: 4242, UnderlayIfindex: 2, OverlayIfindex: 7, OverlayMAC: net.HardwareAddr{2, 0, 0, 0, 0, 7},
		TunnelMTU: 1450, PodIfindexes: []int{11, 12}, SNATPortMin: 40000, SNATPortMax: 40999,
		Down: map[maps.GroupMember]bool{{Addr: netip.MustParseAddr("10.0.0.5")}: true},
	})
	if _, err := maps.Apply(ms, maps.Diff(st, down)); err != nil {
		t.Fatalf("apply down: %v", err)
	}
}

func TestInspectGolden(t *testing.T) {
	dir := pinTestMaps(t)
	fillMaps(t, dir)
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Now = func() (uint64, error) { return now, nil }
	for _, view := range Views {
		for _, output := range []string{"table", "json"} {
			name := fmt.Sprintf("%s.%s", view, map[string]string{"table": "txt", "json": "json"}[output])
			t.Run(name, func(t *testing.T) {
				var out bytes.Buffer
				if err := Write(&out, m, view, output); err != nil {
					t.Fatal(err)
				}
				path := filepath.Join("testdata", name)
				if *update {
					if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(string(want), out.String()); diff != "" {
					t.Errorf("output differs from %s (-want +got; -update rewrites it):\n%s", path, diff)
				}
			})
		}
	}
}

// TestInspectFacts checks the facts the goldens must show whatever -update wrote.
func TestInspectFacts(t *testing.T) {
	dir := pinTestMaps(t)
	fillMaps(t, dir)
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Now = func() (uint64, error) { return now, nil }
	text := func(view string) string {
		var out bytes.Buffer
		if err := Write(&out, m, view, "table"); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	for view, rows := range map[string][]string{
		"routes": {"10.0.2.0/23    -         1      10.0.0.4 (64/64)", "100.64.0.4/32  10.0.0.4"},
		"peers":  {"10.0.0.4  0x0    10.0.0.4/32,10.0.2.0/23,100.64.0.4/32"},
		"nat":    {"tcp    192.168.20.5:33000  <->  192.168.20.1:40017  10.0.2.9:443", "established  1m30s  live", "1m1s   expired", "reply half only"},
		"counters": {"encap                      pod_ingress   15       1500", "drop unknown_peer          underlay_xdp  2        200",
			"drop kernel:NOT_SPECIFIED  pod_ingress   4        400"},
		"groups": {"1   1     10.0.0.4 (64/64)"},
		"config": {"VNI               4242", "TUNNEL IP (SNAT)  192.168.20.1", "SNAT PORTS        40000-40999", "SNAT EXEMPT       192.168.20.0/25", "POD IFINDEXES     11,12"},
	} {
		got := text(view)
		for _, r := range rows {
			if !strings.Contains(got, r) {
				t.Errorf("%s lacks %q:\n%s", view, r, got)
			}
		}
	}
	if got := text("counters"); strings.Contains(got, "no_nexthop") {
		t.Errorf("counters show a zero counter:\n%s", got)
	}
	if err := Write(&bytes.Buffer{}, m, "bogus", "table"); err == nil {
		t.Error("unknown view: no error")
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing dir: %v", err)
	}
	if _, err := Open(t.TempDir()); !errors.Is(err, ErrNotBPFFS) {
		t.Errorf("dir on tmpfs: %v, want ErrNotBPFFS", err)
	}
}

// TestInspectGroupsPerSite: with the node's plan, groups name their remote
// site and each planned gateway's reach to it, and a site no gateway reaches
// is listed (no live member) rather than left out.
func TestInspectGroupsPerSite(t *testing.T) {
	dir := pinTestMaps(t)
	a := netip.MustParseAddr
	gw1, gw2 := a("172.21.0.10"), a("172.21.0.11")
	gws := []plan.NextHop{{Peer: "gw-w1", Via: gw1}, {Peer: "gw-w2", Via: gw2}}
	p := &plan.NodePlan{
		Node: "w-1", Site: "west", Underlay: a("172.21.0.12"),
		Peers: []plan.Peer{{Name: "gw-w1", Underlay: gw1}, {Name: "gw-w2", Underlay: gw2}},
		Routes: []plan.Route{
			{Prefix: netip.MustParsePrefix("10.61.0.0/16"), Group: gws, Site: "east"},
			{Prefix: netip.MustParsePrefix("10.62.0.0/16"), Group: gws, Site: "north"},
			{Prefix: netip.MustParsePrefix("10.63.0.0/16"), Group: gws, Site: "south"},
		},
	}
	st, _ := mapstate.FromPlan(p, mapstate.NodeConfig{Down: map[maps.GroupMember]bool{
		{Site: "north", Addr: gw2}: true, {Site: "south", Addr: gw1}: true, {Site: "south", Addr: gw2}: true,
	}})
	applyState(t, dir, st)
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Plan = p
	var out bytes.Buffer
	if err := Write(&out, m, "groups", "table"); err != nil {
		t.Fatal(err)
	}
	t.Logf("isthmus inspect groups:\n%s", out.String())
	for _, row := range []string{
		"1   east   2     gw-w1 172.21.0.10 reaches, gw-w2 172.21.0.11 reaches",
		"2   north  1     gw-w1 172.21.0.10 reaches, gw-w2 172.21.0.11 down     172.21.0.10 (64/64)",
		"3   south  0     gw-w1 172.21.0.10 down, gw-w2 172.21.0.11 down        (none: no_nexthop)",
	} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("groups lack %q:\n%s", row, out.String())
		}
	}
}

// applyState writes st into the empty maps pinned in dir.
func applyState(t *testing.T, dir string, st maps.State) {
	t.Helper()
	ms, err := maps.OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	if _, err := maps.Apply(ms, maps.Diff(maps.State{}, st)); err != nil {
		t.Fatalf("apply: %v", err)
	}
}
