package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/inspect"
	"github.com/isthmus-dev/isthmus/testenv"
)

// The conntrack timeouts TestConntrackFastPath gives both nodes, in seconds: short,
// so that expiry happens within the test, and in the order the fast path relies on
// (ESTABLISHED longer than TIME_WAIT; docs/architecture.md, "The conntrack fast
// path").
const (
	ctEstablished = 8
	ctTimeWait    = 4
	ctClose       = 2
)

// TestConntrackFastPath runs TCP flows between a1-p1 and b1-p1 of the default lab,
// whose nodes carry the CNI leftovers' `FORWARD -m conntrack --ctstate INVALID -j
// DROP`, with short conntrack timeouts on both nodes:
//   - a bulk transfer both ways takes the fast path on both nodes (ct_fast counts it)
//     and closes cleanly: each side reads all the other sent, then EOF; the INVALID
//     rule drops nothing; afterwards conntrack's entry is short-lived (at most the
//     TIME_WAIT timeout) and then gone, not kept for the ESTABLISHED timeout;
//   - a flow reset (RST) keeps its entry at most the CLOSE timeout;
//   - a flow left idle past the ESTABLISHED timeout (its entry expires) still
//     carries data both ways and closes cleanly;
//   - a fast-path flow is cut by a FORWARD DROP rule plus conntrack -D of its entry
//     on the receiving node: no entry sends the next packet through the stack;
//   - within TIME_WAIT of a clean close, a new connection on the same 4-tuple is a
//     NEW flow for the receiving node's FORWARD (a rule dropping NEW stops it);
//   - a flow through a DNAT rule of kube-proxy's shape (a Service) and one through
//     a SNAT rule never take the fast path on the node that translates them.
func TestConntrackFastPath(t *testing.T) {
	l := upDefault(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	client, server := "a1-p1", "b1-p1"
	nodes := []string{"a1", "b1"}
	invalid := shortCtTimeouts(ctx, t, l, nodes)
	invalidBefore := invalid()
	fast := func(node string) uint64 { return counterPackets(t, l, node, "ct_fast", false) }
	dst := netip.AddrPortFrom(l.PodAddr(server), 5301)

	t.Run("bulk and clean close", func(t *testing.T) {
		fastBefore := map[string]uint64{"a1": fast("a1"), "b1": fast("b1")}
		const size = 8 << 20
		port, err := exchange(ctx, l.PodNS(client), l.PodNS(server), dst, dst, size, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			// 8 MiB each way is some 90 GSO segments of 64 KiB and as many ACKs at
			// the least; the handshake and the first ACK take the stack.
			d := fast(n) - fastBefore[n]
			t.Logf("%s: %d packets of the flow on the fast path", n, d)
			if d < 100 {
				t.Errorf("%s: ct_fast counted %d packets of the bulk flow, want at least 100: it did not take the fast path", n, d)
			}
		}
		if n := invalid(); n != invalidBefore {
			t.Errorf("the INVALID drop rules counted %d packets during the flow (%d -> %d)", n-invalidBefore, invalidBefore, n)
		}
		checkShortLived(ctx, t, l, nodes, port, dst, ctTimeWait)
	})

	t.Run("reset", func(t *testing.T) {
		fastBefore := fast("a1")
		ln, err := listenIn(l.PodNS(server), netip.AddrPortFrom(dst.Addr(), 5304))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		srvErr := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				srvErr <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			_, err = io.Copy(io.Discard, c)
			srvErr <- err
		}()
		c, err := dialFrom(ctx, l.PodNS(client), netip.AddrPortFrom(dst.Addr(), 5304))
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(c.LocalAddr().(*net.TCPAddr).Port)
		if _, err := c.Write(make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		// SO_LINGER 0: close sends a RST, not a FIN.
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		if err := <-srvErr; err == nil || !strings.Contains(err.Error(), "connection reset") {
			t.Errorf("the server's read ended with %v, want connection reset by peer", err)
		}
		if fast("a1") == fastBefore {
			t.Error("a1: the flow never took the fast path")
		}
		checkShortLived(ctx, t, l, nodes, port, netip.AddrPortFrom(dst.Addr(), 5304), ctClose)
		if n := invalid(); n != invalidBefore {
			t.Errorf("the INVALID drop rules counted %d packets", n-invalidBefore)
		}
	})

	t.Run("idle past the established timeout", func(t *testing.T) {
		idle := time.Duration(ctEstablished+3) * time.Second
		var checked int
		expired := func() error {
			// The server's port is known; the client's is found by its listing.
			for _, n := range nodes {
				out, err := l.Exec(ctx, l.NodeNS(n), "conntrack", "-L", "-p", "tcp", "--orig-dst", dst.Addr().String(), "--orig-port-dst", strconv.Itoa(int(dst.Port())))
				if err != nil && !strings.Contains(err.Error(), "0 flow entries") {
					return fmt.Errorf("conntrack -L on %s: %w", n, err)
				}
				if strings.Contains(out, "ESTABLISHED") {
					return fmt.Errorf("%s: conntrack still holds the flow after %s idle, past its ESTABLISHED timeout of %d s; the test does not test expiry:\n%s", n, idle, ctEstablished, out)
				}
			}
			checked++
			return nil
		}
		if _, err := exchange(ctx, l.PodNS(client), l.PodNS(server), dst, dst, 256<<10, idle, expired); err != nil {
			for _, n := range nodes {
				ct, _ := l.Exec(ctx, l.NodeNS(n), "conntrack", "-L", "-p", "tcp")
				fw, _ := l.Exec(ctx, l.NodeNS(n), "iptables", "-w", "-nvxL", "FORWARD")
				t.Logf("%s: conntrack:\n%s\nFORWARD:\n%s\ncounters: %s", n, ct, fw, countersText(t, l, n))
			}
			t.Fatal(err)
		}
		if checked != 1 {
			t.Fatal("the client never checked conntrack after idling")
		}
		t.Logf("a flow idle for %s (conntrack's ESTABLISHED timeout %d s, its entry gone) carried data both ways after it and closed", idle, ctEstablished)
		if n := invalid(); n != invalidBefore {
			t.Errorf("the INVALID drop rules counted %d packets", n-invalidBefore)
		}
	})

	t.Run("revoked with conntrack -D", func(t *testing.T) {
		checkRevoked(ctx, t, l, client, server, l.PodAddr(client), netip.AddrPortFrom(dst.Addr(), 5305), fast)
		time.Sleep(500 * time.Millisecond)
		invalidBefore = invalid()
	})

	t.Run("new flow on a closed tuple", func(t *testing.T) {
		// Three connections from the same client port to the same server port, each
		// closed cleanly by the server first (so the client's port is free at once and
		// the server's TIME_WAIT socket takes the next SYN). The second, with no rule,
		// shows the tuple can be reused; before the third, b1 drops ctstate NEW from the
		// client: within TIME_WAIT of the second's close, the third's SYN must be a NEW
		// flow for b1's conntrack (the fast path closed the flow and expires its entry),
		// not one ignored as ESTABLISHED, so it must fail.
		addr := netip.AddrPortFrom(dst.Addr(), 5306)
		local := netip.AddrPortFrom(l.PodAddr(client), 47006)
		ln, err := listenIn(l.PodNS(server), addr)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					buf := make([]byte, 5)
					if _, err := io.ReadFull(c, buf); err == nil {
						c.Write(bytes.Repeat([]byte("reply "), 1<<14))
					}
					c.Close() // the server closes first
				}()
			}
		}()
		flow := func() error {
			var c net.Conn
			if err := testenv.Do(l.PodNS(client), func() error {
				d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(local),
					Control: func(_, _ string, rc syscall.RawConn) error {
						var serr error
						err := rc.Control(func(fd uintptr) {
							serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
						})
						return errors.Join(err, serr)
					}}
				var err error
				c, err = d.DialContext(ctx, "tcp4", addr.String())
				return err
			}); err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write([]byte("hello")); err != nil {
				return err
			}
			got, err := io.ReadAll(c)
			if err != nil {
				return fmt.Errorf("read to EOF: %w", err)
			}
			if len(got) != 6<<14 {
				return fmt.Errorf("read %d bytes, want %d", len(got), 6<<14)
			}
			return nil
		}
		before := fast("b1")
		for i := 1; i <= 2; i++ {
			if err := flow(); err != nil {
				t.Fatalf("connection %d from %s: %v", i, local, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if fast("b1") == before {
			t.Fatal("b1: the flows never took the fast path")
		}
		rule := []string{"FORWARD", "-s", l.PodAddr(client).String(), "-d", dst.Addr().String(),
			"-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"}
		if _, err := l.Exec(ctx, l.NodeNS("b1"), append([]string{"iptables", "-w", "-I"}, rule...)...); err != nil {
			t.Fatal(err)
		}
		defer l.Exec(context.Background(), l.NodeNS("b1"), append([]string{"iptables", "-w", "-D"}, rule...)...)
		if left, ok := ctTimeout(ctx, t, l, "b1", local.Port(), addr); ok {
			t.Logf("b1 holds the closed flow for %d s more", left)
		}
		err = flow()
		if err == nil {
			t.Fatal("a third connection on the closed tuple got through b1's rule dropping NEW flows: conntrack took its SYN for ESTABLISHED")
		}
		t.Logf("the third connection failed as it should: %v", err)
		if n := ruleCount(ctx, t, l, "b1", "FORWARD", "DROP", "ctstate NEW"); n == 0 {
			t.Error("the NEW drop rule counted no packet")
		}
	})

	t.Run("translated flows keep the stack", func(t *testing.T) {
		// kube-proxy's shape of a ClusterIP rule on the client's node, and a SNAT of
		// the client's ports (its address stays, so replies still reach it) in an nft
		// table of its own that runs before the agent's exemption (srcnat - 10) and so
		// binds the flow first.
		vip := netip.MustParseAddrPort("10.96.0.50:80")
		if _, err := l.Exec(ctx, l.NodeNS("a1"), "iptables", "-w", "-t", "nat", "-I", "PREROUTING", "-d", vip.Addr().String(),
			"-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", netip.AddrPortFrom(dst.Addr(), 5302).String()); err != nil {
			t.Fatal(err)
		}
		snat := fmt.Sprintf("table ip ctfasttest {\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat - 20; policy accept;\n"+
			"\t\tip saddr %s ip daddr %s tcp dport 5303 snat to %s:61000-61010\n\t}\n}\n", l.PodAddr(client), dst.Addr(), l.PodAddr(client))
		cmd := testenv.Command(ctx, l.NodeNS("a1"), "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(snat)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft -f: %v: %s", err, out)
		}
		for _, c := range []struct {
			what      string
			dial, lsn netip.AddrPort
			// translated says whether the server sees another port than the client's.
			translated bool
		}{
			{"Service (DNAT)", vip, netip.AddrPortFrom(dst.Addr(), 5302), false},
			{"SNAT", netip.AddrPortFrom(dst.Addr(), 5303), netip.AddrPortFrom(dst.Addr(), 5303), true},
		} {
			before, beforeB := fast("a1"), fast("b1")
			port, err := exchange(ctx, l.PodNS(client), l.PodNS(server), c.dial, c.lsn, 4<<20, 0, nil)
			if err != nil {
				t.Fatalf("%s: %v", c.what, err)
			}
			if inRange := port >= 61000 && port <= 61010; inRange != c.translated {
				t.Errorf("%s: the server saw source port %d; translated to 61000-61010: %v, want %v", c.what, port, inRange, c.translated)
			}
			if d := fast("a1") - before; d != 0 {
				t.Errorf("%s: a1, which translates the flow, took %d of its packets on the fast path, want 0", c.what, d)
			}
			// b1 translates nothing: the flow is an ordinary one there.
			if d := fast("b1") - beforeB; d < 50 {
				t.Errorf("%s: b1 took %d packets of the flow on the fast path, want at least 50 (it does not translate it)", c.what, d)
			}
		}
		if n := invalid(); n != invalidBefore {
			t.Errorf("the INVALID drop rules counted %d packets", n-invalidBefore)
		}
	})
}

