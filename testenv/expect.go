package testenv

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	"github.com/isthmus-dev/isthmus/loader/ipam"
)

// TunnelAnnotation is the Node annotation that gives a node without a podCIDR
// its tunnel address (docs/unmanaged-sites.md).
const TunnelAnnotation = "isthmus.dev/tunnel-ipv4"

// Host-side interface names of pod veths: isthmus' own pods (the plugin's
// pod-<hash>, ipam.HostIface), and pods of another CNI (Azure CNI names its
// host veths azv<id>).
const (
	ManagedVethPrefix   = ipam.HostIfacePrefix
	UnmanagedVethPrefix = "azv-"
	// UnmanagedIfacePattern is added to the agents' --pod-interfaces when the
	// scenario has unmanaged pods.
	UnmanagedIfacePattern = "azv*"
)

// PodInterfaces returns the agents' --pod-interfaces: PodIfacePattern, plus
// UnmanagedIfacePattern when any pod is unmanaged.
func (s *Scenario) PodInterfaces() string {
	for _, p := range s.Pods() {
		if p.Unmanaged {
			return PodIfacePattern + "," + UnmanagedIfacePattern
		}
	}
	return PodIfacePattern
}

// TunnelAddr returns a node's tunnel address as docs/unmanaged-sites.md defines
// it: the annotation isthmus.dev/tunnel-ipv4, else the first address of its
// first IPv4 podCIDR; the zero Addr when it has neither.
func (n *Node) TunnelAddr() netip.Addr {
	if v, ok := n.Annotations[TunnelAnnotation]; ok {
		a, _ := netip.ParseAddr(v) // validated
		return a
	}
	for _, c := range n.PodCIDRs {
		if a := c.Masked().Addr().Next(); c.Addr().Is4() && c.Bits() < 32 && c.Contains(a) {
			return a
		}
	}
	return netip.Addr{}
}

// siteSemantics is what the lab needs to know of a Site object to say which pod
// pairs should talk and with which source address.
type siteSemantics struct {
	// unmanaged is spec.manageCniPlugin == false.
	unmanaged bool
	// snatReturn is spec.returnPath == SNAT: the site's pods are all translated.
	snatReturn bool
	// blocks are the declared pod blocks.
	blocks []netip.Prefix
}

// ManagesCNI reports whether the site's Site leaves manageCniPlugin at its
// default, true: isthmus is its nodes' CNI. False: another CNI owns its
// pods.
func (site *Site) ManagesCNI() bool { return !site.semantics().unmanaged }

// semantics reads the site's Site object: the spec, or a Site named like the
// site in Objects (else the first Site there).
func (site *Site) semantics() siteSemantics {
	var sem siteSemantics
	sem.blocks, _ = site.podBlocks() // validated
	raw := site.Spec
	if len(raw) == 0 {
		docs, _ := splitDocs(site.Objects)
		for _, d := range docs {
			if d.Kind != "Site" {
				continue
			}
			if raw == nil || d.Metadata.Name == site.Name {
				raw = d.Spec
			}
		}
	}
	var f struct {
		ManageCNIPlugin *bool  `json:"manageCniPlugin"`
		ReturnPath      string `json:"returnPath"`
	}
	if len(raw) > 0 && json.Unmarshal(raw, &f) == nil {
		sem.unmanaged = f.ManageCNIPlugin != nil && !*f.ManageCNIPlugin
		sem.snatReturn = f.ReturnPath == "SNAT"
	}
	return sem
}

// joined reports whether pods of sites a and b talk: the sites are joined by a
// peering (mesh) or by a SiteGatewayPoolAssignment (through gateways). The
// rules of Expectations are the same either way: gateways forward without
// touching the source.
func (s *Scenario) joined(a, b string) bool { return s.peered(a, b) || s.assigned(a, b) }

// peered reports whether sites a and b are joined by a peering: one of
// Peerings or a SitePeering among the raw objects.
func (s *Scenario) peered(a, b string) bool {
	peered, _ := s.peering(a, b)
	return peered
}

