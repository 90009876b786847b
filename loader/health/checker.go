package health

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
)

// probeMagic starts every probe and answer; anything else is ignored. Then
// comes the kind (probeKind, or an answer: reachesKind or unreachableKind), the
// prober's round number (8 bytes, big endian; 0 in an answer nobody asked for)
// and the remote site the probe asks about (the rest, "" for none).
//
// The first version sent the magic and the round only and echoed every
// message with the magic: the responder still echoes such a probe, and the
// prober takes its own probe echoed back (kind probeKind) as "reaches", so
// nodes of both versions keep each other up during a rolling upgrade.
var probeMagic = []byte("isthmus-health1\x00")

const (
	probeKind       = 'P'
	reachesKind     = 'R'
	unreachableKind = 'N'
	v1Len           = 16 + 8
	headerLen       = 16 + 1 + 8
	maxSiteLen      = 253
)

// message is a probe or an answer.
type message struct {
	kind  byte
	round uint64
	site  string
}

func (m message) encode() []byte {
	b := make([]byte, headerLen, headerLen+len(m.site))
	copy(b, probeMagic)
	b[len(probeMagic)] = m.kind
	binary.BigEndian.PutUint64(b[len(probeMagic)+1:], m.round)
	return append(b, m.site...)
}

func decode(b []byte) (message, bool) {
	if len(b) < headerLen || len(b) > headerLen+maxSiteLen || !bytes.HasPrefix(b, probeMagic) {
		return message{}, false
	}
	return message{kind: b[len(probeMagic)], round: binary.BigEndian.Uint64(b[len(probeMagic)+1:]), site: string(b[headerLen:])}, true
}

// prober is a node that probes this one about a site: it hears at once when
// this node's reach to the site changes, rather than at its next probe.
type prober struct {
	from netip.AddrPort
	site string
}

// proberState is when a prober last asked and what it was last told.
type proberState struct {
	seen    time.Time
	reaches bool
}

// Config configures a Checker.
type Config struct {
	// Addr is this node's tunnel address: the responder listens on it and probes
	// leave from it, so both directions go through the tunnel.
	Addr netip.Addr
	// Port is the UDP port of every node's responder (DefaultPort); 0 picks a free
	// one here and probes it (for tests on one host).
	Port int
	// Interval between probe rounds (DefaultInterval when 0), Multiplier, the
	// unanswered probes in a row that make a member down (DefaultMultiplier),
	// and Rise, the good answers in a row that bring it back (DefaultRise).
	Interval         time.Duration
	Multiplier, Rise int
	// Datapath, if set, is the datapath's responder (maps.HealthResponder). The
	// Checker keeps its claims there (this node's reach to every site it probes
	// gateways for, and "" for every other site) fresh, every interval and at once
	// on a change, and the datapath answers probes from them, also while this
	// process is gone; the socket then answers only what the datapath leaves to
	// it. Without it the socket answers every probe.
	Datapath Responder
	// ReachExpiry is how long a claim holds without a refresh
	// (DefaultReachExpiry when 0; at least 2 x Interval): an agent gone longer
	// than that stops claiming reach, and its node's probers fail over.
	ReachExpiry time.Duration
	Log         *slog.Logger
}

// Responder is the datapath's probe responder: claims per (port, site) with a
// deadline on CLOCK_MONOTONIC (maps.MonotonicNow), and the probers it
// answered. maps.HealthResponder implements it.
type Responder interface {
	// Claim writes a claim; it returns false when the datapath cannot hold one
	// for site (the socket answers it).
	Claim(port uint16, site string, reaches bool, until uint64) (bool, error)
	Unclaim(port uint16, site string) error
	// Claims returns the claims of port in the datapath now, by site.
	Claims(port uint16) (map[string]bool, error)
	// Probers returns who the datapath answered about site since then.
	Probers(site string, since uint64) ([]netip.AddrPort, error)
}

// Checker answers probes and probes the targets. Its methods are safe for
// concurrent use.
type Checker struct {
	cfg     Config
	resp    *net.UDPConn
	probe   *net.UDPConn
	port    int
	changes chan map[maps.GroupMember]bool
	done    chan struct{}
	wg      sync.WaitGroup

	mu      sync.Mutex
	tr      *Tracker
	flaps   map[peerKey]*[2]uint64 // transitions [up, down]
	probers map[prober]*proberState

	pubMu sync.Mutex // one publisher at a time, so publish never blocks

	claimMu sync.Mutex
	claimed map[string]bool // the datapath's claims as last written, by site
}

