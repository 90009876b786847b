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

	"github.com/isthmus-dev/isthmus/loader/inspect"
	"github.com/isthmus-dev/isthmus/testenv"
)

// failover is one failover measurement: flows UDP flows from SrcPod to an echo
// server in DstPod, spread over next-hop groups by consistent hash, and a
// failure of FailNode under them (Fail; nil cuts its underlay link), then,
// when Heal is set, its healing.
type failover struct {
	SrcPod, DstPod string
	Flows          int
	FailNode       string
	// What names the failure in the log.
	What       string
	Fail, Heal func(ctx context.Context) error
	// Logs are the nodes whose agent logs a failure prints.
	Logs []string
}

// measureFailover runs f and checks what a consistent hash and health checks
// promise: some flows go through FailNode and are interrupted, the others never
// stop, and every interrupted flow resumes within failoverLimit. With Heal, the
// flows must not stop for longer than failoverLimit while FailNode comes back
// either (moving back to it costs no loss), and FailNode must carry transit
// again afterwards. It logs every flow's longest gap in each phase and returns
// the worst gaps (of the failure, and of the healing), measured by a
// udpFlows.
func measureFailover(t *testing.T, l *testenv.Lab, f failover) (failGap, healGap time.Duration) {
	t.Helper()
	if f.What == "" {
		f.What = f.FailNode + "'s " + testenv.UnderlayDev + " down"
	}
	if f.Fail == nil {
		f.Fail = func(ctx context.Context) error {
			_, err := l.Exec(ctx, l.NodeNS(f.FailNode), "ip", "link", "set", testenv.UnderlayDev, "down")
			return err
		}
	}
	logs := func() string { return agentLogs(l, f.Logs) }
	s := startFlows(t, l, f.SrcPod, f.DstPod, f.Flows)
	defer s.Close()
	if !s.allAnswered() {
		t.Fatal(logs())
	}
	gaps := s.gaps
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	down := time.Now()
	if err := f.Fail(ctx); err != nil {
		t.Fatalf("%s: %v", f.What, err)
	}
	time.Sleep(failoverLimit + 3*time.Second)
	healed := time.Now()
	failGaps := gaps(f.What, down, healed)
	failGap = slices.Max(failGaps)
	interrupted := 0
	for _, g := range failGaps {
		if g > 500*time.Millisecond {
			interrupted++
		}
	}
	t.Logf("%s: %d of %d flows went through %s and were interrupted; failover gap %s (limit %s)",
		f.What, interrupted, f.Flows, f.FailNode, failGap.Round(time.Millisecond), failoverLimit)
	if interrupted == 0 {
		t.Errorf("%s: no flow of %d was interrupted: none went through %s, so the groups never spread them (or the failure did not happen)", f.What, f.Flows, f.FailNode)
	}
	if interrupted == f.Flows {
		t.Errorf("%s: every flow was interrupted: flows through the other members must not stop", f.What)
	}
	if failGap > failoverLimit {
		t.Errorf("%s: failover took %s, want at most %s (health interval %s x %d + 1s)\n%s",
			f.What, failGap.Round(time.Millisecond), failoverLimit, healthInterval, healthMultiplier, logs())
	}
	if f.Heal == nil {
		return failGap, 0
	}

	if err := f.Heal(ctx); err != nil {
		t.Fatalf("heal %s: %v", f.What, err)
	}
	// Rise good answers bring FailNode back (hysteresis), then flows move.
	time.Sleep(failoverLimit + 3*time.Second)
	end := time.Now()
	healGap = slices.Max(gaps(f.What+", healed", healed, end))
	t.Logf("%s, healed: longest gap %s (limit %s)", f.What, healGap.Round(time.Millisecond), failoverLimit)
	if healGap > failoverLimit {
		t.Errorf("%s, healed: a flow stopped for %s, want at most %s\n%s", f.What, healGap.Round(time.Millisecond), failoverLimit, logs())
	}
	// The flows are back on FailNode: its transit counter moves.
	before := counterPackets(t, l, f.FailNode, "transit", false)
	time.Sleep(time.Second)
	if after := counterPackets(t, l, f.FailNode, "transit", false); after <= before {
		t.Errorf("%s, healed: %s forwarded nothing in 1s (transit %d -> %d): the flows did not come back\n%s",
			f.What, f.FailNode, before, after, logs())
	}
	return failGap, healGap
}

