// Package fleet generates synthetic fleets of isthmus objects for control-plane
// benchmarks: Sites of equal size, each Node with an InternalIP from its
// Site's /20 (inside 172.16.0.0/12) and a /24 podCIDR from its Site's /16
// (inside 10.0.0.0/8), joined either by one meshing SitePeering or, hub and
// spoke, by one SiteGatewayPoolAssignment over one Internal GatewayPool of two
// gateways per Site. It is deterministic: the same shape gives the same
// objects.
package fleet

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// Topology is how the Sites of a fleet are joined.
type Topology string

const (
	// Mesh joins every Site with one SitePeering with meshNodes.
	Mesh Topology = "mesh"
	// Hub joins every Site through its gateways: one
	// SiteGatewayPoolAssignment over one Internal GatewayPool per Site.
	Hub Topology = "hub"
)

// Shape is the size and topology of a fleet. Sites may be at most 256 and
// NodesPerSite at most 250.
type Shape struct {
	Sites, NodesPerSite int
	Topology            Topology
}

// GatewaysPerSite is how many nodes of each Site the hub's pools select.
const GatewaysPerSite = 2

// LabelGateway is the label the hub's pools select: its value is the Site.
const LabelGateway = "fleet.isthmus.dev/gateway"

// SiteName and NodeName name the objects of a fleet.
func SiteName(s int) string    { return fmt.Sprintf("site-%03d", s) }
func NodeName(s, n int) string { return fmt.Sprintf("site-%03d-node-%03d", s, n) }

// InternalIP returns the underlay address of node n of site s.
func InternalIP(s, n int) netip.Addr {
	return netip.AddrFrom4([4]byte{172, byte(16 + s/16), byte((s%16)*16 + n/250), byte(n%250 + 1)})
}

// PodCIDR returns the podCIDR of node n of site s.
func PodCIDR(s, n int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(s), byte(n), 0}), 24)
}

// Objects returns the fleet's objects, not yet validated.
func Objects(sh Shape) (objects.Objects, error) {
	if sh.Sites < 2 || sh.Sites > 256 || sh.NodesPerSite < 1 || sh.NodesPerSite > 250 {
		return objects.Objects{}, fmt.Errorf("fleet shape %+v: want 2-256 sites of 1-250 nodes", sh)
	}
	var in objects.Objects
	var names []string
	created := metav1.NewTime(metav1.Now().Rfc3339Copy().Time)
	for s := range sh.Sites {
		name := SiteName(s)
		names = append(names, name)
		site := v1alpha1.Site{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created}}
		site.Spec.NodeCIDRs = []v1alpha1.CIDR{v1alpha1.CIDR(netip.PrefixFrom(InternalIP(s, 0), 20).Masked().String())}
		site.Spec.PodCIDRAssignments = []v1alpha1.PodCIDRAssignment{{
			CIDRBlocks: []v1alpha1.CIDR{v1alpha1.CIDR(netip.PrefixFrom(PodCIDR(s, 0).Addr(), 16).String())},
		}}
		in.Sites = append(in.Sites, site)
		for n := range sh.NodesPerSite {
			in.Nodes = append(in.Nodes, Node(sh, s, n))
		}
		if sh.Topology == Hub {
			in.GatewayPools = append(in.GatewayPools, v1alpha1.GatewayPool{
				ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created},
				Spec: v1alpha1.GatewayPoolSpec{Type: v1alpha1.GatewayPoolInternal,
					NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelGateway: name}}},
			})
		}
	}
	switch sh.Topology {
	case Mesh:
		in.SitePeerings = []v1alpha1.SitePeering{{ObjectMeta: metav1.ObjectMeta{Name: "fleet", CreationTimestamp: created},
			Spec: v1alpha1.SitePeeringSpec{Sites: names}}}
	case Hub:
		in.SiteGatewayPoolAssignments = []v1alpha1.SiteGatewayPoolAssignment{{
			ObjectMeta: metav1.ObjectMeta{Name: "fleet", CreationTimestamp: created},
			Spec:       v1alpha1.SiteGatewayPoolAssignmentSpec{Sites: names, GatewayPools: names}}}
	default:
		return objects.Objects{}, fmt.Errorf("fleet topology %q: want mesh or hub", sh.Topology)
	}
	return in, nil
}

// Node returns node n of site s as the fleet has it.
func Node(sh Shape, s, n int) corev1.Node {
	// A resourceVersion, as the API server gives every object: a
	// Validator reuses what it found for a version it has seen.
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName(s, n), ResourceVersion: "1", Labels: map[string]string{}}}
	if sh.Topology == Hub && n < GatewaysPerSite {
		node.Labels[LabelGateway] = SiteName(s)
	}
	pod := PodCIDR(s, n).String()
	node.Spec.PodCIDR, node.Spec.PodCIDRs = pod, []string{pod}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: InternalIP(s, n).String()}}
	return node
}
