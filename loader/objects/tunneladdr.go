package objects

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// fieldAddr is an address field of one object, for collision checks.
type fieldAddr struct {
	file, object, field string
	addr                netip.Addr
}

func (f fieldAddr) describe() string {
	return inFile(fmt.Sprintf("%s %s %s", f.object, f.field, f.addr), f.file)
}

// checkTunnelAddrs validates every node's tunnel address (see TunnelAddr)
// against the other address plans. It must be an IPv4 unicast address, never
// a node's underlay address (peers would route a tunnel endpoint into the
// tunnel), unique, and never an address a pod may get: inside another node's
// podCIDR, inside any Site's pod blocks (another CNI, or a node block carved
// later, may hand it out), or in the node's own podCIDR other than its first
// address (which IPAM leaves to the node).
func (l *loader) checkTunnelAddrs(podCIDRs, cidrBlocks []fieldPrefix) {
	tunnels := make([]fieldAddr, 0, len(l.nodes))
	underlayAt := make(map[netip.Addr][]fieldAddr, len(l.nodes))
	for _, e := range l.nodes {
		for _, u := range l.factsOf(e).underlays {
			underlayAt[u.addr] = append(underlayAt[u.addr], u)
		}
	}
	for _, e := range l.nodes {
		f := l.factsOf(e)
		l.addErrors(f.tunnelErrs)
		t, annotated, ok := f.tunnel, f.tunnelAnnotated, f.tunnelOK
		if !ok {
			continue
		}
		tunnels = append(tunnels, t)
		// Formatted only for a message: this loop runs for every node.
		what := func() string {
			if !annotated {
				return fmt.Sprintf("tunnel address %s (the first address of %s)", t.addr, t.field)
			}
			return fmt.Sprintf("tunnel address %s", t.addr)
		}
		for _, u := range underlayAt[t.addr] {
			l.errorf(t.file, t.object, t.field, "%s is an underlay address: %s", what(), u.describe())
		}
		if !annotated {
			continue // a podCIDR's first address: the podCIDR overlap checks cover it
		}
		inOwn := false
		for _, p := range podCIDRs {
			if !p.prefix.Contains(t.addr) {
				continue
			}
			if p.object != t.object {
				l.errorf(t.file, t.object, t.field, "%s is inside %s", what(), p.describe())
				continue
			}
			inOwn = true
			if first, _ := firstHost(p.prefix); first != t.addr {
				l.errorf(t.file, t.object, t.field, "%s is a pod address of the node's own %s %s: use %s (its first address, the default) or an address outside every pod block", what(), p.field, p.prefix, first)
			}
		}
		for _, b := range cidrBlocks {
			if !inOwn && b.prefix.Contains(t.addr) {
				l.errorf(t.file, t.object, t.field, "%s is inside a pod block, where a pod may get it: %s", what(), b.describe())
			}
		}
	}
	earlier := make(map[netip.Addr][]fieldAddr, len(tunnels))
	for _, a := range tunnels {
		for _, b := range earlier[a.addr] {
			l.errorf(a.file, a.object, a.field, "tunnel address %s is also the tunnel address of %s", a.addr, b.describe())
		}
		earlier[a.addr] = append(earlier[a.addr], a)
	}
}

// underlaysOf returns the Node's valid InternalIPs and ExternalIPs.
func underlaysOf(e entry[corev1.Node]) []fieldAddr {
	var out []fieldAddr
	for i, a := range e.obj.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, fieldAddr{e.file, e.label, fieldIndex("status.addresses", i), ip.Unmap()})
		}
	}
	return out
}

// tunnelAddrOf returns the node's tunnel address as TunnelAddr picks it, and
// whether it came from the annotation. An annotation that is not an IPv4
// unicast address is reported here and gives no address.
func (l *loader) tunnelAddrOf(e entry[corev1.Node]) (t fieldAddr, annotated, ok bool) {
	if s, set := e.obj.Annotations[v1alpha1.AnnotationTunnelIPv4]; set {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil || !a.Is4():
			l.errorf(e.file, e.label, TunnelAddrField, "%q is not an IPv4 address", s)
			return t, true, false
		case a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			l.errorf(e.file, e.label, TunnelAddrField, "%s is not a unicast address a peer can route to", a)
			return t, true, false
		case l.rules.TunnelCIDR.IsValid() && !l.rules.TunnelCIDR.Contains(a):
			l.errorf(e.file, e.label, TunnelAddrField, "%s is outside the tunnel CIDR %s (--tunnel-cidr): a node may not claim an address outside it", a, l.rules.TunnelCIDR)
			return t, true, false
		}
		return fieldAddr{e.file, e.label, TunnelAddrField, a}, true, true
	}
	for _, f := range PodCIDRFields(e.obj) {
		if a, ok := firstHost(f.Prefix); ok {
			return fieldAddr{e.file, e.label, f.Field, a}, false, true
		}
	}
	return t, false, false
}
