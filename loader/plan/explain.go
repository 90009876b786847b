package plan

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The kinds of entry an address can match in a NodePlan (Match.Kind).
const (
	MatchRoute        = "route"        // a Route: into the tunnel (TransitOnly: not for the host's own traffic)
	MatchException    = "exception"    // an Underlay Route: not tunnelled, whatever a shorter route says
	MatchLocal        = "local"        // a LocalPrefix: left to the site's fabric and CNI
	MatchFabric       = "fabric"       // a FabricPrefix: decapsulated traffic handed to the fabric
	MatchPodCIDR      = "podCIDR"      // one of the node's own PodCIDRs
	MatchTunnelAddr   = "tunnelAddr"   // the node's own tunnel address
	MatchUnderlay     = "underlay"     // the node's own underlay address
	MatchPeerUnderlay = "peerUnderlay" // a peer's underlay address (a tunnel endpoint)
)

// matchKindsInOrder breaks ties between entries of the same prefix length.
const matchKindsInOrder = "underlay peerUnderlay tunnelAddr podCIDR local fabric exception route"

const explainNoRouteText = "no route: stays on the underlay (the kernel routes it; the datapath does not touch it)"

// Match is one entry of a NodePlan that contains an address.
type Match struct {
	// Kind is one of the Match* constants.
	Kind   string       `json:"kind"`
	Prefix netip.Prefix `json:"prefix"`
	// Origin names the object and field that put the entry in the plan.
	Origin string `json:"origin"`
	// Peer and Via are the peer a route or a peer's address belongs to; Group the
	// members of a route to a next-hop group, and Site the remote site they are
	// checked for (Route.Site).
	Peer  string     `json:"peer,omitempty"`
	Via   netip.Addr `json:"via,omitzero"`
	Group []NextHop  `json:"group,omitempty"`
	Site  string     `json:"site,omitempty"`
	// TransitOnly, ViaFabric and NotForPods are the route's (Route).
	TransitOnly bool `json:"transitOnly,omitempty"`
	ViaFabric   bool `json:"viaFabric,omitempty"`
	NotForPods  bool `json:"notForPods,omitempty"`
}

// SNATExplanation says whether a packet from an address entering the tunnel on the
// node is translated by return-path SNAT.
type SNATExplanation struct {
	Translated bool `json:"translated"`
	// To is the translated source (the node's tunnel address) when Translated.
	To netip.Addr `json:"to,omitzero"`
	// Exempt is the snat_exempt entry that keeps the source, when there is one.
	Exempt *ExemptSource `json:"exempt,omitempty"`
	// Reason is one sentence on why.
	Reason string `json:"reason"`
}

// Explanation is what a node's plan does with one address: the entry it matches
// (longest prefix first), the others that contain it, the corrections that cut a
// route which would have covered it, and the SNAT verdict for it as a source.
type Explanation struct {
	Node string     `json:"node"`
	Addr netip.Addr `json:"addr"`
	// Match is the winning entry: the longest prefix among Matches; nil when
	// nothing in the plan contains Addr.
	Match *Match `json:"match,omitempty"`
	// Matches are every entry that contains Addr, longest prefix first.
	Matches []Match `json:"matches,omitempty"`
	// Verdict is one sentence on where a packet to Addr goes from this node.
	Verdict string `json:"verdict"`
	// Corrections are the cuts that removed Addr from a route, each with Why.
	Corrections []ExplainedCorrection `json:"corrections,omitempty"`
	SNAT        SNATExplanation       `json:"snat"`
}

// ExplainedCorrection is a Correction that removed the explained address from a
// route, with a sentence saying why.
type ExplainedCorrection struct {
	Correction
	Why string `json:"why"`
}

