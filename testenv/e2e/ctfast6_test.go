package e2e

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// TestConntrackFastPathIPv6 is TestConntrackFastPath's core for IPv6 pods, on the
// dualstack scenario (the CNI's ip6tables leftovers on every node: FORWARD policy
// DROP with `--ctstate INVALID -j DROP`, MASQUERADE, and the strict IPv6 rpfilter
// rule), with short conntrack timeouts on both nodes:
//   - a bulk transfer both ways between a1-p1 and b1-p1 over IPv6 takes the fast
//     path on both nodes (ct_fast counts it), closes cleanly with every byte checked,
//     and the INVALID and rpfilter rules drop nothing; afterwards conntrack keeps the
//     flow at most the TIME_WAIT timeout, then forgets it;
//   - a fast-path flow is cut by an ip6tables FORWARD DROP rule plus conntrack -D
//     of its entry on the receiving node.
func TestConntrackFastPathIPv6(t *testing.T) {
	l := upScenario(t, "dualstack")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	client, server := "a1-p1", "b1-p1"
	nodes := []string{"a1", "b1"}
	shortCtTimeouts(ctx, t, l, nodes)
	rules6 := func(table, chain, target, comment string) (n uint64) {
		for _, node := range nodes {
			n += tableRuleCount(ctx, t, l, node, "ip6tables", table, chain, target, comment)
		}
		return n
	}
	invalid := func() uint64 { return rules6("filter", "FORWARD", "DROP", "ctstate INVALID") }
	rpfilter := func() uint64 { return rules6("raw", "PREROUTING", "DROP", "rpfilter") }
	invalidBefore, rpBefore := invalid(), rpfilter()
	fast := func(node string) uint64 { return counterPackets(t, l, node, "ct_fast", false) }
	src, _ := l.Pod(client)
	srv, _ := l.Pod(server)
	if !src.Address6.IsValid() || !srv.Address6.IsValid() {
		t.Fatalf("the dualstack pods have no IPv6 address: %v, %v", src.Address6, srv.Address6)
	}
	dst := netip.AddrPortFrom(srv.Address6, 5311)

	t.Run("bulk and clean close", func(t *testing.T) {
		fastBefore := map[string]uint64{"a1": fast("a1"), "b1": fast("b1")}
		port, err := exchange(ctx, l.PodNS(client), l.PodNS(server), dst, dst, 8<<20, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			d := fast(n) - fastBefore[n]
			t.Logf("%s: %d packets of the IPv6 flow on the fast path", n, d)
			if d < 100 {
				t.Errorf("%s: ct_fast counted %d packets of the bulk IPv6 flow, want at least 100: it did not take the fast path", n, d)
			}
		}
		if n := invalid(); n != invalidBefore {
			t.Errorf("the IPv6 INVALID drop rules counted %d packets during the flow", n-invalidBefore)
		}
		if n := rpfilter(); n != rpBefore {
			t.Errorf("the strict IPv6 rpfilter rules dropped %d packets during the flow", n-rpBefore)
		}
		checkShortLived(ctx, t, l, nodes, port, dst, ctTimeWait)
	})

	t.Run("revoked with conntrack -D", func(t *testing.T) {
		checkRevoked(ctx, t, l, client, server, src.Address6, netip.AddrPortFrom(dst.Addr(), 5312), fast)
	})
}

// tableRuleCount is ruleCount for command (iptables or ip6tables) in table.
func tableRuleCount(ctx context.Context, t *testing.T, l *testenv.Lab, node, command, table, chain, target, comment string) uint64 {
	t.Helper()
	out, err := l.Exec(ctx, l.NodeNS(node), command, "-w", "-t", table, "-nvxL", chain)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == target && strings.Contains(line, comment) {
			n, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				t.Fatalf("parse counter in %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s rule %q in %s %s %s on %s:\n%s", target, comment, command, table, chain, node, out)
	return 0
}
