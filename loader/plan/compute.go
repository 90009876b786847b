package plan

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// Compute returns the desired datapath state of the named node.
//
// set must come from objects.Load (Compute relies on its validation: every
// node in exactly one site, canonical CIDRs, valid tunnel addresses, valid
// pools and assignments). Peers are the other nodes of the node's own site and
// every node of each site joined to it by a SitePeering with meshNodes; a node
// of an unmanaged site (manageCniPlugin false) without a tunnel address is no
// peer unless it is a gateway. Routes send each peer's podCIDRs and tunnel
// address to it, and the declared pod blocks of every other unmanaged site
// with returnPath Fabric to a group of that site's nodes. See
// docs/unmanaged-sites.md.
//
// Sites joined by a SiteGatewayPoolAssignment (and not meshed) reach each
// other through gateways (docs/gateways.md): a member routes the prefixes of
// the other sites to a group of its site's gateways; a gateway has the remote
// gateways as peers and routes the other sites' prefixes to a group of them,
// each remote gateway's own prefixes straight to it. A route that holds an
// underlay address (a peer's, this node's, or, on a member, one its gateways
// tunnel to) or overlaps a LocalPrefix is split around it, and the split is
// reported in Corrections; a TransitOnly route (a remote site's nodeCidrs,
// which this node's own traffic reaches on the underlay) stays whole, with an
// Underlay exception for it.
//
// Compute fails when the node is unknown, in no site, or belongs to an
// unmanaged site, has no tunnel address and is no gateway: such a node cannot
// be anyone's peer, so there is nothing useful to install. The result is
// sorted and depends only on the objects, never on their order in files.
func Compute(set *objects.Set, node string) (*NodePlan, error) {
	return compute(set, node, nil)
}

// compute is Compute, reusing what c kept from its previous call (nil: none).
func compute(set *objects.Set, node string, c *Cache) (*NodePlan, error) {
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
		Node:           node,
		Site:           site.Name,
		Underlay:       underlay,
		PodCIDRs:       objects.PodCIDRs(self),
		TunnelMTU:      int(site.Spec.TunnelMTU),
		TunnelOverhead: TunnelOverheadOf(set, site.Name),
		Peers:          []Peer{},
		Routes:         []Route{},
	}
	all := assignments(set)
	isGateway := slices.ContainsFunc(all, func(a assignment) bool { _, ok := a.has(site.Name, node); return ok })
	if a, origin, ok := objects.TunnelAddr(self); ok {
		p.TunnelAddr, p.TunnelAddrOrigin = a, origin
	} else if !site.Spec.ManagesCNIPlugin() && !isGateway {
		return nil, fmt.Errorf("plan node %q: the node has no tunnel address, and as a node of Site %q "+
			"(manageCniPlugin false) it needs one to be a peer: it has no IPv4 podCIDR, so set the annotation %s "+
			"to an IPv4 address outside every pod block and underlay network, e.g. "+
			"kubectl annotate node %s %s=100.64.0.4", node, site.Name, v1alpha1.AnnotationTunnelIPv4, node, v1alpha1.AnnotationTunnelIPv4)
	}
	switch {
	case isGateway && !p.TunnelAddr.IsValid():
		// A gateway forwards without one; only its own host traffic and the
		// health checks of those who route through it need the address.
		p.warnf("gateway Node %q has no tunnel address: it forwards, but peers cannot health-check it and its host traffic cannot use the tunnel", node)
	case len(p.PodCIDRs) == 0 && !p.TunnelAddr.IsValid():
		p.warnf("Node %q has no podCIDR yet: it has no tunnel address, and peers have no route back to its pods", node)
	case len(p.PodCIDRs) == 0 && site.Spec.ManagesCNIPlugin():
		p.warnf("Node %q has no podCIDR yet: peers have no route back to its pods", node)
	case !p.TunnelAddr.IsValid():
		p.warnf("Node %q has no IPv4 podCIDR and no annotation %s: it has no tunnel address", node, v1alpha1.AnnotationTunnelIPv4)
	}
	p.warnStrayPodCIDRs(self.Name, objects.PodCIDRFields(self), site)

	p.LocalPrefixes = localPrefixes(site)
	p.TunnelSources = p.tunnelSources(site)
	if fabricReturn(site) {
		p.FabricPrefixes = declaredPrefixes(site)
	}
	meshed := p.meshedSites(set, site, all)
	encrypted := encryptedMeshes(set, site)
	peers := map[string]*candidate{}
	for i := range set.Nodes {
		n := &set.Nodes[i]
		if s := set.SiteOf(n); n.Name != node && s != nil && (s.Name == site.Name || meshed[s.Name] != "") {
			underlay, _ := objects.InternalIP(n)
			by := encrypted[s.Name]
			peers[n.Name] = &candidate{node: n, underlay: underlay, encrypted: by != "", encryptedBy: by}
		}
	}
	gp := p.addAssignments(set, all, self, site, meshed, peers)
	// A peer has a route or two of its own: one allocation, not a doubling
	// at every power of two of a 5,000-node mesh.
	p.Peers = slices.Grow(p.Peers, len(peers))
	p.Routes = slices.Grow(p.Routes, 2*len(peers))
	for _, name := range slices.Sorted(maps.Keys(peers)) {
		p.addPeer(set, peers[name], c)
	}
	for _, name := range slices.Sorted(maps.Keys(meshed)) {
		p.addGroupRoutes(set.Site(name))
	}
	p.addGatewayRoutes(gp.routes, false)
	p.correctRoutes(gp.endpoints)
	p.splitDirect(gp.direct)
	p.addPeerAddrRoutes(set, site, gp.overlayPeers)
	p.addNodeRoutes(gp.nodeRoutes)
	p.dedupeRoutes()
	if len(p.Routes) > 0 {
		p.Routes = c.aggregate(p.Routes)
	}
	p.addGatewayFabric(gp.fabric)
	p.addFabricEgress(site)
	p.SNAT = p.snatPolicy(self, site)
	p.Masquerade = p.masqueradePolicy(set, site, connectedSites(site.Name, meshed, all))
	return p, nil
}

