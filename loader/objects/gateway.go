package objects

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// GatewayPool returns the GatewayPool with the given name, or nil.
func (s *Set) GatewayPool(name string) *v1alpha1.GatewayPool { return s.lookup().pools[name] }

// GatewaysOf returns the Nodes the pool's nodeSelector selects, in any site,
// sorted by name. A pool from a Set of Load always has a valid selector; an
// invalid one selects nothing. The slice is shared: do not modify it.
func (s *Set) GatewaysOf(pool *v1alpha1.GatewayPool) []*corev1.Node {
	if p := s.lookup().pools[pool.Name]; p == pool {
		return s.lookup().selected[pool.Name]
	}
	sel, err := poolSelector(pool)
	if err != nil {
		return nil
	}
	var out []*corev1.Node
	for i := range s.Nodes {
		if sel.Matches(labels.Set(s.Nodes[i].Labels)) {
			out = append(out, &s.Nodes[i])
		}
	}
	return out
}

// PoolsSelecting returns the names of the GatewayPools whose nodeSelector
// selects node, sorted. Whether the node is a gateway of an assignment also
// depends on its site: see plan.Compute.
func (s *Set) PoolsSelecting(node *corev1.Node) []string {
	if names, ok := s.lookup().pooled[node]; ok {
		return slices.Clone(names)
	}
	var out []string
	for i := range s.GatewayPools {
		if sel, err := poolSelector(&s.GatewayPools[i]); err == nil && sel.Matches(labels.Set(node.Labels)) {
			out = append(out, s.GatewayPools[i].Name)
		}
	}
	return out
}

