package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// Codes of METRIC_MASQ and METRIC_MASQ_REVERSE (bpf/lib/types.h).
const (
	metricMasq        = 16
	metricMasqReverse = 17
)

// masqCounts returns node's masquerade and reverse-translation packet counts.
func masqCounts(t *testing.T, l *testenv.Lab, node string) (masq, reverse uint64) {
	m := nodeMetrics(t, l, node)
	return packets(m, metricMasq, maps.HookUnderlayEgress), packets(m, metricMasqReverse, maps.HookUnderlayTC)
}

// captureSources captures in nsName, on eth0, count packets matching filter while
// traffic runs, and returns the IPv4 source of each as tshark decodes it.
func captureSources(t *testing.T, nsName, filter string, count int, traffic func()) []string {
	t.Helper()
	return captureSourcesOn(t, nsName, testenv.UnderlayDev, filter, count, traffic)
}

// captureSourcesOn is captureSources on the device dev.
func captureSourcesOn(t *testing.T, nsName, dev, filter string, count int, traffic func()) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := testenv.Capture(ctx, nsName, []string{"-i", dev, "-f", filter,
		"-c", strconv.Itoa(count), "-T", "fields", "-e", "ip.src"}, traffic)
	if err != nil {
		t.Fatalf("capture %q in %s: %v\n%s", filter, nsName, err, out)
	}
	return strings.Fields(out)
}

// TestEgressMasquerade: on the egress scenario (managed sites, a world behind the
// router), pods reach each other across sites with their own addresses and no
// masquerade and with strict rp_filter dropping nothing (checkPaths); a pod's TCP, UDP and ICMP to the world work, and the world's servers
// and capture see the node's underlay address (socat's report of its peer, tshark);
// a world address in site-a's nonMasqueradeCIDRs and a peered site's node see the
// pod's own address; a1 counts the translations.
func TestEgressMasquerade(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testEgressMasquerade)
}

