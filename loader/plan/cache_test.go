package plan

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// TestCacheEqualsCompute checks that a Cache's plans equal Compute's exactly
// (routes with their origins, peers, warnings, corrections, errors) over
// random sequences of changes: Nodes added, removed, given another podCIDR
// or none, labelled and unlabelled; Sites given and losing localCidrs;
// pools changing type and routedCidrs (short ones too, which make the Cache
// aggregate everything); assignments routing nodeCidrs or not, losing and
// regaining sites; peerings meshing or not. Starting points are the random
// topologies of the symmetry test and small mesh and hub fleets. Every node
// has its own Cache, which sees every snapshot, as an agent's does.
func TestCacheEqualsCompute(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 5))
	starts := map[string]func() objects.Objects{}
	for i := range 24 {
		starts[fmt.Sprintf("random-%d", i)] = func() objects.Objects { return objectsOf(randomTopology(r)) }
	}
	for _, topo := range []fleet.Topology{fleet.Mesh, fleet.Hub} {
		starts[string(topo)] = func() objects.Objects {
			in, err := fleet.Objects(fleet.Shape{Sites: 4, NodesPerSite: 6, Topology: topo})
			if err != nil {
				t.Fatal(err)
			}
			return in
		}
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range starts {
			if !yield(k) {
				return
			}
		}
	}) {
		in := starts[name]()
		caches := map[string]*Cache{}
		reused := 0
		for step := range 60 {
			what := "start"
			if step > 0 {
				what = editObjects(r, &in)
			}
			set, _ := objects.ValidateSettingAside(in)
			for i := range set.Nodes {
				node := set.Nodes[i].Name
				if caches[node] == nil {
					caches[node] = NewCache()
				}
				c := caches[node]
				want, wantErr := Compute(set, node)
				got, gotErr := c.Compute(set, node)
				if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
					t.Fatalf("%s step %d (%s), node %s: Cache error %v, Compute error %v", name, step, what, node, gotErr, wantErr)
				}
				if !got.Equal(want) {
					t.Fatalf("%s step %d (%s), node %s: Cache plan differs from Compute's\ncache:   %+v\ncompute: %+v", name, step, what, node, got.Routes, want.Routes)
				}
				reused += c.reused
			}
		}
		if reused == 0 {
			t.Errorf("%s: no chunk was reused: the test checks nothing", name)
		}
	}
}

// objectsOf returns the objects of set (deep copies).
func objectsOf(set *objects.Set) objects.Objects {
	var in objects.Objects
	for i := range set.Sites {
		in.Sites = append(in.Sites, *set.Sites[i].DeepCopy())
	}
	for i := range set.SitePeerings {
		in.SitePeerings = append(in.SitePeerings, *set.SitePeerings[i].DeepCopy())
	}
	for i := range set.GatewayPools {
		in.GatewayPools = append(in.GatewayPools, *set.GatewayPools[i].DeepCopy())
	}
	for i := range set.SiteGatewayPoolAssignments {
		in.SiteGatewayPoolAssignments = append(in.SiteGatewayPoolAssignments, *set.SiteGatewayPoolAssignments[i].DeepCopy())
	}
	for i := range set.Nodes {
		in.Nodes = append(in.Nodes, *set.Nodes[i].DeepCopy())
	}
	return in
}