// checkRevoked: an operator cuts an established fast-path flow from the pod
// client (address src) to addr on the pod server, across the lab's a1 and b1: a
// FORWARD DROP rule on b1, the receiving node (iptables or ip6tables, as addr's
// family), then conntrack -D of the flow there. With no entry the next packet goes
// through the stack, where the rule judges it: no byte crosses, and the rule counts
// it. The flow is reset at both ends before it returns.
func checkRevoked(ctx context.Context, t *testing.T, l *testenv.Lab, client, server string, src netip.Addr, addr netip.AddrPort, fast func(string) uint64) {
	t.Helper()
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
		t.Fatal("b1: the flow never took the fast path")
	}
	iptables, family := "iptables", "ipv4"
	if addr.Addr().Is6() {
		iptables, family = "ip6tables", "ipv6"
	}
	rule := []string{"FORWARD", "-s", src.String(), "-d", addr.Addr().String(), "-j", "DROP"}
	if _, err := l.Exec(ctx, l.NodeNS("b1"), append([]string{iptables, "-w", "-I"}, rule...)...); err != nil {
		t.Fatal(err)
	}
	defer l.Exec(context.Background(), l.NodeNS("b1"), append([]string{iptables, "-w", "-D"}, rule...)...)
	if _, err := l.Exec(ctx, l.NodeNS("b1"), "conntrack", "-D", "-f", family, "-p", "tcp", "--orig-src", src.String(),
		"--orig-dst", addr.Addr().String(), "--orig-port-src", strconv.Itoa(int(port)), "--orig-port-dst", strconv.Itoa(int(addr.Port()))); err != nil {
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
	if d := tableRuleCount(ctx, t, l, "b1", iptables, "filter", "FORWARD", "DROP", src.String()); d == 0 {
		t.Error("the DROP rule counted no packet: the flow was not cut by it")
	}
	// The cut flow's last packets meet b1's stack with no entry: INVALID, by
	// design. Both ends reset at once, so that no FIN retransmit runs on into the
	// next test, whose INVALID count starts after them.
	cs.(*net.TCPConn).SetLinger(0)
	ss.(*net.TCPConn).SetLinger(0)
	cs.Close()
	ss.Close()
}

