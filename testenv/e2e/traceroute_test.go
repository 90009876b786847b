package e2e

import (
	"context"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// traceHop matches a line of `traceroute -n`: the hop number, then the probes'
// answers (an address followed by its times, or "*").
var traceHop = regexp.MustCompile(`^\s*(\d+)\s+(.*)$`)

// tracerouteHops runs traceroute (UDP probes, numeric, two probes a hop) from pod
// src to pod dst and returns, for each hop, the addresses that answered it.
func tracerouteHops(t *testing.T, ctx context.Context, nsName string, dst netip.Addr, run func(context.Context, string, ...string) (string, error)) (map[int][]netip.Addr, string) {
	t.Helper()
	out, err := run(ctx, nsName, "traceroute", "-n", "-q", "2", "-w", "2", "-m", "8", dst.String())
	if err != nil {
		t.Fatalf("traceroute %s: %v\n%s", dst, err, out)
	}
	hops := map[int][]netip.Addr{}
	for _, line := range strings.Split(out, "\n") {
		m := traceHop.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		for _, f := range strings.Fields(m[2]) {
			if a, err := netip.ParseAddr(f); err == nil {
				hops[n] = append(hops[n], a)
			}
		}
	}
	return hops, out
}

// TestTracerouteAcrossSites: traceroute (the Debian tool, UDP probes) from a member
// pod of seed 003's cloud site to a member pod of the edge site shows every hop of
// the overlay path, each answering from its tunnel address: the sender's node
// (pod_ingress, TTL 1), the cloud gateway and the edge gateway (transit), the
// receiving node (decapsulation: delivering is a hop), then the pod itself. The ICMP
// time exceeded of the nodes past the first travel back through the tunnel, as GENEVE
// to the hop that sent the frame.
func TestTracerouteAcrossSites(t *testing.T) {
	l := upShared(t, "seed003")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, dst := "m02-p1", "e01-p1"
	want := []netip.Addr{
		tunnelAddr(t, l, "master-02"),
		tunnelAddr(t, l, "master-gw"),
		tunnelAddr(t, l, "edge-gw"),
		tunnelAddr(t, l, "edge-01"),
		l.PodAddr(dst),
	}
	hops, out := tracerouteHops(t, ctx, l.PodNS(src), l.PodAddr(dst), l.Exec)
	t.Logf("traceroute %s -> %s:\n%s", src, dst, out)
	for i, w := range want {
		got := hops[i+1]
		if len(got) == 0 {
			t.Errorf("hop %d: no answer, want %s", i+1, w)
			continue
		}
		for _, a := range got {
			if a != w {
				t.Errorf("hop %d answered from %s, want %s", i+1, a, w)
			}
		}
	}
	last := 0
	for n := range hops {
		last = max(last, n)
	}
	if last != len(want) {
		t.Errorf("the destination answered at hop %d, want %d", last, len(want))
	}
}
