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

// assignment is a SiteGatewayPoolAssignment with its gateways found.
type assignment struct {
	obj   *v1alpha1.SiteGatewayPoolAssignment
	pools []*v1alpha1.GatewayPool
	// gateways are the gateways of each of its sites, sorted by name: the
	// site's nodes selected by one of its pools.
	gateways map[string][]gateway
}

// gateway is a gateway node of one assignment.
type gateway struct {
	node *corev1.Node
	// addr is where the gateways of other sites tunnel to: the InternalIP when
	// an Internal pool of the assignment selects the node (it says the sites
	// share a routed underlay), else the ExternalIP.
	addr netip.Addr
	// pools are the assignment's pools that select the node, sorted.
	pools []string
}

// assignments returns every SiteGatewayPoolAssignment of set with its
// gateways, in name order.
func assignments(set *objects.Set) []assignment {
	var out []assignment
	for i := range set.SiteGatewayPoolAssignments {
		obj := &set.SiteGatewayPoolAssignments[i]
		a := assignment{obj: obj, gateways: map[string][]gateway{}}
		for _, name := range obj.Spec.GatewayPools {
			if pool := set.GatewayPool(name); pool != nil && !slices.Contains(a.pools, pool) {
				a.pools = append(a.pools, pool)
			}
		}
		// The gateways are the nodes of a's sites its pools select: walk the
		// pools' selections (a few nodes each), not every node of every site.
		candidates := map[*corev1.Node]bool{}
		for _, pool := range a.pools {
			for _, n := range set.GatewaysOf(pool) {
				if st := set.SiteOf(n); st != nil && slices.Contains(obj.Spec.Sites, st.Name) {
					candidates[n] = true
				}
			}
		}
		for _, site := range obj.Spec.Sites {
			for _, n := range set.NodesOf(site) {
				if !candidates[n] {
					continue
				}
				if g, ok := a.gatewayOf(set, n); ok {
					a.gateways[site] = append(a.gateways[site], g)
				}
			}
		}
		out = append(out, a)
	}
	return out
}

// gatewayOf reports whether one of a's pools selects n, and how n is reached.
func (a *assignment) gatewayOf(set *objects.Set, n *corev1.Node) (gateway, bool) {
	g := gateway{node: n}
	internal := false
	selecting := set.PoolsSelecting(n)
	for _, pool := range a.pools {
		if slices.Contains(selecting, pool.Name) {
			g.pools = append(g.pools, pool.Name)
			internal = internal || pool.Spec.Type != v1alpha1.GatewayPoolExternal
		}
	}
	if len(g.pools) == 0 {
		return g, false
	}
	slices.Sort(g.pools)
	if internal {
		g.addr, _ = objects.InternalIP(n)
	} else {
		g.addr, _ = objects.ExternalIP(n)
	}
	return g, true
}

// has reports whether node is a gateway of site in a, and returns it.
func (a *assignment) has(site, node string) (gateway, bool) {
	for _, g := range a.gateways[site] {
		if g.node.Name == node {
			return g, true
		}
	}
	return gateway{}, false
}

// unreachable reports whether site has gateways in a and none of them has an
// address the other sites can reach: gateways behind a NAT, without an
// ExternalIP (allowed where every assignment of their pool is encrypted).
func (a *assignment) unreachable(site string) bool {
	gws := a.gateways[site]
	return len(gws) > 0 && !slices.ContainsFunc(gws, func(g gateway) bool { return g.addr.IsValid() })
}