// peering reports whether sites a and b are joined by a peering (one of Peerings
// or a SitePeering among the raw objects), and whether one that joins them meshes
// their nodes (meshNodes absent or true).
func (s *Scenario) peering(a, b string) (peered, meshed bool) {
	both := func(sites []string) bool { return slices.Contains(sites, a) && slices.Contains(sites, b) }
	for _, p := range s.Peerings {
		if both(p.Sites) {
			peered = true
			meshed = meshed || p.MeshNodes == nil || *p.MeshNodes
		}
	}
	all := s.Objects
	for _, site := range s.Sites {
		all += "\n---\n" + site.Objects
	}
	docs, _ := splitDocs(all)
	for _, d := range docs {
		if d.Kind != "SitePeering" {
			continue
		}
		var f struct {
			Sites     []string `json:"sites"`
			MeshNodes *bool    `json:"meshNodes"`
		}
		if json.Unmarshal(d.Spec, &f) == nil && both(f.Sites) {
			peered = true
			meshed = meshed || f.MeshNodes == nil || *f.MeshNodes
		}
	}
	return peered, meshed
}

// Expectation is what an isthmus lab must do for one ordered pod pair.
type Expectation struct {
	Src, Dst string
	// Saw is the source address the destination must see: the source pod's
	// own, or its node's tunnel address when return-path SNAT translates it.
	Saw netip.Addr
}

// Expectations returns, in scenario order, the ordered pod pairs that should
// reach each other in an isthmus lab and the source address each destination
// should see, derived from the scenario as docs/unmanaged-sites.md defines:
//
//   - Pods of one site always talk (through the tunnel, or through the site's
//     fabric for an unmanaged site) and see each other's own addresses.
//   - Across joined sites (a SitePeering, or a SiteGatewayPoolAssignment: the
//     pods talk through the gateways, which keep every source as it is), a
//     destination is reachable when it is a managed pod
//     (in its node's podCIDRs) or an unmanaged pod inside the declared pod
//     blocks of an unmanaged site whose returnPath is Fabric (the default).
//   - Across sites, a source keeps its address when it is a managed pod (in
//     its node's podCIDRs, always exempt) or an unmanaged pod inside its
//     unmanaged site's declared blocks with returnPath Fabric; any other source
//     (returnPath SNAT, or an undeclared pool) is translated to its node's
//     tunnel address, and without one it cannot send across sites at all.
func (s *Scenario) Expectations() []Expectation {
	var out []Expectation
	sems := map[string]siteSemantics{}
	for i := range s.Sites {
		sems[s.Sites[i].Name] = s.Sites[i].semantics()
	}
	nodes := map[string]NodeRef{}
	for _, n := range s.Nodes() {
		nodes[n.Name] = n
	}
	joined := map[[2]string]bool{}
	managed := func(p PodRef) bool {
		return slices.ContainsFunc(nodes[p.Node].PodCIDRs, func(c netip.Prefix) bool { return c.Contains(p.Address) })
	}
	declared := func(p PodRef) bool {
		sem := sems[p.Site]
		return sem.unmanaged && !sem.snatReturn &&
			slices.ContainsFunc(sem.blocks, func(b netip.Prefix) bool { return b.Contains(p.Address) })
	}
	for _, src := range s.Pods() {
		for _, dst := range s.Pods() {
			if src.Name == dst.Name {
				continue
			}
			if src.Site == dst.Site {
				out = append(out, Expectation{Src: src.Name, Dst: dst.Name, Saw: src.Address})
				continue
			}
			key := [2]string{src.Site, dst.Site}
			j, ok := joined[key]
			if !ok {
				j = s.joined(src.Site, dst.Site)
				joined[key] = j
			}
			if !j {
				continue
			}
			if !managed(dst) && !declared(dst) {
				continue
			}
			saw := src.Address
			if !managed(src) && !declared(src) {
				node := nodes[src.Node]
				if saw = node.TunnelAddr(); !saw.IsValid() {
					continue
				}
			}
			out = append(out, Expectation{Src: src.Name, Dst: dst.Name, Saw: saw})
		}
	}
	return out
}

// Expect returns the expectation of the pair, false when the pair should not
// talk.
func (s *Scenario) Expect(src, dst string) (Expectation, bool) {
	for _, e := range s.Expectations() {
		if e.Src == src && e.Dst == dst {
			return e, true
		}
	}
	return Expectation{}, false
}

