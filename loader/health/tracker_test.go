package health

import (
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/loader/plan"
	im "github.com/isthmus-dev/isthmus/maps"
)

var (
	a = Target{Name: "c1", Underlay: netip.MustParseAddr("172.16.3.11"), TunnelAddr: netip.MustParseAddr("10.250.0.1")}
	b = Target{Name: "c2", Underlay: netip.MustParseAddr("172.16.3.12"), TunnelAddr: netip.MustParseAddr("10.250.0.2")}
)

var addrEq = cmp.Comparer(func(x, y netip.Addr) bool { return x == y })

// clock is a fake clock advanced by hand, one probe interval at a time.
type clock struct{ now time.Time }

func (c *clock) tick() time.Time { c.now = c.now.Add(time.Second); return c.now }

func TestTrackerDownAfterMultiplierMissesUpOnFirstAnswer(t *testing.T) {
	clk := &clock{now: time.Unix(1000, 0)}
	tr := NewTracker(3, 1)
	tr.SetTargets([]Target{a, b})
	if tr.Down() != nil {
		t.Fatalf("new members must start up, down = %v", tr.Down())
	}
	// Round 1 sends the first probes; b answers every round, a never does.
	var downAt time.Time
	for round := 1; round <= 5; round++ {
		ts := tr.Round(clk.tick())
		switch {
		case round < 4 && len(ts) != 0:
			t.Fatalf("round %d: transitions %v before 3 misses", round, ts)
		case round == 4:
			want := []Transition{{Target: a, Up: false, Misses: 3, At: clk.now}}
			if diff := cmp.Diff(want, ts, addrEq); diff != "" {
				t.Fatalf("round 4 (-want +got):\n%s", diff)
			}
			downAt = clk.now
		case round == 5 && len(ts) != 0:
			t.Fatalf("round 5: a already down, got %v again", ts)
		}
		tr.Answer(b.TunnelAddr, "", true, clk.now.Add(time.Millisecond))
	}
	// Failover within interval x multiplier + 1s of a's last chance to answer
	// (its first probe went out at 1001).
	if downAt.Sub(time.Unix(1001, 0)) > 3*time.Second+time.Second {
		t.Errorf("down at %v: later than interval x multiplier + 1s", downAt)
	}
	if !maps.Equal(tr.Down(), map[im.GroupMember]bool{a.Member(): true}) {
		t.Fatalf("down = %v, want only a", tr.Down())
	}
	// One answer, even late, brings a back.
	ts := tr.Answer(a.TunnelAddr, "", true, clk.now.Add(500*time.Millisecond))
	if len(ts) != 1 || !ts[0].Up || ts[0].Target != a || ts[0].Misses != 4 {
		t.Fatalf("answer after down: %v, want a up after 4 misses", ts)
	}
	if tr.Down() != nil {
		t.Fatalf("down after the answer = %v", tr.Down())
	}
	if ts := tr.Answer(a.TunnelAddr, "", true, clk.now); len(ts) != 0 {
		t.Fatalf("a second answer is no transition: %v", ts)
	}
}

func TestTrackerMissesMustBeInARow(t *testing.T) {
	clk := &clock{now: time.Unix(0, 0)}
	tr := NewTracker(3, 1)
	tr.SetTargets([]Target{a})
	// Probes of rounds 1 and 2 go unanswered, 3 is answered, then 4, 5 and 6 go
	// unanswered: down only when round 7 counts the third miss in a row.
	for i, answer := range []bool{false, false, true, false, false, false} {
		if ts := tr.Round(clk.tick()); len(ts) != 0 {
			t.Fatalf("round %d: %v", i+1, ts)
		}
		if answer {
			tr.Answer(a.TunnelAddr, "", true, clk.now)
		}
	}
	if ts := tr.Round(clk.tick()); len(ts) != 1 || ts[0].Up {
		t.Fatalf("third miss in a row: %v, want down", ts)
	}
}

