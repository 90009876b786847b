package health

import (
	"bytes"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	imaps "github.com/isthmus-dev/isthmus/maps"
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

// startChecker starts a Checker on addr (port 0: a free one) with a 20 ms
// interval, stopped when the test ends.
func startChecker(t *testing.T, addr string, port, multiplier int) *Checker {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := Start(Config{Addr: netip.MustParseAddr(addr), Port: port, Interval: 20 * time.Millisecond, Multiplier: multiplier, Log: log})
	if err != nil {
		t.Fatalf("start checker on %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestCheckerPerSiteReach: a gateway (127.0.0.3) whose only remote gateway
// (127.0.0.4, nobody there) stops answering tells its member (127.0.0.1),
// which probes it about that site, that it no longer reaches it: the member
// takes it out for that site while it still answers every probe, and keeps
// it for plain liveness.
func TestCheckerPerSiteReach(t *testing.T) {
	gw := startChecker(t, "127.0.0.3", 0, 3)
	remote := Target{Name: "remote-gw", Site: "east", Underlay: netip.MustParseAddr("192.0.2.4"), TunnelAddr: netip.MustParseAddr("127.0.0.4")}
	gw.SetTargets([]Target{remote})

	m := startChecker(t, "127.0.0.1", gw.Port(), 3)
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

// TestCheckerFirstVersionPeers: during a rolling upgrade a node of the first
// version (magic and round only, every such message echoed) and a new one
// keep each other up: the new responder echoes a first-version probe, and the
// new prober takes its probe echoed back as an answer that reaches the site.
func TestCheckerFirstVersionPeers(t *testing.T) {
	c := startChecker(t, "127.0.0.1", 0, 2)
	// A first-version responder on 127.0.0.6: echo what starts with the magic.
	old, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 6), Port: c.Port()})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer old.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := old.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if bytes.HasPrefix(buf[:n], probeMagic) {
				old.WriteToUDPAddrPort(buf[:n], from)
			}
		}
	}()
	gw := Target{Name: "old-gw", Site: "east", Underlay: netip.MustParseAddr("192.0.2.6"), TunnelAddr: netip.MustParseAddr("127.0.0.6")}
	c.SetTargets([]Target{gw})
	time.Sleep(200 * time.Millisecond)
	if d := c.Down(); len(d) != 0 {
		t.Errorf("a first-version gateway that echoes counts down: %v", d)
	}

	// A first-version probe to the new responder comes back as it went.
	probe := append(append([]byte{}, probeMagic...), 0, 0, 0, 0, 0, 0, 0, 42)
	conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: c.Port()})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write(probe); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err != nil || !bytes.Equal(buf[:n], probe) {
		t.Fatalf("answer to a first-version probe: %q, %v; want the probe echoed", buf[:n], err)
	}
}

// TestCheckerPushesReachChanges: a gateway whose reach to a site changes tells
// the member that probed it at once, not at the member's next probe: with the
// member probing every 500 ms, it learns within a fraction of that.
func TestCheckerPushesReachChanges(t *testing.T) {
	gw := startChecker(t, "127.0.0.7", 0, 2)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const memberInterval = 500 * time.Millisecond
	m, err := Start(Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: gw.Port(), Interval: memberInterval, Multiplier: 3, Log: log})
	if err != nil {
		t.Fatalf("start member: %v", err)
	}
	defer m.Close()
	forEast := Target{Name: "gw", Site: "east", Underlay: netip.MustParseAddr("192.0.2.7"), TunnelAddr: netip.MustParseAddr("127.0.0.7")}
	m.SetTargets([]Target{forEast})
	// Wait for the member's first probe to reach the gateway.
	deadline := time.Now().Add(2 * time.Second)
	for {
		gw.mu.Lock()
		n := len(gw.probers)
		gw.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the member's probe never reached the gateway")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Now the gateway's only remote gateway for east dies (nobody at 127.0.0.8).
	start := time.Now()
	gw.SetTargets([]Target{{Name: "remote", Site: "east", Underlay: netip.MustParseAddr("192.0.2.8"), TunnelAddr: netip.MustParseAddr("127.0.0.8")}})
	select {
	case down := <-m.Changes():
		el := time.Since(start)
		if !down[forEast.Member()] {
			t.Fatalf("member's change: down = %v, want the gateway for east", down)
		}
		if el > memberInterval*3/4 {
			t.Errorf("the member learnt after %v: not pushed (its next probe was due within %v)", el, memberInterval)
		}
		t.Logf("member took the gateway out for east %v after its remote gateway died (gateway interval 20ms x 2)", el.Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		t.Fatal("the member never took the gateway out")
	}
}

// fakeResponder is a Responder in memory: claims by site, one port.
type fakeResponder struct {
	mu      sync.Mutex
	reaches map[string]bool
	until   map[string]uint64
	probers []netip.AddrPort // returned for every site
}

func (f *fakeResponder) Claim(port uint16, site string, reaches bool, until uint64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reaches[site], f.until[site] = reaches, until
	return true, nil
}

func (f *fakeResponder) Unclaim(port uint16, site string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.reaches, site)
	delete(f.until, site)
	return nil
}

