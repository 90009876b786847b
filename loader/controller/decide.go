package controller

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// LabelSite is the Node label that names the node's Site.
const LabelSite = "isthmus.dev/site"

// DefaultTunnelCIDR is where tunnel addresses come from when --tunnel-cidr is
// not given: a slice of the shared address space (RFC 6598) that no site
// uses as pods or nodes in the seed topologies.
var DefaultTunnelCIDR = netip.MustParsePrefix("100.64.0.0/16")

// membership is which Sites hold each node's InternalIP.
type membership map[string][]*v1alpha1.Site

func sitesOf(sites []v1alpha1.Site, nodes []corev1.Node) membership {
	m := make(membership, len(nodes))
	for i := range nodes {
		ip, ok := objects.InternalIP(&nodes[i])
		if !ok {
			continue
		}
		for j := range sites {
			for _, c := range sites[j].Spec.NodeCIDRs {
				if p, err := netip.ParsePrefix(string(c)); err == nil && p.Masked().Contains(ip) {
					m[nodes[i].Name] = append(m[nodes[i].Name], &sites[j])
					break
				}
			}
		}
	}
	return m
}

// site returns the node's Site when exactly one holds it. A node claimed by
// two Sites (their nodeCidrs overlap, which the Invalid condition reports)
// has no site: guessing could carve its podCIDR from the wrong pool, and a
// podCIDR can never be taken back.
func (m membership) site(node string) *v1alpha1.Site {
	if s := m[node]; len(s) == 1 {
		return s[0]
	}
	return nil
}

// SiteLabels returns, for every node, the value its isthmus.dev/site label
// should have: the name of the one Site whose nodeCidrs hold its InternalIP,
// or "" (no label) when none or several do, or when the Site's name is too
// long or otherwise unfit to be a label value.
func SiteLabels(sites []v1alpha1.Site, nodes []corev1.Node) map[string]string {
	m := sitesOf(sites, nodes)
	out := make(map[string]string, len(nodes))
	for i := range nodes {
		v := ""
		if s := m.site(nodes[i].Name); s != nil && len(validation.IsValidLabelValue(s.Name)) == 0 {
			v = s.Name
		}
		out[nodes[i].Name] = v
	}
	return out
}

// Exhaustion is a node that needs a podCIDR but finds no free block for at
// least one address family, so it gets none: podCIDRs cannot be extended
// once set, and a single-stack node in a dual-stack site would stay that way.
type Exhaustion struct {
	Site string
	Node string
	// Missing says which family found no block and where it looked, such as
	// "IPv4 /25 in spec.podCidrAssignments[0].cidrBlocks (192.168.20.0/24)".
	Missing []string
}

// pool is one assignment of a site, parsed, with what the controller may
// carve from it.
type pool struct {
	field  string // spec.podCidrAssignments[i]
	re     *regexp.Regexp
	broken bool // nodeRegex does not compile: the assignment matches no node
	blocks [2][]netip.Prefix
	bits   [2]int
}

const (
	v4 = 0
	v6 = 1
)

var familyName = [2]string{"IPv4", "IPv6"}

func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return v4
	}
	return v6
}

// poolsOf returns the site's enabled assignments, highest priority first,
// then in the order written. A cidrBlock that does not parse, or that
// overlaps another Site's cidrBlocks, is left out: handing out a block two
// sites claim would give the same addresses to two nodes' pods. Both are
// reported by the Invalid condition.
func poolsOf(site *v1alpha1.Site, sites []v1alpha1.Site) []pool {
	var others []netip.Prefix
	for i := range sites {
		if sites[i].Name == site.Name {
			continue
		}
		for _, a := range sites[i].Spec.PodCIDRAssignments {
			for _, b := range a.CIDRBlocks {
				if p, err := netip.ParsePrefix(string(b)); err == nil {
					others = append(others, p.Masked())
				}
			}
		}
	}
	type ranked struct {
		pool
		priority int32
	}
	var rs []ranked
	for i := range site.Spec.PodCIDRAssignments {
		a := &site.Spec.PodCIDRAssignments[i]
		if !a.AssignsIn(&site.Spec) {
			continue
		}
		p := pool{field: fmt.Sprintf("spec.podCidrAssignments[%d]", i)}
		if a.NodeRegex != "" {
			re, err := regexp.Compile(a.NodeRegex)
			p.re, p.broken = re, err != nil
		}
		b4, b6 := a.BlockSizes()
		p.bits = [2]int{b4, b6}
		for _, s := range a.CIDRBlocks {
			b, err := netip.ParsePrefix(string(s))
			if err != nil || slices.ContainsFunc(others, b.Masked().Overlaps) {
				continue
			}
			b = b.Masked()
			p.blocks[family(b)] = append(p.blocks[family(b)], b)
		}
		rs = append(rs, ranked{p, a.Priority})
	}
	slices.SortStableFunc(rs, func(a, b ranked) int { return int(b.priority) - int(a.priority) })
	out := make([]pool, len(rs))
	for i := range rs {
		out[i] = rs[i].pool
	}
	return out
}

func (p *pool) matches(node string) bool {
	return !p.broken && (p.re == nil || p.re.MatchString(node))
}