func TestTrackerTargetsChange(t *testing.T) {
	clk := &clock{now: time.Unix(0, 0)}
	tr := NewTracker(1, 1)
	tr.SetTargets([]Target{a, b})
	tr.Round(clk.tick())
	tr.Round(clk.tick())
	if len(tr.Down()) != 2 {
		t.Fatalf("down = %v, want both", tr.Down())
	}
	// b stays (keeps its state), a leaves, a stranger's answer is ignored.
	tr.SetTargets([]Target{b})
	if !maps.Equal(tr.Down(), map[im.GroupMember]bool{b.Member(): true}) {
		t.Fatalf("down after a left = %v", tr.Down())
	}
	if ts := tr.Answer(a.TunnelAddr, "", true, clk.now); len(ts) != 0 {
		t.Fatalf("answer from a former target: %v", ts)
	}
	// b's tunnel address changes: it starts over, up.
	b2 := b
	b2.TunnelAddr = netip.MustParseAddr("10.250.0.22")
	tr.SetTargets([]Target{b2})
	if tr.Down() != nil {
		t.Fatalf("down = %v after b's tunnel address changed", tr.Down())
	}
}

func TestTargets(t *testing.T) {
	p := &plan.NodePlan{
		Peers: []plan.Peer{
			{Name: "c1", Underlay: a.Underlay, TunnelAddr: a.TunnelAddr},
			{Name: "c2", Underlay: b.Underlay, TunnelAddr: b.TunnelAddr},
			{Name: "c3", Underlay: netip.MustParseAddr("172.16.3.13")},
		},
		Routes: []plan.Route{
			{Prefix: netip.MustParsePrefix("10.1.0.0/24"), Peer: "c1", Via: a.Underlay},
			{Prefix: netip.MustParsePrefix("10.0.2.0/23"), Group: []plan.NextHop{{Peer: "c2", Via: b.Underlay}, {Peer: "c1", Via: a.Underlay}, {Peer: "c3", Via: netip.MustParseAddr("172.16.3.13")}}},
			{Prefix: netip.MustParsePrefix("10.0.6.0/24"), Group: []plan.NextHop{{Peer: "c1", Via: a.Underlay}}},
			// A gateway group route: c1 is probed once more, for the site.
			{Prefix: netip.MustParsePrefix("10.61.0.0/16"), Group: []plan.NextHop{{Peer: "c1", Via: a.Underlay}, {Peer: "c3", Via: netip.MustParseAddr("172.16.3.13")}}, Site: "east"},
			{Prefix: netip.MustParsePrefix("10.62.0.0/16"), Group: []plan.NextHop{{Peer: "c1", Via: a.Underlay}}, Site: "east"},
		},
	}
	got, warns := Targets(p)
	aEast := a
	aEast.Site = "east"
	if diff := cmp.Diff([]Target{a, aEast, b}, got, addrEq); diff != "" {
		t.Errorf("targets (-want +got):\n%s", diff)
	}
	if len(warns) != 1 {
		t.Errorf("warnings %q, want one for c3 without a tunnel address", warns)
	}
}

// TestTrackerExpireCountsBeforeTheNextRound: with the round's probes expired a
// timeout after they went out, the member goes down at the third expiry, half an
// interval before the round that would otherwise count it, and a late answer
// before the expiry saves the round.
func TestTrackerExpireCountsBeforeTheNextRound(t *testing.T) {
	clk := &clock{now: time.Unix(0, 0)}
	tr := NewTracker(3, 1)
	tr.SetTargets([]Target{a})
	for i := 1; i <= 2; i++ {
		tr.Round(clk.tick())
		if ts := tr.Expire(clk.now.Add(500 * time.Millisecond)); len(ts) != 0 {
			t.Fatalf("expiry %d: %v, want no transition yet", i, ts)
		}
	}
	tr.Round(clk.tick())
	ts := tr.Expire(clk.now.Add(500 * time.Millisecond))
	if len(ts) != 1 || ts[0].Up || ts[0].Misses != 3 {
		t.Fatalf("third expiry: %v, want a down after 3 misses", ts)
	}
	// The next round must not count the expired probe a second time.
	if ts := tr.Round(clk.tick()); len(ts) != 0 {
		t.Fatalf("round after the expiry: %v", ts)
	}
	// An answer before the expiry: up again, and the expiry counts nothing.
	if ts := tr.Answer(a.TunnelAddr, "", true, clk.now.Add(time.Millisecond)); len(ts) != 1 || !ts[0].Up {
		t.Fatalf("answer: %v, want up", ts)
	}
	if ts := tr.Expire(clk.now.Add(500 * time.Millisecond)); len(ts) != 0 || tr.Down() != nil {
		t.Fatalf("expiry after an answer: %v, down %v", ts, tr.Down())
	}
}

