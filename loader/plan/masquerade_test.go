package plan

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

// masqSet: three managed sites, a and b meshed, c peered with nobody; a has
// nonMasqueradeCIDRs and a node with an annotated tunnel address outside its
// podCIDR.
func masqSet(t *testing.T) *objects.Set {
	return load(t,
		site("a", "172.16.1.0/24", "10.244.0.0/16", "  nonMasqueradeCIDRs: [203.0.113.128/25, 198.51.100.7/32]\n"),
		site("b", "172.16.2.0/24", "10.245.0.0/16", ""),
		site("c", "172.16.3.0/24", "10.246.0.0/16", ""),
		peering("ab", "a, b", ""),
		node("a1", "172.16.1.11", "10.244.1.0/24"),
		annotated("a2", "172.16.1.12", "10.244.2.0/24", "100.64.0.12"),
		node("b1", "172.16.2.11", "10.245.1.0/24"),
		node("c1", "172.16.3.11", "10.246.1.0/24"),
	)
}

// masqOracle lists, straight from the objects, the prefixes a pod of node's
// site reaches with its own address: the site's nonMasqueradeCIDRs, and for
// the site and every site a SitePeering or SiteGatewayPoolAssignment names
// with it, the nodeCidrs, pod blocks, node podCIDRs and tunnel addresses; and
// every route of the plan (routedCidrs).
func masqOracle(set *objects.Set, p *NodePlan) []netip.Prefix {
	var out []netip.Prefix
	self := set.Site(p.Site)
	for _, c := range self.Spec.NonMasqueradeCIDRs {
		out = append(out, netip.MustParsePrefix(string(c)))
	}
	sites := map[string]bool{p.Site: true}
	for _, sp := range set.SitePeerings {
		if slices.Contains(sp.Spec.Sites, p.Site) {
			for _, s := range sp.Spec.Sites {
				sites[s] = true
			}
		}
	}
	for _, a := range set.SiteGatewayPoolAssignments {
		if slices.Contains(a.Spec.Sites, p.Site) {
			for _, s := range a.Spec.Sites {
				sites[s] = true
			}
		}
	}
	for name := range sites {
		s := set.Site(name)
		for _, c := range s.Spec.NodeCIDRs {
			out = append(out, netip.MustParsePrefix(string(c)))
		}
		for _, a := range s.Spec.PodCIDRAssignments {
			for _, c := range a.CIDRBlocks {
				out = append(out, netip.MustParsePrefix(string(c)))
			}
		}
		for _, n := range set.NodesOf(name) {
			for _, c := range n.Spec.PodCIDRs {
				out = append(out, netip.MustParsePrefix(c))
			}
			if a, _, ok := objects.TunnelAddr(n); ok {
				out = append(out, netip.PrefixFrom(a, 32))
			}
		}
	}
	for _, r := range p.Routes {
		out = append(out, r.Prefix)
	}
	return out
}

func exemptPrefixes(es []ExemptSource) []netip.Prefix {
	var out []netip.Prefix
	for _, e := range es {
		out = append(out, e.Prefix)
	}
	return out
}

// TestMasqueradeProperty: on every node of managed sites (meshed, through
// gateways), an address is exempt from masquerade exactly when the oracle
// holds it, probed at random and at the edges of every prefix of every site
// (the unconnected site's included); the exempt list is sorted, IPv4, with an
// origin each, and no entry covers another.
func TestMasqueradeProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 4))
	for name, set := range map[string]*objects.Set{"mesh": masqSet(t), "seed003": seed003(t, nil)} {
		for _, n := range set.Nodes {
			p, err := Compute(set, n.Name)
			if err != nil {
				t.Fatalf("%s %s: %v", name, n.Name, err)
			}
			m := p.Masquerade
			if m.Addr != p.Underlay || m.Reason != "" {
				t.Fatalf("%s %s: masquerade to %v (%q), want the underlay %v", name, n.Name, m.Addr, m.Reason, p.Underlay)
			}
			exempt := exemptPrefixes(m.Exempt)
			for i, e := range m.Exempt {
				if !e.Prefix.Addr().Is4() || e.Origin == "" || e.Prefix != e.Prefix.Masked() {
					t.Errorf("%s %s: entry %+v", name, n.Name, e)
				}
				if i > 0 && comparePrefix(exempt[i-1], e.Prefix) >= 0 {
					t.Errorf("%s %s: %v before %v: not sorted", name, n.Name, exempt[i-1], e.Prefix)
				}
				for j, o := range exempt {
					if i != j && o.Bits() <= e.Prefix.Bits() && o.Contains(e.Prefix.Addr()) {
						t.Errorf("%s %s: %v covers %v", name, n.Name, o, e.Prefix)
					}
				}
			}
			want := masqOracle(set, p)
			var all []netip.Prefix
			for _, s := range set.Sites {
				for _, c := range s.Spec.NodeCIDRs {
					all = append(all, netip.MustParsePrefix(string(c)))
				}
				for _, a := range s.Spec.PodCIDRAssignments {
					for _, c := range a.CIDRBlocks {
						all = append(all, netip.MustParsePrefix(string(c)))
					}
				}
			}
			addrs := probes(r, append(append(all, want...), netip.MustParsePrefix("203.0.113.0/24")))
			for range 300 {
				addrs = append(addrs, netip.AddrFrom4([4]byte{byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}))
			}
			for _, a := range addrs {
				if got, w := oracleContains(exempt, a), oracleContains(want, a); got != w {
					t.Errorf("%s %s: %v exempt %v, oracle says %v", name, n.Name, a, got, w)
				}
			}
		}
	}
}

// TestMasqueradeExamples: the policy of a1 in masqSet names its entries'
// origins, keeps the world (203.0.113.10) and site c out, and an unmanaged
// site has none.
func TestMasqueradeExamples(t *testing.T) {
	p, err := Compute(masqSet(t), "a1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range p.Masquerade.Exempt {
		got = append(got, e.Prefix.String()+" "+e.Origin)
	}
	want := []string{
		`10.244.0.0/16 Site "a" spec.podCidrAssignments[0].cidrBlocks[0]`,
		`10.245.0.0/16 Site "b" spec.podCidrAssignments[0].cidrBlocks[0]`,
		`100.64.0.12/32 Node "a2" metadata.annotations["isthmus.dev/tunnel-ipv4"]`,
		`172.16.1.0/24 Site "a" spec.nodeCidrs[0]`,
		`172.16.2.0/24 Site "b" spec.nodeCidrs[0]`,
		`198.51.100.7/32 Site "a" spec.nonMasqueradeCIDRs[1]`,
		`203.0.113.128/25 Site "a" spec.nonMasqueradeCIDRs[0]`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("exempt:\n%s\nwant:\n%s", fmtList(got), fmtList(want))
	}

	u, err := Compute(seedExtraNodes(t), "aks-nodepool1-0")
	if err != nil {
		t.Fatal(err)
	}
	if u.Masquerade.Addr.IsValid() || len(u.Masquerade.Exempt) != 0 || u.Masquerade.Reason == "" {
		t.Errorf("unmanaged site: masquerade %+v, want none with a reason", u.Masquerade)
	}
}