// connPair connects from srcNS to addr, where it listens in dstNS, and returns the
// client's and the server's ends (closed when the test ends) and the client's port.
func connPair(ctx context.Context, t *testing.T, srcNS, dstNS string, addr netip.AddrPort) (net.Conn, net.Conn, uint16) {
	t.Helper()
	ln, err := listenIn(dstNS, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		acc <- c
	}()
	c, err := dialFrom(ctx, srcNS, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { s.Close() })
	for _, x := range []net.Conn{c, s} {
		stop := context.AfterFunc(ctx, func() { x.SetDeadline(time.Now()) })
		t.Cleanup(func() { stop() })
	}
	return c, s, uint16(c.LocalAddr().(*net.TCPAddr).Port)
}

// checkShortLived fails the test unless conntrack on every node, right after a
// flow from source port sport to dst closed, gives it at most limit seconds, and has
// forgotten it a few seconds after that.
func checkShortLived(ctx context.Context, t *testing.T, l *testenv.Lab, nodes []string, sport uint16, dst netip.AddrPort, limit int) {
	t.Helper()
	for _, n := range nodes {
		left, ok := ctTimeout(ctx, t, l, n, sport, dst)
		t.Logf("%s: right after the close conntrack holds the flow: %v, for %d s more", n, ok, left)
		if ok && left > limit {
			t.Errorf("%s: after the close conntrack keeps the flow for %d s, want at most %d s", n, left, limit)
		}
	}
	deadline := time.Now().Add(time.Duration(limit+5) * time.Second)
	for _, n := range nodes {
		_, ok := ctTimeout(ctx, t, l, n, sport, dst)
		for ok && time.Now().Before(deadline) {
			time.Sleep(500 * time.Millisecond)
			_, ok = ctTimeout(ctx, t, l, n, sport, dst)
		}
		if ok {
			t.Errorf("%s: conntrack still holds the closed flow %d s after its close", n, limit+5)
		}
	}
}

