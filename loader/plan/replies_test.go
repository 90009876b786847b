package plan

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// This file is a model of what a fleet of nodes does with a packet, written
// from the packet walks of docs/architecture.md ("Decapsulation", "Transit",
// "Pods and node addresses"), docs/agent.md ("Routes and rules"),
// docs/unmanaged-sites.md ("Datapath") and docs/gateways.md, and of the
// kernel's strict rp_filter. It reads the plans' fields as the agent
// installs them and never calls the plan's own route selection (only
// lookup, the longest-prefix match the kernel and the datapath both do).
// TestRepliesEnterOnRoutedDevice runs it.

// The devices a packet can enter a node's stack on: the underlay device
// (eth0) and isthmus0, where the datapath hands what it decapsulates (and
// what fabric ingress takes over) to the stack. devFabric is no device: a
// kernel route of a member's FabricEgress rule, out of the underlay device
// to a gateway of its site.
const (
	devUnderlay = "underlay"
	devTunnel   = "tunnel"
	devFabric   = "fabric"
)

// epKind is what an address of the model belongs to.
type epKind int

const (
	// epHost is a node's own stack: its InternalIP and its tunnel address.
	epHost epKind = iota
	// epPod is a pod in a podCIDR of its node (a managed site's).
	epPod
	// epDeclaredPod is another CNI's pod in its site's declared pod blocks,
	// on one node; the site's fabric delivers it. With returnPath SNAT it
	// only dials, as an undeclared one.
	epDeclaredPod
	// epUndeclaredPod is another CNI's pod outside the declared blocks
	// (inside the site's localCidrs): its node translates it into the tunnel
	// (return-path SNAT), and no remote site routes it, so it only dials.
	epUndeclaredPod
	// epJoining is an address in a site's nodeCidrs that no Node holds yet:
	// a node that joins, without a plan and without isthmus (everything it
	// sends and receives is on its underlay device).
	epJoining
)

// endpoint is one address of the model and who holds it.
type endpoint struct {
	kind epKind
	node string // the node that holds it; "" for epJoining
	site string
	addr netip.Addr
	// dialOnly: no remote site routes it (another CNI's pod outside the
	// declared blocks, or in them with returnPath SNAT), so it only opens
	// flows.
	dialOnly bool
}

func (e *endpoint) String() string {
	switch e.kind {
	case epHost:
		return fmt.Sprintf("host %s (%s)", e.node, e.addr)
	case epJoining:
		return fmt.Sprintf("joining node %s of %s", e.addr, e.site)
	case epUndeclaredPod:
		return fmt.Sprintf("undeclared pod %s on %s", e.addr, e.node)
	case epDeclaredPod:
		return fmt.Sprintf("declared pod %s on %s", e.addr, e.node)
	}
	return fmt.Sprintf("pod %s on %s", e.addr, e.node)
}

// model is a set of objects, the plan of each node, and the addresses the
// model sends from and to.
type model struct {
	set   *objects.Set
	plans map[string]*NodePlan
	// egress reads a plan's FabricEgress; the model's own tests replace it.
	egress func(*NodePlan) []netip.Prefix
	nodes  map[string]*corev1.Node
	eps    []*endpoint
	byAddr map[netip.Addr]*endpoint
	// fabricRoutes names the sites whose fabric also routes every node's
	// podCIDRs to that node (a cloud route table, flannel's host-gw).
	fabricRoutes map[string]bool
}

// unmanagedPods places another CNI's pods: node name -> addresses.
type unmanagedPods struct {
	declared, undeclared map[string][]netip.Addr
}