// Explain returns what the plan p does with addr: which entry a packet to addr
// matches on the node (the longest prefix among the routes, local and fabric
// prefixes, the node's podCIDRs, its tunnel and underlay addresses and its peers'
// underlay addresses), where it goes, which corrections cut a route that would
// have covered it, and whether a packet from addr entering the tunnel is
// translated by SNAT (and which exempt entry keeps it). For an IPv6 address the
// verdict says where the datapath does not carry IPv6 (notCarried6). It is a pure
// function; p must not be nil. An IPv4-mapped IPv6 address is unmapped first.
func Explain(p *NodePlan, addr netip.Addr) Explanation {
	addr = addr.Unmap()
	e := Explanation{Node: p.Node, Addr: addr}
	e.Matches = p.matches(addr)
	if len(e.Matches) > 0 {
		m := e.Matches[0]
		e.Match = &m
	}
	e.Verdict = verdict(e.Match)
	if why := p.notCarriedFamily(e.Match); why != "" {
		e.Verdict = why
	} else if why := notCarried6(addr, e.Match); why != "" {
		e.Verdict = why
	} else if r, ok := p.transitOnlyRoute(addr); ok && addr.Is4() && e.Match != nil && e.Match.Kind != MatchRoute {
		// A peer's or a remote node's InternalIP: the host's traffic stays on
		// the underlay, the pods' takes the tunnel (architecture.md, "Pods and
		// node addresses").
		e.Verdict += fmt.Sprintf("; this node's pods and forwarded traffic go into the tunnel by route %s (transit only)", r.Prefix)
	}
	for _, c := range p.Corrections {
		if !c.Removed.Contains(addr) {
			continue
		}
		var why string
		switch {
		case c.Local.IsValid() && c.Local.Contains(addr):
			why = fmt.Sprintf("%s would cover this address but %s is local on this node: %s (the route came from %s)",
				c.Removed, c.Local, p.localOrigin(c.Local), c.Origin)
		case c.Endpoint.IsValid() && c.Endpoint == addr:
			why = fmt.Sprintf("%s would cover this address but it is a tunnel endpoint (underlay address), which the host never sends into the tunnel (the route came from %s)",
				c.Removed, c.Origin)
		default:
			continue
		}
		e.Corrections = append(e.Corrections, ExplainedCorrection{Correction: c, Why: why})
	}
	e.SNAT = p.explainSNAT(addr)
	return e
}

// matches returns every entry of p containing addr, longest prefix first; among
// equal lengths, in the order of matchKindsInOrder.
func (p *NodePlan) matches(addr netip.Addr) []Match {
	var out []Match
	add := func(m Match) {
		if m.Prefix.IsValid() && m.Prefix.Contains(addr) {
			out = append(out, m)
		}
	}
	if p.Underlay.IsValid() {
		add(Match{Kind: MatchUnderlay, Prefix: HostPrefix(p.Underlay), Origin: fmt.Sprintf("Node %q status.addresses[InternalIP]", p.Node)})
	}
	for _, pr := range p.Peers {
		if pr.Underlay.IsValid() {
			add(Match{Kind: MatchPeerUnderlay, Prefix: HostPrefix(pr.Underlay), Origin: fmt.Sprintf("Node %q status.addresses[InternalIP]", pr.Name), Peer: pr.Name, Via: pr.Underlay})
		}
	}
	if p.TunnelAddr.IsValid() {
		add(Match{Kind: MatchTunnelAddr, Prefix: HostPrefix(p.TunnelAddr), Origin: p.TunnelAddrOrigin})
	}
	for i, c := range p.PodCIDRs {
		add(Match{Kind: MatchPodCIDR, Prefix: c, Origin: fmt.Sprintf("Node %q spec.podCIDRs[%d]", p.Node, i)})
	}
	for _, l := range p.LocalPrefixes {
		add(Match{Kind: MatchLocal, Prefix: l, Origin: p.localOrigin(l)})
	}
	for _, f := range p.FabricPrefixes {
		o := p.declaredOrigin(f)
		if o == "" {
			o = fmt.Sprintf("Site %q fabric prefixes (its pod blocks, or on a gateway its nodeCidrs)", p.Site)
		}
		add(Match{Kind: MatchFabric, Prefix: f, Origin: o})
	}
	for _, r := range p.Routes {
		if r.Underlay {
			add(Match{Kind: MatchException, Prefix: r.Prefix, Origin: r.Origin})
			continue
		}
		add(Match{Kind: MatchRoute, Prefix: r.Prefix, Origin: r.Origin, Peer: r.Peer, Via: r.Via, Group: slices.Clone(r.Group), Site: r.Site,
			TransitOnly: r.TransitOnly, ViaFabric: r.ViaFabric, NotForPods: r.NotForPods})
	}
	slices.SortStableFunc(out, func(a, b Match) int {
		if a.Prefix.Bits() != b.Prefix.Bits() {
			return b.Prefix.Bits() - a.Prefix.Bits()
		}
		return kindRank(a.Kind) - kindRank(b.Kind)
	})
	return out
}

