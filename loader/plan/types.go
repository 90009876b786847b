// Package plan computes a node's desired datapath state from isthmus objects.
//
// Compute is a pure function: it reads objects and returns plain data, and never
// touches the kernel or the file system. Everything that applies a plan lives in
// other packages (loader/datapath, loader/agent).
package plan

import "net/netip"

// NodePlan is the desired datapath state of one node.
type NodePlan struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Site is the name of the Site whose nodeCidrs holds the node's InternalIP.
	Site string `json:"site"`
	// Underlay is the node's InternalIP: its tunnel endpoint and the outer source
	// of everything it encapsulates.
	Underlay netip.Addr `json:"underlay"`
	// PodCIDRs are the node's own pod prefixes (spec.podCIDRs), IPv4 first.
	PodCIDRs []netip.Prefix `json:"podCIDRs,omitempty"`
	// TunnelAddr is the overlay address of the node's own stack (host traffic into
	// the tunnel leaves with it, return-path SNAT translates to it, peers route it
	// back here): the annotation isthmus.dev/tunnel-ipv4, else the first address
	// of its IPv4 podCIDR (objects.TunnelAddr). Invalid (zero) when the node has
	// neither; only a node of a managed site can be planned without one.
	TunnelAddr netip.Addr `json:"tunnelAddr,omitzero"`
	// TunnelAddrOrigin names where TunnelAddr came from: `Node "a1" spec.podCIDRs[0]`
	// or `Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"]`.
	TunnelAddrOrigin string `json:"tunnelAddrOrigin,omitempty"`
	// TunnelMTU is the Site's spec.tunnelMTU, 0 when unset (the agent then uses
	// the underlay MTU minus TunnelOverhead).
	TunnelMTU int `json:"tunnelMTU,omitempty"`
	// TunnelOverhead is what the tunnels of the node's site add to a packet
	// (TunnelOverheadOf): the 50 bytes of IPv4 GENEVE, 110 with WireGuard's.
	TunnelOverhead int `json:"tunnelOverhead"`
	// Encrypted is true when a peer is Encrypted: the node runs a WireGuard
	// device, and its tunnel MTU leaves room for WireGuard's header too.
	Encrypted bool `json:"encrypted,omitempty"`
	// Gateway is true when a GatewayPool selects this node: it forwards GENEVE
	// between its site's members and remote gateways (transit), and GatewayPools
	// names the pools, sorted.
	Gateway      bool     `json:"gateway,omitempty"`
	GatewayPools []string `json:"gatewayPools,omitempty"`
	// Peers are the nodes this node tunnels to, sorted by name.
	Peers []Peer `json:"peers"`
	// Routes are the overlay prefixes and the peer each one goes to, sorted by
	// prefix. No route the node's own traffic takes (not TransitOnly)
	// contains a tunnel endpoint or overlaps a LocalPrefix: such a route is
	// cut (Corrections). A TransitOnly route may hold them, each with a
	// longer route that sends it elsewhere: an Underlay exception, or the
	// TransitOnly host route to that very peer (addPeerAddrRoutes).
	Routes []Route `json:"routes"`
	// SNAT is this node's return-path SNAT policy.
	SNAT SNATPolicy `json:"snat"`
	// Masquerade is this node's egress masquerade policy (managed sites only).
	Masquerade MasqueradePolicy `json:"masquerade"`
	// FabricPrefixes are the inner destinations this node hands to its own site's
	// fabric after decapsulation: its site's declared pod blocks when another CNI
	// owns the pods (manageCniPlugin false) and the site's returnPath is Fabric.
	// Sorted.
	FabricPrefixes []netip.Prefix `json:"fabricPrefixes,omitempty"`
	// LocalPrefixes are left to the site's own fabric and CNI on this node and never
	// routed into the tunnel: the site's localCidrs, and its declared pod blocks when
	// the CNI is unmanaged. Routes overlapping them are split (see Corrections),
	// or, TransitOnly ones, given an Underlay exception for them.
	// Sorted.
	LocalPrefixes []netip.Prefix `json:"localPrefixes,omitempty"`
	// FabricEgress are the sources whose traffic on a ViaFabric route the
	// kernel routes to the underlay device (the agent's policy rule to its
	// fabric table, docs/agent.md "Routes and rules"), where the datapath
	// tunnels it to the route's gateway as it leaves: on a member of a site
	// whose pods another CNI owns with returnPath Fabric, the site's declared
	// pod blocks, whose replies the gateways hand to the site fabric. Empty
	// when no route is ViaFabric. Sorted.
	FabricEgress []netip.Prefix `json:"fabricEgress,omitempty"`
	// TunnelSources are the pod prefixes of this node that other nodes route
	// back into the tunnel: a managed site's IPv4 podCIDRs outside
	// LocalPrefixes (to this node), or, on a site whose pods another CNI owns
	// with returnPath Fabric, its declared IPv4 blocks (to the site's nodes),
	// sorted. The agent sends traffic from them through the TransitOnly routes
	// too, but NotForPods (a policy rule, docs/agent.md "Routes and rules"), so
	// a pod reaches a node address the way that node answers it.
	TunnelSources []netip.Prefix `json:"tunnelSources,omitempty"`
	// Corrections report every route that was split because it contained an
	// underlay address or overlapped a LocalPrefix, sorted by removed prefix.
	// A TransitOnly route is not split: it gets Underlay exceptions, reported
	// as routes. Only a LocalPrefix that holds all of it removes one here.
	Corrections []Correction `json:"corrections,omitempty"`
	// Warnings are problems that did not stop the plan (a peer without a
	// podCIDR, say), one sentence each.
	Warnings []string `json:"warnings,omitempty"`
}

