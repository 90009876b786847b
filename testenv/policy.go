package testenv

import (
	"net/netip"
	"slices"
)

// Directions of a pod policy (Pod.Ingress, Pod.Egress).
const (
	PolicyIngress = "ingress"
	PolicyEgress  = "egress"
)

// PolicyCase is one pod policy direction as CheckPolicy probes it: where the
// site's filter judges it and which pod pairs that isthmus carries it denies and
// lets through. Scenario.PolicyCases derives them.
type PolicyCase struct {
	// Pod and Dir name the policy: Pod's Ingress or Egress.
	Pod, Dir string
	// Node and Chain are where the policy is judged: the pod's node, and the
	// chain FORWARD jumps to for its interface (isl-tw-<pod> for ingress,
	// isl-fw-<pod> for egress; writePolicyChain).
	Node, Chain string
	// Denied is the first pair (source, destination) through this policy that it
	// denies; empty when it denies none that isthmus carries.
	Denied [2]string
	// Control is a pair that no policy denies, sharing the source of Denied (or
	// else its destination), that isthmus carries: Denied's probes sent there
	// must arrive, so that a probe that arrives nowhere cannot pass as "denied".
	// Empty when Denied is, or when no such pair exists.
	Control [2]string
	// Revoke is the TCP flow CheckPolicy revokes: Revoke[0] sends the data the
	// policy judges, Revoke[1] receives it. Its first pair through this policy
	// that every policy allows, else the pair Denied, whose flow is then opened
	// from the other end (RevokeReverse). Empty when neither exists.
	Revoke [2]string
	// RevokeReverse says Revoke[1] opens the flow (its first packets are replies
	// the policy accepts as ESTABLISHED, as Calico's chains do), since the policy
	// denies Revoke[0] opening it.
	RevokeReverse bool
	// RevokeMatch are the iptables arguments that match Revoke's sender (its
	// address as the judging node sees it: -s <source>/32 for ingress, -d
	// <destination>/32 for egress).
	RevokeMatch []string
}

// policyChain returns the filter chain of a pod's policy in one direction, as
// writePolicyChain names it.
func policyChain(dir, pod string) string {
	prefix := "isl-tw-"
	if dir == PolicyEgress {
		prefix = "isl-fw-"
	}
	chain := prefix + pod
	if len(chain) > 28 {
		chain = chain[:28]
	}
	return chain
}

// denies reports whether pol drops addr: in a Deny prefix and in no Allow one
// (Allow is checked first). A nil policy denies nothing.
func (pol *Policy) denies(addr netip.Addr) bool {
	if pol == nil {
		return false
	}
	in := func(ps []netip.Prefix) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(addr) })
	}
	return !in(pol.Allow) && in(pol.Deny)
}

// PolicyDenies reports whether the policies of the pair's two pods drop a flow
// that src opens to dst, given expectation e of the pair: dst's Ingress by the
// source address dst sees (e.Saw), src's Egress by dst's address.
func (s *Scenario) PolicyDenies(e Expectation) bool {
	src, _ := s.pod(e.Src)
	dst, _ := s.pod(e.Dst)
	return dst.Ingress.denies(e.Saw) || src.Egress.denies(dst.Address)
}

// isthmusCarries reports whether isthmus' datapath carries traffic between the
// two pods: they sit on different nodes, and not in one site whose fabric routes
// the pair itself (both pods another CNI's, or a site with FabricRoutes).
func (s *Scenario) isthmusCarries(a, b PodRef) bool {
	if a.Node == b.Node {
		return false
	}
	if a.Site != b.Site {
		return true
	}
	for _, site := range s.Sites {
		if site.Name == a.Site && site.FabricRoutes {
			return false
		}
	}
	return !a.Unmanaged || !b.Unmanaged
}

// PolicyCases returns a PolicyCase for every pod policy direction of the scenario
// (Pod.Ingress, Pod.Egress), in scenario order, ingress first. Only pairs that
// should talk (Expectations) and that isthmus carries are considered: the pairs
// a site's own fabric carries are the kernel's business, not the datapath's.
func (s *Scenario) PolicyCases() []PolicyCase {
	var carried []Expectation
	for _, e := range s.Expectations() {
		src, _ := s.pod(e.Src)
		dst, _ := s.pod(e.Dst)
		if s.isthmusCarries(src, dst) {
			carried = append(carried, e)
		}
	}
	allowed := func(src, dst string) bool {
		for _, e := range carried {
			if e.Src == src && e.Dst == dst {
				return !s.PolicyDenies(e)
			}
		}
		return false
	}
	var out []PolicyCase
	for _, p := range s.Pods() {
		for _, dir := range []string{PolicyIngress, PolicyEgress} {
			pol := p.Ingress
			if dir == PolicyEgress {
				pol = p.Egress
			}
			if pol == nil {
				continue
			}
			c := PolicyCase{Pod: p.Name, Dir: dir, Node: p.Node, Chain: policyChain(dir, p.Name)}
			var firstAllowed *Expectation
			for _, e := range carried {
				var judged bool
				var peer netip.Addr
				if dir == PolicyIngress {
					judged, peer = e.Dst == p.Name, e.Saw
				} else {
					judged, peer = e.Src == p.Name, s.mustPod(e.Dst).Address
				}
				if !judged {
					continue
				}
				if pol.denies(peer) {
					if c.Denied == [2]string{} {
						c.Denied = [2]string{e.Src, e.Dst}
					}
				} else if firstAllowed == nil && !s.PolicyDenies(e) {
					firstAllowed = &e
				}
			}
			if c.Denied != [2]string{} {
				for _, e := range carried {
					if e.Src == c.Denied[0] && e.Dst != c.Denied[1] && !s.PolicyDenies(e) {
						c.Control = [2]string{e.Src, e.Dst}
						break
					}
				}
				if c.Control == [2]string{} {
					for _, e := range carried {
						if e.Dst == c.Denied[1] && e.Src != c.Denied[0] && !s.PolicyDenies(e) {
							c.Control = [2]string{e.Src, e.Dst}
							break
						}
					}
				}
			}
			switch {
			case firstAllowed != nil:
				c.Revoke = [2]string{firstAllowed.Src, firstAllowed.Dst}
			case c.Denied != [2]string{} && allowed(c.Denied[1], c.Denied[0]):
				c.Revoke, c.RevokeReverse = c.Denied, true
			}
			if c.Revoke != [2]string{} {
				e, _ := s.Expect(c.Revoke[0], c.Revoke[1])
				if dir == PolicyIngress {
					c.RevokeMatch = []string{"-s", netip.PrefixFrom(e.Saw, 32).String()}
				} else {
					c.RevokeMatch = []string{"-d", netip.PrefixFrom(s.mustPod(c.Revoke[1]).Address, 32).String()}
				}
			}
			out = append(out, c)
		}
	}
	return out
}

// mustPod returns the named pod, which the caller knows exists.
func (s *Scenario) mustPod(name string) PodRef {
	p, _ := s.pod(name)
	return p
}