// exchange connects from srcNS to dial, reaching a listener it opens in dstNS on
// lsn (another address when a DNAT rule sits between). The client sends size
// bytes; if idle is set, the server reads them, both wait that long, the server sends
// size bytes more and the client, once it has read them, too (the server reads them
// below); the client closes its side (FIN),
// the server reads to EOF and checks what came, sends size bytes back and closes its
// side; the client reads them to EOF and checks them. Any error, short read or reset
// is returned, and what afterIdle, called by the client after its wait and before it
// sends, returns. Returns the client's source port as the server saw it.
func exchange(ctx context.Context, srcNS, dstNS string, dial, lsn netip.AddrPort, size int, idle time.Duration, afterIdle func() error) (uint16, error) {
	ln, err := listenIn(dstNS, lsn)
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	payload := bytes.Repeat([]byte("isthmus-fast-path"), size/17+1)[:size]
	type result struct {
		port uint16
		err  error
	}
	srvc := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvc <- result{err: fmt.Errorf("accept: %w", err)}
			return
		}
		defer c.Close()
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
		defer stop()
		r := result{port: uint16(c.RemoteAddr().(*net.TCPAddr).Port)}
		r.err = func() error {
			if idle > 0 {
				if err := readExactly(c, payload); err != nil {
					return fmt.Errorf("server, before idling: %w", err)
				}
				time.Sleep(idle)
				if _, err := c.Write(payload); err != nil {
					return fmt.Errorf("server, after idling: send: %w", err)
				}
			}
			got, err := io.ReadAll(c) // to the client's FIN
			if err != nil {
				return fmt.Errorf("server: read to EOF after %d bytes: %w", len(got), err)
			}
			if !bytes.Equal(got, payload) {
				return fmt.Errorf("server: read %d bytes to EOF, want the client's %d", len(got), size)
			}
			if _, err := c.Write(payload); err != nil {
				return fmt.Errorf("server: send: %w", err)
			}
			return c.(*net.TCPConn).CloseWrite()
		}()
		srvc <- r
	}()

	c, err := dialFrom(ctx, srcNS, dial)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	cerr := func() error {
		if _, err := c.Write(payload); err != nil {
			return fmt.Errorf("client: send: %w", err)
		}
		if idle > 0 {
			time.Sleep(idle)
			if err := afterIdle(); err != nil {
				return err
			}
			// The server sends first: both writing at once, neither reading, could
			// fill both receive buffers and block both.
			if err := readExactly(c, payload); err != nil {
				return fmt.Errorf("client, after idling: %w", err)
			}
			if _, err := c.Write(payload); err != nil {
				return fmt.Errorf("client, after idling: send: %w", err)
			}
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return fmt.Errorf("client: close write: %w", err)
		}
		got, err := io.ReadAll(c) // to the server's FIN
		if err != nil {
			return fmt.Errorf("client: read to EOF after %d bytes: %w", len(got), err)
		}
		if !bytes.Equal(got, payload) {
			return fmt.Errorf("client: read %d bytes to EOF, want the server's %d", len(got), size)
		}
		return nil
	}()
	r := <-srvc
	return r.port, errors.Join(cerr, r.err)
}