// fabricReturn reports whether replies to the site's declared pod blocks come
// back through the site's fabric: another CNI owns its pods and its
// returnPath is Fabric.
func fabricReturn(site *v1alpha1.Site) bool {
	return !site.Spec.ManagesCNIPlugin() && site.Spec.ReturnPathOrDefault() == v1alpha1.ReturnPathFabric
}

// declaredBlocks returns the site's podCidrAssignments[].cidrBlocks with the
// field each comes from.
func declaredBlocks(site *v1alpha1.Site) []objects.FieldPrefix {
	var out []objects.FieldPrefix
	for i, a := range site.Spec.PodCIDRAssignments {
		for j, c := range a.CIDRBlocks {
			if pfx, err := netip.ParsePrefix(string(c)); err == nil {
				out = append(out, objects.FieldPrefix{
					Prefix: pfx.Masked(),
					Field:  fmt.Sprintf("spec.podCidrAssignments[%d].cidrBlocks[%d]", i, j),
				})
			}
		}
	}
	return out
}

// declaredPrefixes is declaredBlocks without the fields, sorted and without
// duplicates.
func declaredPrefixes(site *v1alpha1.Site) []netip.Prefix {
	return sortedUnique(blockPrefixes(site))
}

// blockPrefixes is declaredBlocks without the fields, in their order: it
// runs once per peer, where naming each field would cost 5,000 strings.
func blockPrefixes(site *v1alpha1.Site) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range site.Spec.PodCIDRAssignments {
		for _, c := range a.CIDRBlocks {
			if pfx, err := netip.ParsePrefix(string(c)); err == nil {
				out = append(out, pfx.Masked())
			}
		}
	}
	return out
}

// localPrefixes are the prefixes the site's own fabric and CNI keep on its
// nodes: its localCidrs, and its declared pod blocks when another CNI owns
// its pods (routing them into a tunnel is what black-holed kubelet-to-API
// traffic on Azure CNI nodes in seed 000).
func localPrefixes(site *v1alpha1.Site) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range site.Spec.LocalCIDRs {
		if pfx, err := netip.ParsePrefix(string(c)); err == nil {
			out = append(out, pfx.Masked())
		}
	}
	if !site.Spec.ManagesCNIPlugin() {
		out = append(out, declaredPrefixes(site)...)
	}
	return sortedUnique(out)
}