// poolSelector turns the pool's nodeSelector into a labels.Selector. A nil
// selector selects nothing (LabelSelectorAsSelector would say so too, but Load
// rejects it anyway).
func poolSelector(pool *v1alpha1.GatewayPool) (labels.Selector, error) {
	if pool.Spec.NodeSelector == nil {
		return labels.Nothing(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(pool.Spec.NodeSelector)
	if err != nil {
		return nil, fmt.Errorf("parse node selector: %w", err)
	}
	return sel, nil
}

// validatePool checks one GatewayPool and returns its selector, nil when the
// selector is unusable (reported).
func (l *loader) validatePool(e entry[v1alpha1.GatewayPool]) labels.Selector {
	spec := &e.obj.Spec
	switch spec.Type {
	case "":
		l.errorf(e.file, e.label, "spec.type", "required (want Internal or External)")
	case v1alpha1.GatewayPoolInternal, v1alpha1.GatewayPoolExternal:
	default:
		l.errorf(e.file, e.label, "spec.type", "unknown type %q (want Internal or External)", spec.Type)
	}
	normalizeCIDRs(l, e.file, e.label, "spec.routedCidrs", spec.RoutedCIDRs)
	sel := spec.NodeSelector
	switch {
	case sel == nil:
		l.errorf(e.file, e.label, "spec.nodeSelector", "required: it picks the pool's gateway nodes")
		return nil
	case len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0:
		// Kubernetes reads an empty selector as "everything": every node a
		// gateway is a mistake, not a topology.
		l.errorf(e.file, e.label, "spec.nodeSelector", "empty selector selects every node: give matchLabels or matchExpressions")
		return nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		l.errorf(e.file, e.label, "spec.nodeSelector", "invalid selector: %v", err)
		return nil
	}
	return s
}

// validateGateways checks the pools and the assignments against the Sites and
// Nodes: an External pool's gateways need an ExternalIP, and every site of an
// assignment needs a gateway of one of its pools, or the other sites could
// not reach it. nodeSite maps each node's label to the name of its Site, for
// nodes in exactly one (validateNode reports the others).
func (l *loader) validateGateways(siteNames map[string]bool, nodeSite map[string]string) {
	selectors := make(map[string]labels.Selector)
	types := make(map[string]v1alpha1.GatewayPoolType)
	for _, p := range l.pools {
		if sel := l.validatePool(p); sel != nil {
			selectors[p.obj.Name] = sel
		}
		types[p.obj.Name] = p.obj.Spec.Type
	}
	// A pool all of whose assignments encrypt may have gateways without an
	// ExternalIP: behind a NAT, reached by the WireGuard endpoint their own
	// packets show (docs/gateways.md, "Gateways behind NAT").
	encryptedOnly := make(map[string]bool)
	for _, a := range l.assigns {
		for _, name := range a.obj.Spec.GatewayPools {
			if prev, seen := encryptedOnly[name]; !seen || prev {
				encryptedOnly[name] = a.obj.Spec.Encrypts()
			}
		}
	}
	// Each selector against the nodes once: which sites each pool has a
	// gateway in, for the assignments.
	poolSites := make(map[string]map[string]bool)
	byKey := newLabelKeyIndex(len(l.nodes), func(i int) map[string]string { return l.nodes[i].obj.Labels })
	for _, p := range l.pools {
		sel := selectors[p.obj.Name]
		if sel == nil {
			continue
		}
		sites := make(map[string]bool)
		poolSites[p.obj.Name] = sites
		for _, i := range byKey.selected(sel) {
			n := l.nodes[i]
			sites[nodeSite[n.label]] = true
			if _, ok := ExternalIP(n.obj); !ok && p.obj.Spec.Type == v1alpha1.GatewayPoolExternal && !encryptedOnly[p.obj.Name] {
				l.errorf(p.file, p.label, "spec.nodeSelector", "selects %s, which has no ExternalIP: the gateways of an External pool are reached by their ExternalIP (a gateway behind a NAT without one needs every assignment of the pool encrypted: WireGuard learns its endpoint)", inFile(n.label, n.file))
			}
		}
	}
	for _, a := range l.assigns {
		l.validateAssignment(a, siteNames, types, selectors, poolSites)
	}
	l.checkUnderlayAgrees()
}

// checkUnderlayAgrees rejects an assignment that joins two sites another
// assignment joins too, but says otherwise whether their underlays reach
// each other's nodes: the sites' nodes could not agree on which way their
// host traffic goes, and a path would be asymmetric.
func (l *loader) checkUnderlayAgrees() {
	type pair struct{ a, b string }
	first := map[pair]entry[v1alpha1.SiteGatewayPoolAssignment]{}
	for _, e := range l.assigns {
		reaches := e.obj.Spec.ReachesNodesOnUnderlay()
		reported := false
		for i, a := range e.obj.Spec.Sites {
			for _, b := range e.obj.Spec.Sites[i+1:] {
				k := pair{min(a, b), max(a, b)}
				f, ok := first[k]
				if !ok {
					first[k] = e
					continue
				}
				if f.obj.Spec.ReachesNodesOnUnderlay() != reaches && !reported {
					reported = true
					l.errorf(e.file, e.label, "spec.underlayReachesNodes",
						"%v, but SiteGatewayPoolAssignment %q joins Sites %q and %q too and says %v: give both the same value, since the nodes of two sites reach each other one way",
						reaches, f.obj.Name, k.a, k.b, !reaches)
				}
			}
		}
	}
}

func (l *loader) validateAssignment(e entry[v1alpha1.SiteGatewayPoolAssignment], siteNames map[string]bool,
	types map[string]v1alpha1.GatewayPoolType, selectors map[string]labels.Selector, poolSites map[string]map[string]bool) {
	spec := &e.obj.Spec
	var sites []int // indexes of the known sites, each once
	seen := make(map[string]bool)
	for i, name := range spec.Sites {
		field := fieldIndex("spec.sites", i)
		switch {
		case seen[name]:
			l.errorf(e.file, e.label, field, "site %q is listed twice", name)
		case !siteNames[name]:
			l.errorf(e.file, e.label, field, "unknown Site %q", name)
		default:
			sites = append(sites, i)
		}
		seen[name] = true
	}
	if len(seen) < 2 {
		l.errorf(e.file, e.label, "spec.sites", "an assignment needs at least two sites, got %d", len(seen))
	}
	l.checkEncryption(e.file, e.label, spec.EncryptionOrDefault())
	if !spec.ReachesNodesOnUnderlay() && !spec.RoutesNodeCIDRs() {
		l.errorf(e.file, e.label, "spec.underlayReachesNodes",
			"false says host traffic to the other sites' node addresses must go through the gateways, but routeNodeCidrs false routes no nodeCidrs there: set routeNodeCidrs true (or leave it unset), or underlayReachesNodes true if the underlay does reach the nodes")
	}
	var pools []string
	usable := true
	seenPool := make(map[string]bool)
	for i, name := range spec.GatewayPools {
		field := fieldIndex("spec.gatewayPools", i)
		_, known := types[name]
		switch {
		case seenPool[name]:
			l.errorf(e.file, e.label, field, "pool %q is listed twice", name)
		case !known:
			l.errorf(e.file, e.label, field, "unknown GatewayPool %q", name)
			usable = false
		default:
			pools = append(pools, name)
			usable = usable && selectors[name] != nil
		}
		seenPool[name] = true
	}
	if len(spec.GatewayPools) == 0 {
		l.errorf(e.file, e.label, "spec.gatewayPools", "required: an assignment joins its sites through at least one GatewayPool")
		return
	}
	if !usable {
		return // an unknown pool or a broken selector is reported already
	}
	for _, i := range sites {
		site := spec.Sites[i]
		found := slices.ContainsFunc(pools, func(p string) bool { return poolSites[p][site] })
		if !found {
			quoted := make([]string, len(pools))
			for j, p := range pools {
				quoted[j] = fmt.Sprintf("%q", p)
			}
			l.errorf(e.file, e.label, fieldIndex("spec.sites", i),
				"Site %q has no gateway: none of its Nodes is selected by GatewayPool %s, so the other sites cannot reach it",
				site, strings.Join(quoted, " or "))
		}
	}
}
