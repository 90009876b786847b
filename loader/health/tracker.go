// Package health runs the UDP health checks of next-hop group members
// (docs/unmanaged-sites.md, "Health checks"; docs/gateways.md, "Health and
// failover"): a responder on this node's tunnel address answers probes, and a
// prober sends one probe per interval to the tunnel address of every member of
// every group this node routes to, through the tunnel. A probe for a gateway
// group names the remote site the group leads to, and a gateway answers it
// with whether it reaches that site now (it probes that site's gateways
// itself), so a gateway that still answers its site but has lost its path is
// left for that site at once. A member whose last Multiplier probes all went
// unanswered, or that answers that it does not reach the site, is down; Rise
// good answers in a row bring it back (hysteresis: a flapping path does not
// move flows on every probe). The agent turns the down members into
// nexthop_groups slots (mapstate.FromPlan, NodeConfig.Down). With a Responder (the
// datapath's), the answers come from claims the Checker refreshes in a pinned
// map with a deadline, so they go on while the agent restarts and stop
// claiming reach once it has been gone for ReachExpiry.
//
// Tracker is the state machine, a pure value driven by the caller's clock;
// Checker adds the sockets and the loop.
package health

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/maps"
)

// Defaults of the agent's --health-* flags.
const (
	DefaultPort       = 9997
	DefaultInterval   = time.Second
	DefaultMultiplier = 3
	DefaultRise       = 3
	// DefaultReachExpiry is how long the datapath keeps answering from the
	// agent's last claims: longer than an agent restart or upgrade takes, short
	// enough that a gateway whose agent is gone (and whose paths nobody checks)
	// is left within it (docs/gateways.md).
	DefaultReachExpiry = 30 * time.Second
)

// Target is a group member to probe: the peer's name, the remote site it is
// checked for ("" : only that it answers), its underlay address (what the
// nexthop_groups slots hold) and its tunnel address (where the probe goes).
type Target struct {
	Name       string
	Site       string
	Underlay   netip.Addr
	TunnelAddr netip.Addr
}

// Member returns the key of t in NodeConfig.Down.
func (t Target) Member() maps.GroupMember { return maps.GroupMember{Site: t.Site, Addr: t.Underlay} }

func compareTargets(a, b Target) int {
	if c := a.Underlay.Compare(b.Underlay); c != 0 {
		return c
	}
	return strings.Compare(a.Site, b.Site)
}

// Targets returns every distinct member of every group route of p with the
// route's remote site, sorted by underlay address and site, and a warning for
// each member that cannot be probed (no IPv4 tunnel address, or not among p's
// peers): such a member is never marked down.
func Targets(p *plan.NodePlan) ([]Target, []string) {
	if p == nil {
		return nil, nil
	}
	tunnel := map[string]netip.Addr{}
	for _, peer := range p.Peers {
		tunnel[peer.Name] = peer.TunnelAddr.Unmap()
	}
	seen := map[maps.GroupMember]bool{}
	warned := map[netip.Addr]bool{}
	var out []Target
	var warns []string
	for _, r := range p.Routes {
		for _, nh := range r.Group {
			u := nh.Via.Unmap()
			k := maps.GroupMember{Site: r.Site, Addr: u}
			if !u.Is4() || seen[k] {
				continue
			}
			seen[k] = true
			ta, ok := tunnel[nh.Peer]
			if !ok || !ta.Is4() {
				if !warned[u] {
					warned[u] = true
					warns = append(warns, fmt.Sprintf("group member %s (%v) has no IPv4 tunnel address: not health-checked, always up", nh.Peer, u))
				}
				continue
			}
			out = append(out, Target{Name: nh.Peer, Site: r.Site, Underlay: u, TunnelAddr: ta})
		}
	}
	slices.SortFunc(out, compareTargets)
	return out, warns
}

// Transition is a member going down or coming back up.
type Transition struct {
	Target Target
	Up     bool
	// Misses is how many probes in a row went unanswered (for a member going up,
	// before the answers that brought it back).
	Misses int
	// Unreachable is true when the member went down because it answered that it
	// does not reach Target.Site.
	Unreachable bool
	At          time.Time
}

func (t Transition) String() string {
	state := "down"
	if t.Up {
		state = "up"
	}
	why := fmt.Sprintf("after %d missed probes", t.Misses)
	if t.Unreachable {
		why = "it does not reach the site"
	}
	return fmt.Sprintf("%s %s for site %q (underlay %v, tunnel %v): %s", t.Target.Name, state, t.Target.Site, t.Target.Underlay, t.Target.TunnelAddr, why)
}

// Tracker is the health state of a set of targets. Members start up (a new member
// or a restarted agent sends flows at once rather than drop them while it waits
// for a first answer). It is not safe for concurrent use.
type Tracker struct {
	multiplier, rise int
	members          map[maps.GroupMember]*member
	byTunnel         map[netip.Addr]netip.Addr
}

