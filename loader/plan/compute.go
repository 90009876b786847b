package plan

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// Compute returns the desired datapath state of the named node.
//
// set must come from objects.Load (Compute relies on its validation: every
// node in exactly one site, canonical CIDRs). Peers are the other nodes of
// the node's own site and every node of each site joined to it by a
// SitePeering with meshNodes; routes send each peer's podCIDRs to it. A route
// that holds a peer's or this node's underlay address is split around that
// address and the split is reported in Corrections. The result is sorted and
// depends only on the objects, never on their order in files.
func Compute(set *objects.Set, node string) (*NodePlan, error) {
	self := set.Node(node)
	if self == nil {
		return nil, fmt.Errorf("plan node %q: no Node of that name in the objects", node)
	}
	site := set.SiteOf(self)
	underlay, ok := objects.InternalIP(self)
	if site == nil || !ok {
		return nil, fmt.Errorf("plan node %q: node has no InternalIP in any Site's nodeCidrs", node)
	}
	p := &NodePlan{
		Node:      node,
		Site:      site.Name,
		Underlay:  underlay,
		PodCIDRs:  objects.PodCIDRs(self),
		TunnelMTU: int(site.Spec.TunnelMTU),
		Peers:     []Peer{},
		Routes:    []Route{},
	}
	p.TunnelAddr = tunnelAddr(p.PodCIDRs)
	if len(p.PodCIDRs) == 0 {
		p.warnf("Node %q has no podCIDR yet: it has no tunnel address, and peers have no route back to its pods", node)
	}

	for _, peer := range peerNodes(set, self, site, p) {
		p.addPeer(set, peer)
	}
	p.correctRoutes()
	slices.SortFunc(p.Routes, func(a, b Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	return p, nil
}

// tunnelAddr is the first host address of the first IPv4 prefix, or the zero
// Addr when there is none (or the prefix is a single address).
func tunnelAddr(pods []netip.Prefix) netip.Addr {
	for _, pfx := range pods {
		if a := pfx.Addr().Next(); pfx.Addr().Is4() && pfx.Bits() < 32 && pfx.Contains(a) {
			return a
		}
	}
	return netip.Addr{}
}

// peerNodes returns the nodes self tunnels to, sorted by name: the rest of
// its site and the nodes of every site meshed with it.
func peerNodes(set *objects.Set, self *corev1.Node, site *v1alpha1.Site, p *NodePlan) []*corev1.Node {
	sites := map[string]bool{site.Name: true}
	for _, sp := range set.SitePeerings {
		if !slices.Contains(sp.Spec.Sites, site.Name) {
			continue
		}
		if !sp.Spec.MeshesNodes() {
			p.warnf("SitePeering %q has meshNodes false: gateway mode is not supported yet, so its sites give no peers", sp.Name)
			continue
		}
		for _, s := range sp.Spec.Sites {
			sites[s] = true
		}
	}
	var peers []*corev1.Node
	for i := range set.Nodes {
		n := &set.Nodes[i]
		if n.Name == self.Name {
			continue
		}
		if s := set.SiteOf(n); s != nil && sites[s.Name] {
			peers = append(peers, n)
		}
	}
	slices.SortFunc(peers, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	return peers
}

// addPeer adds peer and routes for each of its podCIDRs.
func (p *NodePlan) addPeer(set *objects.Set, peer *corev1.Node) {
	underlay, _ := objects.InternalIP(peer)
	fields := objects.PodCIDRFields(peer)
	pr := Peer{
		Name:           peer.Name,
		Site:           set.SiteOf(peer).Name,
		Underlay:       underlay,
		AllowedSources: []netip.Prefix{},
	}
	for _, f := range fields {
		pr.AllowedSources = append(pr.AllowedSources, f.Prefix)
		p.Routes = append(p.Routes, Route{
			Prefix: f.Prefix,
			Peer:   peer.Name,
			Via:    underlay,
			Origin: fmt.Sprintf("Node %q %s", peer.Name, f.Field),
		})
	}
	sortPrefixes(pr.AllowedSources)
	if len(fields) == 0 {
		p.warnf("peer Node %q has no podCIDR yet: no routes to it", peer.Name)
	}
	p.Peers = append(p.Peers, pr)
}

// correctRoutes enforces the invariant that no route holds an underlay
// address (a peer's or this node's own): sending a tunnel endpoint into the
// tunnel would loop the tunnel into itself.
func (p *NodePlan) correctRoutes() {
	endpoints := []netip.Addr{p.Underlay}
	for _, pr := range p.Peers {
		endpoints = append(endpoints, pr.Underlay)
	}
	slices.SortFunc(endpoints, netip.Addr.Compare)
	endpoints = slices.Compact(endpoints)

	var routes []Route
	for _, r := range p.Routes {
		var inside []netip.Addr
		var holes []netip.Prefix
		for _, e := range endpoints {
			if r.Prefix.Contains(e) {
				inside = append(inside, e)
				holes = append(holes, HostPrefix(e))
			}
		}
		if len(inside) == 0 {
			routes = append(routes, r)
			continue
		}
		kept := Subtract(r.Prefix, holes...)
		for _, e := range inside {
			p.Corrections = append(p.Corrections, Correction{Removed: r.Prefix, Endpoint: e, Kept: slices.Clone(kept), Origin: r.Origin})
		}
		for _, k := range kept {
			split := r
			split.Prefix = k
			routes = append(routes, split)
		}
	}
	p.Routes = routes
	slices.SortFunc(p.Corrections, func(a, b Correction) int {
		return cmp.Or(comparePrefix(a.Removed, b.Removed), a.Endpoint.Compare(b.Endpoint))
	})
}

func (p *NodePlan) warnf(format string, args ...any) {
	p.Warnings = append(p.Warnings, fmt.Sprintf(format, args...))
}