func (f *fakeResponder) Claims(port uint16) (map[string]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.reaches), nil
}

func (f *fakeResponder) Probers(site string, since uint64) ([]netip.AddrPort, error) {
	return f.probers, nil
}

func (f *fakeResponder) snapshot() (map[string]bool, map[string]uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.reaches), maps.Clone(f.until)
}

// TestCheckerClaims: with a datapath responder the Checker leaves the last
// run's claims alone until it has targets, then claims "" and each target's
// site with a deadline ReachExpiry ahead (refreshed every interval), removes a
// claim no target names, and when its reach to a site changes writes the new
// claim and tells the datapath's recent probers of that site at once.
func TestCheckerClaims(t *testing.T) {
	const expiry = 500 * time.Millisecond
	fake := &fakeResponder{reaches: map[string]bool{"old": true}, until: map[string]uint64{"old": 1}}
	listener, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	fake.probers = []netip.AddrPort{listener.LocalAddr().(*net.UDPAddr).AddrPort()}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := Start(Config{Addr: netip.MustParseAddr("127.0.0.1"), Interval: 20 * time.Millisecond, Multiplier: 3, Rise: 1,
		Datapath: fake, ReachExpiry: expiry, Log: log})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer c.Close()
	if got, _ := fake.snapshot(); !reflect.DeepEqual(got, map[string]bool{"old": true}) {
		t.Fatalf("claims before SetTargets = %v, want the last run's untouched", got)
	}

	// east's only gateway answers nothing: east is reached until it goes down.
	dead := Target{Name: "gw-e", Site: "east", Underlay: netip.MustParseAddr("192.0.2.2"), TunnelAddr: netip.MustParseAddr("127.0.0.2")}
	c.SetTargets([]Target{dead})
	now, err := imaps.MonotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	got, until := fake.snapshot()
	if want := map[string]bool{"": true, "east": true}; !reflect.DeepEqual(got, want) {
		t.Fatalf("claims after SetTargets = %v, want %v", got, want)
	}
	for site, u := range until {
		if d := time.Duration(u - now); d > expiry || d < expiry-100*time.Millisecond {
			t.Errorf("claim %q expires %v from now, want about %v", site, d, expiry)
		}
	}

	select {
	case <-c.Changes():
	case <-time.After(2 * time.Second):
		t.Fatal("east's gateway never went down")
	}
	if got, _ := fake.snapshot(); !reflect.DeepEqual(got, map[string]bool{"": true, "east": false}) {
		t.Errorf("claims after east's gateway went down = %v, want east not reached", got)
	}
	listener.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 512)
	n, from, err := listener.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no push to the datapath's prober: %v", err)
	}
	m, ok := decode(buf[:n])
	if !ok || m.kind != unreachableKind || m.site != "east" || int(from.Port()) != c.Port() {
		t.Errorf("push %q from %v, want kind N for east from port %d", buf[:n], from, c.Port())
	}
}
