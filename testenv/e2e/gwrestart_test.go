package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestGatewayAgentRestart is issue 14's item 4: a gateway's datapath answers the
// health probes of its members and of the remote gateways from the claims its
// agent refreshes, so an agent restart (or upgrade) longer than interval x
// multiplier moves no flow and loses nothing, while an agent gone for longer than
// its reach expiry does let the probers fail over, within expiry + interval.
// gw-w2 runs with --health-reach-expiry 8s, so the long outage takes seconds.
func TestGatewayAgentRestart(t *testing.T) {
	const expiry = 8 * time.Second
	l := upScenario(t, "gwfailover")
	logs := []string{"w-1", "gw-w1", "gw-w2", "gw-e1", "gw-e2"}
	expiryArgs := []string{"--health-reach-expiry", expiry.String()}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	startGW := func() {
		t.Helper()
		if err := l.StartAgent("gw-w2", expiryArgs...); err != nil {
			t.Fatal(err)
		}
		if err := l.WaitReady(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.StopAgent("gw-w2"); err != nil {
		t.Fatal(err)
	}
	startGW()

	// The nodes that probe gw-w2, each for the site it asks about.
	views := []struct{ node, site string }{{"w-1", "east"}, {"gw-e1", "west"}, {"gw-e2", "west"}}
	series := func(v struct{ node, site string }, name, extra string) string {
		return fmt.Sprintf(`%s{peer="gw-w2",site="%s"%s}`, name, v.site, extra)
	}
	// peerState returns, per view, whether gw-w2 is up and its down transitions.
	peerState := func() (up []bool, downs []float64) {
		for _, v := range views {
			m := scrapeMetrics(t, l, v.node)
			upV, ok := m[series(v, "isthmus_peer_up", "")]
			if !ok {
				t.Fatalf("%s does not report gw-w2 for site %s", v.node, v.site)
			}
			up = append(up, upV == 1)
			downs = append(downs, m[series(v, "isthmus_peer_transitions_total", `,state="down"`)])
		}
		return up, downs
	}

	flows := startFlows(t, l, "w1-p1", "em-p1", 32)
	defer flows.Close()
	if !flows.allAnswered() {
		t.Fatal(agentLogs(l, logs))
	}

	t.Run("restart_longer_than_interval_x_multiplier", func(t *testing.T) {
		_, downsBefore := peerState()
		transit := counterPackets(t, l, "gw-w2", "transit", false)
		answered := counterPackets(t, l, "gw-w2", "health_answered", false)
		stop := time.Now()
		if err := l.StopAgent("gw-w2"); err != nil {
			t.Fatal(err)
		}
		outage := healthInterval*healthMultiplier + 2*time.Second
		time.Sleep(outage)
		// While the agent was gone its datapath forwarded and answered.
		if n := counterPackets(t, l, "gw-w2", "transit", false); n <= transit {
			t.Errorf("gw-w2 forwarded nothing while its agent was gone (transit %d -> %d): no flow went through it, the test proves nothing", transit, n)
		}
		if n := counterPackets(t, l, "gw-w2", "health_answered", false); n <= answered {
			t.Errorf("gw-w2's datapath answered no probe while its agent was gone (health_answered %d -> %d)", answered, n)
		}
		startGW()
		time.Sleep(2 * time.Second)
		gap := slices.Max(flows.gaps("gw-w2's agent restarted after "+outage.String(), stop, time.Now()))
		up, downs := peerState()
		for i, v := range views {
			if !up[i] || downs[i] != downsBefore[i] {
				t.Errorf("%s: gw-w2 for %s up=%v, down transitions %v -> %v: the restart moved flows", v.node, v.site, up[i], downsBefore[i], downs[i])
			}
		}
		t.Logf("agent of gw-w2 gone %s (interval x multiplier %s): longest gap of 32 flows %s; gw-w2 up at %v: %v, down transitions %v -> %v",
			outage, healthInterval*healthMultiplier, gap.Round(time.Millisecond), views, up, downsBefore, downs)
		// One datagram every 50 ms: a gap of 3 sends would be a lost answer.
		if gap > 3*flowEvery {
			t.Errorf("a flow stopped for %s across the restart, want no loss (at most %s)\n%s", gap.Round(time.Millisecond), 3*flowEvery, agentLogs(l, logs))
		}
	})
	if t.Failed() {
		return
	}

	t.Run("agent_gone_longer_than_reach_expiry", func(t *testing.T) {
		expired := counterPackets(t, l, "gw-w2", "health_expired", false)
		stop := time.Now()
		if err := l.StopAgent("gw-w2"); err != nil {
			t.Fatal(err)
		}
		// The last claim was refreshed at most an interval before the stop;
		// once it expires the next probe of each view hears "does not reach".
		earliest, latest := expiry-healthInterval, expiry+healthInterval+time.Second
		var left time.Duration
		for {
			time.Sleep(100 * time.Millisecond)
			up, _ := peerState()
			if !slices.Contains(up, true) {
				left = time.Since(stop)
				break
			}
			if time.Since(stop) > latest+2*time.Second {
				t.Fatalf("gw-w2 still up at some prober (%v for %v) %s after its agent went away, reach expiry %s\n%s",
					up, views, time.Since(stop).Round(time.Millisecond), expiry, agentLogs(l, logs))
			}
		}
		t.Logf("agent of gw-w2 gone: every prober left it %s later (reach expiry %s)", left.Round(10*time.Millisecond), expiry)
		if left < earliest || left > latest {
			t.Errorf("probers left gw-w2 %s after its agent stopped, want between %s and %s (reach expiry %s +- interval)",
				left.Round(10*time.Millisecond), earliest, latest, expiry)
		}
		if n := counterPackets(t, l, "gw-w2", "health_expired", false); n <= expired {
			t.Errorf("gw-w2's datapath answered no probe as expired (health_expired %d -> %d)", expired, n)
		}
		// The flows left gw-w2 (it forwards nothing now) and moving them to
		// gw-w1, which works, lost nothing.
		time.Sleep(time.Second)
		transit := counterPackets(t, l, "gw-w2", "transit", false)
		time.Sleep(time.Second)
		if n := counterPackets(t, l, "gw-w2", "transit", false); n != transit {
			t.Errorf("gw-w2 still forwards after every prober left it (transit %d -> %d)", transit, n)
		}
		if gap := slices.Max(flows.gaps("gw-w2's agent gone past its reach expiry", stop, time.Now())); gap > 3*flowEvery {
			t.Errorf("a flow stopped for %s while the probers left gw-w2, want no loss (at most %s)", gap.Round(time.Millisecond), 3*flowEvery)
		}

		// Back: its agent's claims are fresh, the probers take it back after
		// rise answers, and it forwards again. docs/gateways.md measured 2.94
		// to 3.32 s from the start, and a run under the kernel lock with seven
		// other engineers' tests queued 3.11 s, the agent ready after 0.5 s:
		// the agent's start, then rise answers an interval apart, the first up
		// to an interval after its claims. The bound is (rise + 1) intervals
		// plus 2 s, four times the start measured, for a start slowed by load;
		// it was 30 s + failoverLimit (34 s), which no regression could reach.
		limit := (healthRise+1)*healthInterval + 2*time.Second
		back := time.Now()
		startGW()
		ready := time.Since(back)
		for {
			time.Sleep(100 * time.Millisecond)
			up, _ := peerState()
			if !slices.Contains(up, false) {
				break
			}
			if time.Since(back) > limit {
				t.Fatalf("gw-w2 not back at every prober (%v for %v) %s after its agent started, want within %s\n%s", up, views, time.Since(back).Round(time.Millisecond), limit, agentLogs(l, logs))
			}
		}
		t.Logf("agent of gw-w2 back: every prober took it back %s after the start (the agent was ready after %s; limit %s)",
			time.Since(back).Round(10*time.Millisecond), ready.Round(10*time.Millisecond), limit)
		time.Sleep(time.Second)
		transit = counterPackets(t, l, "gw-w2", "transit", false)
		time.Sleep(time.Second)
		if n := counterPackets(t, l, "gw-w2", "transit", false); n <= transit {
			t.Errorf("gw-w2 forwards nothing after it came back (transit %d -> %d)", transit, n)
		}
		if gap := slices.Max(flows.gaps("gw-w2 back", back, time.Now())); gap > 3*flowEvery {
			t.Errorf("a flow stopped for %s when gw-w2 came back, want no loss", gap.Round(time.Millisecond))
		}
	})
}