// tcpNet is the network of TCP over a's family, for net.Listen and Dial.
func tcpNet(a netip.Addr) string {
	if a.Is4() {
		return "tcp4"
	}
	return "tcp6"
}

// listenIn opens a TCP listener on addr in the namespace ns.
func listenIn(ns string, addr netip.AddrPort) (ln net.Listener, err error) {
	if err := testenv.Do(ns, func() error {
		ln, err = net.Listen(tcpNet(addr.Addr()), addr.String())
		return err
	}); err != nil {
		return nil, fmt.Errorf("listen in %s: %w", ns, err)
	}
	return ln, nil
}

// dialFrom connects to addr from the namespace ns, within 3 s.
func dialFrom(ctx context.Context, ns string, addr netip.AddrPort) (c net.Conn, err error) {
	if err := testenv.Do(ns, func() error {
		c, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, tcpNet(addr.Addr()), addr.String())
		return err
	}); err != nil {
		return nil, fmt.Errorf("connect from %s to %s: %w", ns, addr, err)
	}
	return c, nil
}

// readExactly reads len(want) bytes from c and compares them with want.
func readExactly(c net.Conn, want []byte) error {
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("read other bytes than were sent")
	}
	return nil
}

// ctTimeout returns the seconds conntrack on node still gives the TCP flow from
// source port sport to dst (any source address), and whether it holds one.
func ctTimeout(ctx context.Context, t *testing.T, l *testenv.Lab, node string, sport uint16, dst netip.AddrPort) (int, bool) {
	t.Helper()
	out, err := l.Exec(ctx, l.NodeNS(node), "conntrack", "-L", "-p", "tcp", "--orig-port-src", strconv.Itoa(int(sport)),
		"--orig-dst", dst.Addr().String(), "--orig-port-dst", strconv.Itoa(int(dst.Port())))
	if err != nil && !strings.Contains(err.Error(), "0 flow entries") {
		t.Fatalf("conntrack -L on %s: %v", node, err)
	}
	for _, line := range strings.Split(out, "\n") {
		// tcp      6 2 ESTABLISHED src=... : the third field is what is left, in s.
		if f := strings.Fields(line); len(f) > 3 && f[0] == "tcp" {
			left, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatalf("parse conntrack line %q: %v", line, err)
			}
			return left, true
		}
	}
	return 0, false
}

