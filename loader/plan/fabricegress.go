package plan

import (
	"net/netip"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// addFabricEgress marks, on a member of a site whose pods another CNI owns
// with returnPath Fabric, every group route to its own site's gateways
// ViaFabric, and sets FabricEgress to the site's declared pod blocks when
// there is one. Replies to a declared pod come back by the site's fabric: the
// gateway that decapsulates them cannot know which node holds the pod and
// hands them to the fabric, which delivers them on that node's underlay
// device. So the node routes the request to the underlay device too (the
// datapath tunnels it to the gateway as it leaves), or strict rp_filter drops
// every reply: the node would route the remote prefix into isthmus0 and hear
// the answer on eth0. Routes to peers of other sites (a mesh) keep isthmus0:
// their answers arrive from the site router, and the datapath's fabric
// ingress takes them in through isthmus0. Runs last, after aggregation: the
// flag follows the final next hops.
func (p *NodePlan) addFabricEgress(site *v1alpha1.Site) {
	if !fabricReturn(site) {
		return
	}
	own := make(map[string]bool, len(p.Peers))
	for _, pr := range p.Peers {
		if pr.Site == site.Name {
			own[pr.Name] = true
		}
	}
	viaFabric := false
	for i := range p.Routes {
		r := &p.Routes[i]
		if len(r.Group) == 0 || r.Site == "" || r.Site == site.Name {
			continue
		}
		inSite := true
		for _, m := range r.Group {
			inSite = inSite && own[m.Peer]
		}
		if inSite {
			r.ViaFabric, viaFabric = true, true
		}
	}
	if viaFabric {
		p.FabricEgress = sortedUnique(append([]netip.Prefix(nil), declaredPrefixes(site)...))
	}
}
