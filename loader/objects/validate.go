package objects

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// fieldPrefix is a parsed CIDR field of one object, for overlap checks.
type fieldPrefix struct {
	file, object, field string
	prefix              netip.Prefix
}

func (f fieldPrefix) describe() string {
	return inFile(fmt.Sprintf("%s %s %s", f.object, f.field, f.prefix), f.file)
}

// fieldIndex returns field[i]; it runs for every CIDR of every object on each
// snapshot, so it concatenates rather than formats.
func fieldIndex(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

// normalizeCIDR parses *s as a prefix and rewrites it in canonical form. Host
// bits set (10.0.2.5/23) change what the user wrote, so they earn a warning;
// a mere respelling (2001:DB8::/32) is rewritten silently.
func normalizeCIDR[S ~string](l *loader, file, object, field string, s *S) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(string(*s))
	if err != nil {
		l.errorf(file, object, field, "invalid CIDR %q", string(*s))
		return netip.Prefix{}, false
	}
	masked := p.Masked()
	if masked != p {
		l.warnf(file, object, field, "%s has host bits set; normalized to %s", string(*s), masked)
	}
	*s = S(masked.String())
	return masked, true
}

func normalizeCIDRs[S ~string](l *loader, file, object, field string, list []S) []fieldPrefix {
	var out []fieldPrefix
	for i := range list {
		f := fieldIndex(field, i)
		if p, ok := normalizeCIDR(l, file, object, f, &list[i]); ok {
			out = append(out, fieldPrefix{file, object, f, p})
		}
	}
	return out
}

func (l *loader) validate() {
	checkDuplicates(l, l.sites, func(s *v1alpha1.Site) string { return s.Name })
	checkDuplicates(l, l.peerings, func(p *v1alpha1.SitePeering) string { return p.Name })
	checkDuplicates(l, l.pools, func(p *v1alpha1.GatewayPool) string { return p.Name })
	checkDuplicates(l, l.assigns, func(a *v1alpha1.SiteGatewayPoolAssignment) string { return a.Name })
	checkDuplicates(l, l.nodes, func(n *corev1.Node) string { return n.Name })

	var nodeCIDRs, cidrBlocks []fieldPrefix
	for _, s := range l.sites {
		n, b := l.validateSite(s)
		nodeCIDRs = append(nodeCIDRs, n...)
		cidrBlocks = append(cidrBlocks, b...)
	}
	l.checkSiteOverlaps(nodeCIDRs)
	l.checkSiteOverlaps(cidrBlocks)

	siteNames := make(map[string]bool)
	for _, s := range l.sites {
		siteNames[s.obj.Name] = true
	}
	for _, p := range l.peerings {
		l.validatePeering(p, siteNames)
	}

	siteName := make(map[string]string, len(l.sites)) // label -> name
	for _, s := range l.sites {
		siteName[s.label] = s.obj.Name
	}
	nodeSite := make(map[string]string, len(l.nodes))
	podCIDRs := make([]fieldPrefix, 0, len(l.nodes)) // most nodes have one
	for _, n := range l.nodes {
		pods, holders := l.validateNode(n, nodeCIDRs)
		podCIDRs = append(podCIDRs, pods...)
		if name, ok := onlySite(holders, siteName); ok {
			nodeSite[n.label] = name
		}
	}
	for _, ij := range overlapPairs(podCIDRs) {
		a, b := podCIDRs[ij[0]], podCIDRs[ij[1]]
		if a.object != b.object {
			l.errorf(a.file, a.object, a.field, "%s overlaps %s", a.prefix, b.describe())
		}
	}
	l.checkTunnelAddrs(podCIDRs, cidrBlocks)
	l.validateGateways(siteNames, nodeSite)
}

// onlySite returns the name of the Site the holders of a node's InternalIP
// belong to, when they belong to exactly one.
func onlySite(holders []fieldPrefix, siteName map[string]string) (string, bool) {
	if len(holders) == 0 {
		return "", false
	}
	name := siteName[holders[0].object]
	for _, h := range holders[1:] {
		if siteName[h.object] != name {
			return "", false
		}
	}
	return name, true
}

func checkDuplicates[T any](l *loader, entries []entry[T], name func(*T) string) {
	firstFile := make(map[string]string, len(entries)) // name -> file of its first entry
	for _, e := range entries {
		if file, ok := firstFile[name(e.obj)]; ok {
			if file == "" {
				l.errorf(e.file, e.label, "metadata.name", "duplicate name")
			} else {
				l.errorf(e.file, e.label, "metadata.name", "duplicate name, first defined in %s", file)
			}
			continue
		}
		firstFile[name(e.obj)] = e.file
	}
}