// warnStrayPodCIDRs warns about each podCIDR of node (its fields, parsed
// once by the caller) outside every declared pod block of its site (of the
// same family): overlap checks between sites do not cover it, and on an
// unmanaged site it is usually one the CNI never uses (seed 000's AKS node
// got 10.0.12.0/24 beside the pod subnet 10.0.2.0/23).
func (p *NodePlan) warnStrayPodCIDRs(node string, fields []objects.FieldPrefix, site *v1alpha1.Site) {
	blocks := blockPrefixes(site)
	for _, f := range fields {
		var family []netip.Prefix
		inside := false
		for _, b := range blocks {
			if b.Addr().Is4() != f.Prefix.Addr().Is4() {
				continue
			}
			family = append(family, b)
			inside = inside || (b.Bits() <= f.Prefix.Bits() && b.Contains(f.Prefix.Addr()))
		}
		if len(family) > 0 && !inside {
			p.warnf("Node %q %s %s is outside the pod blocks of Site %q (spec.podCidrAssignments[].cidrBlocks %v)",
				node, f.Field, f.Prefix, site.Name, family)
		}
	}
}

// meshedSites returns the sites meshed with site by a SitePeering with
// meshNodes, each with the name of the first such peering. A peering with
// meshNodes false meshes nothing: its sites need a SiteGatewayPoolAssignment,
// and a warning names each pair that has none.
func (p *NodePlan) meshedSites(set *objects.Set, site *v1alpha1.Site, all []assignment) map[string]string {
	meshed := map[string]string{}
	for _, sp := range set.SitePeerings {
		if sp.Spec.MeshesNodes() && slices.Contains(sp.Spec.Sites, site.Name) {
			for _, s := range sp.Spec.Sites {
				if _, ok := meshed[s]; !ok && s != site.Name {
					meshed[s] = sp.Name
				}
			}
		}
	}
	for _, sp := range set.SitePeerings {
		if sp.Spec.MeshesNodes() || !slices.Contains(sp.Spec.Sites, site.Name) {
			continue
		}
		for _, s := range sp.Spec.Sites {
			joined := slices.ContainsFunc(all, func(a assignment) bool {
				return slices.Contains(a.obj.Spec.Sites, site.Name) && slices.Contains(a.obj.Spec.Sites, s)
			})
			if _, ok := meshed[s]; !ok && s != site.Name && !joined {
				p.warnf("SitePeering %q has meshNodes false, and no SiteGatewayPoolAssignment joins Sites %q and %q: they are not connected", sp.Name, site.Name, s)
			}
		}
	}
	return meshed
}

// encryptedMeshes returns the sites that a meshing SitePeering with
// encryption WireGuard joins to site, each with the first such peering's
// description. One such peering is enough: a pair that any object asks to
// encrypt is encrypted.
func encryptedMeshes(set *objects.Set, site *v1alpha1.Site) map[string]string {
	out := map[string]string{}
	for _, sp := range set.SitePeerings {
		if !sp.Spec.MeshesNodes() || !sp.Spec.Encrypts() || !slices.Contains(sp.Spec.Sites, site.Name) {
			continue
		}
		for _, s := range sp.Spec.Sites {
			if _, ok := out[s]; !ok && s != site.Name {
				out[s] = fmt.Sprintf("SitePeering %q", sp.Name)
			}
		}
	}
	return out
}

