package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// failover is one failover measurement: flows UDP flows from SrcPod to an echo
// server in DstPod, spread over a next-hop group by consistent hash, and the
// underlay link of FailNode cut under them.
type failover struct {
	SrcPod, DstPod string
	Flows          int
	FailNode       string
	// Logs are the nodes whose agent logs a failure prints.
	Logs []string
}

// measureFailover runs f and checks what a consistent hash and health checks
// promise: some flows go through FailNode and are interrupted, the others never
// stop, and every interrupted flow resumes within failoverLimit. It logs every
// flow's longest gap. Each flow is its own socket (its own source port, so its
// own hash), a sender ticking every 50 ms and a reader noting when answers come.
func measureFailover(t *testing.T, l *testenv.Lab, f failover) {
	t.Helper()
	const every = 50 * time.Millisecond
	srv, err := testenv.StartEchoServer(l.PodNS(f.DstPod))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dst := netip.AddrPortFrom(l.PodAddr(f.DstPod), srv.UDPPort)
	logs := func() string {
		var b strings.Builder
		for _, n := range f.Logs {
			fmt.Fprintf(&b, "agent log of %s:\n%s\n", n, tailFile(l.AgentLog(n)))
		}
		return b.String()
	}

	var mu sync.Mutex
	replies := make([][]time.Time, f.Flows)
	conns := make([]*net.UDPConn, f.Flows)
	for i := range conns {
		if err := testenv.Do(l.PodNS(f.SrcPod), func() error {
			var err error
			conns[i], err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(2)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					c.Write([]byte("failover probe\n"))
				}
			}
		}()
		go func() {
			defer wg.Done()
			buf := make([]byte, 256)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
				mu.Lock()
				replies[i] = append(replies[i], time.Now())
				mu.Unlock()
			}
		}()
	}
	defer func() {
		close(stop)
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
	}()

	time.Sleep(2 * time.Second)
	mu.Lock()
	for i, r := range replies {
		if len(r) == 0 {
			t.Errorf("flow %d (port %d): no reply before the failure", i, conns[i].LocalAddr().(*net.UDPAddr).Port)
		}
	}
	mu.Unlock()
	if t.Failed() {
		t.Fatal(logs())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	down := time.Now()
	if _, err := l.Exec(ctx, l.NodeNS(f.FailNode), "ip", "link", "set", testenv.UnderlayDev, "down"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(failoverLimit + 3*time.Second)

	mu.Lock()
	defer mu.Unlock()
	var gaps []time.Duration
	var lines []string
	for i, r := range replies {
		// The longest silence of the flow from the link going down on.
		last := down
		var gap time.Duration
		for _, at := range r {
			if at.Before(down) {
				continue
			}
			gap = max(gap, at.Sub(last))
			last = at
		}
		if tail := time.Since(last); tail > gap {
			gap = tail // never resumed, or stopped again
		}
		gaps = append(gaps, gap)
		lines = append(lines, fmt.Sprintf("flow %2d port %5d: longest gap %s", i, conns[i].LocalAddr().(*net.UDPAddr).Port, gap.Round(time.Millisecond)))
	}
	t.Logf("%s's %s down at %s:\n%s", f.FailNode, testenv.UnderlayDev, down.Format("15:04:05.000"), strings.Join(lines, "\n"))
	worst := slices.Max(gaps)
	interrupted := 0
	for _, g := range gaps {
		if g > 500*time.Millisecond {
			interrupted++
		}
	}
	t.Logf("%d of %d flows went through %s and were interrupted; failover gap %s (limit %s)", interrupted, f.Flows, f.FailNode, worst.Round(time.Millisecond), failoverLimit)
	if interrupted == 0 {
		t.Errorf("no flow of %d was interrupted: none went through %s, so the group never spread them (or the link did not go down)", f.Flows, f.FailNode)
	}
	if interrupted == f.Flows {
		t.Errorf("every flow was interrupted: flows through the other members must not stop")
	}
	if worst > failoverLimit {
		t.Errorf("failover took %s, want at most %s (health interval %s x %d + 1s)\n%s",
			worst.Round(time.Millisecond), failoverLimit, healthInterval, healthMultiplier, logs())
	}
}