// Start opens the responder and prober sockets in the network namespace of the
// calling thread (the caller of a namespaced agent must be locked into it) and
// starts probing. It has no targets until SetTargets. Close stops it.
func Start(cfg Config) (*Checker, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Multiplier <= 0 {
		cfg.Multiplier = DefaultMultiplier
	}
	if cfg.Rise <= 0 {
		cfg.Rise = DefaultRise
	}
	if cfg.ReachExpiry <= 0 {
		cfg.ReachExpiry = DefaultReachExpiry
	}
	cfg.ReachExpiry = max(cfg.ReachExpiry, 2*cfg.Interval)
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if !cfg.Addr.Unmap().Is4() {
		return nil, fmt.Errorf("start health checks: tunnel address %v is not IPv4", cfg.Addr)
	}
	ip := cfg.Addr.Unmap().AsSlice()
	resp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip, Port: cfg.Port})
	if err != nil {
		return nil, fmt.Errorf("listen for health probes on %v:%d: %w", cfg.Addr, cfg.Port, err)
	}
	probe, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip})
	if err != nil {
		resp.Close()
		return nil, fmt.Errorf("open health prober on %v: %w", cfg.Addr, err)
	}
	c := &Checker{
		cfg: cfg, resp: resp, probe: probe, port: resp.LocalAddr().(*net.UDPAddr).Port,
		changes: make(chan map[maps.GroupMember]bool, 1), done: make(chan struct{}),
		tr: NewTracker(cfg.Multiplier, cfg.Rise), flaps: map[peerKey]*[2]uint64{},
		probers: map[prober]*proberState{}, claimed: map[string]bool{},
	}
	if cfg.Datapath != nil {
		// An earlier agent's claims: refreshed, or removed once no target
		// names their site (they would expire into "does not reach").
		if old, err := cfg.Datapath.Claims(uint16(c.port)); err != nil {
			cfg.Log.Error("health claims of the last run not read", "err", err)
		} else {
			c.claimed = old
		}
	}
	// No refresh before SetTargets: until then the last claims hold as they are.
	c.wg.Add(3)
	go c.respond()
	go c.readAnswers()
	go c.loop()
	return c, nil
}

// Port is the UDP port the responder listens on and probes go to.
func (c *Checker) Port() int { return c.port }

// SetTargets replaces the members to probe; members still present keep their state.
// If a member that was down is no longer a target, Changes gets the new down set.
func (c *Checker) SetTargets(ts []Target) {
	c.mu.Lock()
	before := len(c.tr.Down())
	c.tr.SetTargets(ts)
	after := c.tr.Down()
	c.mu.Unlock()
	c.pushClaims(c.refreshClaims())
	if len(after) != before {
		c.publish(after)
	}
}

// Down returns the members that are down now.
func (c *Checker) Down() map[maps.GroupMember]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tr.Down()
}

// PeerState is the health of one peer (a node whose addresses are next-hop
// group members) for one remote site as metrics report it.
type PeerState struct {
	Name string
	// Site is the remote site the peer is checked for ("": only that it
	// answers).
	Site string
	// Tracked is true while the peer is a target; Up is then true when none of
	// its addresses is down.
	Tracked, Up bool
	// Ups and Downs count the transitions of its addresses since the Checker
	// started; they stay after the peer stops being a target.
	Ups, Downs uint64
}

type peerKey struct{ name, site string }

// Peers returns the state of every peer and site that is a target or has had
// a transition, sorted by name and site.
func (c *Checker) Peers() []PeerState {
	c.mu.Lock()
	defer c.mu.Unlock()
	byName := map[peerKey]*PeerState{}
	get := func(k peerKey) *PeerState {
		p := byName[k]
		if p == nil {
			p = &PeerState{Name: k.name, Site: k.site, Up: true}
			byName[k] = p
		}
		return p
	}
	down := c.tr.Down()
	for _, t := range c.tr.Targets() {
		p := get(peerKey{t.Name, t.Site})
		p.Tracked = true
		if down[t.Member()] {
			p.Up = false
		}
	}
	for n, f := range c.flaps {
		p := get(n)
		p.Ups, p.Downs = f[0], f[1]
	}
	out := make([]PeerState, 0, len(byName))
	for _, p := range byName {
		if !p.Tracked {
			p.Up = false
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b PeerState) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Site, b.Site))
	})
	return out
}