// countersText lists node's non-zero datapath counters, for a failure's log.
func countersText(t *testing.T, l *testenv.Lab, node string) string {
	t.Helper()
	m, err := inspect.Open(l.PinDir(node))
	if err != nil {
		return err.Error()
	}
	defer m.Close()
	cs, err := m.Counters()
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "%s/%s=%d ", c.Name, c.Hook, c.Packets)
	}
	return b.String()
}

// shortCtTimeouts sets the conntrack timeouts of the fast-path tests
// (ctEstablished, ctTimeWait, ctClose) on nodes, and returns a reader of the
// packets their FORWARD chains' INVALID drop rules have dropped, summed.
func shortCtTimeouts(ctx context.Context, t *testing.T, l *testenv.Lab, nodes []string) (invalid func() uint64) {
	t.Helper()
	for _, n := range nodes {
		for name, v := range map[string]int{"established": ctEstablished, "time_wait": ctTimeWait, "close": ctClose} {
			key := "net.netfilter.nf_conntrack_tcp_timeout_" + name
			if _, err := l.Exec(ctx, l.NodeNS(n), "sysctl", "-qw", key+"="+strconv.Itoa(v)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return func() (n uint64) {
		for _, node := range nodes {
			n += ruleCount(ctx, t, l, node, "FORWARD", "DROP", "ctstate INVALID")
		}
		return n
	}
}
