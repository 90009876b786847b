package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// TestDualStackGateways: on the dualstackgw scenario (sites west and east joined only
// through two gateways each, the firewall passing cross-site traffic between gateways
// only; every pod with an IPv4 and an IPv6 address from the real CNI plugin; a CNI's
// leftover MASQUERADE and FORWARD rules in both families and the strict IPv6 rpfilter
// rule on every node), with TC and with XDP decapsulation, every pod reaches every
// other in both families over ICMP, TCP and UDP, every server sees the client pod's
// own address, and the strict IPv6 rpfilter rule dropped nothing. An IPv6 ping from a
// member to a member of the other site is forwarded by gateways (transit counted on
// both sides), and tshark, an independent decoder, finds it on the router between
// the sites as GENEVE from a west gateway to an east gateway, the inner IPv6 source
// the west pod's own.
func TestDualStackGateways(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testDualStackGateways)
}

func testDualStackGateways(t *testing.T, decap string) {
	l := upScenarioDecap(t, "dualstackgw", decap)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, unprobed := l.Expectations6()
	if len(unprobed) != 0 {
		t.Errorf("pairs left out of the IPv6 probes: %v", unprobed)
	}
	m, err := l.Check(ctx)
	t.Logf("matrix:\n%s", m)
	if err != nil {
		t.Error(err)
	}
	// Six pods: 30 ordered pairs, three protocols, in IPv6 too.
	if v6 := checkOwnSources(t, l, m); v6 != 30*3 {
		t.Errorf("%d IPv6 probes, want %d", v6, 30*3)
	}
	checkRPFilter6Clean(ctx, t, l)

	// One IPv6 ping, member to member: transit on a gateway of each site, and on the
	// wire between the sites GENEVE from a west gateway to an east one with the west
	// pod's own source.
	transits := func(site string) uint64 {
		var sum uint64
		for _, n := range l.Scenario.Nodes() {
			if n.Site.Name != site || !strings.HasPrefix(n.Name, "gw-") {
				continue
			}
			for k, c := range nodeMetrics(t, l, n.Name) {
				if !k.IsDrop() && k.Name() == "transit" {
					sum += c.Packets
				}
			}
		}
		return sum
	}
	src, _ := l.Pod("w1-p1")
	dst, _ := l.Pod("e1-p1")
	beforeW, beforeE := transits("west"), transits("east")
	out, err := testenv.Capture(ctx, l.RouterNS(), []string{"-i", "any",
		// From west to east (every node's frames cross the router, a member's to
		// its own gateway too), inner IPv6 only (the type of the inner Ethernet
		// header behind 8 bytes of UDP and of GENEVE without options): the
		// gateways' health probes cross as well.
		"-f", fmt.Sprintf("udp port 6081 and src net %s and dst net %s and udp[28:2] = 0x86dd", l.Scenario.Sites[0].Subnet, l.Scenario.Sites[1].Subnet), "-d", "udp.port==6081,geneve", "-Y", "icmpv6.type==128", "-c", "1",
		"-T", "fields", "-E", "separator=,", "-e", "ip.src", "-e", "ip.dst", "-e", "geneve.vni", "-e", "ipv6.src", "-e", "ipv6.dst"},
		func() {
			if err := testenv.Ping(l.PodNS(src.Name), dst.Address6, time.Second); err != nil {
				t.Errorf("ping %s from %s: %v", dst.Address6, src.Name, err)
			}
		})
	if err != nil {
		t.Fatalf("capture: %v\n%s", err, out)
	}
	gateways := map[string][]string{}
	for _, n := range l.Scenario.Nodes() {
		if strings.HasPrefix(n.Name, "gw-") {
			gateways[n.Site.Name] = append(gateways[n.Site.Name], n.Address.String())
		}
	}
	f := strings.Split(strings.TrimSpace(out), ",")
	vni := fmt.Sprintf("0x%06x", l.Scenario.VNI)
	if len(f) != 5 || !slices.Contains(gateways["west"], f[0]) || !slices.Contains(gateways["east"], f[1]) || f[2] != vni ||
		f[3] != src.Address6.String() || f[4] != dst.Address6.String() {
		t.Errorf("on the router: %q, want GENEVE (VNI %s) from one of %v to one of %v carrying %s -> %s",
			out, vni, gateways["west"], gateways["east"], src.Address6, dst.Address6)
	}
	if w, e := transits("west")-beforeW, transits("east")-beforeE; w == 0 || e == 0 {
		t.Errorf("transit counted %d times on west's gateways and %d on east's during an IPv6 ping, want both > 0", w, e)
	}
}
