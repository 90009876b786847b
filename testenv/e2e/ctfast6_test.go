package e2e

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
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
			n += rule6Count(ctx, t, l, node, table, chain, target, comment)
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
		addr := netip.AddrPortFrom(dst.Addr(), 5312)
		cs, ss, port := connPair(ctx, t, l.PodNS(client), l.PodNS(server), addr)
		fastBefore := fast("b1")
		chunk := bytes.Repeat([]byte("before the cut "), 1<<14)
		for _, dir := range []struct{ w, r net.Conn }{{cs, ss}, {ss, cs}} {
			if _, err := dir.w.Write(chunk); err != nil {
				t.Fatal(err)
			}
			if err := readExactly(dir.r, chunk); err != nil {
				t.Fatal(err)
			}
		}
		if fast("b1") == fastBefore {
			t.Fatal("b1: the IPv6 flow never took the fast path")
		}
		rule := []string{"FORWARD", "-s", src.Address6.String(), "-d", dst.Addr().String(), "-j", "DROP"}
		if _, err := l.Exec(ctx, l.NodeNS("b1"), append([]string{"ip6tables", "-w", "-I"}, rule...)...); err != nil {
			t.Fatal(err)
		}
		defer l.Exec(context.Background(), l.NodeNS("b1"), append([]string{"ip6tables", "-w", "-D"}, rule...)...)
		if _, err := l.Exec(ctx, l.NodeNS("b1"), "conntrack", "-D", "-f", "ipv6", "-p", "tcp", "--orig-src", src.Address6.String(),
			"--orig-dst", dst.Addr().String(), "--orig-port-src", strconv.Itoa(int(port)), "--orig-port-dst", strconv.Itoa(int(addr.Port()))); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.Write([]byte("after the cut")); err != nil {
			t.Fatal(err)
		}
		ss.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 64)
		n, err := ss.Read(buf)
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("after the DROP rule and conntrack -D the server read %d bytes (%q), %v; want nothing within 3 s", n, buf[:n], err)
		}
		if d := rule6Count(ctx, t, l, "b1", "filter", "FORWARD", "DROP", src.Address6.String()); d == 0 {
			t.Error("the IPv6 DROP rule counted no packet: the flow was not cut by it")
		}
		cs.(*net.TCPConn).SetLinger(0)
		ss.(*net.TCPConn).SetLinger(0)
		cs.Close()
		ss.Close()
	})
}

// rule6Count is ruleCount for ip6tables, in table.
func rule6Count(ctx context.Context, t *testing.T, l *testenv.Lab, node, table, chain, target, comment string) uint64 {
	t.Helper()
	out, err := l.Exec(ctx, l.NodeNS(node), "ip6tables", "-w", "-t", table, "-nvxL", chain)
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
	t.Fatalf("no %s rule %q in ip6tables %s %s on %s:\n%s", target, comment, table, chain, node, out)
	return 0
}
