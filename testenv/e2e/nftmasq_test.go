package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/testenv"
)

// TestNFTMasqueradeKeptAway: the default scenario whose nodes carry, instead of
// iptables leftovers, a CNI's masquerade written with nft in a table of its own
// at srcnat, as an nftables-native CNI writes it:
//
//	table ip cni { chain postrouting { type nat hook postrouting priority srcnat; ip saddr { <pod blocks> } masquerade } }
//
// An accept in another table cannot stop it (nftables runs every base chain of
// a hook). Every pod still reaches every other with its own address, so the
// agent's nat binding (table ip isthmus, before srcnat) kept the rule away; the
// agent's rules counted the packets; and the CNI's rule is live: a pod reaching
// the router, which has no route to pod addresses, is answered only because the
// rule masqueraded it to its node's address.
func TestNFTMasqueradeKeptAway(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testNFTMasqueradeKeptAway)
}

// testNFTMasqueradeKeptAway is TestNFTMasqueradeKeptAway with every agent
// started with --decap decap.
func testNFTMasqueradeKeptAway(t *testing.T, decap string) {
	requireSetup(t)
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	sc.Decap = decap
	sc.Defaults.CNILeftovers = testenv.Leftovers{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l := upLab(ctx, t, sc, testenv.Options{})
	var blocks []string
	for _, b := range sc.PodBlocks() {
		blocks = append(blocks, b.String())
	}
	cniTable := fmt.Sprintf("table ip cni {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip saddr { %s } counter masquerade\n\t}\n}\n", strings.Join(blocks, ", "))
	for _, n := range sc.Nodes() {
		cmd := testenv.Command(ctx, l.NodeNS(n.Name), "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(cniTable)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("node %s: install the CNI's nft masquerade: %v: %s", n.Name, err, out)
		}
	}

	m, err := l.Check(ctx)
	t.Logf("matrix:\n%s", m)
	if err != nil {
		t.Fatal(err)
	}
	checkOwnSources(t, l, m)
	for _, n := range sc.Nodes() {
		if c := nftCounter(ctx, t, l, n.Name, "ip "+datapath.ExemptTable, "isthmus: pod traffic keeps its addresses"); c == 0 {
			t.Errorf("node %s: the agent's nat binding rule counted no packet", n.Name)
		}
	}

	// The control: traffic isthmus does not carry is the CNI's to masquerade.
	srv, err := testenv.StartEchoServer(l.RouterNS())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	site := sc.Sites[0]
	gw := site.Gateway
	if !gw.IsValid() {
		gw = site.Subnet.Addr().Next()
	}
	pod := site.Nodes[0].Pods[0]
	saw, err := eventuallyTCPEcho(l.PodNS(pod.Name), netip.AddrPortFrom(gw, srv.TCPPort))
	if err != nil {
		t.Fatalf("%s -> router %s: %v (the CNI's masquerade should have made this work)", pod.Name, gw, err)
	}
	if saw != site.Nodes[0].Address {
		t.Errorf("%s -> router %s: router saw %s, want node %s's address %s (the CNI's masquerade)", pod.Name, gw, saw, site.Nodes[0].Name, site.Nodes[0].Address)
	}
}

var nftPackets = regexp.MustCompile(`counter packets (\d+)`)

// nftCounter reads the packet counter of the rule with comment in an nftables
// table on node.
func nftCounter(ctx context.Context, t *testing.T, l *testenv.Lab, node, table, comment string) uint64 {
	t.Helper()
	out, err := l.Exec(ctx, l.NodeNS(node), append([]string{"nft", "list", "table"}, strings.Fields(table)...)...)
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, strconv.Quote(comment)) {
			continue
		}
		if m := nftPackets.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseUint(m[1], 10, 64)
			return n
		}
	}
	t.Fatalf("node %s: no counted rule %q in table %s:\n%s", node, comment, table, out)
	return 0
}
