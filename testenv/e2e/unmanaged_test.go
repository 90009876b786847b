package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// Failover bound of docs/unmanaged-sites.md with the agent's defaults
// (--health-interval 1s, --health-multiplier 3): interval x multiplier + 1s.
const (
	healthInterval   = time.Second
	healthMultiplier = 3
	healthRise       = 3
	failoverLimit    = healthInterval*healthMultiplier + time.Second
)

// TestSeed000 is seed 000's mesh case end to end, through the stateful firewall:
// every pair that should talk does, in both directions, over ICMP, TCP and UDP,
// with strict rp_filter dropping nothing (checkPaths);
// the flex pod sees the seed's pod 10.0.2.128 with its own address (declared
// block, routed back through the cluster's nodes) and the undeclared
// 10.0.4.10 as aks-1's tunnel address 100.64.0.4 (return-path SNAT); node to
// node underlay traffic still passes; and a pod packet sent across without the
// tunnel is still dropped by the firewall.
func TestSeed000(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testSeed000)
}

// testSeed000 is TestSeed000 with every agent started with --decap decap.
func testSeed000(t *testing.T, decap string) {
	l := upScenarioDecap(t, "seed000", decap)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	m := checkPaths(t, l, "aks-1", "aks-2", "flex-1")
	t.Run("matrix", func(t *testing.T) {
		// Both directions between every Azure-CNI-style pod and the flex pod
		// (except into the undeclared pool, which nothing routes to).
		for _, aks := range []string{"aks1-p1", "aks2-p1", "aks1-ext"} {
			pairs := [][2]string{{aks, "flex-p1"}}
			if aks != "aks1-ext" {
				pairs = append(pairs, [2]string{"flex-p1", aks})
			}
			for _, pr := range pairs {
				for _, proto := range testenv.Protos {
					if p, ok := m.Get(pr[0], pr[1], proto); !ok || !p.OK {
						t.Errorf("%s -> %s %s: probed %v, passed %v (%s)", pr[0], pr[1], proto, ok, p.OK, p.Err)
					}
				}
			}
		}
		// What the receiving flex pod saw.
		for _, c := range []struct {
			src  string
			want netip.Addr
		}{
			{"aks1-p1", netip.MustParseAddr("10.0.2.128")}, // declared block: source preserved
			{"aks2-p1", netip.MustParseAddr("10.0.2.200")},
			{"aks1-ext", netip.MustParseAddr("100.64.0.4")}, // undeclared: translated to aks-1's tunnel address
		} {
			for _, proto := range []testenv.Proto{testenv.TCP, testenv.UDP} {
				p, _ := m.Get(c.src, "flex-p1", proto)
				if p.Saw != c.want {
					t.Errorf("%s -> flex-p1 %s: flex-p1 saw %s, want %s", c.src, proto, p.Saw, c.want)
				}
			}
		}
	})

	t.Run("underlay", func(t *testing.T) {
		for _, pair := range [][2]string{{"aks-1", "flex-1"}, {"flex-1", "aks-1"}, {"aks-2", "flex-1"}, {"flex-1", "aks-2"}, {"aks-1", "aks-2"}} {
			dst, _ := l.Node(pair[1])
			if err := testenv.Ping(l.NodeNS(pair[0]), dst.Address, 2*time.Second); err != nil {
				t.Errorf("node %s -> node %s (%s): %v", pair[0], pair[1], dst.Address, err)
			}
		}
	})

	t.Run("firewall", func(t *testing.T) {
		before, err := l.FirewallDrops(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Nothing routes 10.0.4.10 into the tunnel on flex-1, so the packet
		// goes out plain and the firewall must stop it.
		if err := testenv.Ping(l.PodNS("flex-p1"), l.PodAddr("aks1-ext"), 500*time.Millisecond); err == nil {
			t.Error("flex-p1 reached the undeclared 10.0.4.10 straight through the firewall")
		}
		after, err := l.FirewallDrops(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after <= before {
			t.Errorf("firewall drops %d -> %d: the plain packet was not dropped there", before, after)
		}
	})
}

// TestSeed000Failover: with flows from the flex pod to the seed's pod
// 10.0.2.128 spread over both cluster nodes by the route group, aks-2's
// underlay link goes down. Flows through aks-1 never stop; flows through aks-2
// resume through aks-1 within health interval x multiplier + 1s.
func TestSeed000Failover(t *testing.T) { eachDecap(t, testSeed000Failover) }

// testSeed000Failover is TestSeed000Failover with every agent started with --decap decap.
func testSeed000Failover(t *testing.T, decap string) {
	l := upScenarioDecap(t, "seed000", decap)
	measureFailover(t, l, failover{SrcPod: "flex-p1", DstPod: "aks1-p1", Flows: 16, FailNode: "aks-2",
		Logs: []string{"flex-1"}})
}