// validateSite checks one Site and returns its nodeCidrs and cidrBlocks.
func (l *loader) validateSite(e entry[v1alpha1.Site]) (nodeCIDRs, cidrBlocks []fieldPrefix) {
	spec := &e.obj.Spec
	nodeCIDRs = normalizeCIDRs(l, e.file, e.label, "spec.nodeCidrs", spec.NodeCIDRs)
	for i := range spec.PodCIDRAssignments {
		a := &spec.PodCIDRAssignments[i]
		field := fieldIndex("spec.podCidrAssignments", i)
		cidrBlocks = append(cidrBlocks, normalizeCIDRs(l, e.file, e.label, field+".cidrBlocks", a.CIDRBlocks)...)
		if len(a.CIDRBlocks) == 0 {
			l.errorf(e.file, e.label, field+".cidrBlocks", "required")
		}
		if a.NodeBlockSizes != nil {
			if v := a.NodeBlockSizes.IPv4; v < 0 || v > 32 {
				l.errorf(e.file, e.label, field+".nodeBlockSizes.ipv4", "%d is not a prefix length (1-32)", v)
			}
			if v := a.NodeBlockSizes.IPv6; v < 0 || v > 128 {
				l.errorf(e.file, e.label, field+".nodeBlockSizes.ipv6", "%d is not a prefix length (1-128)", v)
			}
		}
		if _, err := regexp.Compile(a.NodeRegex); err != nil {
			l.errorf(e.file, e.label, field+".nodeRegex", "invalid regular expression: %v", err)
		}
	}
	normalizeCIDRs(l, e.file, e.label, "spec.localCidrs", spec.LocalCIDRs)
	normalizeCIDRs(l, e.file, e.label, "spec.nonMasqueradeCIDRs", spec.NonMasqueradeCIDRs)
	switch rp := spec.ReturnPath; {
	case rp != "" && rp != v1alpha1.ReturnPathFabric && rp != v1alpha1.ReturnPathSNAT:
		l.errorf(e.file, e.label, "spec.returnPath", "unknown return path %q (want Fabric or SNAT)", rp)
	case rp == v1alpha1.ReturnPathSNAT && spec.ManagesCNIPlugin():
		l.warnf(e.file, e.label, "spec.returnPath", "SNAT has no effect while manageCniPlugin is true: every pod source is in a node's podCIDR, which peers route back")
	}
	if mtu := spec.TunnelMTU; mtu != 0 && (mtu < 576 || mtu > 65535) {
		l.errorf(e.file, e.label, "spec.tunnelMTU", "%d is out of range (576-65535, or 0 for automatic)", mtu)
	}
	return nodeCIDRs, cidrBlocks
}

// checkSiteOverlaps reports every pair of prefixes of different Sites that
// overlap; prefixes of one Site may overlap each other.
func (l *loader) checkSiteOverlaps(prefixes []fieldPrefix) {
	for _, ij := range overlapPairs(prefixes) {
		a, b := prefixes[ij[0]], prefixes[ij[1]]
		if a.object != b.object {
			l.errorf(a.file, a.object, a.field, "%s overlaps %s", a.prefix, b.describe())
		}
	}
}

// overlapPairs returns every pair {i, j}, j < i, of overlapping prefixes, in
// the order of a loop over i and then j: the later one is reported against
// the earlier. Two prefixes overlap only when one holds the other, so a sweep
// in address order with a stack of the prefixes that hold the current one
// finds them all in O(n log n) plus the pairs, where comparing every pair
// took seconds for 5,000 podCIDRs.
func overlapPairs(ps []fieldPrefix) [][2]int {
	order := make([]int, len(ps))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		pa, pb := ps[a].prefix, ps[b].prefix
		if c := pa.Addr().Compare(pb.Addr()); c != 0 {
			return c
		}
		return pa.Bits() - pb.Bits() // the holder first
	})
	var pairs [][2]int
	var stack []int
	for _, i := range order {
		for len(stack) > 0 && !ps[stack[len(stack)-1]].prefix.Overlaps(ps[i].prefix) {
			stack = stack[:len(stack)-1]
		}
		for _, j := range stack {
			pairs = append(pairs, [2]int{max(i, j), min(i, j)})
		}
		stack = append(stack, i)
	}
	slices.SortFunc(pairs, func(a, b [2]int) int {
		if a[0] != b[0] {
			return a[0] - b[0]
		}
		return a[1] - b[1]
	})
	return pairs
}

func (l *loader) validatePeering(e entry[v1alpha1.SitePeering], siteNames map[string]bool) {
	spec := &e.obj.Spec
	seen := make(map[string]bool)
	for i, name := range spec.Sites {
		field := fieldIndex("spec.sites", i)
		switch {
		case seen[name]:
			l.errorf(e.file, e.label, field, "site %q is listed twice", name)
		case !siteNames[name]:
			l.errorf(e.file, e.label, field, "unknown Site %q", name)
		}
		seen[name] = true
	}
	if len(seen) < 2 {
		l.errorf(e.file, e.label, "spec.sites", "a peering needs at least two sites, got %d", len(seen))
	}
	if p := spec.Protocol(); p != v1alpha1.TunnelGENEVE {
		l.errorf(e.file, e.label, "spec.tunnelProtocol", "unsupported tunnel protocol %q (want GENEVE)", p)
	}
	l.checkEncryption(e.file, e.label, spec.EncryptionOrDefault())
}