// testEgressMasquerade is TestEgressMasquerade with every agent started with --decap decap.
func testEgressMasquerade(t *testing.T, decap string) {
	l := upScenarioDecap(t, "egress", decap)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const pod, node = "a1-p1", "a1"
	podAddr := l.PodAddr(pod)
	n, _ := l.Node(node)
	underlay := n.Address.String()

	m := checkPaths(t, l, "a1", "b1")
	t.Run("peered sites keep the pod address", func(t *testing.T) {
		requireOwnSources(t, l, m)
		for _, nd := range []string{"a1", "b1"} {
			if masq, _ := masqCounts(t, l, nd); masq != 0 {
				t.Errorf("%s masqueraded %d packets of pod-to-pod traffic", nd, masq)
			}
		}
	})

	// The world's servers answer each client with the address they see it from.
	world := l.WorldNS()
	udp := testenv.Command(ctx, world, "socat", "UDP-RECVFROM:8081,reuseaddr,fork", "SYSTEM:echo $SOCAT_PEERADDR")
	if err := udp.Start(); err != nil {
		t.Fatalf("start the UDP server in the world: %v", err)
	}
	t.Cleanup(func() { udp.Process.Kill(); udp.Wait() })
	// Started first, the UDP server has had the TCP one's start-up to bind.
	servePeerAddrTCP(ctx, t, world, "8080")
	masq0, rev0 := masqCounts(t, l, node)

	worldAddr := testenv.WorldAddr.String()
	t.Run("tcp", func(t *testing.T) {
		var out string
		var err error
		for range 3 {
			if out, err = l.Exec(ctx, l.PodNS(pod), "socat", "-t3", "-T3", "-", "TCP:"+worldAddr+":8080,connect-timeout=3"); err == nil {
				break
			}
		}
		if err != nil || strings.TrimSpace(out) != underlay {
			t.Fatalf("TCP to the world: server saw %q (err %v), want %s", strings.TrimSpace(out), err, underlay)
		}
	})
	t.Run("udp", func(t *testing.T) {
		var out string
		var err error
		for range 3 {
			if out, err = l.Exec(ctx, l.PodNS(pod), "sh", "-c", "echo hi | socat -t3 -T3 - UDP:"+worldAddr+":8081"); err == nil && strings.TrimSpace(out) != "" {
				break
			}
		}
		if strings.TrimSpace(out) != underlay {
			t.Fatalf("UDP to the world: server saw %q (err %v), want %s", strings.TrimSpace(out), err, underlay)
		}
	})
	t.Run("icmp", func(t *testing.T) {
		var perr error
		srcs := captureSources(t, world, "icmp[icmptype] == icmp-echo", 1, func() {
			perr = testenv.Ping(l.PodNS(pod), testenv.WorldAddr, time.Second)
		})
		if len(srcs) != 1 || srcs[0] != underlay {
			t.Errorf("world saw echo requests from %v, want %s", srcs, underlay)
		}
		if err := testenv.Ping(l.PodNS(pod), testenv.WorldAddr, 2*time.Second); err != nil {
			t.Errorf("ping the world from %s: %v (during capture: %v)", pod, err, perr)
		}
	})
	// A Service whose backend is in the world: the DNAT (kube-proxy's, here one
	// rule of the same shape) happens in the stack before underlay_egress
	// masquerades; the reply is translated back before conntrack reverses the DNAT.
	t.Run("service DNAT then masquerade", func(t *testing.T) {
		const clusterIP = "10.96.0.10"
		if out, err := l.Exec(ctx, l.NodeNS(node), "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-d", clusterIP+"/32",
			"-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", worldAddr+":8080"); err != nil {
			t.Fatalf("add the Service DNAT: %v\n%s", err, out)
		}
		out, err := l.Exec(ctx, l.PodNS(pod), "socat", "-t3", "-T3", "-", "TCP:"+clusterIP+":80,connect-timeout=3")
		if err != nil || strings.TrimSpace(out) != underlay {
			t.Fatalf("TCP to the Service: backend saw %q (err %v), want %s", strings.TrimSpace(out), err, underlay)
		}
	})
	masq1, rev1 := masqCounts(t, l, node)
	// A TCP connection, a UDP exchange and a ping at least, each way.
	if masq1-masq0 < 3 || rev1-rev0 < 3 {
		t.Errorf("%s counted %d masqueraded and %d reversed packets, want 3 or more each", node, masq1-masq0, rev1-rev0)
	}

	t.Run("nonMasqueradeCIDRs", func(t *testing.T) {
		srcs := captureSources(t, world, "icmp[icmptype] == icmp-echo", 1, func() {
			// No route back: the echo request leaves with the pod's address
			// and no reply comes.
			if err := testenv.Ping(l.PodNS(pod), testenv.WorldNoMasqAddr, 200*time.Millisecond); err == nil {
				t.Errorf("%s answered %s: it has no route back to the pod's own address, so the request was masqueraded", testenv.WorldNoMasqAddr, pod)
			}
		})
		if len(srcs) != 1 || srcs[0] != podAddr.String() {
			t.Errorf("%s (nonMasqueradeCIDRs) saw echo requests from %v, want the pod's %s", testenv.WorldNoMasqAddr, srcs, podAddr)
		}
	})
	// A peer's node address is reached through the tunnel, as the peer answers
	// the pod: b1's host sees the request arrive decapsulated on
	// isthmus0 from the pod's own address, and answers.
	t.Run("peered site's node", func(t *testing.T) {
		b1, _ := l.Node("b1")
		srcs := captureSourcesOn(t, l.NodeNS("b1"), "isthmus0", "icmp[icmptype] == icmp-echo and dst host "+b1.Address.String(), 1, func() {
			if err := testenv.Ping(l.PodNS(pod), b1.Address, 2*time.Second); err != nil {
				t.Errorf("ping b1's node address from %s (captured): %v", pod, err)
			}
		})
		if len(srcs) != 1 || srcs[0] != podAddr.String() {
			t.Errorf("b1 saw echo requests from %v, want the pod's %s", srcs, podAddr)
		}
		if err := testenv.Ping(l.PodNS(pod), b1.Address, 2*time.Second); err != nil {
			t.Errorf("ping b1's node address from %s: %v", pod, err)
		}
	})
}