// translated reports whether return-path SNAT translates the named pod's
// traffic to other sites: some expectation of it sees another address.
func (s *Scenario) translated(pod string) bool {
	p, _ := s.pod(pod)
	for _, e := range s.Expectations() {
		if e.Src == pod && e.Saw != p.Address {
			return true
		}
	}
	return false
}

// Pod returns the named pod, false when there is none.
func (s *Scenario) Pod(name string) (PodRef, bool) { return s.pod(name) }

// Unprobed6 is an ordered pair of pods that both have an address6 whose IPv6
// the lab does not probe, and why.
type Unprobed6 struct {
	Src, Dst string
	// Why names the scenario feature that leaves the pair's IPv6 expectation
	// unclear.
	Why string
}

// Expectations6 returns, in scenario order, the ordered pod pairs that should
// reach each other over IPv6 in an isthmus lab, each destination seeing the
// source's own address6, and the pairs with an address6 on both pods that are
// left out, with the reason. IPv6 is expected where it is as plain as IPv4
// between managed pods of a mesh:
//
//   - both pods have an address6 (so both are managed) and the pair has an
//     IPv4 expectation in which the destination sees the source's own
//     address;
//   - the pods are of one site, or of two sites a SitePeering meshes
//     (meshNodes not false) and no SiteGatewayPoolAssignment joins;
//   - neither site has manageCniPlugin false, returnPath SNAT, behindNAT or
//     fabricRoutes, and neither pod has an ingress or egress policy: each of
//     those changes the IPv4 path in a way the lab models for IPv4 only.
//
// Pairs without an IPv4 expectation are in neither list: they have no path by
// design in either family.
func (s *Scenario) Expectations6() ([]Expectation, []Unprobed6) {
	var out []Expectation
	var skipped []Unprobed6
	sites := map[string]*Site{}
	for i := range s.Sites {
		sites[s.Sites[i].Name] = &s.Sites[i]
	}
	for _, e := range s.Expectations() {
		src, _ := s.pod(e.Src)
		dst, _ := s.pod(e.Dst)
		if !src.Address6.IsValid() || !dst.Address6.IsValid() {
			continue
		}
		if why := s.unclear6(src, dst, e, sites); why != "" {
			skipped = append(skipped, Unprobed6{Src: e.Src, Dst: e.Dst, Why: why})
			continue
		}
		out = append(out, Expectation{Src: e.Src, Dst: e.Dst, Saw: src.Address6})
	}
	return out, skipped
}

// Expect6 returns the IPv6 expectation of the pair, false when its IPv6 is
// not probed.
func (s *Scenario) Expect6(src, dst string) (Expectation, bool) {
	es, _ := s.Expectations6()
	for _, e := range es {
		if e.Src == src && e.Dst == dst {
			return e, true
		}
	}
	return Expectation{}, false
}

// unclear6 returns why the IPv6 expectation of the pair with IPv4
// expectation e is unclear, or "" when it is the IPv4 one.
func (s *Scenario) unclear6(src, dst PodRef, e Expectation, sites map[string]*Site) string {
	if e.Saw != src.Address {
		return "the source is translated (return-path SNAT)"
	}
	for _, p := range []PodRef{src, dst} {
		if p.Ingress != nil || p.Egress != nil {
			return fmt.Sprintf("pod %s has a policy (the lab writes policies for IPv4 only)", p.Name)
		}
	}
	for _, name := range []string{src.Site, dst.Site} {
		site := sites[name]
		sem := site.semantics()
		switch {
		case sem.unmanaged:
			return fmt.Sprintf("site %s has manageCniPlugin: false", name)
		case sem.snatReturn:
			return fmt.Sprintf("site %s has returnPath: SNAT", name)
		case site.BehindNAT.IsValid():
			return fmt.Sprintf("site %s is behind a NAT", name)
		case site.FabricRoutes:
			return fmt.Sprintf("site %s has fabricRoutes (the lab's fabric routes IPv4 only)", name)
		}
	}
	return ""
}
