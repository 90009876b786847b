package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// metricFragNeededSent is METRIC_FRAG_NEEDED_SENT of enum metric (bpf/lib/types.h).
const metricFragNeededSent = 5

// fragProbeScript sends one UDP datagram with DF, of argv[2] bytes (IPv4 header
// included), to argv[1], once, and prints what came back, as scapy decodes it: "src type
// code nexthopmtu" of an ICMP answer, or "none".
const fragProbeScript = `
import sys
from scapy.all import IP, UDP, ICMP, Raw, L3RawSocket, sr1, conf
conf.verb = 0
# The kernel routes and resolves the next hop: a pod's gateway here is a
# link-local address scapy's own ARP does not reach.
conf.L3socket = L3RawSocket
dst, size = sys.argv[1], int(sys.argv[2])
p = IP(dst=dst, flags="DF", ttl=64)/UDP(sport=40999, dport=9)/Raw(b"x" * (size - 28))
# One datagram, no retry: the answer to the first is the claim.
r = sr1(p, timeout=2, retry=0)
if r is None or ICMP not in r:
    print("none")
else:
    print(r[IP].src, r[ICMP].type, r[ICMP].code, r[ICMP].nexthopmtu)
`

// TestGatewayPathMTU is seed 003 with a WAN link smaller than the sites': on
// master-gw the route to the edge site's underlay has a locked MTU of 1400 (as a
// gateway whose WAN-side link is smaller sees it), and the router enforces it
// toward edge-gw, dropping larger frames. A member pod's DF datagram that fits the
// site (1400 bytes inside a 1450 pod MTU) but not the WAN once encapsulated is
// answered by master-gw with ICMP frag needed announcing 1350 (1400 less GENEVE's
// 50 bytes), which scapy decodes in the pod; and bulk TCP from another member pod,
// which starts with 1450-byte segments, completes: path MTU discovery works across
// the gateway, where before the frames died at the router and TCP black-holed.
func TestGatewayPathMTU(t *testing.T) {
	l := upShared(t, "seed003")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const wanMTU = 1400
	gw, _ := l.Node("master-gw")
	remote, ok := l.Node("edge-gw")
	if !ok {
		t.Fatal("seed003 has no edge-gw")
	}
	run := func(ctx context.Context, ns string, argv ...string) {
		t.Helper()
		if out, err := l.Exec(ctx, ns, argv...); err != nil {
			t.Fatalf("%s: %s: %v\n%s", ns, strings.Join(argv, " "), err, out)
		}
	}
	wan := remote.Site.Subnet.String()
	run(ctx, l.NodeNS(gw.Name), "ip", "route", "replace", wan, "via", gw.Site.Gateway.String(),
		"dev", testenv.UnderlayDev, "mtu", "lock", strconv.Itoa(wanMTU))
	run(ctx, l.RouterNS(), "ip", "route", "replace", remote.Address.String()+"/32",
		"dev", testenv.RouterPort(remote.Name), "mtu", "lock", strconv.Itoa(wanMTU))
	src, bulkSrc, dst := "m02-p1", "m02-p2", "e01-p1"
	// The lab is shared: leave it as it was, path MTUs the pods learned included.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		run(ctx, l.NodeNS(gw.Name), "ip", "route", "del", wan)
		run(ctx, l.RouterNS(), "ip", "route", "replace", remote.Address.String()+"/32",
			"dev", testenv.RouterPort(remote.Name), "scope", "link")
		for _, p := range []string{src, bulkSrc} {
			run(ctx, l.PodNS(p), "ip", "route", "flush", "cache")
		}
	})
	for _, p := range []string{src, bulkSrc} {
		if mtu := cachedMTU(t, ctx, l, p, dst); mtu != "" {
			t.Fatalf("pod %s already caches path MTU %s toward %s: the test would prove nothing", p, mtu, dst)
		}
	}
	sent := func() uint64 {
		return packets(nodeMetrics(t, l, gw.Name), metricFragNeededSent, maps.HookUnderlayTC)
	}

	t.Run("frag needed decoded by scapy", func(t *testing.T) {
		before := sent()
		out, err := l.Exec(ctx, l.PodNS(src), "/usr/bin/python3", "-c", fragProbeScript, l.PodAddr(dst).String(), "1400")
		if err != nil {
			t.Fatalf("scapy probe: %v\n%s", err, out)
		}
		got := strings.TrimSpace(out)
		want := fmt.Sprintf("%s 3 4 %d", tunnelAddr(t, l, gw.Name), wanMTU-testenv.GeneveOverhead)
		t.Logf("%s -> %s, 1400 bytes DF: %s", src, dst, got)
		if got != want {
			t.Errorf("answer %q, want ICMP frag needed from master-gw's tunnel address: %q", got, want)
		}
		if n := sent() - before; n != 1 {
			t.Errorf("master-gw's frag_needed_sent at underlay_tc moved by %d for the one datagram, want 1", n)
		}
		// What fits the WAN still arrives.
		if n, err := udpOnce(l, src, dst, wanMTU-testenv.GeneveOverhead-28); err != nil {
			t.Errorf("a datagram that fits the WAN: %v", err)
		} else {
			t.Logf("%d-byte datagram (%d on the wire) arrived", n, wanMTU-testenv.GeneveOverhead)
		}
	})

	t.Run("bulk TCP finds the path MTU", func(t *testing.T) {
		const size = 16 << 20
		before := sent()
		res, err := testenv.BulkTCP(ctx, l.PodNS(bulkSrc), l.PodNS(dst), l.PodAddr(dst), size)
		if err != nil {
			t.Fatalf("16 MiB %s -> %s: %v (received %d bytes, longest gap %s); agent log of master-gw:\n%s",
				bulkSrc, dst, err, res.Bytes, res.MaxGap, tailFile(l.AgentLog(gw.Name)))
		}
		t.Logf("16 MiB %s -> %s in %s: %.2f Gbit/s, longest gap %s", bulkSrc, dst,
			res.Duration.Round(time.Millisecond), res.Gbps(), res.MaxGap.Round(time.Millisecond))
		if res.Bytes != size {
			t.Errorf("received %d bytes, want %d", res.Bytes, size)
		}
		if n := sent() - before; n == 0 {
			t.Errorf("no frag needed sent during the transfer: its segments never met the smaller WAN, the test proves nothing")
		}
		if mtu := cachedMTU(t, ctx, l, bulkSrc, dst); mtu != strconv.Itoa(wanMTU-testenv.GeneveOverhead) {
			t.Errorf("pod %s caches path MTU %q toward %s, want %d", bulkSrc, mtu, dst, wanMTU-testenv.GeneveOverhead)
		}
	})
}