// addPeer adds c's node as a peer reached at c.underlay, with routes for its
// podCIDRs and its tunnel address and c.extra among its allowed sources
// (aggregated through cache, which may be nil), or
// skips it with a warning when it belongs to an unmanaged site, has no tunnel
// address (nothing could route back to it) and is no gateway.
func (p *NodePlan) addPeer(set *objects.Set, c *candidate, cache *Cache) {
	peer, underlay := c.node, c.underlay
	site := set.SiteOf(peer)
	tunnel, tunnelOrigin, hasTunnel := objects.TunnelAddr(peer)
	if !hasTunnel && !site.Spec.ManagesCNIPlugin() && !c.gateway {
		p.warnf("peer Node %q of Site %q has no tunnel address (no IPv4 podCIDR, no annotation %s): it is not a peer until it has one",
			peer.Name, site.Name, v1alpha1.AnnotationTunnelIPv4)
		return
	}
	if c.encrypted && !p.encryptable(peer.Name, site.Name, hasTunnel, c.encryptedBy) {
		return
	}
	fields := objects.PodCIDRFields(peer)
	pr := Peer{
		Name:           peer.Name,
		Site:           site.Name,
		Underlay:       underlay,
		TunnelAddr:     tunnel,
		AllowedSources: []netip.Prefix{},
		Encrypted:      c.encrypted,
	}
	if c.encrypted {
		p.Encrypted = true
		pr.WireGuardKey = p.wireGuardKey(peer)
	}
	via := pr.Via()
	for _, f := range fields {
		pr.AllowedSources = append(pr.AllowedSources, f.Prefix)
		p.Routes = append(p.Routes, Route{
			Prefix: f.Prefix,
			Peer:   peer.Name,
			Via:    via,
			Origin: objects.NodeField(peer.Name, f.Field),
		})
	}
	if hasTunnel && !slices.ContainsFunc(fields, func(f objects.FieldPrefix) bool { return f.Prefix.Contains(tunnel) }) {
		pr.AllowedSources = append(pr.AllowedSources, HostPrefix(tunnel))
		p.Routes = append(p.Routes, Route{Prefix: HostPrefix(tunnel), Peer: peer.Name, Via: via, Origin: tunnelOrigin})
	}
	if fabricReturn(site) {
		// Any node of the site may forward a pod of the site from anywhere in
		// its blocks; with returnPath SNAT such sources never arrive.
		pr.AllowedSources = append(pr.AllowedSources, declaredPrefixes(site)...)
	}
	pr.AllowedSources = cache.allowedSources(peer.Name, append(pr.AllowedSources, c.extra...))
	p.warnStrayPodCIDRs(peer.Name, fields, site)
	switch {
	case len(fields) == 0 && !hasTunnel && !c.gateway:
		p.warnf("peer Node %q has no podCIDR yet: no routes to it", peer.Name)
	case len(fields) == 0 && site.Spec.ManagesCNIPlugin() && !c.gateway:
		p.warnf("peer Node %q has no podCIDR yet: only its tunnel address is routed to it", peer.Name)
	}
	p.Peers = append(p.Peers, pr)
}

// addGroupRoutes routes the declared pod blocks of u, another site, to the
// group of u's peers when u is unmanaged with returnPath Fabric: any of them
// hands a packet to u's fabric, which knows which node holds the pod.
func (p *NodePlan) addGroupRoutes(u *v1alpha1.Site) {
	if u == nil || !fabricReturn(u) {
		return
	}
	var group []NextHop
	for _, pr := range p.Peers {
		if pr.Site == u.Name {
			group = append(group, NextHop{Peer: pr.Name, Via: pr.Via()})
		}
	}
	blocks := declaredBlocks(u)
	if len(group) == 0 {
		if len(blocks) > 0 {
			p.warnf("Site %q has no node with a tunnel address to deliver its pod blocks: they are not routed", u.Name)
		}
		return
	}
	for _, b := range blocks {
		p.Routes = append(p.Routes, Route{
			Prefix: b.Prefix,
			Group:  slices.Clone(group),
			Origin: fmt.Sprintf("Site %q %s", u.Name, b.Field),
		})
	}
}

