package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// maxListed caps the names a condition message lists, so a thousand pending
// nodes do not make a Site too large to store.
const maxListed = 10

// SiteStatuses returns the status every Site should have, computed from the
// cluster as it is now (not as it will be once the other decisions are
// applied: Ready turns True on the pass after the last patch lands).
// problems are validation messages per Site name (see problemsBySite);
// exhausted and tunnelPending come from AssignPodCIDRs and
// AssignTunnelAddrs. Each condition keeps its lastTransitionTime from the
// Site's current status unless its status changes, when it takes now.
func SiteStatuses(sites []v1alpha1.Site, nodes []corev1.Node, problems map[string][]string,
	exhausted []Exhaustion, tunnelPending []string, now metav1.Time) map[string]v1alpha1.SiteStatus {
	m := sitesOf(sites, nodes)
	now = now.Rfc3339Copy()
	out := make(map[string]v1alpha1.SiteStatus, len(sites))
	for i := range sites {
		site := &sites[i]
		st := v1alpha1.SiteStatus{
			ObservedGeneration: site.Generation,
			Conditions:         slices.Clone(site.Status.Conditions),
		}
		ps := poolsOf(site, sites)
		var pending []string
		for _, n := range sortedByName(nodes) {
			holders := m[n.Name]
			if !slices.Contains(holders, site) {
				continue
			}
			st.Nodes++
			if _, ok := n.Annotations[v1alpha1.AnnotationTunnelIPv4]; ok {
				st.TunnelAddresses++
			}
			if inPools(objects.PodCIDRs(n), site) {
				st.PodCIDRsAssigned++
			}
			if len(holders) == 1 {
				if w := waitingFor(n, site, ps, tunnelPending); w != "" {
					pending = append(pending, n.Name+" ("+w+")")
				}
			}
		}
		var mine []Exhaustion
		for _, e := range exhausted {
			if e.Site == site.Name {
				mine = append(mine, e)
			}
		}
		set := func(typ string, ok bool, reason, msg string) {
			status := metav1.ConditionFalse
			if ok {
				status = metav1.ConditionTrue
			}
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{
				Type: typ, Status: status, Reason: reason, Message: msg,
				ObservedGeneration: site.Generation, LastTransitionTime: now,
			})
		}
		invalid := problems[site.Name]
		if len(invalid) > 0 {
			msg := strings.Join(invalid, "; ")
			if len(invalid) > maxListed {
				msg = fmt.Sprintf("%s; and %d more problems", strings.Join(invalid[:maxListed], "; "), len(invalid)-maxListed)
			}
			set(v1alpha1.ConditionInvalid, true, v1alpha1.ReasonInvalid, msg)
		} else {
			set(v1alpha1.ConditionInvalid, false, v1alpha1.ReasonValid, "every CIDR is valid and no pool overlaps another Site's")
		}
		if len(mine) > 0 {
			set(v1alpha1.ConditionPoolExhausted, true, v1alpha1.ReasonPoolExhausted, exhaustionMessage(mine))
		} else {
			set(v1alpha1.ConditionPoolExhausted, false, v1alpha1.ReasonPoolsAvailable, "every node that needs a podCIDR has one or can get one")
		}
		switch {
		case len(invalid) > 0:
			set(v1alpha1.ConditionReady, false, v1alpha1.ReasonInvalid, "the Site is invalid: see the Invalid condition")
		case len(mine) > 0:
			set(v1alpha1.ConditionReady, false, v1alpha1.ReasonPoolExhausted, "a pool is full: see the PoolExhausted condition")
		case len(pending) > 0:
			set(v1alpha1.ConditionReady, false, v1alpha1.ReasonNodesPending, "waiting for "+listNames(pending))
		default:
			set(v1alpha1.ConditionReady, true, v1alpha1.ReasonNodesReady,
				fmt.Sprintf("%d node(s) labeled, each with a podCIDR or a tunnel address as the Site needs", st.Nodes))
		}
		out[site.Name] = st
	}
	return out
}

// waitingFor says what the node still lacks, or "" when nothing.
func waitingFor(n *corev1.Node, site *v1alpha1.Site, ps []pool, tunnelPending []string) string {
	var w []string
	if n.Labels[LabelSite] != site.Name {
		w = append(w, "site label")
	}
	if !hasPodCIDR(n) && slices.ContainsFunc(ps, func(p pool) bool {
		return p.matches(n.Name) && len(p.blocks[v4])+len(p.blocks[v6]) > 0
	}) {
		w = append(w, "podCIDR")
	}
	if _, _, ok := objects.TunnelAddr(n); !ok {
		what := "tunnel address"
		if slices.Contains(tunnelPending, n.Name) {
			what += ": --tunnel-cidr is full"
		}
		w = append(w, what)
	}
	return strings.Join(w, ", ")
}

// inPools reports whether the node has a podCIDR and each lies inside one of
// the site's cidrBlocks.
func inPools(pods []netip.Prefix, site *v1alpha1.Site) bool {
	if len(pods) == 0 {
		return false
	}
	for _, p := range pods {
		in := false
		for _, a := range site.Spec.PodCIDRAssignments {
			for _, b := range a.CIDRBlocks {
				if bp, err := netip.ParsePrefix(string(b)); err == nil && bp.Masked().Bits() <= p.Bits() && bp.Masked().Contains(p.Addr()) {
					in = true
				}
			}
		}
		if !in {
			return false
		}
	}
	return true
}

// exhaustionMessage groups the nodes by what they miss: "no free IPv4 /25 in
// spec.podCidrAssignments[0].cidrBlocks (192.168.20.0/24) for node flex-3".
func exhaustionMessage(es []Exhaustion) string {
	byMissing := make(map[string][]string)
	var order []string
	for _, e := range es {
		k := strings.Join(e.Missing, " and ")
		if _, ok := byMissing[k]; !ok {
			order = append(order, k)
		}
		byMissing[k] = append(byMissing[k], e.Node)
	}
	var parts []string
	for _, k := range order {
		word := "node"
		if len(byMissing[k]) > 1 {
			word = "nodes"
		}
		parts = append(parts, fmt.Sprintf("no free %s for %s %s", k, word, listNames(byMissing[k])))
	}
	return strings.Join(parts, "; ")
}

func listNames(names []string) string {
	if len(names) <= maxListed {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxListed], ", "), len(names)-maxListed)
}

// statusEqual reports whether two statuses would read the same on the API
// server, which stores times to the second.
func statusEqual(a, b v1alpha1.SiteStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}