// counterPackets returns the packets of node's datapath counter name (a drop
// reason when drop is set, as "no_nexthop"; else an event, as "transit"),
// summed over hooks, read from its pinned maps.
func counterPackets(t *testing.T, l *testenv.Lab, node, name string, drop bool) uint64 {
	t.Helper()
	m, err := inspect.Open(l.PinDir(node))
	if err != nil {
		t.Fatalf("open %s's maps: %v", node, err)
	}
	defer m.Close()
	cs, err := m.Counters()
	if err != nil {
		t.Fatalf("read %s's counters: %v", node, err)
	}
	var n uint64
	for _, c := range cs {
		if c.Drop == drop && c.Name == name {
			n += c.Packets
		}
	}
	return n
}

// flowEvery is how often each flow of a udpFlows sends.
const flowEvery = 50 * time.Millisecond

// udpFlows is UDP flows from a pod to an echo server in another pod, spread
// over next-hop groups by consistent hash: each flow is its own socket (its own
// source port, so its own hash), a sender ticking every flowEvery and a
// reader noting when answers come.
type udpFlows struct {
	t       *testing.T
	srv     *testenv.EchoServer
	conns   []*net.UDPConn
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	replies [][]time.Time
}

// startFlows starts flows flows from srcPod to dstPod and waits 2 s for them
// to run. Close stops them.
func startFlows(t *testing.T, l *testenv.Lab, srcPod, dstPod string, flows int) *udpFlows {
	t.Helper()
	srv, err := testenv.StartEchoServer(l.PodNS(dstPod))
	if err != nil {
		t.Fatal(err)
	}
	s := &udpFlows{t: t, srv: srv, conns: make([]*net.UDPConn, flows), stop: make(chan struct{}), replies: make([][]time.Time, flows)}
	dst := netip.AddrPortFrom(l.PodAddr(dstPod), srv.UDPPort)
	for i := range s.conns {
		if err := testenv.Do(l.PodNS(srcPod), func() error {
			var err error
			s.conns[i], err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
			return err
		}); err != nil {
			s.Close()
			t.Fatal(err)
		}
	}
	for i, c := range s.conns {
		s.wg.Add(2)
		go func() {
			defer s.wg.Done()
			tick := time.NewTicker(flowEvery)
			defer tick.Stop()
			for {
				select {
				case <-s.stop:
					return
				case <-tick.C:
					c.Write([]byte("failover probe\n"))
				}
			}
		}()
		go func() {
			defer s.wg.Done()
			buf := make([]byte, 256)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
				s.mu.Lock()
				s.replies[i] = append(s.replies[i], time.Now())
				s.mu.Unlock()
			}
		}()
	}
	time.Sleep(2 * time.Second)
	return s
}

// allAnswered reports (and marks the test failed) whether every flow has had
// a reply.
func (s *udpFlows) allAnswered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := true
	for i, r := range s.replies {
		if len(r) == 0 {
			s.t.Errorf("flow %d (port %d): no reply", i, s.port(i))
			ok = false
		}
	}
	return ok
}

func (s *udpFlows) port(i int) int { return s.conns[i].LocalAddr().(*net.UDPAddr).Port }

// gaps returns each flow's longest silence between from and to (a flow silent
// up to to counts its silence until then) and logs them.
func (s *udpFlows) gaps(phase string, from, to time.Time) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Duration
	var lines []string
	for i, r := range s.replies {
		last := from
		var gap time.Duration
		for _, at := range r {
			if at.Before(from) || at.After(to) {
				continue
			}
			gap = max(gap, at.Sub(last))
			last = at
		}
		gap = max(gap, to.Sub(last))
		out = append(out, gap)
		lines = append(lines, fmt.Sprintf("flow %2d port %5d: longest gap %s", i, s.port(i), gap.Round(time.Millisecond)))
	}
	s.t.Logf("%s at %s:\n%s", phase, from.Format("15:04:05.000"), strings.Join(lines, "\n"))
	return out
}

// Close stops the flows and the echo server.
func (s *udpFlows) Close() {
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	for _, c := range s.conns {
		if c != nil {
			c.Close()
		}
	}
	s.wg.Wait()
	s.srv.Close()
}

// agentLogs returns the tails of the agent logs of nodes.
func agentLogs(l *testenv.Lab, nodes []string) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "agent log of %s:\n%s\n", n, tailFile(l.AgentLog(n)))
	}
	return b.String()
}
