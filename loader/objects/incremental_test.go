package objects_test

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// TestValidatorIncrementalEqualsFull: over random sequences of Node adds,
// removes and edits (valid ones, and ones that overlap, collide, break an
// address or an annotation, leave a site without a gateway), with the Sites
// and pools now and then changed too, a Validator fed snapshot after
// snapshot returns what a full ValidateSettingAside of each snapshot
// returns: the same Set, the same objects set aside for the same reasons in
// the same order, the same warnings. Every edit bumps the Node's
// resourceVersion, as the API server does.
func TestValidatorIncrementalEqualsFull(t *testing.T) {
	steps, rejecting := 0, 0
	for _, topo := range []fleet.Topology{fleet.Mesh, fleet.Hub} {
		sh := fleet.Shape{Sites: 3, NodesPerSite: 6, Topology: topo}
		for seed := range uint64(40) {
			r := rand.New(rand.NewPCG(seed, 12))
			in, err := fleet.Objects(sh)
			if err != nil {
				t.Fatal(err)
			}
			version := 0
			bump := func(n *corev1.Node) {
				version++
				n.ResourceVersion = strconv.Itoa(version)
			}
			for i := range in.Nodes {
				bump(&in.Nodes[i])
			}
			v := objects.NewValidator(objects.Rules{TunnelCIDR: netip.MustParsePrefix("100.64.0.0/16")})
			for step := range 30 {
				what := edit(r, sh, &in, bump)
				got, gotWarns := v.ValidateSettingAside(in)
				want, wantWarns := objects.Rules{TunnelCIDR: netip.MustParsePrefix("100.64.0.0/16")}.ValidateSettingAside(in)
				steps++
				if len(want.Rejected) > 0 {
					rejecting++
				}
				if reflect.DeepEqual(want, got) && reflect.DeepEqual(wantWarns, gotWarns) {
					continue // cmp.Diff is slow; it only explains a difference
				}
				if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
					t.Fatalf("%s seed %d step %d (%s): incremental Set differs from full (-full +incremental):\n%s", topo, seed, step, what, d)
				}
				if d := cmp.Diff(wantWarns, gotWarns, cmpopts.EquateEmpty()); d != "" {
					t.Fatalf("%s seed %d step %d (%s): warnings differ (-full +incremental):\n%s", topo, seed, step, what, d)
				}
				t.Fatalf("%s seed %d step %d (%s): results differ only in nil and empty slices", topo, seed, step, what)
			}
		}
	}
	// The sequences must exercise setting aside, not only valid fleets.
	if rejecting < steps/4 {
		t.Errorf("only %d of %d snapshots set an object aside", rejecting, steps)
	}
	t.Logf("%d snapshots, %d with objects set aside", steps, rejecting)
}

// edit makes one random change to in and says what it was.
func edit(r *rand.Rand, sh fleet.Shape, in *objects.Objects, bump func(*corev1.Node)) string {
	pick := func() *corev1.Node {
		if len(in.Nodes) == 0 {
			return nil
		}
		return &in.Nodes[r.IntN(len(in.Nodes))]
	}
	other := func() string { // another node's podCIDR or address, or a fresh one
		s, n := r.IntN(sh.Sites), r.IntN(sh.NodesPerSite+3)
		return fleet.PodCIDR(s, n).String()
	}
	switch k := r.IntN(12); k {
	case 0, 1: // add a Node, maybe a duplicate of a podCIDR or an address
		s, n := r.IntN(sh.Sites), sh.NodesPerSite+r.IntN(4)
		node := fleet.Node(sh, s, n)
		if r.IntN(3) == 0 {
			node.Spec.PodCIDR, node.Spec.PodCIDRs = other(), nil
		}
		if r.IntN(4) == 0 {
			node.Status.Addresses[0].Address = fleet.InternalIP(r.IntN(sh.Sites), r.IntN(sh.NodesPerSite)).String()
		}
		// Created earlier or later than the fleet: the first created wins a conflict.
		node.CreationTimestamp = metav1.NewTime(time.Unix(int64(r.IntN(3)), 0))
		bump(&node)
		in.Nodes = append(in.Nodes, node)
		return "add " + node.Name
	case 2: // remove a Node
		if n := pick(); n != nil {
			name := n.Name
			in.Nodes = slices.DeleteFunc(in.Nodes, func(x corev1.Node) bool { return x.Name == name })
			return "remove " + name
		}
	case 3, 4: // change a podCIDR: fresh, another's, host bits, invalid, none
		if n := pick(); n != nil {
			pod := []string{other(), "10.250." + strconv.Itoa(r.IntN(250)) + ".7/24", "10.0.0.0/33", ""}[r.IntN(4)]
			n.Spec.PodCIDR, n.Spec.PodCIDRs = pod, nil
			if pod != "" && r.IntN(2) == 0 {
				n.Spec.PodCIDRs = []string{pod}
			}
			bump(n)
			return "podCIDR of " + n.Name + " to " + pod
		}
	case 5: // label or unlabel a gateway
		if n := pick(); n != nil {
			n.Labels = map[string]string{}
			if r.IntN(2) == 0 {
				n.Labels[fleet.LabelGateway] = fleet.SiteName(r.IntN(sh.Sites))
			}
			bump(n)
			return "labels of " + n.Name
		}
	case 6, 7: // a tunnel annotation: inside the tunnel CIDR, outside it, taken, not an address
		if n := pick(); n != nil {
			a := []string{"100.64.0." + strconv.Itoa(1+r.IntN(3)), "192.0.2.1", "nonsense", "10.0.0.1"}[r.IntN(4)]
			n.Annotations = map[string]string{v1alpha1.AnnotationTunnelIPv4: a}
			if r.IntN(3) == 0 {
				n.Annotations = nil
			}
			bump(n)
			return "tunnel annotation of " + n.Name + " to " + a
		}
	case 8: // an address: invalid, another node's, none, an ExternalIP
		if n := pick(); n != nil {
			switch r.IntN(4) {
			case 0:
				n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "300.1.1.1"}}
			case 1:
				n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fleet.InternalIP(r.IntN(sh.Sites), r.IntN(sh.NodesPerSite)).String()}}
			case 2:
				n.Status.Addresses = nil
			default:
				n.Status.Addresses = append(slices.Clone(n.Status.Addresses), corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113." + strconv.Itoa(r.IntN(250))})
			}
			bump(n)
			return "addresses of " + n.Name
		}
	case 9: // a Site's nodeCidrs or pod blocks: another's, or its own again
		i := r.IntN(len(in.Sites))
		s := in.Sites[i].DeepCopy()
		j := r.IntN(sh.Sites)
		if r.IntN(2) == 0 {
			s.Spec.NodeCIDRs = []v1alpha1.CIDR{v1alpha1.CIDR(netip.PrefixFrom(fleet.InternalIP(j, 0), 20).Masked().String())}
		} else {
			s.Spec.PodCIDRAssignments[0].CIDRBlocks = []v1alpha1.CIDR{v1alpha1.CIDR(netip.PrefixFrom(fleet.PodCIDR(j, 0).Addr(), 16).String())}
		}
		in.Sites = slices.Clone(in.Sites)
		in.Sites[i] = *s
		return "site " + s.Name
	case 10: // remove or restore a GatewayPool
		if len(in.GatewayPools) > 0 && r.IntN(2) == 0 {
			in.GatewayPools = slices.Clone(in.GatewayPools[1:])
			return "remove a pool"
		}
		return "nothing"
	default: // the same snapshot again
		return "no change"
	}
	return "nothing"
}
