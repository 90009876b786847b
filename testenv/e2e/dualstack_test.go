package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/testenv"
)

// TestDualStackMesh: on the dualstack scenario (two meshed sites, every pod given an
// IPv4 and an IPv6 address by the real CNI plugin through cnitool; on every node
// strict rp_filter, a CNI's leftover MASQUERADE and FORWARD rules in both families,
// an nftables CNI's IPv6 masquerade in a table of its own, and the strict IPv6
// rpfilter rule), with TC and with XDP decapsulation, every pod reaches every other
// in both families over ICMP, TCP and UDP, every server sees the client pod's own
// address, the agent's IPv6 nat binding counted packets, and the IPv6 rpfilter rule
// dropped nothing. On the wire between the sites tshark, an independent decoder,
// finds the IPv6 echo inside GENEVE over the IPv4 underlay, from pod to pod.
func TestDualStackMesh(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testDualStackMesh)
}

func testDualStackMesh(t *testing.T, decap string) {
	l := upScenarioDecap(t, "dualstack", decap)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Beside the iptables leftovers, an nftables-native CNI's IPv6 masquerade in
	// a table of its own, which no accept elsewhere stops (TestNFTMasqueradeKeptAway
	// for IPv4): only the agent's nat binding (table ip6 isthmus) keeps it away.
	var blocks6 []string
	for _, b := range l.Scenario.PodBlocks() {
		if b.Addr().Is6() {
			blocks6 = append(blocks6, b.String())
		}
	}
	cniTable := fmt.Sprintf("table ip6 cni {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip6 saddr { %s } counter masquerade\n\t}\n}\n", strings.Join(blocks6, ", "))
	for _, n := range l.Scenario.Nodes() {
		cmd := testenv.Command(ctx, l.NodeNS(n.Name), "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(cniTable)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("node %s: install the CNI's nft IPv6 masquerade: %v: %s", n.Name, err, out)
		}
	}
	m, err := l.Check(ctx)
	t.Logf("matrix:\n%s", m)
	if err != nil {
		t.Error(err)
	}
	// Eight pods: 56 ordered pairs, three protocols, in IPv6 too.
	if v6 := checkOwnSources(t, l, m); v6 != 56*3 {
		t.Errorf("%d IPv6 probes, want %d", v6, 56*3)
	}

	for _, n := range l.Scenario.Nodes() {
		if c := nftCounter(ctx, t, l, n.Name, "ip6 "+datapath.ExemptTable, "isthmus: pod traffic keeps its addresses"); c == 0 {
			t.Errorf("node %s: the agent's IPv6 nat binding rule counted no packet", n.Name)
		}
	}
	checkRPFilter6Clean(ctx, t, l)

	src, _ := l.Pod("a1-p1")
	dst, _ := l.Pod("b1-p1")
	out, err := testenv.Capture(ctx, l.RouterNS(), []string{"-i", testenv.RouterPort(src.Node),
		"-f", "udp port 6081", "-d", "udp.port==6081,geneve", "-Y", "icmpv6.type==128", "-c", "1",
		"-T", "fields", "-E", "separator=,", "-e", "ip.src", "-e", "ip.dst", "-e", "geneve.vni", "-e", "ipv6.src", "-e", "ipv6.dst"},
		func() {
			if err := testenv.Ping(l.PodNS(src.Name), dst.Address6, time.Second); err != nil {
				t.Logf("ping %s: %v", dst.Address6, err)
			}
		})
	if err != nil {
		t.Fatalf("capture: %v\n%s", err, out)
	}
	srcNode, _ := l.Node(src.Node)
	dstNode, _ := l.Node(dst.Node)
	vni := fmt.Sprintf("0x%06x", l.Scenario.VNI) // as tshark prints it
	want := strings.Join([]string{srcNode.Address.String(), dstNode.Address.String(), vni, src.Address6.String(), dst.Address6.String()}, ",")
	if got := strings.TrimSpace(out); got != want {
		t.Errorf("on the wire: %q, want outer,outer,vni,inner,inner %q", got, want)
	}
}

// checkRPFilter6Clean fails t unless every node of l has the strict IPv6
// reverse-path rule (the lab's ip6tables raw rpfilter rule, firewalld's default)
// and it dropped nothing.
func checkRPFilter6Clean(ctx context.Context, t *testing.T, l *testenv.Lab) {
	t.Helper()
	for _, n := range l.Scenario.Nodes() {
		out, err := l.Exec(ctx, l.NodeNS(n.Name), "ip6tables", "-w", "-t", "raw", "-L", "PREROUTING", "-v", "-x", "-n")
		if err != nil {
			t.Fatalf("%s: ip6tables: %v\n%s", n.Name, err, out)
		}
		rule := ""
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "rpfilter") {
				rule = line
			}
		}
		if f := strings.Fields(rule); len(f) == 0 || f[0] != "0" {
			t.Errorf("%s: the strict IPv6 rpfilter rule dropped packets (or is missing):\n%s", n.Name, out)
		}
	}
}
