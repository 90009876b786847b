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
	// TransitOnly is set on a route only this node's pods and forwarded
	// traffic take (Route.TransitOnly).
	TransitOnly bool `json:"transitOnly,omitempty"`
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
// translated by SNAT (and which exempt entry keeps it). It is a pure function; p
// must not be nil. An IPv4-mapped IPv6 address is unmapped first.
func Explain(p *NodePlan, addr netip.Addr) Explanation {
	addr = addr.Unmap()
	e := Explanation{Node: p.Node, Addr: addr}
	e.Matches = p.matches(addr)
	if len(e.Matches) > 0 {
		m := e.Matches[0]
		e.Match = &m
	}
	e.Verdict = verdict(e.Match)
	if r, ok := p.transitOnlyRoute(addr); ok && e.Match != nil && e.Match.Kind != MatchRoute {
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
		add(Match{Kind: MatchRoute, Prefix: r.Prefix, Origin: r.Origin, Peer: r.Peer, Via: r.Via, Group: slices.Clone(r.Group), Site: r.Site, TransitOnly: r.TransitOnly})
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

// explainSNAT says whether a packet from addr entering the tunnel is translated.
func (p *NodePlan) explainSNAT(addr netip.Addr) SNATExplanation {
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
