package plan

import (
	"encoding/base64"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// wireGuardKeyLen is the length of a WireGuard (Curve25519) public key.
const wireGuardKeyLen = 32

// Bytes each encapsulation adds in front of an inner IPv4 packet: GENEVE over
// IPv4 (outer IPv4 20, UDP 8, GENEVE 8, inner Ethernet 14), and WireGuard over
// IPv4 around it (outer IPv4 20, UDP 8, WireGuard's header 16 and tag 16); over
// the IPv6 underlay the outer IPv6 header is 40 bytes, 20 more.
const (
	GeneveOverhead     = 50
	WireGuardOverhead  = 60
	GeneveOverhead6    = 70
	WireGuardOverhead6 = 80
)

// TunnelOverheadOf is what the tunnels of the nodes of site add to a packet:
// GeneveOverhead, or GeneveOverhead6 when a node of the site has an IPv6 underlay
// address (objects.InternalIP: no IPv4 one), plus WireGuardOverhead (or
// WireGuardOverhead6) when a SitePeering or SiteGatewayPoolAssignment with
// encryption WireGuard joins site to another: GENEVE inside WireGuard runs between
// IPv4 tunnel addresses, so it adds GeneveOverhead whatever the underlay. Every
// node of such a site counts both, not only those with encrypted peers: a
// member's packets cross its gateways' encrypted tunnels whole.
func TunnelOverheadOf(set *objects.Set, site string) int {
	v6 := slices.ContainsFunc(set.NodesOf(site), func(n *corev1.Node) bool {
		a, ok := objects.InternalIP(n)
		return ok && a.Is6()
	})
	switch {
	case set.SiteEncrypted(site) && v6:
		return GeneveOverhead + WireGuardOverhead6
	case set.SiteEncrypted(site):
		return GeneveOverhead + WireGuardOverhead
	case v6:
		return GeneveOverhead6
	}
	return GeneveOverhead
}

// encryptable reports whether this node can tunnel to peer (of site) inside
// WireGuard, as by (the object asking for it) wants: both ends need a tunnel
// address, the outer addresses of GENEVE inside WireGuard. Without one the
// peer is left out with a warning: nothing of the pair may leave in the clear.
func (p *NodePlan) encryptable(peer, site string, peerHasTunnel bool, by string) bool {
	switch {
	case !p.TunnelAddr.IsValid():
		p.warnf("%s encrypts the tunnels to Site %q, and Node %q has no tunnel address to send WireGuard's GENEVE from: peer Node %q is not a peer until it has one",
			by, site, p.Node, peer)
		return false
	case !peerHasTunnel:
		p.warnf("%s encrypts the tunnels to Site %q, and peer Node %q has no tunnel address (no IPv4 podCIDR, no annotation %s): it is not a peer until it has one",
			by, site, peer, v1alpha1.AnnotationTunnelIPv4)
		return false
	}
	return true
}

// wireGuardKey returns the public key n publishes in its annotation, or ""
// with a warning when it has none yet or an invalid one.
func (p *NodePlan) wireGuardKey(n *corev1.Node) string {
	key, ok := n.Annotations[v1alpha1.AnnotationWireGuardPublicKey]
	if !ok {
		p.warnf("peer Node %q has not published its WireGuard public key (annotation %s) yet: what this node sends it is dropped until it does",
			n.Name, v1alpha1.AnnotationWireGuardPublicKey)
		return ""
	}
	key = strings.TrimSpace(key)
	if raw, err := base64.StdEncoding.DecodeString(key); err != nil || len(raw) != wireGuardKeyLen {
		p.warnf("peer Node %q has an invalid WireGuard public key %q in annotation %s (want 32 bytes in base64, as `wg pubkey` prints them): what this node sends it is dropped until it is fixed",
			n.Name, key, v1alpha1.AnnotationWireGuardPublicKey)
		return ""
	}
	return key
}
