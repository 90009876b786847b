package health

import (
	"bytes"
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
)

// probeMagic starts every probe and answer; anything else is ignored.
var probeMagic = []byte("isthmus-health1\x00")

// Config configures a Checker.
type Config struct {
	// Addr is this node's tunnel address: the responder listens on it and probes
	// leave from it, so both directions go through the tunnel.
	Addr netip.Addr
	// Port is the UDP port of every node's responder (DefaultPort); 0 picks a free
	// one here and probes it (for tests on one host).
	Port int
	// Interval between probe rounds (DefaultInterval when 0) and Multiplier, the
	// unanswered probes in a row that make a member down (DefaultMultiplier).
	Interval   time.Duration
	Multiplier int
	Log        *slog.Logger
}

// Checker answers probes and probes the targets. Its methods are safe for
// concurrent use.
type Checker struct {
	cfg     Config
	resp    *net.UDPConn
	probe   *net.UDPConn
	port    int
	changes chan map[netip.Addr]bool
	done    chan struct{}
	wg      sync.WaitGroup

	mu    sync.Mutex
	tr    *Tracker
	flaps map[string]*[2]uint64 // peer name -> transitions [up, down]

	pubMu sync.Mutex // one publisher at a time, so publish never blocks
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
		changes: make(chan map[netip.Addr]bool, 1), done: make(chan struct{}),
		tr: NewTracker(cfg.Multiplier), flaps: map[string]*[2]uint64{},
	}
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
	if len(after) != before {
		c.publish(after)
	}
}

// Down returns the underlay addresses of the members that are down now.
func (c *Checker) Down() map[netip.Addr]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tr.Down()
}

// PeerState is the health of one peer (a node whose addresses are next-hop
// group members) as metrics report it.
type PeerState struct {
	Name string
	// Tracked is true while the peer is a target; Up is then true when none of
	// its addresses is down.
	Tracked, Up bool
	// Ups and Downs count the transitions of its addresses since the Checker
	// started; they stay after the peer stops being a target.
	Ups, Downs uint64
}

// Peers returns the state of every peer that is a target or has had a
// transition, sorted by name.
func (c *Checker) Peers() []PeerState {
	c.mu.Lock()
	defer c.mu.Unlock()
	byName := map[string]*PeerState{}
	get := func(n string) *PeerState {
		p := byName[n]
		if p == nil {
			p = &PeerState{Name: n, Up: true}
			byName[n] = p
		}
		return p
	}
	down := c.tr.Down()
	for _, t := range c.tr.Targets() {
		p := get(t.Name)
		p.Tracked = true
		if down[t.Underlay] {
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
	slices.SortFunc(out, func(a, b PeerState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Changes delivers the set of down members after each change; only the latest is
// kept if the reader is slow.
func (c *Checker) Changes() <-chan map[netip.Addr]bool { return c.changes }

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

func (c *Checker) publish(down map[netip.Addr]bool) {
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
		f := c.flaps[t.Target.Name]
		if f == nil {
			f = new([2]uint64)
			c.flaps[t.Target.Name] = f
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
			c.cfg.Log.Info("group member up", "member", t.Target.Name, "underlay", t.Target.Underlay, "tunnel", t.Target.TunnelAddr)
		} else {
			c.cfg.Log.Warn("group member down", "member", t.Target.Name, "underlay", t.Target.Underlay, "tunnel", t.Target.TunnelAddr, "missed", t.Misses)
		}
	}
	c.publish(c.Down())
}

// respond echoes every probe back to its sender.
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
		if !bytes.HasPrefix(buf[:n], probeMagic) {
			continue
		}
		if _, err := c.resp.WriteToUDPAddrPort(buf[:n], from); err != nil {
			c.cfg.Log.Debug("health responder answer", "to", from, "err", err)
		}
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
		if !bytes.HasPrefix(buf[:n], probeMagic) || int(from.Port()) != c.port {
			continue
		}
		c.mu.Lock()
		ts := c.tr.Answer(from.Addr(), time.Now())
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
	msg := make([]byte, len(probeMagic)+8)
	copy(msg, probeMagic)
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
			binary.BigEndian.PutUint64(msg[len(probeMagic):], round)
			for _, t := range targets {
				to := netip.AddrPortFrom(t.TunnelAddr, uint16(c.port))
				if _, err := c.probe.WriteToUDPAddrPort(msg, to); err != nil {
					c.cfg.Log.Debug("health probe", "to", to, "err", err)
				}
			}
			expire.Reset(c.cfg.Interval / 2)
		}
	}
}