func kindRank(k string) int {
	return slices.Index(strings.Fields(matchKindsInOrder), k)
}

// localOrigin names where a LocalPrefix comes from. The plan keeps the origins of
// the site's declared pod blocks in its SNAT exempt entries; any other local prefix
// is one of the site's localCidrs (the plan does not record which index).
func (p *NodePlan) localOrigin(l netip.Prefix) string {
	if o := p.declaredOrigin(l); o != "" {
		return o
	}
	return fmt.Sprintf("Site %q spec.localCidrs", p.Site)
}

// declaredOrigin returns the origin of a declared pod block of the node's site, as
// recorded in the SNAT exempt entries, or "".
func (p *NodePlan) declaredOrigin(pr netip.Prefix) string {
	site := fmt.Sprintf("Site %q spec.podCidrAssignments", p.Site)
	for _, e := range p.SNAT.Exempt {
		if e.Prefix == pr && strings.HasPrefix(e.Origin, site) {
			return e.Origin
		}
	}
	return ""
}

// verdict says in one sentence where a packet to the address of m goes.
func verdict(m *Match) string {
	if m == nil {
		return explainNoRouteText
	}
	switch m.Kind {
	case MatchRoute:
		if m.TransitOnly {
			return fmt.Sprintf("this node's own traffic stays on the underlay (route %s is transit only); its pods and forwarded traffic go %s",
				m.Prefix, tunnelVerdict(m))
		}
		return tunnelVerdict(m)
	case MatchException:
		return fmt.Sprintf("not tunnelled: %s is an exception to a shorter transit-only route (%s), left to the kernel and the underlay", m.Prefix, m.Origin)
	case MatchLocal:
		return fmt.Sprintf("stays in this node's site: %s is local (left to the site's fabric and CNI, never tunneled)", m.Prefix)
	case MatchFabric:
		return fmt.Sprintf("handed to this site's fabric: %s is a fabric prefix (decapsulated packets to it leave through the site's network)", m.Prefix)
	case MatchPodCIDR:
		return fmt.Sprintf("a pod on this node: %s is its own podCIDR (delivered locally, never tunneled)", m.Prefix)
	case MatchTunnelAddr:
		return "this node's own tunnel address (delivered to its host stack)"
	case MatchUnderlay:
		return "this node's own underlay address: a tunnel endpoint, stays on the underlay"
	case MatchPeerUnderlay:
		return fmt.Sprintf("the underlay address of peer %s: a tunnel endpoint, stays on the underlay", m.Peer)
	}
	return explainNoRouteText
}

// tunnelVerdict says where route m sends a packet into the tunnel.
func tunnelVerdict(m *Match) string {
	if len(m.Group) > 0 {
		ms := make([]string, len(m.Group))
		for i, h := range m.Group {
			ms[i] = fmt.Sprintf("%s %s", h.Peer, h.Via)
		}
		up := "among those up"
		if m.Site != "" {
			up = "among those that reach site " + m.Site
		}
		return fmt.Sprintf("into the tunnel by route %s to a group of %d (one member per flow by consistent hash, %s): %s",
			m.Prefix, len(m.Group), up, strings.Join(ms, ", "))
	}
	return fmt.Sprintf("into the tunnel by route %s to peer %s (underlay %s)", m.Prefix, m.Peer, m.Via)
}

// notCarriedFamily returns, for a winning route m to one peer in the clear whose
// underlay address is not of this node's underlay family, the verdict that says
// the datapath does not carry it: GENEVE runs over one family end to end, and
// the node has no outer header for the other (an encrypted peer is known by its
// IPv4 tunnel address whatever the underlay). "" otherwise.
func (p *NodePlan) notCarriedFamily(m *Match) string {
	if m == nil || m.Kind != MatchRoute || len(m.Group) > 0 || !m.Via.IsValid() {
		return ""
	}
	via, own := m.Via.Unmap(), p.Underlay.Unmap()
	if via.Is6() == own.Is6() {
		return ""
	}
	for i := range p.Peers {
		if pr := &p.Peers[i]; pr.Name == m.Peer && pr.Encrypted {
			return ""
		}
	}
	return fmt.Sprintf("not carried: peer %s is at underlay address %s and this node at %s, of the other family; route %s is not in the datapath's maps", m.Peer, via, own, m.Prefix)
}