// checkEncryption reports a spec.encryption that is neither None nor
// WireGuard, as the CRD's enum does for objects from the API.
func (l *loader) checkEncryption(file, label string, enc v1alpha1.Encryption) {
	if enc != v1alpha1.EncryptionNone && enc != v1alpha1.EncryptionWireGuard {
		l.errorf(file, label, "spec.encryption", "unsupported encryption %q (want None or WireGuard)", enc)
	}
}

// validateNode checks one Node against the Sites' nodeCidrs and returns its
// podCIDRs and the nodeCidrs that hold its InternalIP. What depends on the
// Node alone comes from its nodeFacts (computed once per version of it);
// only the Site it falls in is looked up on each call.
func (l *loader) validateNode(e entry[corev1.Node], nodeCIDRs []fieldPrefix) (pods, holders []fieldPrefix) {
	f := l.factsOf(e)
	l.addErrors(f.addrErrs)
	if f.hasInternal {
		holders = l.checkNodeSite(e, f.internal, nodeCIDRs)
	} else if f.internalIPs == 0 {
		l.errorf(e.file, e.label, "status.addresses", "no InternalIP: a node's InternalIP is its tunnel endpoint and decides its site")
	}
	l.addErrors(f.podErrs)
	l.warnings = append(l.warnings, f.podWarns...)
	return f.pods, holders
}

// checkNodeAddresses reports the Node's unparsable InternalIPs and
// ExternalIPs and returns how many InternalIPs it lists.
func (l *loader) checkNodeAddresses(e entry[corev1.Node]) (internalIPs int) {
	for i := range e.obj.Status.Addresses {
		a := &e.obj.Status.Addresses[i]
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if a.Type == corev1.NodeInternalIP {
			internalIPs++
		}
		if _, err := netip.ParseAddr(a.Address); err != nil {
			l.errorf(e.file, e.label, fieldIndex("status.addresses", i)+".address", "invalid %s %q", a.Type, a.Address)
		}
	}
	return internalIPs
}

// checkPodCIDRs normalizes the Node's podCIDR fields in place, reports the
// invalid ones, and returns its podCIDRs.
func (l *loader) checkPodCIDRs(e entry[corev1.Node]) (pods []fieldPrefix) {
	n := e.obj
	if n.Spec.PodCIDR != "" {
		p, ok := normalizeCIDR(l, e.file, e.label, "spec.podCIDR", &n.Spec.PodCIDR)
		if ok && len(n.Spec.PodCIDRs) == 0 {
			pods = append(pods, fieldPrefix{e.file, e.label, "spec.podCIDR", p})
		}
	}
	pods = append(pods, normalizeCIDRs(l, e.file, e.label, "spec.podCIDRs", n.Spec.PodCIDRs)...)
	if len(n.Spec.PodCIDRs) > 0 && n.Spec.PodCIDR != "" && n.Spec.PodCIDR != n.Spec.PodCIDRs[0] {
		l.errorf(e.file, e.label, "spec.podCIDR", "%s differs from spec.podCIDRs[0] %s", n.Spec.PodCIDR, n.Spec.PodCIDRs[0])
	}
	families := make(map[bool]string)
	for _, p := range pods {
		if prev, ok := families[p.prefix.Addr().Is4()]; ok {
			l.errorf(e.file, e.label, p.field, "second prefix of one address family (first is %s)", prev)
		}
		families[p.prefix.Addr().Is4()] = p.field
	}
	return pods
}

// checkNodeSite reports a node whose InternalIP is in no Site or in several,
// and returns the nodeCidrs that hold it (one per Site).
func (l *loader) checkNodeSite(e entry[corev1.Node], ip netip.Addr, nodeCIDRs []fieldPrefix) (holders []fieldPrefix) {
	for _, c := range nodeCIDRs {
		if c.prefix.Contains(ip) && (len(holders) == 0 || holders[len(holders)-1].object != c.object) {
			holders = append(holders, c)
		}
	}
	switch len(holders) {
	case 0:
		l.errorf(e.file, e.label, "status.addresses", "InternalIP %s is in no Site's spec.nodeCidrs", ip)
	case 1:
	default:
		msg := fmt.Sprintf("InternalIP %s is in more than one Site:", ip)
		for i, h := range holders {
			if i > 0 {
				msg += " and"
			}
			msg += " " + h.describe()
		}
		l.errorf(e.file, e.label, "status.addresses", "%s", msg)
	}
	return holders
}
