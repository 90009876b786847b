package controller

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

var (
	siteInMessage = regexp.MustCompile(`Site "([^"]+)"`)
	nodeInMessage = regexp.MustCompile(`Node "([^"]+)"`)
)

// problemsBySite runs objects.Validate, the rules of file mode, over the
// Sites and Nodes and files each problem under every Site it concerns: the
// Site it is reported on, every Site its message names (an overlap concerns
// both sides), and for every Node it names, the Sites whose nodeCidrs hold
// it. Problems of Nodes in no Site concern no Site and are dropped: a
// cluster may run nodes isthmus does not join.
func problemsBySite(sites []v1alpha1.Site, nodes []corev1.Node) map[string][]string {
	_, _, err := objects.Validate(objects.Objects{Sites: sites, Nodes: nodes})
	m := sitesOf(sites, nodes)
	out := make(map[string][]string)
	for _, oe := range objects.Errors(err) {
		var concerns []string
		for _, sm := range siteInMessage.FindAllStringSubmatch(oe.Object+" "+oe.Msg, -1) {
			concerns = append(concerns, sm[1])
		}
		for _, nm := range nodeInMessage.FindAllStringSubmatch(oe.Object+" "+oe.Msg, -1) {
			for _, s := range m[nm[1]] {
				concerns = append(concerns, s.Name)
			}
		}
		slices.Sort(concerns)
		msg := oe.Object + ": " + oe.Msg
		if oe.Field != "" {
			msg = oe.Object + " " + oe.Field + ": " + oe.Msg
		}
		for _, s := range slices.Compact(concerns) {
			out[s] = append(out[s], msg)
		}
	}
	return out
}

// foreignAddresses reports, per Site, what the controller would not have
// given its nodes: a tunnel address annotation outside tunnelCIDR (a node
// must not claim an address the controller may hand another, or one outside
// the range the network expects tunnel addresses in), and, in a Site whose
// assignment is enabled, a podCIDR outside every cidrBlock of the Site: some
// other allocator set it, typically kube-controller-manager with
// --allocate-node-cidrs, which must be off where the controller assigns.
func foreignAddresses(sites []v1alpha1.Site, nodes []corev1.Node, tunnelCIDR netip.Prefix) map[string][]string {
	out := make(map[string][]string)
	m := sitesOf(sites, nodes)
	for _, n := range sortedByName(nodes) {
		site := m.site(n.Name)
		if site == nil {
			continue
		}
		if s, ok := n.Annotations[v1alpha1.AnnotationTunnelIPv4]; ok && tunnelCIDR.IsValid() {
			if a, err := netip.ParseAddr(s); err == nil && !tunnelCIDR.Contains(a) {
				out[site.Name] = append(out[site.Name], fmt.Sprintf("Node %q %s: %s is outside the controller's --tunnel-cidr %s: a node may not claim an address outside it",
					n.Name, objects.TunnelAddrField, a, tunnelCIDR))
			}
		}
		assigns := slices.ContainsFunc(site.Spec.PodCIDRAssignments, func(a v1alpha1.PodCIDRAssignment) bool { return a.AssignsIn(&site.Spec) })
		if pods := objects.PodCIDRs(n); assigns && len(pods) > 0 && !inPools(pods, site) {
			out[site.Name] = append(out[site.Name], fmt.Sprintf("Node %q spec.podCIDRs %v: not assigned by the controller (outside the Site's cidrBlocks): "+
				"is kube-controller-manager running with --allocate-node-cidrs? It must be off where isthmus assigns podCIDRs", n.Name, pods))
		}
	}
	return out
}