// relays returns the gateways that carry traffic between sites s and t of a
// when neither can reach the other (both unreachable: two sites behind NATs,
// neither with an inbound path): the gateways with an address of the first
// other site of a, in spec.sites order, that has any. Both sides compute the
// same, so a flow and its answer take the same site's gateways. Nil when no
// site of a has a reachable gateway.
func (a *assignment) relays(s, t string) []gateway {
	if !a.unreachable(s) || !a.unreachable(t) {
		return nil
	}
	for _, r := range a.obj.Spec.Sites {
		if r == s || r == t {
			continue
		}
		var out []gateway
		for _, g := range a.gateways[r] {
			if g.addr.IsValid() {
				out = append(out, g)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// sitePrefix is one prefix of a site, as an assignment routes it.
type sitePrefix struct {
	prefix netip.Prefix
	origin string
	// node is the node the prefix belongs to (its podCIDR or tunnel address),
	// empty for a prefix of the site.
	node string
	// fabric is true for the prefixes only the site's fabric delivers (pools'
	// routedCidrs and the site's nodeCidrs): a gateway hands them to it.
	fabric bool
	// nodeCIDR is true for the site's nodeCidrs: routed TransitOnly when the
	// underlay reaches the nodes (see addAssignments).
	nodeCIDR bool
}

// prefixesOf returns the prefixes of site t in a (docs/gateways.md, "Prefixes
// of a site T"), one entry per prefix, the first origin kept: the podCIDRs
// and tunnel addresses of t's nodes, t's declared pod blocks when its CNI is
// unmanaged with returnPath Fabric, the routedCidrs of a's pools that have
// gateways in t, and t's nodeCidrs when a routes them.
func (a *assignment) prefixesOf(set *objects.Set, t *v1alpha1.Site) []sitePrefix {
	nodes := set.NodesOf(t.Name)
	out := make([]sitePrefix, 0, 2*len(nodes))
	// A site's hundreds of prefixes: a scan of out for each was quadratic.
	seen := make(map[netip.Prefix]bool, 2*len(nodes))
	add := func(sp sitePrefix) {
		if !seen[sp.prefix] {
			seen[sp.prefix] = true
			out = append(out, sp)
		}
	}
	for _, n := range nodes {
		fields := objects.PodCIDRFields(n)
		for _, f := range fields {
			add(sitePrefix{prefix: f.Prefix, origin: objects.NodeField(n.Name, f.Field), node: n.Name})
		}
		if tunnel, origin, ok := objects.TunnelAddr(n); ok && !slices.ContainsFunc(fields, func(f objects.FieldPrefix) bool { return f.Prefix.Contains(tunnel) }) {
			add(sitePrefix{prefix: HostPrefix(tunnel), origin: origin, node: n.Name})
		}
	}
	if fabricReturn(t) {
		for _, b := range declaredBlocks(t) {
			add(sitePrefix{prefix: b.Prefix, origin: fmt.Sprintf("Site %q %s", t.Name, b.Field)})
		}
	}
	for _, pool := range a.pools {
		if !slices.ContainsFunc(a.gateways[t.Name], func(g gateway) bool { return slices.Contains(g.pools, pool.Name) }) {
			continue
		}
		for i, c := range pool.Spec.RoutedCIDRs {
			if pfx, err := netip.ParsePrefix(string(c)); err == nil {
				add(sitePrefix{prefix: pfx.Masked(), origin: fmt.Sprintf("GatewayPool %q spec.routedCidrs[%d]", pool.Name, i), fabric: true})
			}
		}
	}
	if a.obj.Spec.RoutesNodeCIDRs() {
		for i, c := range t.Spec.NodeCIDRs {
			if pfx, err := netip.ParsePrefix(string(c)); err == nil {
				add(sitePrefix{prefix: pfx.Masked(), origin: fmt.Sprintf("Site %q spec.nodeCidrs[%d]", t.Name, i), fabric: true, nodeCIDR: true})
			}
		}
	}
	return out
}

// sources returns the prefixes of sps as inner sources a node accepts, cut
// around its local prefixes: a remote site never legitimately sends from an
// address this node's own site keeps (a pool spanning both sites may list it
// in routedCidrs, as seed 000's does).
func (p *NodePlan) sources(sps []sitePrefix) []netip.Prefix {
	var out []netip.Prefix
	for _, sp := range sps {
		out = append(out, Subtract(sp.prefix, p.LocalPrefixes...)...)
	}
	return sortedUnique(out)
}

// candidate is a peer before addPeer: where it is reached and what it may
// send besides its own sources.
type candidate struct {
	node     *corev1.Node
	underlay netip.Addr
	extra    []netip.Prefix
	// gateway keeps the peer even without a tunnel address: it forwards for
	// its site, and only health checks need the address.
	gateway bool
	// encrypted: a SitePeering or SiteGatewayPoolAssignment joining this
	// node's site and the peer's asks for WireGuard between them (encryptedBy
	// names it).
	encrypted   bool
	encryptedBy string
}

// groupRoute is a route to the gateways of a site, its members resolved to
// peers once every peer is known.
type groupRoute struct {
	sp sitePrefix
	// site is the remote site sp belongs to: members are checked for their
	// reach to it.
	site    string
	members []string
	// transitOnly routes sp for forwarded traffic only (Route.TransitOnly).
	transitOnly bool
	// underlaySource gives the node's own traffic to sp its InternalIP as
	// source (Route.UnderlaySource).
	underlaySource bool
}

// nodeAddrs returns the InternalIPs of site t's nodes, as host prefixes.
func nodeAddrs(set *objects.Set, t string) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range set.NodesOf(t) {
		if ip, ok := objects.InternalIP(n); ok {
			out = append(out, HostPrefix(ip))
		}
	}
	return out
}

// gatewayPlan is what the assignments add to a node's plan.
type gatewayPlan struct {
	routes []groupRoute
	// endpoints are the tunnel endpoints the node's gateways tunnel to, for a
	// member: its routes must not hold them either, since the gateway never
	// carries traffic for its own tunnel endpoints (that route is cut there),
	// so such a route on the member would be a black hole.
	endpoints []netip.Addr
	// nodeRoutes send the InternalIPs of the nodes of the sites reached
	// through gateways (remote gateways' endpoints included) to the gateways
	// that carry the rest of their site: see addNodeRoutes.
	nodeRoutes []groupRoute
	// fabric are the prefixes the node, a gateway, hands to its site's fabric.
	fabric []netip.Prefix
	// overlayPeers are, on a gateway, the remote gateways of sites whose
	// nodes the underlay does not reach, and the nodes of its own site: it
	// routes their InternalIPs TransitOnly to them even without
	// TunnelSources (addPeerAddrRoutes), since host traffic between the
	// sites' nodes comes through it. It reaches the remote gateways'
	// InternalIPs on the underlay (cut out as endpoints), as they reach its
	// own.
	overlayPeers []string
	// direct are addresses this node's own traffic reaches on the underlay:
	// the InternalIPs of the nodes of the sites it reaches through gateways,
	// and their nodeCidrs where it routes them (see splitDirect).
	direct []netip.Prefix
}

// splitDirect cuts the addresses in direct out of the group routes the
// kernel's main table takes, after correctRoutes, and routes each of them
// TransitOnly to the same group: the kernel sends this node's own traffic to
// them on the underlay, the datapath forwards others' traffic through the
// tunnel. A TransitOnly group route (a remote site's nodeCidrs, where the
// direct addresses usually are) does that for all of them already, known
// nodes or not, and is left whole. The split is by design, not a correction
// to report.
func (p *NodePlan) splitDirect(direct []netip.Prefix) {
	if len(direct) == 0 {
		return
	}
	direct = sortedUnique(slices.Clone(direct))
	routes := rewriteRoutes(p.Routes)
	for _, r := range p.Routes {
		var inside []netip.Prefix
		if r.Group != nil && !r.TransitOnly {
			// direct is sorted: those inside the route are one run of it.
			first, _ := slices.BinarySearchFunc(direct, r.Prefix.Masked(), comparePrefix)
			for _, d := range direct[first:] {
				if !r.Prefix.Contains(d.Addr()) {
					break
				}
				if d.Bits() >= r.Prefix.Bits() {
					inside = append(inside, d)
				}
			}
		}
		if len(inside) == 0 {
			routes.keep(r)
			continue
		}
		// Each direct address adds at most a transit route and the pieces
		// around it.
		routes.replace(2 * len(direct))
		for _, k := range Subtract(r.Prefix, inside...) {
			split := r
			split.Prefix = k
			split.Group = slices.Clone(r.Group)
			routes.add(split)
		}
		for _, d := range inside {
			transit := r
			transit.Prefix, transit.TransitOnly = d, true
			transit.Group = slices.Clone(r.Group)
			routes.add(transit)
		}
	}
	p.Routes = routes.out
}

// addAssignments applies the roles of docs/gateways.md for every assignment
// naming site: it marks the node as a gateway, adds remote gateways to peers
// and extra allowed sources to the peers that forward for remote sites, and
// returns the group routes, the extra endpoints and the fabric prefixes.
// meshed names, for each site meshed with site, the SitePeering that does it:
// a mesh wins over an assignment for the same pair of sites.
func (p *NodePlan) addAssignments(set *objects.Set, all []assignment, self *corev1.Node, site *v1alpha1.Site,
	meshed map[string]string, peers map[string]*candidate) gatewayPlan {
	var gp gatewayPlan
	// overlay holds the sites joined to site by an assignment that says
	// the underlay does not reach their nodes.
	overlay := map[string]bool{}
	for i := range all {
		if spec := &all[i].obj.Spec; !spec.ReachesNodesOnUnderlay() && slices.Contains(spec.Sites, site.Name) {
			for _, t := range spec.Sites {
				overlay[t] = true
			}
		}
	}
	for i := range all {
		a := &all[i]
		if !slices.Contains(a.obj.Spec.Sites, site.Name) {
			continue
		}
		me, isGateway := a.has(site.Name, self.Name)
		if isGateway {
			p.Gateway = true
			p.GatewayPools = append(p.GatewayPools, me.pools...)
			for _, sp := range a.prefixesOf(set, site) {
				if sp.fabric {
					gp.fabric = append(gp.fabric, sp.prefix)
				}
			}
		}
		for _, tName := range a.obj.Spec.Sites {
			t := set.Site(tName)
			if tName == site.Name || t == nil {
				continue
			}
			if sp, ok := meshed[tName]; ok {
				p.warnf("Sites %q and %q are joined both by SitePeering %q (meshNodes) and by SiteGatewayPoolAssignment %q: they mesh, and the assignment is not used between them",
					site.Name, tName, sp, a.obj.Name)
				continue
			}
			prefixes := a.prefixesOf(set, t)
			// Where the underlay reaches t's nodes, t's nodeCidrs are routed
			// TransitOnly, whole: this node's own traffic to any of their
			// addresses stays on the underlay, a node that joined t before
			// its Node object arrived included, and what it forwards takes
			// the gateways. Where it does not (any assignment joining the
			// two sites says so), they are routed for all traffic, here and
			// at t's nodes for this site's nodeCidrs, so both directions
			// take the tunnel (see overlayPeers), from the nodes' InternalIPs
			// (underlaySource).
			underlay := !overlay[tName]
			// t's nodes answer pods from their InternalIPs through the
			// gateways (addPeerAddrRoutes, addNodeRoutes).
			sources := sortedUnique(append(p.sources(prefixes), nodeAddrs(set, tName)...))
			// Paths are symmetric: this node's own traffic reaches the
			// InternalIPs of t's nodes on the underlay, as theirs reaches it,
			// whatever the role of either. Through the tunnel one side would
			// arrive tunnelled and the other handed over on the fabric by a
			// gateway (a gateway's endpoint is cut from its members' routes;
			// the fabric leg fails strict rp_filter), so node to node would
			// work one way or not at all. What this node forwards (from a
			// tunnel or a pod) still takes the gateways: see splitDirect.
			if gp.direct == nil {
				// Sized once for every remote node (and, below, two
				// prefixes each): a hub's 10,000 entries grew by doubling.
				gp.direct = make([]netip.Prefix, 0, len(set.Nodes))
				gp.routes = make([]groupRoute, 0, 2*len(set.Nodes))
			}
			if underlay {
				gp.direct = append(gp.direct, nodeAddrs(set, tName)...)
				for _, sp := range prefixes {
					if sp.nodeCIDR {
						gp.direct = append(gp.direct, sp.prefix)
					}
				}
			}
			if isGateway {
				// Remote gateways are peers, reached at their pool's address;
				// each one's own prefixes go straight to it (its health probe
				// must test that gateway), the rest of the site to the group.
				// Where neither site's gateways can be reached (both behind
				// NATs), the gateways of a reachable third site of the
				// assignment relay: all of t goes to them, and they forward
				// (transit keeps the sources, both legs encrypted).
				remote := a.gateways[tName]
				relayed := a.unreachable(site.Name) && a.unreachable(tName)
				if relayed {
					remote = a.relays(site.Name, tName)
					if len(remote) == 0 {
						p.warnf("Sites %q and %q of SiteGatewayPoolAssignment %q are both behind NATs (their gateways have no ExternalIP), and no other site of it has a gateway with an address to relay between them: they do not reach each other",
							site.Name, tName, a.obj.Name)
						continue
					}
				}
				// A site whose gateways are partly behind the NAT: those
				// without an address cannot reach a site whose gateways have
				// none either (relays are for two sites wholly behind NATs).
				if !relayed && !me.addr.IsValid() && a.unreachable(tName) {
					p.warnf("gateway Node %q has no ExternalIP while other gateways of site %q do, and site %q's gateways have none: %q cannot reach them; put a site's gateways all behind its NAT or all at public addresses",
						self.Name, site.Name, tName, self.Name)
				}
				var members []string
				for _, g := range remote {
					c := peers[g.node.Name]
					if c == nil {
						c = &candidate{node: g.node, underlay: g.addr}
						peers[g.node.Name] = c
					} else if c.underlay != g.addr {
						p.warnf("gateway Node %q is reached at %s by SiteGatewayPoolAssignment %q but at %s by another: %s is used",
							g.node.Name, g.addr, a.obj.Name, c.underlay, c.underlay)
					}
					c.gateway = true
					c.extra = append(c.extra, sources...)
					if a.obj.Spec.Encrypts() && !c.encrypted {
						c.encrypted, c.encryptedBy = true, fmt.Sprintf("SiteGatewayPoolAssignment %q", a.obj.Name)
					}
					members = append(members, g.node.Name)
				}
				for _, sp := range prefixes {
					if !slices.Contains(members, sp.node) {
						gp.routes = append(gp.routes, groupRoute{sp: sp, site: tName, members: members, transitOnly: sp.nodeCIDR && underlay, underlaySource: sp.nodeCIDR && !underlay})
					}
				}
				if underlay {
					gp.nodeRoutes = append(gp.nodeRoutes, nodeRoutes(set, tName, members)...)
				} else {
					if relayed {
						// The relays are peers for their own site, which
						// adds their addresses; t's gateways are none.
						remote = nil
					}
					for _, g := range remote {
						gp.overlayPeers = append(gp.overlayPeers, g.node.Name)
						if ip, ok := objects.InternalIP(g.node); ok {
							gp.endpoints = append(gp.endpoints, ip)
						}
					}
					// What t's nodes send to this site's node addresses
					// arrives here tunnelled and goes on tunnelled, not
					// handed to the fabric: the receiver routes the
					// sender's InternalIP back into the tunnel.
					for _, n := range set.NodesOf(site.Name) {
						if n.Name != self.Name {
							gp.overlayPeers = append(gp.overlayPeers, n.Name)
						}
					}
				}
				continue
			}
			// A member sends the remote site's prefixes to its own site's
			// gateways (peers of its site, reached at their InternalIP) and
			// accepts those sources back from them.
			var members []string
			for _, g := range a.gateways[site.Name] {
				if c := peers[g.node.Name]; c != nil {
					c.gateway = true
					c.extra = append(c.extra, sources...)
					members = append(members, g.node.Name)
				}
			}
			if underlay {
				// Where t's gateways' addresses are reached on the
				// underlay, this site's gateways cut them out of their
				// own routes and would not carry them.
				for _, g := range a.gateways[tName] {
					gp.endpoints = append(gp.endpoints, g.addr)
				}
				gp.nodeRoutes = append(gp.nodeRoutes, nodeRoutes(set, tName, members)...)
			}
			for _, sp := range prefixes {
				gp.routes = append(gp.routes, groupRoute{sp: sp, site: tName, members: members, transitOnly: sp.nodeCIDR && underlay, underlaySource: sp.nodeCIDR && !underlay})
			}
		}
	}
	p.GatewayPools = slices.Compact(slices.Sorted(slices.Values(p.GatewayPools)))
	return gp
}

// nodeRoutes returns a route for the IPv4 InternalIP of each node of site t
// to members; a node that is one of members goes to itself alone (a remote
// gateway reached at its ExternalIP: another gateway of its site would hand
// it a pod's packet that it does not accept from a node of its own site).
func nodeRoutes(set *objects.Set, t string, members []string) []groupRoute {
	var out []groupRoute
	for _, n := range set.NodesOf(t) {
		ip, ok := objects.InternalIP(n)
		if !ok || !ip.Is4() {
			continue // the datapath is IPv4
		}
		to := members
		if slices.Contains(members, n.Name) {
			to = []string{n.Name}
		}
		out = append(out, groupRoute{
			sp:   sitePrefix{prefix: HostPrefix(ip), origin: fmt.Sprintf("Node %q status.addresses[InternalIP]", n.Name), node: n.Name},
			site: t, members: to,
		})
	}
	return out
}

// addNodeRoutes appends, on a node with TunnelSources (addPeerAddrRoutes says
// why), TransitOnly routes for the InternalIPs of the nodes of the sites it
// reaches through gateways and whose underlay reaches them (but for peers
// reached there), after correctRoutes and splitDirect, first (so they win a
// tie with splitDirect's: the first assignment's gateways, as for the sites'
// pod prefixes): its pods reach those nodes through the gateways, as the
// nodes answer them, whatever routeNodeCidrs says, remote gateways'
// endpoints included (over their exceptions); its own traffic stays on the
// underlay. Where the site's nodeCidrs are routed TransitOnly to the same
// gateways, the aggregation folds these into that route. The gateways they
// go to carry them on (a gateway's peer addresses and node routes), so such
// a route is no black hole, unlike one the node's own traffic would take.
func (p *NodePlan) addNodeRoutes(routes []groupRoute) {
	if len(p.TunnelSources) > 0 {
		// A peer's own address goes straight to it (addPeerAddrRoutes), as
		// it sends its answers straight here.
		routes = slices.DeleteFunc(slices.Clone(routes), func(gr groupRoute) bool {
			return slices.ContainsFunc(p.Peers, func(pr Peer) bool { return pr.Name == gr.sp.node && HostPrefix(pr.Underlay) == gr.sp.prefix })
		})
		n := len(p.Routes)
		p.addGatewayRoutes(routes, true)
		p.Routes = slices.Concat(p.Routes[n:], p.Routes[:n])
	}
}

// addGatewayRoutes appends the group routes of the assignments, after every
// peer's own routes (those win a tie in dedupeRoutes), TransitOnly when
// transitOnly or the group route's own transitOnly is set. A member that is no peer (skipped by addPeer) is left
// out of the group.
func (p *NodePlan) addGatewayRoutes(routes []groupRoute, transitOnly bool) {
	peers := map[string]Peer{}
	for _, pr := range p.Peers {
		peers[pr.Name] = pr
	}
	warned := map[string]bool{}
	p.Routes = slices.Grow(p.Routes, len(routes))
	for _, gr := range routes {
		group := make([]NextHop, 0, len(gr.members))
		for _, m := range gr.members {
			pr, ok := peers[m]
			if !ok {
				continue
			}
			group = append(group, NextHop{Peer: m, Via: pr.Via()})
			if !pr.TunnelAddr.IsValid() && !warned[m] {
				warned[m] = true
				p.warnf("gateway Node %q has no tunnel address: it cannot be health-checked, so it is always up", m)
			}
		}
		if len(group) == 0 {
			continue
		}
		slices.SortFunc(group, func(a, b NextHop) int { return cmp.Compare(a.Peer, b.Peer) })
		only := transitOnly || gr.transitOnly
		p.Routes = append(p.Routes, Route{Prefix: gr.sp.prefix, Group: group, Site: gr.site, Origin: gr.sp.origin, TransitOnly: only,
			UnderlaySource: gr.underlaySource && !only})
	}
}

// addGatewayFabric adds to FabricPrefixes the prefixes a gateway hands to
// its site's fabric (its pools' routedCidrs, its site's nodeCidrs), except
// those it routes itself: a pool spanning several sites lists the same
// routedCidrs for each, and the node sends them where they are.
func (p *NodePlan) addGatewayFabric(fabric []netip.Prefix) {
	for _, f := range fabric {
		routed := slices.ContainsFunc(p.Routes, func(r Route) bool {
			return !r.Underlay && r.Prefix.Bits() <= f.Bits() && r.Prefix.Contains(f.Addr())
		})
		if !routed {
			p.FabricPrefixes = append(p.FabricPrefixes, f)
		}
	}
	p.FabricPrefixes = sortedUnique(p.FabricPrefixes)
}