// AssignPodCIDRs returns the podCIDRs to give each node that has none and
// needs one, IPv4 first, and the nodes that need one but find a pool full.
//
// A node needs one when its Site (see SiteLabels) has an enabled assignment
// (assignmentEnabled, defaulting to the Site's manageCniPlugin) whose
// nodeRegex matches the node's name (Go regexp syntax, unanchored: write
// ^...$ to match the whole name). Nodes are taken in name order. For each
// address family found in the matching assignments, the node gets the first
// free block of the assignment's nodeBlockSizes (default /24 and /64) from
// the first assignment, by descending priority and then written order, that
// has one; blocks are searched in the order of cidrBlocks and by address
// inside each. A block is free when it overlaps no podCIDR of any node, in
// any site and whether or not inside a pool (a stray block like seed 000's
// 10.0.12.0/24 is still someone's), and no block given earlier in the same
// call. Nothing outside the declared cidrBlocks is ever returned. A node with
// a podCIDR is never in the result, so running AssignPodCIDRs on nodes that
// carry its result returns nothing new.
func AssignPodCIDRs(sites []v1alpha1.Site, nodes []corev1.Node) (map[string][]netip.Prefix, []Exhaustion) {
	m := sitesOf(sites, nodes)
	var taken []netip.Prefix
	for i := range nodes {
		taken = append(taken, objects.PodCIDRs(&nodes[i])...)
	}
	pools := make(map[string][]pool)
	out := make(map[string][]netip.Prefix)
	var exhausted []Exhaustion
	for _, n := range sortedByName(nodes) {
		site := m.site(n.Name)
		if site == nil || hasPodCIDR(n) {
			continue
		}
		ps, ok := pools[site.Name]
		if !ok {
			ps = poolsOf(site, sites)
			pools[site.Name] = ps
		}
		var got []netip.Prefix
		var missing []string
		for fam := range 2 {
			var tried []string
			var block netip.Prefix
			found := false
			for _, p := range ps {
				if !p.matches(n.Name) || len(p.blocks[fam]) == 0 {
					continue
				}
				for _, b := range p.blocks[fam] {
					if block, found = firstFree(b, p.bits[fam], taken); found {
						break
					}
				}
				if found {
					break
				}
				tried = append(tried, fmt.Sprintf("/%d in %s.cidrBlocks (%s)", p.bits[fam], p.field, joinPrefixes(p.blocks[fam])))
			}
			switch {
			case found:
				got = append(got, block)
			case len(tried) > 0:
				missing = append(missing, familyName[fam]+" "+strings.Join(tried, ", "))
			}
		}
		switch {
		case len(missing) > 0:
			exhausted = append(exhausted, Exhaustion{Site: site.Name, Node: n.Name, Missing: missing})
		case len(got) > 0:
			out[n.Name] = got
			taken = append(taken, got...)
		}
	}
	return out, exhausted
}

func hasPodCIDR(n *corev1.Node) bool {
	return n.Spec.PodCIDR != "" || len(n.Spec.PodCIDRs) > 0
}

func sortedByName(nodes []corev1.Node) []*corev1.Node {
	out := make([]*corev1.Node, len(nodes))
	for i := range nodes {
		out[i] = &nodes[i]
	}
	slices.SortFunc(out, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// AssignTunnelAddrs returns a tunnel address for each node of a Site that has
// none: no isthmus.dev/tunnel-ipv4 annotation and no IPv4 podCIDR (whose first
// address would be its tunnel address, see objects.TunnelAddr). Each gets the
// lowest free address of cidr, in node name order; pending names the nodes
// left without one because cidr is full.
//
// An address is free when it is not the network or broadcast address of
// cidr, not any node's InternalIP or ExternalIP (a tunnel endpoint must never
// be routed into the tunnel), not any node's annotated tunnel address, and
// not inside any node's podCIDR or any Site's nodeCidrs, cidrBlocks or
// localCidrs (where a pod, a future node, or a site's own fabric may claim
// it). Existing annotations are never changed, even when they break these
// rules (objects.Validate reports that), so addresses are stable across
// controller restarts: the annotations are the record.
func AssignTunnelAddrs(cidr netip.Prefix, sites []v1alpha1.Site, nodes []corev1.Node) (addrs map[string]netip.Addr, pending []string) {
	cidr = cidr.Masked()
	m := sitesOf(sites, nodes)
	var taken []netip.Prefix
	if cidr.Addr().Is4() && cidr.Bits() <= 30 {
		taken = append(taken, netip.PrefixFrom(cidr.Addr(), 32), netip.PrefixFrom(lastAddr(cidr), 32))
	}
	for i := range sites {
		s := &sites[i].Spec
		lists := [][]v1alpha1.CIDR{s.NodeCIDRs, s.LocalCIDRs}
		for _, a := range s.PodCIDRAssignments {
			lists = append(lists, a.CIDRBlocks)
		}
		for _, l := range lists {
			for _, c := range l {
				if p, err := netip.ParsePrefix(string(c)); err == nil {
					taken = append(taken, p.Masked())
				}
			}
		}
	}
	for i := range nodes {
		n := &nodes[i]
		taken = append(taken, objects.PodCIDRs(n)...)
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				taken = append(taken, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
			}
		}
		if ip, err := netip.ParseAddr(n.Annotations[v1alpha1.AnnotationTunnelIPv4]); err == nil {
			taken = append(taken, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
		}
	}
	addrs = make(map[string]netip.Addr)
	for _, n := range sortedByName(nodes) {
		if m.site(n.Name) == nil || !needsTunnelAddr(n) {
			continue
		}
		b, ok := firstFree(cidr, 32, taken)
		if !ok {
			pending = append(pending, n.Name)
			continue
		}
		addrs[n.Name] = b.Addr()
		taken = append(taken, b)
	}
	return addrs, pending
}

// needsTunnelAddr reports whether the node has neither an annotation (valid
// or not: a user's value is never overwritten) nor an IPv4 podCIDR.
func needsTunnelAddr(n *corev1.Node) bool {
	if _, ok := n.Annotations[v1alpha1.AnnotationTunnelIPv4]; ok {
		return false
	}
	for _, p := range objects.PodCIDRs(n) {
		if p.Addr().Is4() {
			return false
		}
	}
	return true
}
