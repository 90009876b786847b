package e2e

import (
	"context"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// scrape GETs path from the agent of node (testenv.Lab.AgentHTTP) and fails
// the test when it cannot.
func scrape(t *testing.T, l *testenv.Lab, node, path string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, body, err := l.AgentHTTP(ctx, node, path)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// exposition is a scraped text exposition: series (name and labels, as served)
// to value.
type exposition map[string]float64

func scrapeMetrics(t *testing.T, l *testenv.Lab, node string) exposition {
	t.Helper()
	code, body := scrape(t, l, node, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics from %s: %d\n%s", node, code, body)
	}
	out := exposition{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("GET /metrics from %s: bad line %q", node, line)
		}
		out[line[:i]] = v
	}
	return out
}

// sum adds the values of every series of metric whose labels include all of
// labels (each `name="value"`).
func (e exposition) sum(metric string, labels ...string) float64 {
	var s float64
next:
	for series, v := range e {
		if !strings.HasPrefix(series, metric+"{") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(series, l) {
				continue next
			}
		}
		s += v
	}
	return s
}

// TestMetricsEndpoint: the agent serves /readyz and /healthz, and /metrics
// reports what the datapath did. After exactly N pings a1-p1 -> b1-p1, encap on
// a1 at pod_ingress moved by N and decap on b1 by N; after M GENEVE frames from
// an address that is no peer, drops{reason="unknown_peer"} on a1 moved by
// exactly M. The scraped values agree with the pinned map.
func TestMetricsEndpoint(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)

	// Ready soon after the ready file (written just before the status flips).
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := scrape(t, l, "a1", "/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz on a1: %d %q, want 200 once the agent is ready", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range []string{"a1", "b1"} {
		if code, body := scrape(t, l, n, "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz on %s: %d %q", n, code, body)
		}
		if code, body := scrape(t, l, n, "/readyz"); code != http.StatusOK {
			t.Errorf("/readyz on %s: %d %q", n, code, body)
		}
	}

	const pings = 7
	// A pod's echo requests open flows: they pass a1's stack and are encapsulated by
	// overlay_egress on isthmus0 (architecture.md, "Netfilter").
	encapA1 := `isthmus_datapath_packets_total{event="encap",hook="overlay_egress"}`
	beforeA1, beforeB1 := scrapeMetrics(t, l, "a1"), scrapeMetrics(t, l, "b1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dst := l.PodAddr("b1-p1")
	if out, err := l.Exec(ctx, l.PodNS("a1-p1"), "ping", "-n", "-q", "-c", strconv.Itoa(pings), "-i", "0.1", "-W", "2", dst.String()); err != nil {
		t.Fatalf("ping a1-p1 -> b1-p1 (%v): %v\n%s", dst, err, out)
	}
	afterA1, afterB1 := scrapeMetrics(t, l, "a1"), scrapeMetrics(t, l, "b1")
	if got := afterA1[encapA1] - beforeA1[encapA1]; got != pings {
		t.Errorf("%s on a1 moved by %v, want %d", encapA1, got, pings)
	}
	decap := func(e exposition) float64 { return e.sum("isthmus_datapath_packets_total", `event="decap"`) }
	if got := decap(afterB1) - decap(beforeB1); got != pings {
		t.Errorf("decap on b1 moved by %v, want %d", got, pings)
	}
	// The bytes moved with the packets: at least an IPv4 + ICMP header each.
	encapBytes := `isthmus_datapath_bytes_total{event="encap",hook="overlay_egress"}`
	if got := afterA1[encapBytes] - beforeA1[encapBytes]; got < pings*28 {
		t.Errorf("%s on a1 moved by %v, want at least %d", encapBytes, got, pings*28)
	}
	// What /metrics says is what the pinned map holds.
	pinned := nodeMetrics(t, l, "a1")
	if got, want := scrapeMetrics(t, l, "a1")[encapA1], float64(packets(pinned, 1, maps.HookOverlayEgress)); got != want {
		t.Errorf("scraped encap %v, pinned map %v", got, want)
	}

	// Frames from a stranger, as TestDropCounted sends them.
	const frames = 5
	a1, _ := l.Node("a1")
	stranger := netip.MustParseAddr("172.16.9.99")
	for _, n := range l.Scenario.Nodes() {
		if n.Address == stranger || n.Site.Subnet.Contains(stranger) {
			t.Fatalf("%s belongs to node %s or its site; pick another stranger", stranger, n.Name)
		}
	}
	a1MAC := linkAt(t, l.NodeNS("a1"), testenv.UnderlayDev).Attrs().HardwareAddr.String()
	drops := `isthmus_datapath_drops_total{hook="underlay_tc",reason="unknown_peer"}`
	droppedBytes := `isthmus_datapath_dropped_bytes_total{hook="underlay_tc",reason="unknown_peer"}`
	before := scrapeMetrics(t, l, "a1")
	argv := []string{"/usr/bin/python3", "-c", sendScript, testenv.RouterPort("a1"), routerPortMAC(t, l, "a1"), a1MAC,
		stranger.String(), a1.Address.String(), strconv.Itoa(vni), l.PodAddr("b1-p1").String(), l.PodAddr("a1-p1").String(),
		strconv.Itoa(frames)}
	if out, err := l.Exec(ctx, l.RouterNS(), argv...); err != nil {
		t.Fatalf("send with scapy: %v\n%s", err, out)
	}
	var after exposition
	deadline = time.Now().Add(2 * time.Second)
	for {
		after = scrapeMetrics(t, l, "a1")
		if after[drops]-before[drops] >= frames || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // let any extra count show up too
	after = scrapeMetrics(t, l, "a1")
	if got := after[drops] - before[drops]; got != frames {
		t.Errorf("%s on a1 moved by %v, want exactly the %d frames sent", drops, got, frames)
	}
	if got := after[droppedBytes] - before[droppedBytes]; got < frames*50 {
		t.Errorf("%s on a1 moved by %v, want at least %d (50 bytes of outer headers a frame)", droppedBytes, got, frames*50)
	}

	// The rest of the families are there.
	for _, s := range []string{
		`isthmus_syncs_total{result="ok"}`,
		`isthmus_sync_entries_written_total`,
		`isthmus_sync_last_success_timestamp_seconds`,
		`isthmus_sync_duration_seconds_count`,
		`isthmus_map_capacity{map="nat"}`,
		`isthmus_map_capacity{map="health_reach"}`,
		`isthmus_map_capacity{map="health_probers"}`,
		`isthmus_map_capacity{map="trace_prefixes"}`,
		`isthmus_map_entries{map="routes"}`,
		`isthmus_map_entries{map="peers"}`,
	} {
		if after[s] <= 0 {
			t.Errorf("/metrics on a1: %s = %v, want > 0", s, after[s])
		}
	}
	if after.sum("isthmus_build_info") != 1 {
		t.Errorf("/metrics on a1 has no isthmus_build_info")
	}
	if got, capacity := after[`isthmus_map_entries{map="nat"}`], after[`isthmus_map_capacity{map="nat"}`]; got > capacity {
		t.Errorf("nat entries %v over capacity %v", got, capacity)
	}
	// The fill levels are the pinned maps' contents.
	set, err := maps.OpenPinned(l.PinDir("a1"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := set.Read()
	set.Close()
	if err != nil {
		t.Fatal(err)
	}
	for m, n := range map[string]int{"routes": len(st.Routes), "peers": len(st.Peers), "peer_sources": len(st.PeerSources),
		"pod_ifaces": len(st.PodIfaces), "nexthop_groups": len(st.Groups)} {
		if got := after[`isthmus_map_entries{map="`+m+`"}`]; got != float64(n) {
			t.Errorf("isthmus_map_entries{map=%q} = %v, the pinned map holds %d", m, got, n)
		}
	}
}

// TestReadyzObjectsRejected: a broken object elsewhere is set aside and leaves
// /readyz at 200 (counted in isthmus_objects_rejected); this node's own Node
// set aside makes /readyz 503 with the reason (the last good state stays in
// force), and fixing it makes it 200 again; /healthz stays 200 throughout.
func TestReadyzObjectsRejected(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	waitStatus := func(want int, substr string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, body := scrape(t, l, "a1", "/readyz")
			if code == want && strings.Contains(body, substr) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz on a1: %d %q, want %d containing %q", code, body, want, substr)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	broken := filepath.Join(l.ObjectsDir(), "zz-broken.yaml")
	if err := os.WriteFile(broken, []byte("apiVersion: isthmus.dev/v1alpha1\nkind: Site\nmetadata: [not, a, map]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := scrape(t, l, "a1", "/metrics")
		if strings.Contains(body, `isthmus_objects_rejected{kind="unnamed"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("isthmus_objects_rejected{kind=\"unnamed\"} never 1 on a1")
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitStatus(http.StatusOK, "ok")
	// A Node a1 written before the lab's own (file order) with an invalid
	// tunnel address: it is set aside, and the lab's a1 as its duplicate.
	own := filepath.Join(l.ObjectsDir(), "00-a1.yaml")
	if err := os.WriteFile(own, []byte("apiVersion: v1\nkind: Node\nmetadata: {name: a1, annotations: {isthmus.dev/tunnel-ipv4: nope}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitStatus(http.StatusServiceUnavailable, "cannot be planned")
	if code, body := scrape(t, l, "a1", "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz on a1 with its Node set aside: %d %q, want 200", code, body)
	}
	if err := os.Remove(own); err != nil {
		t.Fatal(err)
	}
	waitStatus(http.StatusOK, "ok")
}