// correctRoutes enforces two invariants. No route sends an underlay address
// (a peer's, this node's own, or one in extra: those its gateways tunnel to)
// into the tunnel: that would loop the tunnel into itself. No route sends a
// LocalPrefix there: those belong to the site's fabric and CNI on this node.
// A route the kernel's main table takes is cut around them (Corrections),
// since that table cannot say "not this longer prefix". A TransitOnly route
// stays whole and gets an Underlay exception for each (see exceptions);
// only a LocalPrefix holding all of it removes it.
func (p *NodePlan) correctRoutes(extra []netip.Addr) {
	endpoints := append([]netip.Addr{p.Underlay}, extra...)
	for _, pr := range p.Peers {
		endpoints = append(endpoints, pr.Underlay)
	}
	// A gateway behind a NAT has no address to be reached at (its WireGuard
	// endpoint is learnt): nothing to cut.
	endpoints = slices.DeleteFunc(endpoints, func(a netip.Addr) bool { return !a.IsValid() })
	slices.SortFunc(endpoints, netip.Addr.Compare)
	endpoints = slices.Compact(endpoints)

	routes := rewriteRoutes(p.Routes)
	for _, r := range p.Routes {
		if r.TransitOnly {
			p.exceptions(routes, r, endpoints)
			continue
		}
		var cuts []Correction
		var holes []netip.Prefix
		// endpoints is sorted: those inside the prefix are one run of it.
		first, _ := slices.BinarySearchFunc(endpoints, r.Prefix.Masked().Addr(), netip.Addr.Compare)
		for _, e := range endpoints[first:] {
			if !r.Prefix.Contains(e) {
				break
			}
			cuts = append(cuts, Correction{Removed: r.Prefix, Endpoint: e, Origin: r.Origin})
			holes = append(holes, HostPrefix(e))
		}
		for _, l := range p.LocalPrefixes {
			if r.Prefix.Overlaps(l) {
				cuts = append(cuts, Correction{Removed: r.Prefix, Local: l, Origin: r.Origin})
				holes = append(holes, l)
			}
		}
		if len(cuts) == 0 {
			routes.keep(r)
			continue
		}
		kept := Subtract(r.Prefix, holes...)
		routes.replace(len(kept))
		for _, c := range cuts {
			c.Kept = slices.Clone(kept)
			if c.Kept == nil {
				c.Kept = []netip.Prefix{}
			}
			p.Corrections = append(p.Corrections, c)
		}
		for _, k := range kept {
			split := r
			split.Prefix = k
			split.Group = slices.Clone(r.Group)
			routes.add(split)
		}
	}
	p.Routes = routes.out
	slices.SortFunc(p.Corrections, func(a, b Correction) int {
		return cmp.Or(comparePrefix(a.Removed, b.Removed), a.Endpoint.Compare(b.Endpoint), comparePrefix(a.Local, b.Local))
	})
}

// exceptions keeps the TransitOnly route r, with an Underlay exception for
// each endpoint and LocalPrefix inside it (endpoints sorted), and removes
// it, reported, when one of them holds all of it. The datapath's lookup is
// longest prefix first, so one longer route per exception does what cutting
// r into pieces did, in two routes where a /20 cut around one address took
// twelve. A later route for the same prefix (a peer's own address) wins
// over the exception (dedupeRoutes).
func (p *NodePlan) exceptions(routes *routeRewrite, r Route, endpoints []netip.Addr) {
	var holes []Route
	first, _ := slices.BinarySearchFunc(endpoints, r.Prefix.Masked().Addr(), netip.Addr.Compare)
	for _, e := range endpoints[first:] {
		if !r.Prefix.Contains(e) {
			break
		}
		if HostPrefix(e) == r.Prefix {
			p.Corrections = append(p.Corrections, Correction{Removed: r.Prefix, Endpoint: e, Kept: []netip.Prefix{}, Origin: r.Origin})
			routes.replace(0)
			return
		}
		holes = append(holes, Route{Prefix: HostPrefix(e), Origin: fmt.Sprintf("tunnel endpoint in %s", r.Origin)})
	}
	for _, l := range p.LocalPrefixes {
		if !r.Prefix.Overlaps(l) {
			continue
		}
		if l.Bits() <= r.Prefix.Bits() {
			p.Corrections = append(p.Corrections, Correction{Removed: r.Prefix, Local: l, Kept: []netip.Prefix{}, Origin: r.Origin})
			routes.replace(0)
			return
		}
		holes = append(holes, Route{Prefix: l, Origin: fmt.Sprintf("LocalPrefix of Site %q in %s", p.Site, r.Origin)})
	}
	if len(holes) == 0 {
		routes.keep(r)
		return
	}
	routes.replace(len(holes))
	routes.add(r)
	for _, h := range holes {
		h.TransitOnly, h.Underlay = true, true
		routes.add(h)
	}
}

// routeRewrite rebuilds a list of routes, each kept or replaced by pieces
// (which may be more), in place for as long as every route is kept: a cut is
// rare, and a copy of a mesh node's 5,000 routes at each step is garbage.
type routeRewrite struct {
	src, out []Route
	copied   bool
}

