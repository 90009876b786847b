package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// fullMTUPods get the underlay MTU (1500) instead of the lab's 1450: pods of a
// CNI that knows nothing of the tunnel.
var fullMTUPods = map[string]bool{"a1-p1": true, "b1-p1": true}

// upFullMTU builds the scenario (default, or one of its variants with the same
// pods) with fullMTUPods at MTU 1500 and removes it when the test ends.
func upFullMTU(t *testing.T, scenario string) *testenv.Lab {
	t.Helper()
	requireSetup(t)
	sc, err := testenv.LoadScenario(scenario)
	if err != nil {
		t.Fatal(err)
	}
	set := 0
	for i := range sc.Sites {
		for j := range sc.Sites[i].Nodes {
			for k := range sc.Sites[i].Nodes[j].Pods {
				if p := &sc.Sites[i].Nodes[j].Pods[k]; fullMTUPods[p.Name] {
					p.MTU = 1500
					set++
				}
			}
		}
	}
	if set != len(fullMTUPods) {
		t.Fatalf("scenario %s has %d of the pods %v", scenario, set, fullMTUPods)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return upLab(ctx, t, sc, testenv.Options{})
}

// fragNeededSent reads node's METRIC_FRAG_NEEDED_SENT count at pod_ingress.
func fragNeededSent(t *testing.T, l *testenv.Lab, node string) uint64 {
	t.Helper()
	set, err := maps.OpenPinned(l.PinDir(node))
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	m, err := maps.ReadMetrics(set.Map(maps.MapMetrics))
	if err != nil {
		t.Fatal(err)
	}
	for k, c := range m {
		if k.Hook == maps.HookPodIngress && k.Name() == "frag_needed_sent" {
			return c.Packets
		}
	}
	return 0
}

// TestMTUFullSizePods: pods whose interface has the underlay MTU (1500) talk to
// remote pods through the 1450-byte tunnel. TCP works in both directions because
// the datapath clamps the SYNs' MSS; a DF packet too large for the tunnel is
// answered with ICMP frag needed, which the pod's kernel caches as the path MTU;
// UDP datagrams that fit still arrive.
func TestMTUFullSizePods(t *testing.T) { checkFullSizePods(t, "default", 1450) }

// TestWireGuardMTUFullSizePods is TestMTUFullSizePods across an encrypted
// peering: the tunnel takes GENEVE and WireGuard (110 bytes), so the MSS is
// clamped and frag needed announced for 1390 bytes, and 64 MiB of TCP cross
// intact both ways.
func TestWireGuardMTUFullSizePods(t *testing.T) { checkFullSizePods(t, "wireguard", 1390) }

// checkFullSizePods runs TestMTUFullSizePods on scenario, whose tunnel between
// a1 and b1 carries tunnelMTU bytes.
func checkFullSizePods(t *testing.T, scenario string, tunnelMTU int) {
	l := upFullMTU(t, scenario)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a, b := "a1-p1", "b1-p1"
	for pod := range fullMTUPods {
		out, err := l.Exec(ctx, l.PodNS(pod), "ip", "-o", "link", "show", "eth0")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, " mtu 1500 ") {
			t.Fatalf("pod %s: eth0 is not at MTU 1500, the test would prove nothing: %s", pod, out)
		}
	}

	// Before anything teaches the pods a path MTU. Without the MSS clamp TCP
	// still gets through, but only by learning the path MTU from our ICMP after
	// its first full-size segments are refused: so no ICMP may be sent and no
	// path MTU cached while this runs.
	t.Run("bulk TCP", func(t *testing.T) {
		const size = 64 << 20
		sentBefore := fragNeededSent(t, l, "a1") + fragNeededSent(t, l, "b1")
		for _, dir := range [][2]string{{a, b}, {b, a}} {
			src, dst := dir[0], dir[1]
			res, err := testenv.BulkTCP(ctx, l.PodNS(src), l.PodNS(dst), l.PodAddr(dst), size)
			if err != nil {
				t.Errorf("64 MiB %s -> %s: %v (received %d bytes, longest gap %s)", src, dst, err, res.Bytes, res.MaxGap)
				continue
			}
			t.Logf("64 MiB %s -> %s in %s: %.2f Gbit/s, longest gap %s", src, dst,
				res.Duration.Round(time.Millisecond), res.Gbps(), res.MaxGap.Round(time.Millisecond))
			if res.Bytes != size {
				t.Errorf("%s -> %s: received %d bytes, want %d", src, dst, res.Bytes, size)
			}
			if res.MaxGap > 3*time.Second {
				t.Errorf("%s -> %s: the flow stalled for %s", src, dst, res.MaxGap)
			}
		}
		if n := fragNeededSent(t, l, "a1") + fragNeededSent(t, l, "b1") - sentBefore; n != 0 {
			t.Errorf("%d ICMP frag needed sent during the transfers: TCP found the path MTU itself, the MSS was not clamped", n)
		}
		for _, dir := range [][2]string{{a, b}, {b, a}} {
			if mtu := cachedMTU(t, ctx, l, dir[0], dir[1]); mtu != "" {
				t.Errorf("pod %s cached path MTU %s toward %s during the transfer: the MSS was not clamped", dir[0], mtu, dir[1])
			}
		}
	})

	fits := tunnelMTU - 50 // a datagram (and its IPv4 and UDP headers) the tunnel carries
	t.Run(fmt.Sprintf("UDP %d bytes", fits), func(t *testing.T) {
		got, err := udpOnce(l, a, b, fits)
		if err != nil {
			t.Fatal(err)
		}
		if got != fits {
			t.Errorf("received a %d-byte datagram, want %d", got, fits)
		}
	})

	t.Run("ping DF 1500 bytes", func(t *testing.T) {
		dst := l.PodAddr(b)
		if mtu := cachedMTU(t, ctx, l, a, b); mtu != "" {
			t.Fatalf("pod %s already has path MTU %s toward %s: ping would not reach the datapath", a, mtu, b)
		}
		before := fragNeededSent(t, l, "a1")
		// ping exits non-zero here: no echo comes back.
		out, err := l.Exec(ctx, l.PodNS(a), "ping", "-n", "-c", "2", "-i", "0.3", "-W", "1", "-M", "do", "-s", "1472", dst.String())
		t.Logf("ping -M do -s 1472 %s:\n%s", dst, out)
		if err == nil {
			t.Errorf("ping -M do -s 1472 %s succeeded: a 1500-byte packet crossed a %d-byte tunnel", dst, tunnelMTU)
		}
		if want := fmt.Sprintf("Frag needed and DF set (mtu = %d)", tunnelMTU); !strings.Contains(out, want) {
			t.Errorf("ping did not report %q", want)
		}
		if n := fragNeededSent(t, l, "a1") - before; n == 0 {
			t.Errorf("a1's frag_needed_sent counter did not move")
		}
		if mtu := cachedMTU(t, ctx, l, a, b); mtu != strconv.Itoa(tunnelMTU) {
			t.Errorf("pod %s caches path MTU %q toward %s, want %d", a, mtu, dst, tunnelMTU)
		}
		// With the path MTU learned, a ping of the tunnel's size gets through.
		size := strconv.Itoa(tunnelMTU - 28)
		if out, err := l.Exec(ctx, l.PodNS(a), "ping", "-n", "-c", "1", "-W", "2", "-M", "do", "-s", size, dst.String()); err != nil {
			t.Errorf("ping -M do -s %s %s: %v\n%s", size, dst, err, out)
		}
	})
}

