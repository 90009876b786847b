package health

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// TestCheckerLoopback runs the responder and the prober on 127.0.0.1: 127.0.0.1
// answers, 127.0.0.2 (nobody listens there) goes down after 3 intervals, and comes
// up within an interval of a responder appearing on it.
func TestCheckerLoopback(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const interval = 20 * time.Millisecond
	c, err := Start(Config{Addr: netip.MustParseAddr("127.0.0.1"), Interval: interval, Multiplier: 3, Rise: 1, Log: log})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer c.Close()
	up := Target{Name: "self", Underlay: netip.MustParseAddr("192.0.2.1"), TunnelAddr: netip.MustParseAddr("127.0.0.1")}
	dead := Target{Name: "dead", Underlay: netip.MustParseAddr("192.0.2.2"), TunnelAddr: netip.MustParseAddr("127.0.0.2")}
	c.SetTargets([]Target{up, dead})

	start := time.Now()
	select {
	case down := <-c.Changes():
		if len(down) != 1 || !down[dead.Member()] {
			t.Fatalf("first change: down = %v, want only 127.0.0.2's member", down)
		}
		if el := time.Since(start); el < 3*interval || el > 3*interval+time.Second {
			t.Errorf("down after %v, want after 3 intervals and within interval x 3 + 1s", el)
		}
		want := []PeerState{{Name: "dead", Tracked: true, Downs: 1}, {Name: "self", Tracked: true, Up: true}}
		if got := c.Peers(); !slices.Equal(got, want) {
			t.Errorf("Peers() = %+v, want %+v", got, want)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the dead member never went down")
	}

	// A responder on 127.0.0.2 at the same port brings it back.
	r, err := Start(Config{Addr: netip.MustParseAddr("127.0.0.2"), Port: c.Port(), Interval: time.Hour, Log: log})
	if err != nil {
		t.Fatalf("start second responder: %v", err)
	}
	defer r.Close()
	select {
	case down := <-c.Changes():
		if len(down) != 0 {
			t.Fatalf("after the responder appeared: down = %v", down)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the member never came back up")
	}
	if d := c.Down(); len(d) != 0 {
		t.Fatalf("Down() = %v", d)
	}
	// The flap stays counted; dropping the member keeps its counts, untracked.
	c.SetTargets([]Target{up})
	want := []PeerState{{Name: "dead", Ups: 1, Downs: 1}, {Name: "self", Tracked: true, Up: true}}
	if got := c.Peers(); !slices.Equal(got, want) {
		t.Errorf("Peers() after removing dead = %+v, want %+v", got, want)
	}
}

// TestCheckerPerSiteReach: a gateway (127.0.0.3) whose only remote gateway
// (127.0.0.4, nobody there) stops answering tells its member (127.0.0.1),
// which probes it about that site, that it no longer reaches it: the member
// takes it out for that site while it still answers every probe, and keeps
// it for plain liveness.
func TestCheckerPerSiteReach(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const interval = 20 * time.Millisecond
	gw, err := Start(Config{Addr: netip.MustParseAddr("127.0.0.3"), Interval: interval, Multiplier: 3, Log: log})
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	defer gw.Close()
	remote := Target{Name: "remote-gw", Site: "east", Underlay: netip.MustParseAddr("192.0.2.4"), TunnelAddr: netip.MustParseAddr("127.0.0.4")}
	gw.SetTargets([]Target{remote})

	m, err := Start(Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: gw.Port(), Interval: interval, Multiplier: 3, Log: log})
	if err != nil {
		t.Fatalf("start member: %v", err)
	}
	defer m.Close()
	forEast := Target{Name: "gw", Site: "east", Underlay: netip.MustParseAddr("192.0.2.3"), TunnelAddr: netip.MustParseAddr("127.0.0.3")}
	alive := forEast
	alive.Site = ""
	m.SetTargets([]Target{forEast, alive})

	select {
	case down := <-m.Changes():
		if len(down) != 1 || !down[forEast.Member()] {
			t.Fatalf("member's first change: down = %v, want the gateway for east only", down)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the member never took the gateway out for east")
	}
	if gw.Down()[remote.Member()] != true {
		t.Errorf("gateway's down = %v, want its remote gateway", gw.Down())
	}
	m.mu.Lock()
	misses := m.tr.members[forEast.Member()].misses
	m.mu.Unlock()
	if misses != 0 {
		t.Errorf("the member counted %d misses: it must learn from the gateway's answer, not from silence", misses)
	}
	want := []PeerState{{Name: "gw", Tracked: true, Up: true}, {Name: "gw", Site: "east", Tracked: true, Downs: 1}}
	if got := m.Peers(); !slices.Equal(got, want) {
		t.Errorf("Peers() = %+v, want %+v", got, want)
	}
}