// rewriteRoutes starts rebuilding routes; the caller visits them in order.
func rewriteRoutes(routes []Route) *routeRewrite {
	return &routeRewrite{src: routes, out: routes[:0]}
}

// keep keeps the route visited as it is. Before the first replace, out is
// src's prefix up to the route visited, so the append writes it onto itself.
func (w *routeRewrite) keep(r Route) { w.out = append(w.out, r) }

// replace marks the route visited as replaced by pieces (about more of them
// than the route); from the first, out is a copy, since pieces outnumber
// what they replace.
func (w *routeRewrite) replace(more int) {
	if !w.copied {
		w.out = append(make([]Route, 0, len(w.src)+more), w.out...)
		w.copied = true
	}
}

// add adds a piece of the route replaced.
func (w *routeRewrite) add(r Route) { w.out = append(w.out, r) }

// dedupeRoutes sorts the routes by prefix and keeps one route per prefix: a
// node's own prefixes (added first) win over a site's pod blocks, since the
// datapath has one entry per prefix, and any route wins over an Underlay
// exception (a peer's own address, routed to that peer, needs none). Only a tie between different next hops
// earns a warning: a prefix both declared and listed in routedCidrs goes to
// the same gateways either way.
func (p *NodePlan) dedupeRoutes() {
	if len(p.Routes) == 0 {
		return // keep the non-nil empty slice: the JSON says "routes": []
	}
	slices.SortStableFunc(p.Routes, func(a, b Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	kept := p.Routes[:0] // in place: a route is written at or before where it was read
	for _, r := range p.Routes {
		if n := len(kept); n > 0 && kept[n-1].Prefix == r.Prefix {
			if kept[n-1].Underlay && !r.Underlay {
				kept[n-1] = r // a route for the prefix itself needs no exception
				continue
			}
			if r.Underlay || sameTarget(kept[n-1], r) {
				continue
			}
			p.warnf("route %s from %s is also claimed by %s: the first is kept", r.Prefix, kept[n-1].Origin, r.Origin)
			continue
		}
		kept = append(kept, r)
	}
	p.Routes = kept
}

// sameTarget reports whether two routes go to the same peer or group.
func sameTarget(a, b Route) bool {
	return a.Peer == b.Peer && a.Via == b.Via && slices.Equal(a.Group, b.Group) && a.Underlay == b.Underlay
}

// snatPolicy returns the return-path SNAT policy of self: translate to the
// tunnel address every IPv4 source that no peer routes back to this node.
func (p *NodePlan) snatPolicy(self *corev1.Node, site *v1alpha1.Site) SNATPolicy {
	if !p.TunnelAddr.IsValid() {
		return SNATPolicy{Reason: fmt.Sprintf("Node %q has no tunnel address to translate to (no IPv4 podCIDR, no annotation %s)", self.Name, v1alpha1.AnnotationTunnelIPv4)}
	}
	s := SNATPolicy{Addr: p.TunnelAddr}
	inPods := false
	for _, f := range objects.PodCIDRFields(self) {
		if f.Prefix.Addr().Is4() {
			s.Exempt = append(s.Exempt, ExemptSource{Prefix: f.Prefix, Origin: objects.NodeField(self.Name, f.Field)})
			inPods = inPods || f.Prefix.Contains(p.TunnelAddr)
		}
	}
	if !inPods {
		s.Exempt = append(s.Exempt, ExemptSource{Prefix: HostPrefix(p.TunnelAddr), Origin: p.TunnelAddrOrigin})
	}
	if fabricReturn(site) {
		for _, b := range declaredBlocks(site) {
			if b.Prefix.Addr().Is4() {
				s.Exempt = append(s.Exempt, ExemptSource{Prefix: b.Prefix, Origin: fmt.Sprintf("Site %q %s", site.Name, b.Field)})
			}
		}
	}
	slices.SortStableFunc(s.Exempt, func(a, b ExemptSource) int { return comparePrefix(a.Prefix, b.Prefix) })
	s.Exempt = slices.CompactFunc(s.Exempt, func(a, b ExemptSource) bool { return a.Prefix == b.Prefix })
	return s
}

func (p *NodePlan) warnf(format string, args ...any) {
	p.Warnings = append(p.Warnings, fmt.Sprintf(format, args...))
}
