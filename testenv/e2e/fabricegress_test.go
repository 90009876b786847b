package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// TestSeed000GatewayPodsOnTheirOwnDevices is seed 000's gateway topology with
// the agents leaving the Azure-CNI-style pods' interfaces alone
// (--pod-interfaces pod-*, the DaemonSet's default), under strict rp_filter on
// every node: the gateway aks-1 hands the flex pod's packets for the member's
// declared pod to the site fabric, so they reach aks-2 on eth0, and aks-2 must
// route the flex pods, for that pod's source, to eth0 as well (its fabric
// table; the datapath tunnels what leaves there to the gateway). Every pair,
// both ways, ICMP, TCP and UDP, with the source each receiver saw, from cold
// neighbour caches; TcpExtIPReversePathFilter stays 0 on every node (checkPaths);
// and the member's routes say so: eth0 for the declared pod's source, isthmus0
// for the host's own traffic. Before the fabric table the member routed the
// flex pods into isthmus0 for every source, and strict rp_filter dropped every
// reply to aks2-p1.
func TestSeed000GatewayPodsOnTheirOwnDevices(t *testing.T) {
	beside(t, weightLab)
	sc, err := testenv.LoadScenario("seed000gw")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := upLab(ctx, t, sc, testenv.Options{AgentArgs: []string{"--pod-interfaces", testenv.PodIfacePattern}})
	m := checkPaths(t, l, "aks-1", "aks-2")
	for _, pr := range [][2]string{{"aks2-p1", "flex-p1"}, {"flex-p1", "aks2-p1"}} {
		for _, proto := range testenv.Protos {
			if p, ok := m.Get(pr[0], pr[1], proto); !ok || !p.OK {
				t.Errorf("%s -> %s %s: probed %v, passed %v (%s)", pr[0], pr[1], proto, ok, p.OK, p.Err)
			}
		}
	}
	flex, pod := l.PodAddr("flex-p1").String(), l.PodAddr("aks2-p1").String()
	routeDev := func(args ...string) string {
		out, err := l.Exec(ctx, l.NodeNS("aks-2"), append([]string{"ip", "-o", "route", "get", flex}, args...)...)
		if err != nil {
			t.Fatalf("ip route get %s %v on aks-2: %v", flex, args, err)
		}
		return out
	}
	if out := routeDev("from", pod, "iif", l.HostVeth("aks2-p1")); !strings.Contains(out, "dev "+testenv.UnderlayDev+" ") {
		t.Errorf("aks-2 routes %s for the declared pod %s by %q, want the underlay device: its replies arrive there", flex, pod, out)
	}
	if out := routeDev(); !strings.Contains(out, "dev isthmus0 ") {
		t.Errorf("aks-2 routes its own traffic to %s by %q, want isthmus0", flex, out)
	}
}