var routeMTU = regexp.MustCompile(`\bmtu (\d+)\b`)

// cachedMTU returns the path MTU pod src has cached toward pod dst (from
// `ip route get`), or "" if none.
func cachedMTU(t *testing.T, ctx context.Context, l *testenv.Lab, src, dst string) string {
	t.Helper()
	out, err := l.Exec(ctx, l.PodNS(src), "ip", "route", "get", l.PodAddr(dst).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: ip route get %s: %s", src, l.PodAddr(dst), strings.Join(strings.Fields(out), " "))
	if m := routeMTU.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

// udpOnce sends one datagram of n bytes from pod src to a listener in pod dst
// and returns the size that arrived.
func udpOnce(l *testenv.Lab, src, dst string, n int) (int, error) {
	var pc net.PacketConn
	if err := testenv.Do(l.PodNS(dst), func() error {
		var err error
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(l.PodAddr(dst), 0).String())
		return err
	}); err != nil {
		return 0, fmt.Errorf("listen in %s: %w", dst, err)
	}
	defer pc.Close()
	var c net.Conn
	if err := testenv.Do(l.PodNS(src), func() error {
		var err error
		c, err = net.Dial("udp4", pc.LocalAddr().String())
		return err
	}); err != nil {
		return 0, fmt.Errorf("dial from %s: %w", src, err)
	}
	defer c.Close()
	buf := make([]byte, 65536)
	for try := 0; try < 3; try++ {
		if _, err := c.Write(make([]byte, n)); err != nil {
			return 0, fmt.Errorf("send %d bytes: %w", n, err)
		}
		pc.SetReadDeadline(time.Now().Add(time.Second))
		m, _, err := pc.ReadFrom(buf)
		if err == nil {
			return m, nil
		}
	}
	return 0, fmt.Errorf("no %d-byte datagram arrived in 3 tries", n)
}
