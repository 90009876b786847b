package objects

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// InternalIP returns the node's underlay address: its first IPv4 InternalIP,
// or its first InternalIP of any family when it has no IPv4 one. The second
// result is false when the node has no valid InternalIP.
func InternalIP(node *corev1.Node) (netip.Addr, bool) {
	return nodeAddress(node, corev1.NodeInternalIP)
}

// ExternalIP returns the node's first IPv4 ExternalIP, or its first of any
// family; false when it has none.
func ExternalIP(node *corev1.Node) (netip.Addr, bool) {
	return nodeAddress(node, corev1.NodeExternalIP)
}

func nodeAddress(node *corev1.Node, typ corev1.NodeAddressType) (netip.Addr, bool) {
	var first netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != typ {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() {
			return ip, true
		}
		if !first.IsValid() {
			first = ip
		}
	}
	return first, first.IsValid()
}

// PodCIDRs returns the node's pod prefixes, IPv4 first: spec.podCIDRs, or
// spec.podCIDR when podCIDRs is empty. Invalid entries are skipped (a Set
// from Load has none); the result is nil when the node has no podCIDR yet.
func PodCIDRs(node *corev1.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, f := range PodCIDRFields(node) {
		out = append(out, f.Prefix)
	}
	return out
}

// FieldPrefix is a prefix with the path of the field it came from.
type FieldPrefix struct {
	Prefix netip.Prefix
	Field  string
}

// PodCIDRFields is PodCIDRs with the field each prefix came from
// (spec.podCIDRs[i] or spec.podCIDR), for messages and route origins.
func PodCIDRFields(node *corev1.Node) []FieldPrefix {
	if len(node.Spec.PodCIDRs) == 0 {
		if node.Spec.PodCIDR == "" {
			return nil
		}
		if p, err := netip.ParsePrefix(node.Spec.PodCIDR); err == nil {
			return []FieldPrefix{{p.Masked(), "spec.podCIDR"}}
		}
		return nil
	}
	// A plan calls this for every node, several times: one allocation.
	out := make([]FieldPrefix, 0, len(node.Spec.PodCIDRs))
	for i, s := range node.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, FieldPrefix{p.Masked(), podCIDRsField(i)})
		}
	}
	// Kubernetes allows at most one prefix per family, so a stable sort by
	// family is enough to put IPv4 first.
	slices.SortStableFunc(out, func(a, b FieldPrefix) int {
		return cmp.Compare(family(a.Prefix), family(b.Prefix))
	})
	return out
}

func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 4
	}
	return 6
}

// podCIDRsFields are the usual field paths of spec.podCIDRs, spelled once.
var podCIDRsFields = [...]string{"spec.podCIDRs[0]", "spec.podCIDRs[1]"}

func podCIDRsField(i int) string {
	if i < len(podCIDRsFields) {
		return podCIDRsFields[i]
	}
	return fieldIndex("spec.podCIDRs", i)
}

// siteHolds reports whether ip is inside one of the site's nodeCidrs.
func siteHolds(site *v1alpha1.Site, ip netip.Addr) bool {
	for _, c := range site.Spec.NodeCIDRs {
		if p, err := netip.ParsePrefix(string(c)); err == nil && p.Contains(ip) {
			return true
		}
	}
	return false
}

// TunnelAddrField is the path of the tunnel address annotation, for messages
// and origins.
var TunnelAddrField = fmt.Sprintf("metadata.annotations[%q]", v1alpha1.AnnotationTunnelIPv4)

// TunnelAddr returns the node's tunnel address and the object and field it
// comes from (`Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"]`
// or `Node "flex-1" spec.podCIDRs[0]`): the annotation isthmus.dev/tunnel-ipv4
// when set, else the first host address of the node's IPv4 podCIDR. The
// annotation wins because a user who writes one means it (a node of an
// unmanaged site may carry a podCIDR its CNI never uses, as in seed 000). In a
// Set from Load the annotation is outside every pod block and podCIDR, or is
// the first address of the node's own podCIDR, so it is never an address a pod
// may get. ok is false when the node has neither (or the annotation is not an
// IPv4 address, which Load rejects).
func TunnelAddr(node *corev1.Node) (addr netip.Addr, origin string, ok bool) {
	if s, set := node.Annotations[v1alpha1.AnnotationTunnelIPv4]; set {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return netip.Addr{}, "", false
		}
		return a, NodeField(node.Name, TunnelAddrField), true
	}
	for _, f := range PodCIDRFields(node) {
		if a, ok := firstHost(f.Prefix); ok {
			return a, NodeField(node.Name, f.Field), true
		}
	}
	return netip.Addr{}, "", false
}

// NodeField names a field of a Node for messages and route origins:
// `Node "b1" spec.podCIDRs[0]`. A plan names one per route and allowed
// source, so it concatenates rather than formats.
func NodeField(node, field string) string {
	if quotesAsIs(node) {
		return "Node \"" + node + "\" " + field // what strconv.Quote gives, in one allocation
	}
	return "Node " + strconv.Quote(node) + " " + field
}

// quotesAsIs reports whether strconv.Quote(s) is s between double quotes:
// printable ASCII without a quote or a backslash, as every Node name is.
func quotesAsIs(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// firstHost returns the address after the network address of an IPv4 prefix
// (192.168.20.1 for 192.168.20.0/25); false for IPv6 and for a /32.
func firstHost(p netip.Prefix) (netip.Addr, bool) {
	a := p.Masked().Addr().Next()
	if !p.Addr().Is4() || p.Bits() >= 32 || !p.Contains(a) {
		return netip.Addr{}, false
	}
	return a, true
}
