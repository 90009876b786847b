package plan

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// tunnelSources returns the node's pod prefixes that reach node addresses
// through the tunnel, as the nodes' answers come back (the agent's policy
// rule to its pods' table): on a node of a site whose pods isthmus manages,
// its IPv4 podCIDRs outside the site's local prefixes, which its peers route
// back to it; on a node of a site whose pods another CNI owns with returnPath
// Fabric, the site's declared IPv4 blocks, which every other site routes
// into the tunnel to that site's nodes (a remote node's answer comes back
// through the tunnel or, handed to the site's fabric, by the rule to the
// fabric table, addFabricEgress). A site with returnPath SNAT: none, its
// pods reach addresses outside the overlay as its own CNI lets them.
func (p *NodePlan) tunnelSources(site *v1alpha1.Site) []netip.Prefix {
	var out []netip.Prefix
	switch {
	case site.Spec.ManagesCNIPlugin():
		for _, pfx := range p.PodCIDRs {
			if pfx.Addr().Is4() {
				out = append(out, Subtract(pfx, p.LocalPrefixes...)...)
			}
		}
	case fabricReturn(site):
		for _, pfx := range declaredPrefixes(site) {
			if pfx.Addr().Is4() {
				out = append(out, pfx)
			}
		}
	}
	return sortedUnique(out)
}

// addPeerAddrRoutes routes the underlay address of every peer reached at its
// InternalIP to that peer, TransitOnly: the node's own traffic and the
// tunnel's frames reach it on the underlay, while the node's pods
// (TunnelSources, through the agent's policy rule) and what the node forwards
// for others reach it through the tunnel. The peer routes this node's pods
// into the tunnel straight back to it (they are its peer's own prefixes), so
// pod <-> node paths are as symmetric as pod <-> pod ones and strict
// rp_filter holds on both. The peer answers from that address, so it becomes
// one of the sources accepted from it. Only on a node with TunnelSources or
// a gateway (which forwards remote pods' packets for its peers' addresses):
// elsewhere no pod source of this node comes back through the tunnel. Also,
// for the peers named in also, on a gateway of a site whose underlay does
// not reach another's nodes (underlayReachesNodes false): the remote
// gateways, whose InternalIP this node's members reach through it, routed so
// even when the peer is reached at its ExternalIP (this node's own traffic
// reaches that InternalIP on the underlay, as the peer's reaches this
// node's: it is cut out of the other routes as an endpoint), and the nodes
// of its own site, which the remote nodes reach through it. Runs after
// correctRoutes, which cuts every endpoint out of the other routes.
//
// On a site whose pods another CNI owns, the routes to peers of the node's
// own site are NotForPods: those pods reach them over the site's fabric, as
// the answers come, and only what a gateway forwards takes the tunnel.
func (p *NodePlan) addPeerAddrRoutes(set *objects.Set, site *v1alpha1.Site, also []string) {
	for i := range p.Peers {
		pr := &p.Peers[i]
		overlay := slices.Contains(also, pr.Name)
		notForPods := pr.Site == site.Name && !site.Spec.ManagesCNIPlugin()
		if (len(p.TunnelSources) == 0 && !p.Gateway && !overlay) || (notForPods && !p.Gateway) {
			continue
		}
		internal, ok := objects.InternalIP(set.Node(pr.Name))
		if !ok || (internal != pr.Underlay && !overlay) || !internal.Is4() {
			continue // reached at its ExternalIP: that address is not its own endpoint
		}
		p.Routes = append(p.Routes, Route{
			Prefix:      HostPrefix(internal),
			Peer:        pr.Name,
			Via:         pr.Via(),
			TransitOnly: true,
			NotForPods:  notForPods,
			Origin:      fmt.Sprintf("Node %q status.addresses[InternalIP]", pr.Name),
		})
		if !slices.Contains(pr.AllowedSources, HostPrefix(internal)) {
			pr.AllowedSources = AggregatePrefixes(sortedUnique(append(pr.AllowedSources, HostPrefix(internal))))
		}
	}
}
