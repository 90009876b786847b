package plan

import "slices"

// Clone returns a deep copy of p; nil for nil.
func (p *NodePlan) Clone() *NodePlan {
	if p == nil {
		return nil
	}
	c := *p
	c.PodCIDRs = slices.Clone(p.PodCIDRs)
	c.Peers = slices.Clone(p.Peers)
	for i := range c.Peers {
		c.Peers[i].AllowedSources = slices.Clone(p.Peers[i].AllowedSources)
	}
	c.Routes = slices.Clone(p.Routes)
	c.Corrections = slices.Clone(p.Corrections)
	for i := range c.Corrections {
		c.Corrections[i].Kept = slices.Clone(p.Corrections[i].Kept)
	}
	c.Warnings = slices.Clone(p.Warnings)
	return &c
}

// Equal reports whether p and q describe the same state. Nil and empty
// slices are equal; two nil plans are equal, a nil and a non-nil one are not.
func (p *NodePlan) Equal(q *NodePlan) bool {
	if p == nil || q == nil {
		return p == q
	}
	return p.Node == q.Node && p.Site == q.Site && p.Underlay == q.Underlay &&
		slices.Equal(p.PodCIDRs, q.PodCIDRs) && p.TunnelAddr == q.TunnelAddr &&
		p.TunnelMTU == q.TunnelMTU &&
		slices.EqualFunc(p.Peers, q.Peers, Peer.Equal) &&
		slices.Equal(p.Routes, q.Routes) &&
		slices.EqualFunc(p.Corrections, q.Corrections, Correction.Equal) &&
		slices.Equal(p.Warnings, q.Warnings)
}

// Equal reports whether two peers are the same.
func (a Peer) Equal(b Peer) bool {
	return a.Name == b.Name && a.Site == b.Site && a.Underlay == b.Underlay &&
		slices.Equal(a.AllowedSources, b.AllowedSources)
}

// Equal reports whether two corrections are the same.
func (a Correction) Equal(b Correction) bool {
	return a.Removed == b.Removed && a.Endpoint == b.Endpoint && a.Origin == b.Origin &&
		slices.Equal(a.Kept, b.Kept)
}
