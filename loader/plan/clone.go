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
	c.Routes = cloneRoutes(p.Routes)
	c.SNAT.Exempt = slices.Clone(p.SNAT.Exempt)
	c.Masquerade.Exempt = slices.Clone(p.Masquerade.Exempt)
	c.GatewayPools = slices.Clone(p.GatewayPools)
	c.FabricPrefixes = slices.Clone(p.FabricPrefixes)
	c.LocalPrefixes = slices.Clone(p.LocalPrefixes)
	c.TunnelSources = slices.Clone(p.TunnelSources)
	c.FabricEgress = slices.Clone(p.FabricEgress)
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
		p.TunnelAddrOrigin == q.TunnelAddrOrigin && p.TunnelMTU == q.TunnelMTU &&
		p.Gateway == q.Gateway && slices.Equal(p.GatewayPools, q.GatewayPools) &&
		slices.EqualFunc(p.Peers, q.Peers, Peer.Equal) &&
		slices.EqualFunc(p.Routes, q.Routes, Route.Equal) &&
		p.SNAT.Addr == q.SNAT.Addr && p.SNAT.Reason == q.SNAT.Reason &&
		slices.Equal(p.SNAT.Exempt, q.SNAT.Exempt) &&
		p.Masquerade.Addr == q.Masquerade.Addr && p.Masquerade.Reason == q.Masquerade.Reason &&
		slices.Equal(p.Masquerade.Exempt, q.Masquerade.Exempt) &&
		slices.Equal(p.FabricPrefixes, q.FabricPrefixes) &&
		slices.Equal(p.LocalPrefixes, q.LocalPrefixes) &&
		slices.Equal(p.TunnelSources, q.TunnelSources) &&
		slices.Equal(p.FabricEgress, q.FabricEgress) &&
		slices.EqualFunc(p.Corrections, q.Corrections, Correction.Equal) &&
		slices.Equal(p.Warnings, q.Warnings)
}

// Equal reports whether two peers are the same.
func (a Peer) Equal(b Peer) bool {
	return a.Name == b.Name && a.Site == b.Site && a.Underlay == b.Underlay &&
		a.TunnelAddr == b.TunnelAddr && slices.Equal(a.AllowedSources, b.AllowedSources)
}

// Equal reports whether two routes are the same.
func (a Route) Equal(b Route) bool {
	return a.Prefix == b.Prefix && a.Peer == b.Peer && a.Via == b.Via && a.Origin == b.Origin &&
		a.TransitOnly == b.TransitOnly && a.Underlay == b.Underlay && a.ViaFabric == b.ViaFabric && a.NotForPods == b.NotForPods &&
		a.Site == b.Site && a.UnderlaySource == b.UnderlaySource && slices.Equal(a.Group, b.Group)
}

// Equal reports whether two corrections are the same.
func (a Correction) Equal(b Correction) bool {
	return a.Removed == b.Removed && a.Endpoint == b.Endpoint && a.Local == b.Local && a.Origin == b.Origin &&
		slices.Equal(a.Kept, b.Kept)
}
