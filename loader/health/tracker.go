// Package health runs the UDP health checks of next-hop group members
// (docs/unmanaged-sites.md, "Health checks"): a responder on this node's tunnel
// address answers probes, and a prober sends one probe per interval to the tunnel
// address of every member of every group this node routes to, through the tunnel.
// A member whose last Multiplier probes all went unanswered is down; its first
// answer brings it up again. The agent turns the set of down members into
// nexthop_groups slots (maps.FromPlan, NodeConfig.Down).
//
// Tracker is the state machine, a pure value driven by the caller's clock; Checker
// adds the sockets and the loop.
package health

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/isthmus-dev/isthmus/loader/plan"
)

// Defaults of the agent's --health-* flags.
const (
	DefaultPort       = 9997
	DefaultInterval   = time.Second
	DefaultMultiplier = 3
)

// Target is a group member to probe: the peer's name, its underlay address (what
// the nexthop_groups slots hold) and its tunnel address (where the probe goes).
type Target struct {
	Name       string
	Underlay   netip.Addr
	TunnelAddr netip.Addr
}

// Targets returns every distinct member of every group route of p, sorted by
// underlay address, and a warning for each member that cannot be probed (no IPv4
// tunnel address, or not among p's peers): such a member is never marked down.
func Targets(p *plan.NodePlan) ([]Target, []string) {
	if p == nil {
		return nil, nil
	}
	tunnel := map[string]netip.Addr{}
	for _, peer := range p.Peers {
		tunnel[peer.Name] = peer.TunnelAddr.Unmap()
	}
	seen := map[netip.Addr]bool{}
	var out []Target
	var warns []string
	for _, r := range p.Routes {
		for _, nh := range r.Group {
			u := nh.Via.Unmap()
			if !u.Is4() || seen[u] {
				continue
			}
			seen[u] = true
			ta, ok := tunnel[nh.Peer]
			if !ok || !ta.Is4() {
				warns = append(warns, fmt.Sprintf("group member %s (%v) has no IPv4 tunnel address: not health-checked, always up", nh.Peer, u))
				continue
			}
			out = append(out, Target{Name: nh.Peer, Underlay: u, TunnelAddr: ta})
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return a.Underlay.Compare(b.Underlay) })
	return out, warns
}

// Transition is a member going down or coming back up.
type Transition struct {
	Target Target
	Up     bool
	// Misses is how many probes in a row went unanswered (for a member going up,
	// before the answer).
	Misses int
	At     time.Time
}

func (t Transition) String() string {
	state := "down"
	if t.Up {
		state = "up"
	}
	return fmt.Sprintf("%s %s (underlay %v, tunnel %v) after %d missed probes", t.Target.Name, state, t.Target.Underlay, t.Target.TunnelAddr, t.Misses)
}

// Tracker is the health state of a set of targets. Members start up (a new member
// or a restarted agent sends flows at once rather than drop them while it waits
// for a first answer). It is not safe for concurrent use.
type Tracker struct {
	multiplier int
	members    map[netip.Addr]*member // by underlay address
	byTunnel   map[netip.Addr]netip.Addr
}

type member struct {
	t        Target
	awaiting bool // a probe is out and unanswered
	misses   int
	down     bool
}

// NewTracker returns a Tracker that marks a member down after multiplier
// unanswered probes in a row (at least 1).
func NewTracker(multiplier int) *Tracker {
	return &Tracker{multiplier: max(multiplier, 1), members: map[netip.Addr]*member{}, byTunnel: map[netip.Addr]netip.Addr{}}
}

// SetTargets replaces the targets. Members still present keep their state; a member
// whose tunnel address changed starts over (up).
func (tr *Tracker) SetTargets(ts []Target) {
	keep := map[netip.Addr]*member{}
	tr.byTunnel = map[netip.Addr]netip.Addr{}
	for _, t := range ts {
		m := tr.members[t.Underlay]
		if m == nil || m.t != t {
			m = &member{t: t}
		}
		keep[t.Underlay] = m
		tr.byTunnel[t.TunnelAddr] = t.Underlay
	}
	tr.members = keep
}

// Targets returns the current targets, sorted by underlay address.
func (tr *Tracker) Targets() []Target {
	var out []Target
	for _, m := range tr.members {
		out = append(out, m.t)
	}
	slices.SortFunc(out, func(a, b Target) int { return a.Underlay.Compare(b.Underlay) })
	return out
}

// Round records that a probe goes out to every target at now. A target whose
// previous probe is still unanswered (Expire was not called for it) counts a miss
// first; one that reaches the multiplier goes down. Returns the members that went
// down, sorted by underlay address.
func (tr *Tracker) Round(now time.Time) []Transition {
	out := tr.Expire(now)
	for _, m := range tr.members {
		m.awaiting = true
	}
	return out
}

// Expire records that the probes out at now have timed out: every target still
// awaiting an answer counts a miss, and one that reaches the multiplier goes down.
// Called a timeout after each round (shorter than the interval), it makes the
// last miss count before the next round, so detection takes interval x
// (multiplier - 1) + timeout after the first lost probe. Returns the members that
// went down, sorted by underlay address.
func (tr *Tracker) Expire(now time.Time) []Transition {
	var out []Transition
	for _, m := range tr.members {
		if !m.awaiting {
			continue
		}
		m.awaiting = false
		m.misses++
		if !m.down && m.misses >= tr.multiplier {
			m.down = true
			out = append(out, Transition{Target: m.t, Up: false, Misses: m.misses, At: now})
		}
	}
	slices.SortFunc(out, func(a, b Transition) int { return a.Target.Underlay.Compare(b.Target.Underlay) })
	return out
}

// Answer records an answer from the tunnel address from at now: the member's
// misses are cleared, and a member that was down is up again (the returned
// transition). An answer from an address that is no target is ignored.
func (tr *Tracker) Answer(from netip.Addr, now time.Time) []Transition {
	u, ok := tr.byTunnel[from.Unmap()]
	if !ok {
		return nil
	}
	m := tr.members[u]
	var out []Transition
	if m.down {
		m.down = false
		out = append(out, Transition{Target: m.t, Up: true, Misses: m.misses, At: now})
	}
	m.awaiting, m.misses = false, 0
	return out
}

// Down returns the underlay addresses of the members that are down (nil if none).
func (tr *Tracker) Down() map[netip.Addr]bool {
	var out map[netip.Addr]bool
	for u, m := range tr.members {
		if m.down {
			if out == nil {
				out = map[netip.Addr]bool{}
			}
			out[u] = true
		}
	}
	return out
}