// Changes delivers the set of down members after each change; only the latest is
// kept if the reader is slow.
func (c *Checker) Changes() <-chan map[maps.GroupMember]bool { return c.changes }

// Close stops probing and answering and closes the sockets.
func (c *Checker) Close() {
	select {
	case <-c.done:
		return
	default:
	}
	close(c.done)
	c.resp.Close()
	c.probe.Close()
	c.wg.Wait()
}

func (c *Checker) publish(down map[maps.GroupMember]bool) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	select {
	case <-c.changes:
	default:
	}
	c.changes <- down
}

func (c *Checker) report(ts []Transition) {
	if len(ts) == 0 {
		return
	}
	c.mu.Lock()
	for _, t := range ts {
		k := peerKey{t.Target.Name, t.Target.Site}
		f := c.flaps[k]
		if f == nil {
			f = new([2]uint64)
			c.flaps[k] = f
		}
		if t.Up {
			f[0]++
		} else {
			f[1]++
		}
	}
	c.mu.Unlock()
	for _, t := range ts {
		if t.Up {
			c.cfg.Log.Info("group member up", "member", t.Target.Name, "site", t.Target.Site, "underlay", t.Target.Underlay, "tunnel", t.Target.TunnelAddr)
		} else {
			c.cfg.Log.Warn("group member down", "member", t.Target.Name, "site", t.Target.Site, "underlay", t.Target.Underlay, "tunnel", t.Target.TunnelAddr,
				"missed", t.Misses, "unreachable", t.Unreachable)
		}
	}
	// The datapath's claims first, as SetTargets does: whoever acts on
	// Changes finds the responder already answering with the new reach.
	c.pushClaims(c.refreshClaims())
	c.notifyProbers()
	c.publish(c.Down())
}

// refreshClaims writes the datapath's claims with a new deadline: reach for
// every site this node has targets for, "" (every other site, and liveness)
// reached; a site no longer probed loses its claim. Returns the sites whose
// reach changed since the last write. Without a datapath it does nothing.
func (c *Checker) refreshClaims() map[string]bool {
	dp := c.cfg.Datapath
	if dp == nil {
		return nil
	}
	now, err := maps.MonotonicNow()
	if err != nil {
		c.cfg.Log.Error("health claims not refreshed", "err", err)
		return nil
	}
	until := now + uint64(c.cfg.ReachExpiry)
	want := map[string]bool{"": true}
	c.mu.Lock()
	for _, t := range c.tr.Targets() {
		want[t.Site] = c.tr.Reaches(t.Site)
	}
	c.mu.Unlock()

	c.claimMu.Lock()
	defer c.claimMu.Unlock()
	changed := map[string]bool{}
	port := uint16(c.port)
	for site, r := range want {
		ok, err := dp.Claim(port, site, r, until)
		if err != nil {
			c.cfg.Log.Error("health claim not written", "site", site, "err", err)
			continue
		}
		if !ok {
			continue // the socket answers a name the datapath cannot hold
		}
		if was, seen := c.claimed[site]; seen && was != r {
			changed[site] = r
		}
		c.claimed[site] = r
	}
	for site := range c.claimed {
		if _, ok := want[site]; ok {
			continue
		}
		if err := dp.Unclaim(port, site); err != nil {
			c.cfg.Log.Error("health claim not removed", "site", site, "err", err)
			continue
		}
		delete(c.claimed, site)
	}
	return changed
}

// pushClaims tells every node the datapath answered about a site in changed,
// within the last (multiplier + 1) intervals, the site's new reach at once, as
// notifyProbers does for the nodes this process answered.
func (c *Checker) pushClaims(changed map[string]bool) {
	if len(changed) == 0 {
		return
	}
	now, err := maps.MonotonicNow()
	if err != nil {
		return
	}
	recent := uint64(c.cfg.Interval) * uint64(c.cfg.Multiplier+1)
	since := uint64(0)
	if now > recent {
		since = now - recent
	}
	for site, r := range changed {
		ps, err := c.cfg.Datapath.Probers(site, since)
		if err != nil {
			c.cfg.Log.Error("health probers not read", "site", site, "err", err)
			continue
		}
		for _, p := range ps {
			c.answer(message{kind: answerKind(r), site: site}, p)
		}
	}
}