// newModel computes every node's plan (a node whose plan fails has none,
// and the caller counts) and lists the endpoints: every node's host, a pod
// (.2) in each IPv4 podCIDR, other CNIs' pods where pods places them, and
// for each site the last address of its first nodeCidr when no node holds
// it (a joining node).
func newModel(set *objects.Set, pods unmanagedPods) (*model, []error) {
	f := &model{set: set, plans: map[string]*NodePlan{}, egress: func(p *NodePlan) []netip.Prefix { return p.FabricEgress }, nodes: map[string]*corev1.Node{}, byAddr: map[netip.Addr]*endpoint{}}
	var errs []error
	add := func(e *endpoint, also ...netip.Addr) {
		f.eps = append(f.eps, e)
		for _, a := range append([]netip.Addr{e.addr}, also...) {
			if a.IsValid() {
				f.byAddr[a] = e
			}
		}
	}
	for i := range set.Nodes {
		n := &set.Nodes[i]
		f.nodes[n.Name] = n
		st := set.SiteOf(n)
		p, err := Compute(set, n.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f.plans[n.Name] = p
		add(&endpoint{kind: epHost, node: n.Name, site: st.Name, addr: p.Underlay}, p.TunnelAddr)
		for _, pfx := range p.PodCIDRs {
			if pfx.Addr().Is4() && pfx.Bits() <= 30 {
				add(&endpoint{kind: epPod, node: n.Name, site: st.Name, addr: pfx.Addr().Next().Next()})
			}
		}
		for _, a := range pods.declared[n.Name] {
			add(&endpoint{kind: epDeclaredPod, node: n.Name, site: st.Name, addr: a, dialOnly: !fabricReturn(st)})
		}
		for _, a := range pods.undeclared[n.Name] {
			add(&endpoint{kind: epUndeclaredPod, node: n.Name, site: st.Name, addr: a, dialOnly: true})
		}
	}
	for _, st := range set.Sites {
		if len(st.Spec.NodeCIDRs) == 0 {
			continue
		}
		pfx, err := netip.ParsePrefix(string(st.Spec.NodeCIDRs[0]))
		if err != nil || !pfx.Addr().Is4() || pfx.Bits() > 30 {
			continue
		}
		last := lastHost(pfx.Masked())
		if _, held := f.byAddr[last]; !held {
			add(&endpoint{kind: epJoining, site: st.Name, addr: last})
		}
	}
	return f, errs
}

// lastHost is the address below the broadcast address of an IPv4 prefix.
func lastHost(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(a).Prev()
}

// connected reports whether pods of sites a and b are meant to reach each
// other: one site, a SitePeering with meshNodes, or a
// SiteGatewayPoolAssignment naming both.
// underlayBlind reports whether an assignment joining sites a and b says
// their underlays do not reach each other's node addresses
// (underlayReachesNodes false): a node not in the objects yet has no agent
// and no tunnel, so nothing across reaches it until it joins.
func (f *model) underlayBlind(a, b string) bool {
	for _, as := range f.set.SiteGatewayPoolAssignments {
		if !as.Spec.ReachesNodesOnUnderlay() && slices.Contains(as.Spec.Sites, a) && slices.Contains(as.Spec.Sites, b) {
			return true
		}
	}
	return false
}

func (f *model) connected(a, b string) bool {
	if a == b {
		return true
	}
	for _, sp := range f.set.SitePeerings {
		if sp.Spec.MeshesNodes() && slices.Contains(sp.Spec.Sites, a) && slices.Contains(sp.Spec.Sites, b) {
			return true
		}
	}
	for _, as := range f.set.SiteGatewayPoolAssignments {
		if slices.Contains(as.Spec.Sites, a) && slices.Contains(as.Spec.Sites, b) {
			return true
		}
	}
	return false
}

// kernelRoute is the device node p's kernel sends a packet from src to dst
// out of (and the route it took): the FabricEgress rule first (table 202:
// the ViaFabric routes, TransitOnly included, out of the underlay device,
// where the datapath tunnels it to the route's gateway), then the rule of
// TunnelSources (table 201: TransitOnly routes too, but NotForPods), then the main table
// (the routes but TransitOnly); no route is the underlay. entered is the
// device a flow entered the node on for one of the node's own addresses (its
// packets carry the agent's mark for it), "" for any other flow: both rules
// pass over a flow that entered on the underlay device, the FabricEgress rule
// over one that entered on isthmus0.
func (m *model) kernelRoute(p *NodePlan, src, dst netip.Addr, entered string) (string, Route) {
	if entered == devUnderlay {
		if r, ok := lookup(p, dst, false); ok {
			return devTunnel, r
		}
		return devUnderlay, Route{}
	}
	if inPrefixes(m.egress(p), src) && entered != devTunnel {
		// Table 202: the ViaFabric routes, and a throw route for every other
		// route inside one.
		if r, ok := lookup(p, dst, true); ok && r.ViaFabric {
			return devFabric, r
		}
	}
	if inPrefixes(p.TunnelSources, src) {
		var best Route
		found := false
		for _, r := range p.Routes {
			if !r.NotForPods && r.Prefix.Contains(dst) && (!found || r.Prefix.Bits() > best.Prefix.Bits()) {
				best, found = r, true
			}
		}
		if found {
			return devTunnel, best
		}
	}
	if r, ok := lookup(p, dst, false); ok {
		return devTunnel, r
	}
	return devUnderlay, Route{}
}

// rpDevice is the device strict rp_filter on p's node expects a packet from
// src to dst to arrive on: the one it routes a reply from dst to src out of
// (with the packet's mark: src_valid_mark on the underlay device).
func (m *model) rpDevice(p *NodePlan, src, dst netip.Addr, entered string) string {
	if dev, _ := m.kernelRoute(p, dst, src, entered); dev != devFabric {
		return dev
	}
	return devUnderlay
}

// nextHops are the peers a route sends to: its peer, or every member of its
// group (each flow hashes to one; the model walks each).
func nextHops(r Route) []string {
	if r.Group == nil {
		return []string{r.Peer}
	}
	var out []string
	for _, h := range r.Group {
		out = append(out, h.Peer)
	}
	return out
}

type packet struct{ src, dst netip.Addr }

func (p packet) String() string { return fmt.Sprintf("%s -> %s", p.src, p.dst) }

// natEntry is a return-path SNAT translation: node rewrote orig to
// translated for a flow to remote.
type natEntry struct {
	node                     string
	orig, translated, remote netip.Addr
}

// arrival is one way a walk ended: delivered to ep as pkt on dev, or failed.
type arrival struct {
	ep    *endpoint
	pkt   packet
	dev   string
	nat   *natEntry // the translation the walk made on the way, if any
	trace []string
	fail  string
}

// walkState is what a branch of a walk carries: its trace, the translation
// it made, how many tunnel legs it took.
type walkState struct {
	trace []string
	nat   *natEntry
	legs  int
}

func (s walkState) then(format string, args ...any) walkState {
	s.trace = append(slices.Clip(s.trace), fmt.Sprintf(format, args...))
	return s
}

func (s walkState) fail(format string, args ...any) []arrival {
	return []arrival{{trace: s.trace, nat: s.nat, fail: fmt.Sprintf(format, args...)}}
}

// walker follows packets through a fleet. reverse is the translation of the
// request a reply answers: the node that made it translates the reply back.
type walker struct {
	f       *model
	reverse *natEntry
}

// send is from's packet p: a host that opens a flow takes the source its
// route gives (the tunnel address into isthmus0, else its InternalIP); a
// reply keeps the address the request reached.
func (w *walker) send(from *endpoint, p packet, reply bool) []arrival {
	st := walkState{}.then("%s sends %s", from, p)
	if from.kind == epJoining {
		return w.underlay(from.site, p, st)
	}
	np := w.f.plans[from.node]
	if np == nil {
		return st.fail("%s has no plan", from.node)
	}
	if from.kind == epHost && !reply {
		p.src = hostSource(np, p.dst)
		st = st.then("from %s (the route's source)", p.src)
	}
	return w.route(np, p, p.src, "", st)
}

// hostSource is the source np's kernel gives a packet of its own to dst
// from a socket bound to no address: the route's src, the tunnel address
// for a route into isthmus0 unless it is UnderlaySource, else the
// InternalIP.
func hostSource(np *NodePlan, dst netip.Addr) netip.Addr {
	if r, ok := lookup(np, dst, false); ok && np.TunnelAddr.IsValid() && !r.UnderlaySource {
		return np.TunnelAddr
	}
	return np.Underlay
}

// route is np's kernel routing p, whose source was routeSrc when the kernel
// chose its route (a reply's source before the un-DNAT rewrites it in
// POSTROUTING), and the device it leaves by.
func (w *walker) route(np *NodePlan, p packet, routeSrc netip.Addr, entered string, st walkState) []arrival {
	dev, r := w.f.kernelRoute(np, routeSrc, p.dst, entered)
	switch dev {
	case devTunnel:
		return w.encap(np, p, st.then("%s routes it into isthmus0 (%s)", np.Node, r.Prefix))
	case devFabric:
		// fabric_egress: tunnelled as it leaves the underlay device, with
		// its own source (a declared pod: SNAT-exempt).
		var out []arrival
		for _, g := range nextHops(r) {
			out = append(out, w.decap(g, np.Node, p, st.then("%s routes it to the underlay and tunnels it there to gateway %s (FabricEgress, %s)", np.Node, g, r.Prefix))...)
		}
		return out
	}
	return w.underlay(np.Site, p, st.then("%s sends it on the underlay", np.Node))
}

// encap is the datapath of np's node encapsulating p (pod_ingress or
// overlay_egress): the datapath's routes (TransitOnly included) pick the
// next hops, return-path SNAT translates a source that is neither the
// host's own nor exempt.
func (w *walker) encap(np *NodePlan, p packet, st walkState) []arrival {
	r, ok := lookup(np, p.dst, true)
	if !ok {
		return st.fail("%s's datapath has no route for %s", np.Node, p.dst)
	}
	host := p.src == np.Underlay || p.src == np.TunnelAddr
	if !host && np.SNAT.Addr.IsValid() && !slices.ContainsFunc(np.SNAT.Exempt, func(e ExemptSource) bool { return e.Prefix.Contains(p.src) }) {
		st.nat = &natEntry{node: np.Node, orig: p.src, translated: np.SNAT.Addr, remote: p.dst}
		st = st.then("%s translates %s to %s (return-path SNAT)", np.Node, p.src, np.SNAT.Addr)
		p.src = np.SNAT.Addr
	}
	var out []arrival
	for _, h := range nextHops(r) {
		out = append(out, w.decap(h, np.Node, p, st.then("%s tunnels it to %s (%s)", np.Node, h, r.Prefix))...)
	}
	return out
}

// decap is node at receiving p tunnelled from peer from: the peer's allowed
// sources, transit on a gateway, then delivery to the node's own addresses
// (isthmus0), or to its site's fabric.
func (w *walker) decap(at, from string, p packet, st walkState) []arrival {
	st.legs++
	if st.legs > 8 {
		return st.fail("loop")
	}
	np := w.f.plans[at]
	if np == nil {
		return st.fail("tunnelled to %s, which has no plan", at)
	}
	i := slices.IndexFunc(np.Peers, func(pr Peer) bool { return pr.Name == from })
	if i < 0 {
		return st.fail("%s has no peer %s", at, from)
	}
	// A tunnel opens when one end has an address for the other: a gateway
	// behind a NAT (no Underlay) is reached at the endpoint WireGuard learns
	// from its own packets, so two such gateways never meet.
	if fp := w.f.plans[from]; fp != nil && !np.Peers[i].Underlay.IsValid() {
		if j := slices.IndexFunc(fp.Peers, func(pr Peer) bool { return pr.Name == at }); j >= 0 && !fp.Peers[j].Underlay.IsValid() {
			return st.fail("%s and %s have no address for each other (both behind NATs): no tunnel between them", from, at)
		}
	}
	if !inPrefixes(np.Peers[i].AllowedSources, p.src) {
		return st.fail("%s does not accept source %s from %s", at, p.src, from)
	}
	if np.Gateway {
		if r, ok := lookup(np, p.dst, true); ok {
			var out []arrival
			for _, h := range nextHops(r) {
				if h == from {
					out = append(out, st.fail("%s would send it back to %s (DROP_TRANSIT_LOOP)", at, from)...)
					continue
				}
				out = append(out, w.decap(h, at, p, st.then("%s transits it to %s (%s)", at, h, r.Prefix))...)
			}
			return out
		}
	}
	if rv := w.reverse; rv != nil && rv.node == at && p.dst == rv.translated && p.src == rv.remote {
		st = st.then("%s translates %s back to %s", at, p.dst, rv.orig)
		p.dst = rv.orig
	}
	if ep := w.f.byAddr[p.dst]; ep != nil && ep.node == at {
		if ep.kind == epHost && p.dst != np.Underlay && p.dst != np.TunnelAddr {
			return st.fail("%s is no address of %s's host", p.dst, at)
		}
		return w.deliver(ep, np, p, devTunnel, st.then("%s decapsulates it for itself", at))
	}
	if inPrefixes(np.FabricPrefixes, p.dst) {
		return w.siteFabric(np.Site, at, p, st.then("%s hands it to the fabric of %s", at, np.Site))
	}
	return st.fail("%s has no route, no address and no fabric prefix for %s (DROP_NOT_LOCAL)", at, p.dst)
}

// siteFabric is the fabric of site carrying p from node from to the node
// of the site that holds its destination.
func (w *walker) siteFabric(site, from string, p packet, st walkState) []arrival {
	ep := w.f.byAddr[p.dst]
	if ep == nil || ep.site != site || ep.node == from {
		return st.fail("the fabric of %s delivers %s to no other node", site, p.dst)
	}
	if ep.kind == epHost && p.dst != ep.addr && !(w.f.fabricRoutes[site] && w.f.inPodCIDRs(ep.node, p.dst)) {
		return st.fail("the fabric of %s does not route %s, a tunnel address", site, p.dst)
	}
	return w.arrive(ep, p, st)
}

// inPodCIDRs reports whether a lies in one of node's podCIDRs.
func (f *model) inPodCIDRs(node string, a netip.Addr) bool {
	p := f.plans[node]
	return p != nil && inPrefixes(p.PodCIDRs, a)
}

// underlay is a plain packet leaving a node (or a joining node) of site:
// the underlay routes every node's InternalIP, joining nodes' included, and
// a site's fabric the pods of another CNI in it, and every node's podCIDRs
// where it has fabric routes. Nothing else.
func (w *walker) underlay(site string, p packet, st walkState) []arrival {
	ep := w.f.byAddr[p.dst]
	switch {
	case ep == nil:
		return st.fail("nothing on the underlay holds %s", p.dst)
	case ep.kind == epHost && p.dst == ep.addr, ep.kind == epJoining:
	case (ep.kind == epDeclaredPod || ep.kind == epUndeclaredPod) && ep.site == site:
	case w.f.fabricRoutes[site] && ep.site == site && w.f.inPodCIDRs(ep.node, p.dst):
	default:
		return st.fail("the underlay of %s does not route %s (%s)", site, p.dst, ep)
	}
	return w.arrive(ep, p, st)
}

// arrive is a plain packet for ep arriving on its node's underlay device:
// fabric ingress moves it into isthmus0 when it is for a pod in the node's
// FabricPrefixes, the datapath routes its source, and the frame comes from
// the site router: the node reaches the route's next hop (slot 0 of a
// group: any member) through it, which holds for a next hop in another
// site only (one of its own site is on the site's L2).
func (w *walker) arrive(ep *endpoint, p packet, st walkState) []arrival {
	if ep.kind == epJoining {
		return []arrival{{ep: ep, pkt: p, dev: devUnderlay, nat: st.nat, trace: st.then("joining node %s receives it", ep.addr).trace}}
	}
	np := w.f.plans[ep.node]
	if np == nil {
		return st.fail("%s has no plan", ep.node)
	}
	if ep.kind == epHost || !inPrefixes(np.FabricPrefixes, p.dst) {
		return w.deliver(ep, np, p, devUnderlay, st.then("%s receives it on the underlay", ep.node))
	}
	r, ok := lookup(np, p.src, true)
	if !ok {
		return w.deliver(ep, np, p, devUnderlay, st.then("%s receives it on the underlay (no route for the source: no fabric ingress)", ep.node))
	}
	if r.ViaFabric {
		return w.deliver(ep, np, p, devUnderlay, st.then("%s receives it on the underlay (its source's route is ViaFabric: no fabric ingress)", ep.node))
	}
	var out []arrival
	seen := map[string]bool{}
	for _, h := range nextHops(r) {
		dev := devUnderlay
		if hn := w.f.nodes[h]; hn != nil && w.f.set.SiteOf(hn) != nil && w.f.set.SiteOf(hn).Name != np.Site {
			dev = devTunnel
		}
		if seen[dev] {
			continue
		}
		seen[dev] = true
		out = append(out, w.deliver(ep, np, p, dev, st.then("%s receives it on the underlay; fabric ingress (next hop %s for %s) leaves it on %s", ep.node, h, p.src, dev))...)
	}
	return out
}

// deliver is p entering the stack of np's node on dev, for ep: strict
// rp_filter passes when the node routes a reply (from p.dst to p.src) out
// of dev.
func (w *walker) deliver(ep *endpoint, np *NodePlan, p packet, dev string, st walkState) []arrival {
	if want := w.f.rpDevice(np, p.src, p.dst, ""); want != dev {
		return st.fail("strict rp_filter on %s drops it: it arrives on %s, and %s routes %s (from %s) to %s", np.Node, dev, np.Node, p.src, p.dst, want)
	}
	return []arrival{{ep: ep, pkt: p, dev: dev, nat: st.nat, trace: st.trace}}
}

// pairFailure is one way a pair fails.
type pairFailure struct {
	a, b  *endpoint
	what  string
	trace []string
}

// class names the kind of failure: the roles of both ends, how their sites
// are joined, which leg failed and why, without addresses.
func (m *model) class(pf pairFailure) string {
	why := "other"
	for _, c := range []string{"strict rp_filter", "does not route", "does not accept", "has no route", "DROP_NOT_LOCAL",
		"DROP_TRANSIT_LOOP", "does not take", "delivers", "delivered to", "loop", "has no plan", "has no peer"} {
		if strings.Contains(pf.what, c) {
			why = c
			break
		}
	}
	leg, _, _ := strings.Cut(pf.what, ":")
	return fmt.Sprintf("%s -> %s (%s), %s: %s", m.role(pf.a), m.role(pf.b), m.joined(pf.a.site, pf.b.site), leg, why)
}

// role is an endpoint's kind and its node's role, for class.
func (m *model) role(e *endpoint) string {
	kind := map[epKind]string{epHost: "host", epPod: "pod", epDeclaredPod: "declared pod", epUndeclaredPod: "undeclared pod", epJoining: "joining node"}[e.kind]
	if e.kind == epDeclaredPod && e.dialOnly {
		kind += " (returnPath SNAT)"
	}
	if p := m.plans[e.node]; p != nil && p.Gateway {
		return kind + " of a gateway"
	} else if p != nil && slices.ContainsFunc(p.Routes, func(r Route) bool { return r.Site != "" }) {
		return kind + " of a member"
	}
	return kind
}

// joined says how sites a and b are joined, for class.
func (m *model) joined(a, b string) string {
	switch {
	case a == b:
		return "one site"
	case slices.ContainsFunc(m.set.SitePeerings, func(sp v1alpha1.SitePeering) bool {
		return sp.Spec.MeshesNodes() && slices.Contains(sp.Spec.Sites, a) && slices.Contains(sp.Spec.Sites, b)
	}):
		return "meshed"
	case m.connected(a, b):
		return "through gateways"
	}
	return "not joined"
}

// describeModel is describeSet with each site's kind.
func describeModel(m *model) string {
	var b strings.Builder
	for _, st := range m.set.Sites {
		fmt.Fprintf(&b, "\n site %s manageCniPlugin %v returnPath %s nodeCidrs %v blocks %v localCidrs %v", st.Name, st.Spec.ManagesCNIPlugin(),
			st.Spec.ReturnPathOrDefault(), st.Spec.NodeCIDRs, blockPrefixes(&st), st.Spec.LocalCIDRs)
	}
	return b.String() + describeSet(m.set)
}

func (pf pairFailure) String() string {
	return fmt.Sprintf("%s -> %s: %s\n    %s", pf.a, pf.b, pf.what, strings.Join(pf.trace, "\n    "))
}

// checkPair walks a's request to b along every next hop, and b's reply
// (from the address b saw, to the address it saw) back along every next
// hop: each must reach its endpoint and pass strict rp_filter where it
// enters a stack.
func (f *model) checkPair(a, b *endpoint) []pairFailure {
	var out []pairFailure
	for _, req := range (&walker{f: f}).send(a, packet{src: a.addr, dst: b.addr}, false) {
		if req.fail != "" {
			out = append(out, pairFailure{a, b, "request: " + req.fail, req.trace})
			continue
		}
		if req.ep != b {
			out = append(out, pairFailure{a, b, fmt.Sprintf("request delivered to %s", req.ep), req.trace})
			continue
		}
		// A host's server on a socket bound to no address (a plain UDP
		// one) answers another host from the source its route back gives,
		// and the client takes only an answer from the address it asked.
		// (Pods are answered from the tunnel address, the source of every
		// host packet to a pod: docs/architecture.md, "Pods and node
		// addresses".)
		if b.kind == epHost && a.kind != epPod && a.kind != epDeclaredPod && a.kind != epUndeclaredPod {
			if src := hostSource(f.plans[b.node], req.pkt.src); src != req.pkt.dst {
				out = append(out, pairFailure{a, b, fmt.Sprintf("reply from an unbound socket: %s routes %s from %s, but the request reached %s", b.node, req.pkt.src, src, req.pkt.dst), req.trace})
			}
		}
		for _, rep := range (&walker{f: f, reverse: req.nat}).send(b, packet{src: req.pkt.dst, dst: req.pkt.src}, true) {
			trace := append(slices.Clip(req.trace), rep.trace...)
			if rep.fail != "" {
				out = append(out, pairFailure{a, b, "reply: " + rep.fail, trace})
			} else if rep.ep != a {
				out = append(out, pairFailure{a, b, fmt.Sprintf("reply delivered to %s", rep.ep), trace})
			}
		}
		if b.kind == epHost {
			for _, t := range f.eps {
				if t.node == b.node && t.kind != epHost {
					out = append(out, f.checkDNAT(a, b, t, req)...)
				}
			}
		}
	}
	return out
}

// checkDNAT walks a's request to b's host once more, as b's node DNATs it to
// its pod t (a NodePort or a hostPort with a local endpoint: kube-proxy,
// portmap): strict rp_filter checks it from a to t on the device it entered
// on, and t's reply is routed from t's address and leaves with the address
// the request reached (the un-DNAT in POSTROUTING, after routing). The flow
// carries the mark of the device it entered on (docs/agent.md, "Routes and
// rules").
func (f *model) checkDNAT(a, b, t *endpoint, req arrival) []pairFailure {
	np := f.plans[b.node]
	entered := req.dev
	st := walkState{trace: slices.Clip(req.trace)}.then("%s DNATs it to %s", b.node, t)
	what := "request DNATed to a pod of its node"
	if want := f.rpDevice(np, req.pkt.src, t.addr, entered); want != req.dev {
		return []pairFailure{{a, b, fmt.Sprintf("%s: strict rp_filter on %s drops it: it arrives on %s, and %s routes %s (from %s) to %s",
			what, np.Node, req.dev, np.Node, req.pkt.src, t.addr, want), st.trace}}
	}
	var out []pairFailure
	p := packet{src: req.pkt.dst, dst: req.pkt.src}
	w := &walker{f: f, reverse: req.nat}
	for _, rep := range w.route(np, p, t.addr, entered, st.then("%s answers %s, leaving as %s", t, p.dst, p.src)) {
		if rep.fail != "" {
			out = append(out, pairFailure{a, b, what + ", reply: " + rep.fail, rep.trace})
		} else if rep.ep != a {
			out = append(out, pairFailure{a, b, fmt.Sprintf("%s, reply delivered to %s", what, rep.ep), rep.trace})
		}
	}
	return out
}

// pairs lists the pairs the property covers: every two endpoints of one family on
// different nodes, pods only between connected sites, a joining node only
// with nodes' hosts (not across an assignment whose underlays do not reach
// node addresses: underlayBlind), a pod no remote site routes (dialOnly: another CNI's
// pod outside the declared blocks, or of a site with returnPath SNAT) only
// as the one that dials, and only pods: such a pod's packets take the
// overlay (and its return-path SNAT) only for the overlay's own routes; to
// a node address they leave as its own CNI lets them (its MASQUERADE), which
// isthmus neither does nor can see.
func (f *model) pairs() [][2]*endpoint {
	var out [][2]*endpoint
	for _, a := range f.eps {
		for _, b := range f.eps {
			joining := a.kind == epJoining || b.kind == epJoining
			hosts := (a.kind == epHost || a.kind == epJoining) && (b.kind == epHost || b.kind == epJoining)
			toNode := b.kind == epHost || b.kind == epJoining
			switch {
			case a == b, a.node != "" && a.node == b.node, b.dialOnly, a.dialOnly && toNode:
			case a.addr.Unmap().Is4() != b.addr.Unmap().Is4():
				// No flow crosses families (a pod's IPv4 address to a node's
				// IPv6 underlay address).
			case joining && (!hosts || a.kind == b.kind || f.underlayBlind(a.site, b.site)):
			case !hosts && !f.connected(a.site, b.site):
			default:
				out = append(out, [2]*endpoint{a, b})
			}
		}
	}
	return out
}

// check runs every pair of f and returns how many it walked and what failed.
func (f *model) check() (int, []pairFailure) {
	pairs := f.pairs()
	var fails []pairFailure
	for _, pr := range pairs {
		fails = append(fails, f.checkPair(pr[0], pr[1])...)
	}
	return len(pairs), fails
}

// randomFleet writes a random fleet and places its unmanaged pods: 2-4
// Sites of 1-4 nodes (InternalIPs 10.<s>.0.<n+1> in nodeCidrs
// 10.<s>.0.0/24, ExternalIPs 198.18.<s>.<n+1>), each managed (pods
// 10.<100+s>.0.0/16, a /24 podCIDR per node) or, one in three, unmanaged as
// seed 000's cluster (manageCniPlugin false, one in four with returnPath
// SNAT, declared block 10.<100+s>.0.0/20, localCidrs 10.<100+s>.0.0/16 and sometimes the
// nodeCidrs, nodes without podCIDR and with the tunnel-ipv4 annotation
// 100.64.<s>.<n+1>, a declared pod 10.<100+s>.0.<10+n> on each node and an
// undeclared one 10.<100+s>.200.<n+1> on some); 1-3 GatewayPools of random
// type selecting random nodes; random assignments (routeNodeCidrs on or
// off) and peerings (meshNodes on or off). Every node has a tunnel address,
// so every node has a plan: a fleet with fewer plans than nodes is a bug.
func randomFleet(r *rand.Rand) (docs []string, nodes int, pods unmanagedPods) {
	pods = unmanagedPods{declared: map[string][]netip.Addr{}, undeclared: map[string][]netip.Addr{}}
	sites := 2 + r.IntN(3)
	pools := 1 + r.IntN(3)
	for s := range sites {
		unmanaged := r.IntN(3) == 0
		if unmanaged {
			local := fmt.Sprintf("10.%d.0.0/16", 100+s)
			if r.IntN(2) == 0 {
				local += fmt.Sprintf(", 10.%d.0.0/24", s)
			}
			returnPath := "Fabric"
			if r.IntN(4) == 0 {
				returnPath = "SNAT"
			}
			docs = append(docs, site(fmt.Sprintf("s%d", s), fmt.Sprintf("10.%d.0.0/24", s), fmt.Sprintf("10.%d.0.0/20", 100+s),
				fmt.Sprintf("  manageCniPlugin: false\n  returnPath: %s\n  localCidrs: [%s]\n", returnPath, local)))
		} else {
			docs = append(docs, site(fmt.Sprintf("s%d", s), fmt.Sprintf("10.%d.0.0/24", s), fmt.Sprintf("10.%d.0.0/16", 100+s), ""))
		}
		for n := range 1 + r.IntN(4) {
			nodes++
			name := fmt.Sprintf("s%d-n%d", s, n)
			var labels []string
			for p := range pools {
				if r.IntN(2) == 0 {
					labels = append(labels, fmt.Sprintf("gw%d: y", p))
				}
			}
			spec, annotations := fmt.Sprintf("spec: {podCIDRs: [10.%d.%d.0/24]}\n", 100+s, n), ""
			if unmanaged {
				spec, annotations = "", fmt.Sprintf("  annotations: {isthmus.dev/tunnel-ipv4: 100.64.%d.%d}\n", s, n+1)
				pods.declared[name] = []netip.Addr{netip.AddrFrom4([4]byte{10, byte(100 + s), 0, byte(10 + n)})}
				if r.IntN(2) == 0 {
					pods.undeclared[name] = []netip.Addr{netip.AddrFrom4([4]byte{10, byte(100 + s), 200, byte(n + 1)})}
				}
			}
			docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %s
  labels: {%s}
%s%sstatus:
  addresses:
    - {type: InternalIP, address: 10.%d.0.%d}
    - {type: ExternalIP, address: 198.18.%d.%d}
`, name, strings.Join(labels, ", "), annotations, spec, s, n+1, s, n+1))
		}
	}
	docs = append(docs, randomJoins(r, sites, pools)...)
	return docs, nodes, pods
}

// seed000Pods places the pods of the seed000 and seed000gw labs: aks1-p1
// 10.0.2.128 on the first AKS node, aks2-p1 10.0.2.200 on the second, and
// the undeclared pod 10.0.4.10 of seed000 on the second.
func seed000Pods(aks1, aks2 string) unmanagedPods {
	return unmanagedPods{
		declared: map[string][]netip.Addr{
			aks1: {netip.MustParseAddr("10.0.2.128")},
			aks2: {netip.MustParseAddr("10.0.2.200")},
		},
		undeclared: map[string][]netip.Addr{aks2: {netip.MustParseAddr("10.0.4.10")}},
	}
}

// TestRepliesEnterOnRoutedDevice: for random fleets and the seed
// topologies, every request between two addresses (pods of podCIDRs, pods
// of another CNI in declared blocks and outside them, nodes' InternalIPs,
// and a joining node's address in a site's nodeCidrs that no Node holds)
// reaches its destination, and the reply, from the address the receiver
// saw to the address it saw, reaches the sender, each along every member
// of every next-hop group, and each enters every stack it enters on the
// device that node routes the packet's source to (strict rp_filter).
//
// The model, written from the docs' packet walks, not from the plan's code:
// devices per node are the underlay and isthmus0 ("tunnel"). A node's
// kernel routes a packet by its source: TunnelSources also see TransitOnly
// routes (table 201), FabricEgress the ViaFabric routes (table 202, out of
// the underlay, where the datapath tunnels it to the route's gateway), the rest
// the main table (no TransitOnly route); a hit goes into isthmus0, whose
// datapath picks the next hop from every route and translates a source
// outside the SNAT exemptions (a host opening a flow takes its route's
// source: its tunnel address into isthmus0 but on an UnderlaySource route,
// its InternalIP elsewhere). A host's answer to another host from a server
// bound to no address leaves from its route's source too, which must be
// the address the request reached. A tunnelled packet is
// taken only from a source the peer may send; a gateway transits what its
// routes hold; the node's own addresses are delivered into isthmus0; its
// FabricPrefixes go to its site's fabric, which delivers them on the
// underlay of the node that holds them, where fabric ingress moves them
// into isthmus0 only when the frame came from the site router (the
// source's next hop is in another site) and the source's route is not
// ViaFabric. The underlay
// routes node addresses and, within a site, another CNI's pods; nothing
// else. Forwarding in the datapath (transit, fabric hand-off) passes no
// rp_filter.
//
// It counts the plans and pairs it checked: a random fleet that yields
// fewer plans than nodes fails (every node there has a tunnel address).
func TestRepliesEnterOnRoutedDevice(t *testing.T) {
	const fleets = 200
	plansChecked, pairsWalked, failed := 0, 0, 0
	// Each class of failure once, from the smallest fleet that shows it.
	type example struct {
		count, nodes int
		seed         uint64
		pf           pairFailure
		m            *model
	}
	classes := map[string]*example{}
	for seed := range uint64(fleets) {
		docs, nodes, pods := randomFleet(rand.New(rand.NewPCG(seed, 20)))
		set, _ := objects.LoadSettingAside(map[string][]byte{"fleet.yaml": []byte(strings.Join(docs, "---\n"))})
		f, errs := newModel(set, pods)
		if len(set.Nodes) != nodes || len(f.plans) != nodes || len(f.plans) == 0 {
			t.Fatalf("seed %d: %d nodes written, %d loaded, %d plans: %v\nset: %s", seed, nodes, len(set.Nodes), len(f.plans), errs, describeSet(set))
		}
		plansChecked += len(f.plans)
		n, fails := f.check()
		pairsWalked += n
		if len(fails) > 0 {
			failed++
		}
		for _, pf := range fails {
			c := f.class(pf)
			ex := classes[c]
			if ex == nil {
				ex = &example{nodes: nodes + 1}
				classes[c] = ex
			}
			ex.count++
			if nodes < ex.nodes {
				ex.nodes, ex.seed, ex.pf, ex.m = nodes, seed, pf, f
			}
		}
	}
	for _, c := range slices.Sorted(maps.Keys(classes)) {
		ex := classes[c]
		t.Errorf("%s: %d pairs; in the smallest fleet, seed %d:\n%s\nfleet:%s", c, ex.count, ex.seed, ex.pf, describeModel(ex.m))
	}
	if failed > 0 {
		t.Errorf("%d of %d fleets have failing pairs", failed, fleets)
	}
	t.Logf("%d fleets: %d plans checked, %d pairs walked both ways", fleets, plansChecked, pairsWalked)
}

// TestRepliesEnterOnRoutedDeviceSeeds runs the model on the seed
// topologies: seed 000 mesh and gateway (with the labs' pods) and seed 003.
func TestRepliesEnterOnRoutedDeviceSeeds(t *testing.T) {
	seed000, warnings, err := objects.LoadDir("../objects/testdata/seed000")
	if err != nil || len(warnings) != 0 {
		t.Fatalf("load seed000: %v, warnings %v", err, warnings)
	}
	for _, tc := range []struct {
		name string
		set  *objects.Set
		pods unmanagedPods
	}{
		{"seed 000 mesh", seed000, seed000Pods("aks-nodepool1-0", "aks-nodepool1-1")},
		{"seed 000 gateway", seed000Gateway(t), seed000Pods("aks-1", "aks-2")},
		{"seed 003", seed003(t, nil), unmanagedPods{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, errs := newModel(tc.set, tc.pods)
			if len(errs) > 0 || len(f.plans) != len(tc.set.Nodes) {
				t.Fatalf("%d nodes, %d plans: %v", len(tc.set.Nodes), len(f.plans), errs)
			}
			n, fails := f.check()
			for _, pf := range fails {
				t.Errorf("%s\n    (%s)", pf, f.class(pf))
			}
			t.Logf("%d plans, %d pairs walked both ways, %d failures", len(f.plans), n, len(fails))
		})
	}
}

// TestReplyModelFabricEgress tests the model itself, on seed 000's gateway
// topology: the member aks-2's declared pod and the flex pod fail both ways
// on the plans without FabricEgress, as does flex-1's host dialling that pod
// (the gateway hands the flex site's packets to aks-2 on its underlay, and
// aks-2 routes them back into the tunnel); they pass with the cluster's
// declared block as the FabricEgress of aks-1 and aks-2 (only aks-2 has
// ViaFabric routes), the path docs/gateways.md gives members of such a site. The gateway aks-1's pod
// and the flex pod pass either way. So the model tells the two apart, and
// its property can be met.
func TestReplyModelFabricEgress(t *testing.T) {
	block := netip.MustParsePrefix("10.0.2.0/23")
	for _, tc := range []struct {
		name     string
		egress   func(*NodePlan) []netip.Prefix
		wantFail bool
	}{
		{"no FabricEgress", func(*NodePlan) []netip.Prefix { return nil }, true},
		{"the declared block as FabricEgress", func(p *NodePlan) []netip.Prefix {
			if p.Site == "cluster" {
				return []netip.Prefix{block}
			}
			return nil
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, errs := newModel(seed000Gateway(t), seed000Pods("aks-1", "aks-2"))
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			m.egress = tc.egress
			ep := func(a string) *endpoint { return m.byAddr[netip.MustParseAddr(a)] }
			member, gateway := ep("10.0.2.200"), ep("10.0.2.128")
			flexPod, flexHost := ep("192.168.20.2"), ep("192.168.10.10")
			for _, pr := range [][2]*endpoint{{member, flexPod}, {flexPod, member}, {flexHost, member}} {
				if fails := m.checkPair(pr[0], pr[1]); (len(fails) > 0) != tc.wantFail {
					t.Errorf("%s -> %s: %d failures, want failures %v: %v", pr[0], pr[1], len(fails), tc.wantFail, fails)
				}
			}
			for _, pr := range [][2]*endpoint{{gateway, flexPod}, {flexPod, gateway}} {
				if fails := m.checkPair(pr[0], pr[1]); len(fails) > 0 {
					t.Errorf("%s -> %s: %v", pr[0], pr[1], fails)
				}
			}
		})
	}
}
