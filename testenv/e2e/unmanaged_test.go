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

// Failover bound of docs/unmanaged-sites.md with the agent's defaults
// (--health-interval 1s, --health-multiplier 3): interval x multiplier + 1s.
const (
	healthInterval   = time.Second
	healthMultiplier = 3
	failoverLimit    = healthInterval*healthMultiplier + time.Second
)

// upScenario builds a built-in scenario with agents and removes it when the
// test ends, checking that nothing is left.
func upScenario(t *testing.T, scenario string) *testenv.Lab {
	t.Helper()
	requireSetup(t)
	sc, err := testenv.LoadScenario(scenario)
	if err != nil {
		t.Fatal(err)
	}
	name := labName()
	t.Cleanup(func() {
		if err := testenv.Down(name, testenv.DownOptions{Binary: binary}); err != nil {
			t.Error(err)
		}
		assertGone(t, name)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := testenv.Up(ctx, sc, testenv.Options{Name: name, Binary: binary, ReadyTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSeed000 is seed 000's mesh case end to end, through the stateful firewall:
// every pair that should talk does, in both directions, over ICMP, TCP and UDP;
// the flex pod sees the seed's pod 10.0.2.128 with its own address (declared
// block, routed back through the cluster's nodes) and the undeclared
// 10.0.4.10 as aks-1's tunnel address 100.64.0.4 (return-path SNAT); node to
// node underlay traffic still passes; and a pod packet sent across without the
// tunnel is still dropped by the firewall.
func TestSeed000(t *testing.T) {
	l := upScenario(t, "seed000")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("matrix", func(t *testing.T) {
		m, err := l.Check(ctx)
		t.Logf("matrix:\n%s", m)
		if err != nil {
			t.Errorf("%v; agent log of aks-1:\n%s\nagent log of flex-1:\n%s", err, tailFile(l.AgentLog("aks-1")), tailFile(l.AgentLog("flex-1")))
		}
		if m == nil {
			t.FailNow()
		}
		if want := len(l.Scenario.Expectations()) * len(testenv.Protos); len(m.Probes) != want {
			t.Errorf("%d probes, want %d", len(m.Probes), want)
		}
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
func TestSeed000Failover(t *testing.T) {
	l := upScenario(t, "seed000")
	const flows = 16
	const every = 50 * time.Millisecond
	srv, err := testenv.StartEchoServer(l.PodNS("aks1-p1"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dst := netip.AddrPortFrom(l.PodAddr("aks1-p1"), srv.UDPPort)

	// One UDP socket per flow (its own source port, so its own hash), a sender
	// ticking every 50ms and a reader noting when each answer came.
	var mu sync.Mutex
	replies := make([][]time.Time, flows)
	conns := make([]*net.UDPConn, flows)
	for i := range conns {
		if err := testenv.Do(l.PodNS("flex-p1"), func() error {
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
		t.FailNow()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	down := time.Now()
	if _, err := l.Exec(ctx, l.NodeNS("aks-2"), "ip", "link", "set", testenv.UnderlayDev, "down"); err != nil {
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
	t.Logf("aks-2's eth0 down at %s:\n%s", down.Format("15:04:05.000"), strings.Join(lines, "\n"))
	worst := slices.Max(gaps)
	interrupted := 0
	for _, g := range gaps {
		if g > 500*time.Millisecond {
			interrupted++
		}
	}
	t.Logf("%d of %d flows went through aks-2 and were interrupted; failover gap %s (limit %s)", interrupted, flows, worst.Round(time.Millisecond), failoverLimit)
	if interrupted == 0 {
		t.Errorf("no flow of %d was interrupted: none went through aks-2, so the group never spread them (or the link did not go down)", flows)
	}
	if interrupted == flows {
		t.Errorf("every flow was interrupted: flows through aks-1 must not stop")
	}
	if worst > failoverLimit {
		t.Errorf("failover took %s, want at most %s (health interval %s x %d + 1s); flex-1 agent log:\n%s",
			worst.Round(time.Millisecond), failoverLimit, healthInterval, healthMultiplier, tailFile(l.AgentLog("flex-1")))
	}
}