// notifyProbers tells every node that probed this one recently (within a
// down time) about a site whose reach has changed since its last answer, so
// it moves its flows now, not up to an interval later at its next probe.
func (c *Checker) notifyProbers() {
	c.mu.Lock()
	recent := time.Now().Add(-c.cfg.Interval * time.Duration(c.cfg.Multiplier+1))
	var tell []prober
	var kinds []byte
	for p, st := range c.probers {
		if st.seen.Before(recent) {
			delete(c.probers, p)
			continue
		}
		if r := c.tr.Reaches(p.site); r != st.reaches {
			st.reaches = r
			tell = append(tell, p)
			kinds = append(kinds, answerKind(r))
		}
	}
	c.mu.Unlock()
	for i, p := range tell {
		c.answer(message{kind: kinds[i], site: p.site}, p.from)
	}
}

func answerKind(reaches bool) byte {
	if reaches {
		return reachesKind
	}
	return unreachableKind
}

// answerV1 echoes a probe of the first version: it asks about no site.
func (c *Checker) answerV1(probe []byte, to netip.AddrPort) { c.send(probe, to) }

func (c *Checker) answer(m message, to netip.AddrPort) { c.send(m.encode(), to) }

func (c *Checker) send(b []byte, to netip.AddrPort) {
	if _, err := c.resp.WriteToUDPAddrPort(b, to); err != nil {
		c.cfg.Log.Debug("health responder answer", "to", to, "err", err)
	}
}

// respond answers every probe: whether this node reaches the site it names.
func (c *Checker) respond() {
	defer c.wg.Done()
	buf := make([]byte, 512)
	for {
		n, from, err := c.resp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			c.cfg.Log.Debug("health responder read", "err", err)
			continue
		}
		if n == v1Len && bytes.HasPrefix(buf[:n], probeMagic) {
			c.answerV1(buf[:n], from)
			continue
		}
		m, ok := decode(buf[:n])
		if !ok || m.kind != probeKind {
			continue
		}
		c.mu.Lock()
		r := c.tr.Reaches(m.site)
		c.probers[prober{from, m.site}] = &proberState{seen: time.Now(), reaches: r}
		c.mu.Unlock()
		m.kind = answerKind(r)
		c.answer(m, from)
	}
}

// readAnswers feeds answers to the tracker.
func (c *Checker) readAnswers() {
	defer c.wg.Done()
	buf := make([]byte, 512)
	for {
		n, from, err := c.probe.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. ICMP errors reported on the socket
		}
		m, ok := decode(buf[:n])
		if !ok || int(from.Port()) != c.port {
			continue
		}
		// A probe of ours echoed by a first-version responder: alive, and
		// that version had no notion of reach.
		reaches := m.kind == reachesKind || m.kind == probeKind
		c.mu.Lock()
		ts := c.tr.Answer(from.Addr(), m.site, reaches, time.Now())
		c.mu.Unlock()
		c.report(ts)
	}
}

// loop sends a round of probes every interval and expires the round's unanswered
// probes half an interval later: a probe through the tunnel answers in well under a
// millisecond, and counting the miss then, not at the next round, keeps failover
// within interval x multiplier + 1s with room to spare (interval x multiplier +
// interval/2 after the first lost probe).
func (c *Checker) loop() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	expire := time.NewTimer(time.Hour)
	expire.Stop()
	defer expire.Stop()
	var round uint64
	for {
		select {
		case <-c.done:
			return
		case now := <-expire.C:
			c.mu.Lock()
			ts := c.tr.Expire(now)
			c.mu.Unlock()
			c.report(ts)
		case now := <-tick.C:
			round++
			c.mu.Lock()
			ts := c.tr.Round(now)
			targets := c.tr.Targets()
			c.mu.Unlock()
			c.report(ts)
			c.pushClaims(c.refreshClaims())
			for _, t := range targets {
				to := netip.AddrPortFrom(t.TunnelAddr, uint16(c.port))
				msg := message{kind: probeKind, round: round, site: t.Site}.encode()
				if _, err := c.probe.WriteToUDPAddrPort(msg, to); err != nil {
					c.cfg.Log.Debug("health probe", "to", to, "err", err)
				}
			}
			expire.Reset(c.cfg.Interval / 2)
		}
	}
}