type member struct {
	t        Target
	awaiting bool // a probe is out and unanswered
	misses   int
	goods    int // good answers in a row while down
	down     bool
}

// NewTracker returns a Tracker that marks a member down after multiplier
// unanswered probes in a row, or at once when it answers that it does not
// reach the site, and up again after rise good answers in a row (each at
// least 1).
func NewTracker(multiplier, rise int) *Tracker {
	return &Tracker{multiplier: max(multiplier, 1), rise: max(rise, 1), members: map[maps.GroupMember]*member{}, byTunnel: map[netip.Addr]netip.Addr{}}
}

// SetTargets replaces the targets. Members still present keep their state; a member
// whose tunnel address changed starts over (up).
func (tr *Tracker) SetTargets(ts []Target) {
	keep := map[maps.GroupMember]*member{}
	tr.byTunnel = map[netip.Addr]netip.Addr{}
	for _, t := range ts {
		m := tr.members[t.Member()]
		if m == nil || m.t != t {
			m = &member{t: t}
		}
		keep[t.Member()] = m
		tr.byTunnel[t.TunnelAddr] = t.Underlay
	}
	tr.members = keep
}

// Targets returns the current targets, sorted by underlay address and site.
func (tr *Tracker) Targets() []Target {
	var out []Target
	for _, m := range tr.members {
		out = append(out, m.t)
	}
	slices.SortFunc(out, compareTargets)
	return out
}

// Round records that a probe goes out to every target at now. A target whose
// previous probe is still unanswered (Expire was not called for it) counts a miss
// first; one that reaches the multiplier goes down. Returns the members that went
// down, sorted by underlay address and site.
func (tr *Tracker) Round(now time.Time) []Transition {
	out := tr.Expire(now)
	for _, m := range tr.members {
		m.awaiting = true
	}
	return out
}

// Expire records that the probes out at now have timed out: every target still
// awaiting an answer counts a miss (and loses its good answers), and one that
// reaches the multiplier goes down. Called a timeout after each round (shorter
// than the interval), it makes the last miss count before the next round, so
// detection takes interval x (multiplier - 1) + timeout after the first lost
// probe. Returns the members that went down, sorted by underlay address and site.
func (tr *Tracker) Expire(now time.Time) []Transition {
	var out []Transition
	for _, m := range tr.members {
		if !m.awaiting {
			continue
		}
		m.awaiting = false
		m.misses++
		m.goods = 0
		if !m.down && m.misses >= tr.multiplier {
			m.down = true
			out = append(out, Transition{Target: m.t, Up: false, Misses: m.misses, At: now})
		}
	}
	slices.SortFunc(out, func(a, b Transition) int { return compareTargets(a.Target, b.Target) })
	return out
}

// Answer records an answer at now from the tunnel address from for site, which
// says whether the member reaches the site. A good answer clears the misses and,
// the rise-th in a row for a member that is down, brings it up. A member that
// answers it does not reach the site goes down at once: it applied its own
// multiplier to its path before saying so. Returns the transition, if any. An
// answer that matches no target is ignored.
func (tr *Tracker) Answer(from netip.Addr, site string, reaches bool, now time.Time) []Transition {
	u, ok := tr.byTunnel[from.Unmap()]
	if !ok {
		return nil
	}
	m := tr.members[maps.GroupMember{Site: site, Addr: u}]
	if m == nil {
		return nil
	}
	m.awaiting = false
	if !reaches {
		m.goods = 0
		if m.down {
			return nil
		}
		m.down = true
		return []Transition{{Target: m.t, Up: false, Misses: m.misses, Unreachable: true, At: now}}
	}
	misses := m.misses
	m.misses = 0
	if !m.down {
		return nil
	}
	m.goods++
	if m.goods < tr.rise {
		return nil
	}
	m.down, m.goods = false, 0
	return []Transition{{Target: m.t, Up: true, Misses: misses, At: now}}
}

// Down returns the members that are down (nil if none).
func (tr *Tracker) Down() map[maps.GroupMember]bool {
	var out map[maps.GroupMember]bool
	for k, m := range tr.members {
		if m.down {
			if out == nil {
				out = map[maps.GroupMember]bool{}
			}
			out[k] = true
		}
	}
	return out
}

// Reaches reports whether this node reaches site as far as its own checks
// know: true unless site has targets and every one of them is down. A
// gateway's targets for a remote site are that site's gateways; it has none
// for its own site, nor does any node for "" (an answer means alive).
func (tr *Tracker) Reaches(site string) bool {
	if site == "" {
		return true
	}
	tracked := false
	for k, m := range tr.members {
		if k.Site != site {
			continue
		}
		if !m.down {
			return true
		}
		tracked = true
	}
	return !tracked
}
