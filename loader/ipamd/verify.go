// Package ipamd is the agent's IPAM server: it verifies the node's podCIDRs
// against the objects of the API (or of the object directory) again and again,
// publishes them as ranges only while they verify, and hands out addresses
// from them to the isthmus CNI plugin over a Unix socket. Reservations are in
// an ipam.Store on the node's disk; the server also releases those whose
// pods are gone (leaks), which the plugin's DEL and GC never saw.
package ipamd

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

// Verdict is the result of verifying a node's podCIDRs: the ranges the plugin
// may allocate from and the pods' MTU, or the reason there are none.
type Verdict struct {
	Ranges []netip.Prefix
	MTU    int
	// Reason is empty when Ranges may be used.
	Reason string
	// Unmanaged is set when the node's Site has manageCniPlugin: false:
	// another CNI owns its pods, and isthmus is not the node's CNI.
	Unmanaged bool
}

// Ready reports whether addresses may be handed out.
func (v Verdict) Ready() bool { return v.Reason == "" && len(v.Ranges) > 0 }

// Verify checks the node's podCIDRs in set: the node exists and belongs to a
// Site, the Site has isthmus manage its pods (manageCniPlugin), the node has
// podCIDRs, and every one of them lies inside one of the Site's
// podCidrAssignments blocks, so it was carved from the Site's pools and not
// written by someone else. underlayMTU is the node's underlay MTU; the pods
// get the Site's tunnelMTU, or the underlay MTU less the tunnels' overhead
// (GENEVE's, and WireGuard's where the Site's tunnels are encrypted).
func Verify(set *objects.Set, node string, underlayMTU int) Verdict {
	n := set.Node(node)
	if n == nil {
		return Verdict{Reason: fmt.Sprintf("node %q is not in the API", node)}
	}
	site := set.SiteOf(n)
	if site == nil {
		return Verdict{Reason: fmt.Sprintf("node %q belongs to no Site (no Site's nodeCidrs hold its InternalIP)", node)}
	}
	if m := site.Spec.ManageCNIPlugin; m != nil && !*m {
		return Verdict{Reason: fmt.Sprintf("Site %q has manageCniPlugin: false: another CNI owns its pods", site.Name), Unmanaged: true}
	}
	cidrs := objects.PodCIDRs(n)
	if len(cidrs) == 0 {
		return Verdict{Reason: fmt.Sprintf("node %q has no podCIDR yet", node)}
	}
	var blocks []netip.Prefix
	for _, a := range site.Spec.PodCIDRAssignments {
		for _, b := range a.CIDRBlocks {
			if p, err := netip.ParsePrefix(string(b)); err == nil {
				blocks = append(blocks, p.Masked())
			}
		}
	}
	for _, c := range cidrs {
		if !slices.ContainsFunc(blocks, func(b netip.Prefix) bool { return b.Bits() <= c.Bits() && b.Contains(c.Addr()) }) {
			return Verdict{Reason: fmt.Sprintf("podCIDR %s of node %q is outside the podCidrAssignments of Site %q", c, node, site.Name)}
		}
	}
	return Verdict{Ranges: cidrs, MTU: datapath.TunnelMTU(underlayMTU, int(site.Spec.TunnelMTU), plan.TunnelOverheadOf(set, site.Name))}
}