// Peer is a node this node exchanges GENEVE with.
type Peer struct {
	Name string `json:"name"`
	Site string `json:"site"`
	// Underlay is the peer's tunnel endpoint (its InternalIP in mesh mode).
	// Invalid for a gateway of an External pool that has no ExternalIP (one
	// behind a NAT, allowed where every assignment of the pool is encrypted):
	// the WireGuard device learns its endpoint from its packets.
	Underlay netip.Addr `json:"underlay,omitzero"`
	// TunnelAddr is the peer's tunnel address (zero if it has none); it is routed
	// to the peer and allowed as a source from it.
	TunnelAddr netip.Addr `json:"tunnelAddr,omitzero"`
	// AllowedSources are the inner source prefixes decapsulation accepts from
	// this peer, sorted: its podCIDRs, its tunnel address, and the declared pod
	// blocks of its site when another CNI owns that site's pods.
	AllowedSources []netip.Prefix `json:"allowedSources"`
	// Encrypted is true when the tunnel to the peer runs inside WireGuard:
	// the peer is a node of another site joined to this node's by a meshing
	// SitePeering, or (between gateways) a SiteGatewayPoolAssignment, with
	// encryption WireGuard. Inside WireGuard the GENEVE packets go from this
	// node's tunnel address to the peer's (Via), so both have one; Underlay
	// is then where this node sends the WireGuard packets (the peer's
	// endpoint).
	Encrypted bool `json:"encrypted,omitempty"`
	// WireGuardKey is an encrypted peer's public key, from its Node's
	// annotation isthmus.dev/wireguard-public-key; empty while the peer's
	// agent has not published a valid one: the datapath then drops what this
	// node would send the peer (never in the clear).
	WireGuardKey string `json:"wireguardKey,omitempty"`
}

// Via is the address the datapath knows the peer by: the outer destination
// of the GENEVE packets this node sends it, the outer source of those it
// accepts from it, and the next hop of routes to it. For an encrypted peer it
// is the peer's tunnel address (WireGuard's cryptokey routing binds it to the
// peer's key), else its underlay address.
func (pr *Peer) Via() netip.Addr {
	if pr.Encrypted {
		return pr.TunnelAddr
	}
	return pr.Underlay
}

// NextHop is one peer a route can go to.
type NextHop struct {
	Peer string     `json:"peer"`
	Via  netip.Addr `json:"via"`
}

// SNATPolicy says which pod sources this node translates when they enter the
// tunnel: every source outside Exempt is rewritten to Addr, with a connection
// table entry so the reply finds its way back (return-path SNAT).
type SNATPolicy struct {
	// Addr is the translated source: the node's tunnel address. Invalid (zero)
	// means no translation on this node; Reason then says why.
	Addr netip.Addr `json:"addr,omitzero"`
	// Exempt are the IPv4 sources the peers route back to this node, sorted by
	// prefix: its podCIDRs, its tunnel address (unless inside one) and, on a
	// site whose pods another CNI owns with returnPath Fabric, the site's
	// declared pod blocks.
	Exempt []ExemptSource `json:"exempt,omitempty"`
	// Reason explains a disabled policy, e.g. the node has no tunnel address.
	Reason string `json:"reason,omitempty"`
}

// MasqueradePolicy says which destinations this node's pods reach from the
// node's underlay address: on a node of a Site that manages the CNI, every IPv4
// destination outside Exempt that leaves by the underlay device (egress
// masquerade, docs/cni.md). Sources are the node's pods, SNATPolicy.Exempt.
type MasqueradePolicy struct {
	// Addr is the translated source: the node's underlay address. Invalid
	// (zero) means no masquerade on this node; Reason then says why.
	Addr netip.Addr `json:"addr,omitzero"`
	// Exempt are the IPv4 destinations a pod reaches with its own address,
	// sorted by prefix, covering ones removed: the Site's nonMasqueradeCIDRs,
	// the pod blocks, node podCIDRs, nodeCidrs and tunnel addresses of the
	// node's own site and of every site it is connected to (meshed or through
	// gateways), and every route's prefix (routedCidrs included).
	Exempt []ExemptSource `json:"exempt,omitempty"`
	// Reason explains a disabled policy.
	Reason string `json:"reason,omitempty"`
}