// TestTrackerHysteresis: a member that went down comes back only after rise
// good answers in a row; a path that answers every other probe stays down, so
// its flows do not move back and forth on every probe.
func TestTrackerHysteresis(t *testing.T) {
	clk := &clock{now: time.Unix(0, 0)}
	tr := NewTracker(3, 3)
	tr.SetTargets([]Target{a})
	for range 3 {
		tr.Round(clk.tick())
	}
	if ts := tr.Round(clk.tick()); len(ts) != 1 || ts[0].Up {
		t.Fatalf("3 misses: %v, want down", ts)
	}
	// Flapping: answered, lost, answered, lost, ... never up.
	for i := range 10 {
		if i%2 == 0 {
			if ts := tr.Answer(a.TunnelAddr, "", true, clk.now); len(ts) != 0 {
				t.Fatalf("flapping, answer %d: %v, want no transition", i, ts)
			}
		}
		if ts := tr.Round(clk.tick()); len(ts) != 0 {
			t.Fatalf("flapping, round %d: %v", i, ts)
		}
	}
	if !maps.Equal(tr.Down(), map[im.GroupMember]bool{a.Member(): true}) {
		t.Fatalf("a flapping member must stay down, down = %v", tr.Down())
	}
	// Three good answers in a row bring it back, at the third.
	for i := 1; i <= 3; i++ {
		ts := tr.Answer(a.TunnelAddr, "", true, clk.now)
		if i < 3 && len(ts) != 0 {
			t.Fatalf("good answer %d: %v, want none before the third", i, ts)
		}
		if i == 3 && (len(ts) != 1 || !ts[0].Up) {
			t.Fatalf("third good answer: %v, want up", ts)
		}
		tr.Round(clk.tick())
	}
	if tr.Down() != nil {
		t.Fatalf("down = %v after rise answers", tr.Down())
	}
}

// TestTrackerPerSite: a gateway probed for two remote sites that answers it
// does not reach one goes down for that site at once (no multiplier: it
// applied its own) and stays up for the other; Reaches follows.
func TestTrackerPerSite(t *testing.T) {
	clk := &clock{now: time.Unix(0, 0)}
	east, north := a, a
	east.Site, north.Site = "east", "north"
	tr := NewTracker(3, 2)
	tr.SetTargets([]Target{east, north})
	tr.Round(clk.tick())
	ts := tr.Answer(a.TunnelAddr, "east", false, clk.now)
	if len(ts) != 1 || ts[0].Up || !ts[0].Unreachable || ts[0].Target != east {
		t.Fatalf("unreachable answer: %v, want east down at once", ts)
	}
	tr.Answer(a.TunnelAddr, "north", true, clk.now)
	if !maps.Equal(tr.Down(), map[im.GroupMember]bool{east.Member(): true}) {
		t.Fatalf("down = %v, want a for east only", tr.Down())
	}
	if tr.Reaches("east") || !tr.Reaches("north") || !tr.Reaches("west") || !tr.Reaches("") {
		t.Errorf("reaches east %v north %v west (no targets) %v \"\" %v; want false true true true",
			tr.Reaches("east"), tr.Reaches("north"), tr.Reaches("west"), tr.Reaches(""))
	}
	// An answer for a site it is not probed for is ignored.
	if ts := tr.Answer(a.TunnelAddr, "west", false, clk.now); len(ts) != 0 {
		t.Fatalf("answer for an unprobed site: %v", ts)
	}
	// Reaching east again: up after rise (2) good answers.
	tr.Round(clk.tick())
	if ts := tr.Answer(a.TunnelAddr, "east", true, clk.now); len(ts) != 0 {
		t.Fatalf("first good answer: %v", ts)
	}
	tr.Round(clk.tick())
	if ts := tr.Answer(a.TunnelAddr, "east", true, clk.now); len(ts) != 1 || !ts[0].Up {
		t.Fatalf("second good answer: %v, want up", ts)
	}
}