// notCarried6 returns, for an IPv6 address whose winning entry m is a route the
// datapath does not carry IPv6 on, the verdict that says so; "" otherwise
// (docs/architecture.md, "IPv6 pods"): the pods' and fabric tables' rules are IPv4
// only, so a transit-only or via-fabric route takes no IPv6. Group routes carry it:
// gateways transit IPv6 as IPv4.
func notCarried6(addr netip.Addr, m *Match) string {
	if addr.Is4() || m == nil || m.Kind != MatchRoute || (!m.TransitOnly && !m.ViaFabric) {
		return ""
	}
	return fmt.Sprintf("not carried: route %s is for forwarded traffic or the site fabric, which isthmus carries for IPv4 only; an IPv6 packet to it takes the kernel's own routes", m.Prefix)
}

// explainSNAT says whether a packet from addr entering the tunnel is translated.
func (p *NodePlan) explainSNAT(addr netip.Addr) SNATExplanation {
	if !addr.Is4() {
		return SNATExplanation{Reason: "not translated: return-path SNAT is IPv4 only; a peer drops an IPv6 source it does not route back to this node (inner_src_denied)"}
	}
	s := p.SNAT
	if !s.Addr.IsValid() {
		return SNATExplanation{Reason: "SNAT is off on this node: " + s.Reason}
	}
	var best *ExemptSource
	for i := range s.Exempt {
		e := &s.Exempt[i]
		if e.Prefix.Contains(addr) && (best == nil || e.Prefix.Bits() > best.Prefix.Bits()) {
			best = e
		}
	}
	if best != nil {
		b := *best
		return SNATExplanation{Exempt: &b, Reason: fmt.Sprintf("exempt: %s is a source peers route back to this node (%s)", b.Prefix, b.Origin)}
	}
	return SNATExplanation{Translated: true, To: s.Addr,
		Reason: fmt.Sprintf("translated to %s: no snat_exempt entry contains %s, so replies could not find their way back untranslated", s.Addr, addr)}
}

// transitOnlyRoute returns the longest TransitOnly route holding addr,
// false when there is none or it is an Underlay exception.
func (p *NodePlan) transitOnlyRoute(addr netip.Addr) (Route, bool) {
	var best Route
	found := false
	for _, r := range p.Routes {
		if r.TransitOnly && r.Prefix.Contains(addr) && (!found || r.Prefix.Bits() > best.Prefix.Bits()) {
			best, found = r, true
		}
	}
	return best, found && !best.Underlay
}

// The tables a node's kernel routes a packet by, after its policy rules
// (docs/agent.md, "Routes and rules").
const (
	TableFabric = "fabric" // a FabricEgress source: the ViaFabric routes, to the underlay device
	TablePods   = "pods"   // a TunnelSources source: every route but NotForPods, into isthmus0
	TableMain   = "main"   // any other source: the routes but TransitOnly, into isthmus0
)

// The devices a packet leaves a node by, or must arrive on.
const (
	DeviceOverlay  = "isthmus0"
	DeviceUnderlay = "underlay"
)

// Direction is one direction of a pair as the node's kernel routes it.
type Direction struct {
	From netip.Addr `json:"from"`
	To   netip.Addr `json:"to"`
	// Table is TableFabric, TablePods or TableMain: the one the node's policy
	// rules pick for From.
	Table string `json:"table"`
	// Route is the route taken; nil when the table has none (the underlay,
	// as the kernel's own routes say).
	Route *Match `json:"route,omitempty"`
	// Device is DeviceOverlay or DeviceUnderlay.
	Device string `json:"device"`
}

