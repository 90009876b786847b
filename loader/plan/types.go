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
	// the tunnel leaves with it): the first address of its IPv4 podCIDR. Invalid
	// (zero) when the node has none.
	TunnelAddr netip.Addr `json:"tunnelAddr,omitzero"`
	// TunnelMTU is the Site's spec.tunnelMTU, 0 when unset (the agent then uses
	// the underlay MTU minus the 50 bytes of IPv4 GENEVE overhead).
	TunnelMTU int `json:"tunnelMTU,omitempty"`
	// Peers are the nodes this node tunnels to, sorted by name.
	Peers []Peer `json:"peers"`
	// Routes are the overlay prefixes and the peer each one goes to, sorted by
	// prefix. No route contains a peer's underlay address.
	Routes []Route `json:"routes"`
	// Corrections report every route that was split because it contained a
	// peer's underlay address.
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
	Underlay netip.Addr `json:"underlay"`
	// AllowedSources are the inner source prefixes decapsulation accepts from
	// this peer, sorted.
	AllowedSources []netip.Prefix `json:"allowedSources"`
}

// Route sends an overlay prefix to a peer.
type Route struct {
	Prefix netip.Prefix `json:"prefix"`
	// Peer is the name of the peer node and Via its underlay address.
	Peer string     `json:"peer"`
	Via  netip.Addr `json:"via"`
	// Origin names the object and field that put the prefix here, such as
	// `Node "b1" spec.podCIDRs[0]`.
	Origin string `json:"origin"`
}

// Correction records a prefix that contained a peer's underlay address and was
// replaced by the prefixes around it.
type Correction struct {
	Removed  netip.Prefix   `json:"removed"`
	Endpoint netip.Addr     `json:"endpoint"`
	Kept     []netip.Prefix `json:"kept"`
	Origin   string         `json:"origin"`
}