// ExemptSource is a source prefix that keeps its address in the tunnel.
type ExemptSource struct {
	Prefix netip.Prefix `json:"prefix"`
	// Origin names the object and field it comes from.
	Origin string `json:"origin"`
}

// Route sends an overlay prefix to a peer.
type Route struct {
	Prefix netip.Prefix `json:"prefix"`
	// Peer is the name of the peer node and Via its underlay address. Both are
	// empty when Group is set.
	Peer string     `json:"peer,omitempty"`
	Via  netip.Addr `json:"via,omitzero"`
	// Group, when set, lists the peers that can all deliver Prefix (the agent
	// nodes of an unmanaged site, which hand it to their fabric): each flow goes to
	// one of them by consistent hash, skipping members whose health checks fail.
	// Sorted by peer name.
	Group []NextHop `json:"group,omitempty"`
	// Site, on a group route of a SiteGatewayPoolAssignment, is the remote site
	// the prefix belongs to: each member is health-checked for its reach to that
	// site (docs/gateways.md, "Health and failover"), so one group of gateways
	// is a different next-hop group per remote site. Empty otherwise (the
	// members deliver the prefix themselves and are checked for liveness).
	Site string `json:"site,omitempty"`
	// Origin names the object and field that put the prefix here, such as
	// `Node "b1" spec.podCIDRs[0]`.
	Origin string `json:"origin"`
	// TransitOnly routes go into the datapath's route map but not into the
	// kernel's main table: traffic this node forwards for others (from a
	// tunnel or a pod) takes the route, the node's own host traffic does not.
	// The kernel reaches them only for sources in TunnelSources (the agent's
	// policy rule and table). Besides the nodeCidrs of the sites reached
	// through gateways (or, where they are not routed, their nodes'
	// InternalIPs), the underlay address of each peer is one, to that peer.
	// A gateway reaches a remote member's InternalIP on the underlay, as the
	// member reaches it, while forwarding its own members' traffic to that
	// address through the tunnel (paths stay symmetric both ways).
	TransitOnly bool `json:"transitOnly,omitempty"`
	// ViaFabric routes go to gateways of the node's own site (a group route
	// of a remote site, on a member): traffic from the node's FabricEgress
	// sources leaves by the underlay device, because their replies arrive
	// there (the gateways hand them to the site fabric); it is still
	// tunnelled to the gateway. Everything else on the route takes isthmus0.
	ViaFabric bool `json:"viaFabric,omitempty"`
	// NotForPods, on a TransitOnly route, keeps it out of the node's pods'
	// table too: only what the node forwards takes it. A gateway of a site
	// whose pods another CNI owns forwards remote pods' packets for its own
	// site's node addresses through the tunnel, while its own pods reach
	// those nodes over the site's fabric, as their answers come.
	NotForPods bool `json:"notForPods,omitempty"`
	// Underlay routes are exceptions inside a TransitOnly route: Prefix is
	// not tunnelled by this node, whatever a shorter route says (a tunnel
	// endpoint, a LocalPrefix). They have no Peer, Via, Group or Site, and
	// TransitOnly is set too, so they never reach the kernel's main table.
	// The datapath's route lookup treats one as a miss (ROUTE_F_UNDERLAY:
	// the packet is left to the kernel and the site's network), and the
	// pods' table gets a throw route for it, so the kernel's lookup goes on
	// to the main table. Routes the main table takes are never given one:
	// they are cut around such prefixes instead (Corrections).
	Underlay bool `json:"underlay,omitempty"`
	// UnderlaySource, on a route the main table takes, gives the node's own
	// traffic on it the node's InternalIP as source (the kernel route's src)
	// instead of its tunnel address: set on the nodeCidrs of a Site whose
	// underlay does not reach this node's (underlayReachesNodes false). The
	// nodes there route this node's InternalIP into the tunnel as it routes
	// theirs, and answer it from their InternalIPs, so a host's server bound
	// to no address (a plain UDP one) answers from the address it was asked.
	UnderlaySource bool `json:"underlaySource,omitempty"`
}

// Correction records a route that was cut: it contained a tunnel endpoint
// (Endpoint, a peer's or this node's underlay address) or overlapped one of the
// node's LocalPrefixes (Local). Exactly one of Endpoint and Local is set. Kept
// are the prefixes that replaced Removed; empty when nothing of it is left. A
// route cut in several places gives one Correction per cut, with the same Kept.
type Correction struct {
	Removed  netip.Prefix   `json:"removed"`
	Endpoint netip.Addr     `json:"endpoint,omitzero"`
	Local    netip.Prefix   `json:"local,omitzero"`
	Kept     []netip.Prefix `json:"kept"`
	Origin   string         `json:"origin"`
}