// editObjects makes one random change to in (to copies of the objects it
// changes: earlier snapshots keep theirs) and says what it did.
func editObjects(r *rand.Rand, in *objects.Objects) string {
	pick := func(n int) int { return r.IntN(max(n, 1)) }
	randomIn := func(c v1alpha1.CIDR, bits int) netip.Prefix {
		pfx := netip.MustParsePrefix(string(c))
		a := pfx.Addr().As4()
		for i := pfx.Bits() / 8; i < bits/8 && i < 4; i++ {
			a[i] = byte(r.IntN(256))
		}
		if bits == 32 {
			a[3] = byte(1 + r.IntN(254))
		}
		return netip.PrefixFrom(netip.AddrFrom4(a), bits).Masked()
	}
	if len(in.Sites) == 0 {
		return "nothing to edit"
	}
	in.Sites, in.Nodes = slices.Clone(in.Sites), slices.Clone(in.Nodes)
	site := &in.Sites[pick(len(in.Sites))]
	switch k := r.IntN(10); {
	case k == 0 || k == 1:
		n := corev1.Node{}
		n.Name = fmt.Sprintf("new-%d", r.IntN(1<<20))
		n.Labels = map[string]string{}
		ip := randomIn(site.Spec.NodeCIDRs[0], 32).Addr()
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
		pod := randomIn(site.Spec.PodCIDRAssignments[0].CIDRBlocks[0], 24).String()
		n.Spec.PodCIDR, n.Spec.PodCIDRs = pod, []string{pod}
		in.Nodes = append(in.Nodes, n)
		return "add Node " + n.Name
	case k == 2 && len(in.Nodes) > 0:
		i := pick(len(in.Nodes))
		name := in.Nodes[i].Name
		in.Nodes = slices.Delete(in.Nodes, i, i+1)
		return "remove Node " + name
	case k == 3 && len(in.Nodes) > 0:
		n := &in.Nodes[pick(len(in.Nodes))]
		*n = *n.DeepCopy()
		if r.IntN(4) == 0 {
			n.Spec.PodCIDR, n.Spec.PodCIDRs = "", nil
			return "drop the podCIDR of " + n.Name
		}
		pod := randomIn(site.Spec.PodCIDRAssignments[0].CIDRBlocks[0], 24).String()
		n.Spec.PodCIDR, n.Spec.PodCIDRs = pod, []string{pod}
		return "podCIDR " + pod + " for " + n.Name
	case k == 4 && len(in.Nodes) > 0 && len(in.GatewayPools) > 0:
		n := &in.Nodes[pick(len(in.Nodes))]
		*n = *n.DeepCopy()
		pool := in.GatewayPools[pick(len(in.GatewayPools))]
		for key, v := range pool.Spec.NodeSelector.MatchLabels {
			if n.Labels[key] == v {
				delete(n.Labels, key)
				return "unlabel " + n.Name
			}
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[key] = v
		}
		return "label " + n.Name
	case k == 5:
		*site = *site.DeepCopy()
		if len(site.Spec.LocalCIDRs) > 0 {
			site.Spec.LocalCIDRs = nil
			return "Site " + site.Name + " without localCidrs"
		}
		local := randomIn(site.Spec.PodCIDRAssignments[0].CIDRBlocks[0], 24)
		site.Spec.LocalCIDRs = []v1alpha1.CIDR{v1alpha1.CIDR(local.String())}
		return "Site " + site.Name + " localCidrs " + local.String()
	case k == 6 && len(in.GatewayPools) > 0:
		in.GatewayPools = slices.Clone(in.GatewayPools)
		pool := &in.GatewayPools[pick(len(in.GatewayPools))]
		*pool = *pool.DeepCopy()
		switch r.IntN(4) {
		case 0:
			pool.Spec.Type = map[v1alpha1.GatewayPoolType]v1alpha1.GatewayPoolType{
				v1alpha1.GatewayPoolExternal: v1alpha1.GatewayPoolInternal}[pool.Spec.Type]
			if pool.Spec.Type == "" {
				pool.Spec.Type = v1alpha1.GatewayPoolExternal
			}
		case 1:
			pool.Spec.RoutedCIDRs = []v1alpha1.CIDR{v1alpha1.CIDR(fmt.Sprintf("192.168.%d.0/24", r.IntN(4)))}
		case 2:
			// Halves of a chunk, which merge inside it, and the
			// neighbouring chunk, which the merged /16 merges with.
			pool.Spec.RoutedCIDRs = []v1alpha1.CIDR{"192.168.0.0/17", "192.168.128.0/17", "192.169.0.0/16"}
		default:
			pool.Spec.RoutedCIDRs = []v1alpha1.CIDR{"192.160.0.0/12", "192.168.0.0/17"} // shorter than a chunk, and one inside
		}
		return "GatewayPool " + pool.Name
	case k == 7 && len(in.SiteGatewayPoolAssignments) > 0:
		in.SiteGatewayPoolAssignments = slices.Clone(in.SiteGatewayPoolAssignments)
		a := &in.SiteGatewayPoolAssignments[pick(len(in.SiteGatewayPoolAssignments))]
		*a = *a.DeepCopy()
		if r.IntN(2) == 0 {
			on := !a.Spec.RoutesNodeCIDRs()
			a.Spec.RouteNodeCIDRs = &on
		} else if i := slices.Index(a.Spec.Sites, site.Name); i >= 0 {
			a.Spec.Sites = slices.Delete(a.Spec.Sites, i, i+1)
		} else {
			a.Spec.Sites = append(a.Spec.Sites, site.Name)
		}
		return "SiteGatewayPoolAssignment " + a.Name
	case k == 8 && len(in.SitePeerings) > 0:
		in.SitePeerings = slices.Clone(in.SitePeerings)
		sp := &in.SitePeerings[pick(len(in.SitePeerings))]
		*sp = *sp.DeepCopy()
		on := !sp.Spec.MeshesNodes()
		sp.Spec.MeshNodes = &on
		return "SitePeering " + sp.Name
	}
	return "no change"
}
