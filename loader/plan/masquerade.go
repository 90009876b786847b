package plan

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// masqueradePolicy returns the egress masquerade policy of a node of site:
// on a Site that manages the CNI, pods reach every destination from the node's
// underlay address except the Site's nonMasqueradeCIDRs and the prefixes of
// the sites it is connected to (connected, besides its own), which are
// routed back to the pod's own address. Call it after the routes are final.
func (p *NodePlan) masqueradePolicy(set *objects.Set, site *v1alpha1.Site, connected []string) MasqueradePolicy {
	if !site.Spec.ManagesCNIPlugin() {
		return MasqueradePolicy{Reason: fmt.Sprintf("Site %q does not manage the CNI (manageCniPlugin false): its own CNI decides what is masqueraded", site.Name)}
	}
	if !p.Underlay.Unmap().Is4() {
		return MasqueradePolicy{Reason: fmt.Sprintf("Node %q has no IPv4 underlay address to masquerade to", p.Node)}
	}
	m := MasqueradePolicy{Addr: p.Underlay.Unmap()}
	add := func(pfx netip.Prefix, origin string) {
		if pfx.Addr().Unmap().Is4() {
			m.Exempt = append(m.Exempt, ExemptSource{Prefix: netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()).Masked(), Origin: origin})
		}
	}
	for i, c := range site.Spec.NonMasqueradeCIDRs {
		if pfx, err := netip.ParsePrefix(string(c)); err == nil {
			add(pfx, fmt.Sprintf("Site %q spec.nonMasqueradeCIDRs[%d]", site.Name, i))
		}
	}
	for _, name := range append([]string{site.Name}, connected...) {
		s := set.Site(name)
		if s == nil {
			continue
		}
		siteWide := len(m.Exempt)
		for i, c := range s.Spec.NodeCIDRs {
			if pfx, err := netip.ParsePrefix(string(c)); err == nil {
				add(pfx, fmt.Sprintf("Site %q spec.nodeCidrs[%d]", name, i))
			}
		}
		for _, b := range declaredBlocks(s) {
			add(b.Prefix, fmt.Sprintf("Site %q %s", name, b.Field))
		}
		// A node prefix inside one of its site's (its podCIDR in a pod
		// block) is dropped by coveringOnly anyway: skip it before naming
		// its origin, which is most of the cost at 5,000 nodes.
		siteEnd := len(m.Exempt)
		covered := func(pfx netip.Prefix) bool {
			return slices.ContainsFunc(m.Exempt[siteWide:siteEnd], func(e ExemptSource) bool {
				return e.Prefix.Bits() <= pfx.Bits() && e.Prefix.Contains(pfx.Addr())
			})
		}
		for _, n := range set.NodesOf(name) {
			for _, f := range objects.PodCIDRFields(n) {
				if !covered(f.Prefix) {
					add(f.Prefix, objects.NodeField(n.Name, f.Field))
				}
			}
			if a, origin, ok := objects.TunnelAddr(n); ok && !covered(HostPrefix(a)) {
				add(HostPrefix(a), origin)
			}
		}
	}
	for _, r := range p.Routes {
		add(r.Prefix, r.Origin)
	}
	m.Exempt = coveringOnly(m.Exempt)
	return m
}

// coveringOnly sorts es by prefix and drops every entry another one covers (an
// LPM lookup never needs it), keeping the first origin of equal prefixes.
func coveringOnly(es []ExemptSource) []ExemptSource {
	slices.SortStableFunc(es, func(a, b ExemptSource) int { return comparePrefix(a.Prefix, b.Prefix) })
	var out []ExemptSource
	for _, e := range es {
		// Sorted by address then length, the kept prefixes are disjoint and
		// ascending: only the last can cover e.
		if n := len(out); n > 0 && out[n-1].Prefix.Bits() <= e.Prefix.Bits() && out[n-1].Prefix.Contains(e.Prefix.Addr()) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// connectedSites returns the sites other than site's own that its pods reach
// through isthmus, sorted: meshed by a SitePeering, or joined by a
// SiteGatewayPoolAssignment.
func connectedSites(site string, meshed map[string]string, all []assignment) []string {
	var out []string
	for s := range meshed {
		out = append(out, s)
	}
	for _, a := range all {
		if slices.Contains(a.obj.Spec.Sites, site) {
			for _, s := range a.obj.Spec.Sites {
				if s != site {
					out = append(out, s)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