// PairExplanation is what a node does with both directions of a pair: a
// packet from Local (an address on or behind the node: a pod, its host) to
// Remote, and the answer from Remote to Local, which strict rp_filter accepts
// only on the device the node routes the request by.
type PairExplanation struct {
	Node    string    `json:"node"`
	Request Direction `json:"request"`
	// Reply is the answer: it must arrive on Request.Device.
	Reply Direction `json:"reply"`
	// Says is one sentence on how the answer comes back to that device.
	Says string `json:"says"`
}

// ExplainPair returns how p's node routes a packet from local to remote, and
// on which device it must hear the answer. It is a pure function; p must not
// be nil.
func ExplainPair(p *NodePlan, local, remote netip.Addr) PairExplanation {
	local, remote = local.Unmap(), remote.Unmap()
	req := p.kernelDirection(local, remote)
	e := PairExplanation{Node: p.Node, Request: req,
		Reply: Direction{From: remote, To: local, Table: req.Table, Route: req.Route, Device: req.Device}}
	switch {
	case req.Table == TableFabric:
		e.Says = fmt.Sprintf("%s leaves by the underlay device, tunnelled there to a gateway of this site (route %s via fabric); the gateway hands the answer to the site's fabric, which delivers it on this node's underlay device, where the node routes %s for %s",
			local, req.Route.Prefix, remote, local)
	case req.Device == DeviceOverlay:
		e.Says = fmt.Sprintf("%s goes into isthmus0 (route %s, table %s); the answer comes back through the tunnel and the datapath hands it to the stack on isthmus0", local, req.Route.Prefix, req.Table)
	case inPrefixes(p.FabricPrefixes, local):
		e.Says = fmt.Sprintf("no overlay route for %s from %s: the underlay; an answer the site's fabric delivers arrives on the underlay device, or the datapath takes it in through isthmus0 only where this node routes its source into the tunnel", remote, local)
	default:
		e.Says = fmt.Sprintf("no overlay route for %s from %s: the kernel's own routes, on the underlay both ways", remote, local)
	}
	return e
}

// kernelDirection is the table, route and device p's node routes a packet
// from src to dst by: the FabricEgress rule first (the ViaFabric routes),
// then the TunnelSources rule (every route but NotForPods), then main (the
// routes but TransitOnly). The rules are IPv4 only: IPv6 goes by main.
func (p *NodePlan) kernelDirection(src, dst netip.Addr) Direction {
	d := Direction{From: src, To: dst, Table: TableMain, Device: DeviceUnderlay}
	pick := func(table string, ok func(Route) bool) bool {
		var best *Route
		for i := range p.Routes {
			r := &p.Routes[i]
			if ok(*r) && r.Prefix.Contains(dst) && (best == nil || r.Prefix.Bits() > best.Prefix.Bits()) {
				best = r
			}
		}
		// An Underlay exception is a throw route: the lookup goes on.
		if best == nil || best.Underlay {
			return false
		}
		d.Table, d.Device = table, DeviceOverlay
		if table == TableFabric {
			d.Device = DeviceUnderlay
		}
		d.Route = &Match{Kind: MatchRoute, Prefix: best.Prefix, Origin: best.Origin, Peer: best.Peer, Via: best.Via,
			Group: slices.Clone(best.Group), Site: best.Site, TransitOnly: best.TransitOnly, ViaFabric: best.ViaFabric, NotForPods: best.NotForPods}
		return true
	}
	// The policy rules are IPv4 only: an IPv6 packet is routed by main.
	if !src.Is4() || !dst.Is4() {
		pick(TableMain, func(r Route) bool { return !r.TransitOnly && !r.Underlay })
		return d
	}
	// The fabric table holds the ViaFabric routes and a throw route for every
	// other route inside one (the agent's fabricRoutes).
	if inPrefixes(p.FabricEgress, src) && pick(TableFabric, func(Route) bool { return true }) {
		if d.Route.ViaFabric {
			return d
		}
		d = Direction{From: src, To: dst, Table: TableMain, Device: DeviceUnderlay}
	}
	if inPrefixes(p.TunnelSources, src) && pick(TablePods, func(r Route) bool { return !r.NotForPods }) {
		return d
	}
	pick(TableMain, func(r Route) bool { return !r.TransitOnly && !r.Underlay })
	return d
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}
