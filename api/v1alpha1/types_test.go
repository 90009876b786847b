package v1alpha1

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestDefaults(t *testing.T) {
	no, yes := false, true
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"manageCniPlugin unset", (&SiteSpec{}).ManagesCNIPlugin(), true},
		{"manageCniPlugin false", (&SiteSpec{ManageCNIPlugin: &no}).ManagesCNIPlugin(), false},
		{"returnPath unset", (&SiteSpec{}).ReturnPathOrDefault(), ReturnPathFabric},
		{"returnPath SNAT", (&SiteSpec{ReturnPath: ReturnPathSNAT}).ReturnPathOrDefault(), ReturnPathSNAT},
		{"meshNodes unset", (&SitePeeringSpec{}).MeshesNodes(), true},
		{"meshNodes false", (&SitePeeringSpec{MeshNodes: &no}).MeshesNodes(), false},
		{"meshNodes true", (&SitePeeringSpec{MeshNodes: &yes}).MeshesNodes(), true},
		{"tunnelProtocol unset", (&SitePeeringSpec{}).Protocol(), TunnelGENEVE},
		{"routeNodeCidrs unset", (&SiteGatewayPoolAssignmentSpec{}).RoutesNodeCIDRs(), true},
		{"routeNodeCidrs false", (&SiteGatewayPoolAssignmentSpec{RouteNodeCIDRs: &no}).RoutesNodeCIDRs(), false},
		{"underlayReachesNodes unset", (&SiteGatewayPoolAssignmentSpec{}).ReachesNodesOnUnderlay(), true},
		{"underlayReachesNodes false", (&SiteGatewayPoolAssignmentSpec{UnderlayReachesNodes: &no}).ReachesNodesOnUnderlay(), false},
		{"assignmentEnabled unset, managed", (&PodCIDRAssignment{}).AssignsIn(&SiteSpec{}), true},
		{"assignmentEnabled unset, unmanaged", (&PodCIDRAssignment{}).AssignsIn(&SiteSpec{ManageCNIPlugin: &no}), false},
		{"assignmentEnabled true, unmanaged", (&PodCIDRAssignment{AssignmentEnabled: &yes}).AssignsIn(&SiteSpec{ManageCNIPlugin: &no}), true},
		{"assignmentEnabled false, managed", (&PodCIDRAssignment{AssignmentEnabled: &no}).AssignsIn(&SiteSpec{}), false},
		{"nodeBlockSizes unset", fmt.Sprint((&PodCIDRAssignment{}).BlockSizes()), "24 64"},
		{"nodeBlockSizes ipv4 only", fmt.Sprint((&PodCIDRAssignment{NodeBlockSizes: &NodeBlockSizes{IPv4: 25}}).BlockSizes()), "25 64"},
		{"nodeBlockSizes both", fmt.Sprint((&PodCIDRAssignment{NodeBlockSizes: &NodeBlockSizes{IPv4: 26, IPv6: 80}}).BlockSizes()), "26 80"},
		{"tunnelProtocol set", (&SitePeeringSpec{TunnelProtocol: "VXLAN"}).Protocol(), TunnelProtocol("VXLAN")},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestDeepCopyIsDeep(t *testing.T) {
	enabled := true
	s := &Site{Spec: SiteSpec{
		NodeCIDRs:          []CIDR{"10.0.0.0/27"},
		PodCIDRAssignments: []PodCIDRAssignment{{CIDRBlocks: []CIDR{"10.0.2.0/23"}, AssignmentEnabled: &enabled, NodeBlockSizes: &NodeBlockSizes{IPv4: 25}}},
	}}
	c := s.DeepCopy()
	c.Spec.NodeCIDRs[0] = "x"
	c.Spec.PodCIDRAssignments[0].CIDRBlocks[0] = "x"
	*c.Spec.PodCIDRAssignments[0].AssignmentEnabled = false
	c.Spec.PodCIDRAssignments[0].NodeBlockSizes.IPv4 = 1
	a := s.Spec.PodCIDRAssignments[0]
	if s.Spec.NodeCIDRs[0] != "10.0.0.0/27" || a.CIDRBlocks[0] != "10.0.2.0/23" || !*a.AssignmentEnabled || a.NodeBlockSizes.IPv4 != 25 {
		t.Errorf("changing the copy changed the original: %+v", s.Spec)
	}
}

func TestGatewayDeepCopyIsDeep(t *testing.T) {
	no := false
	p := &GatewayPool{Spec: GatewayPoolSpec{
		Type:         GatewayPoolInternal,
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gw": "yes"}},
		RoutedCIDRs:  []CIDR{"10.0.2.0/23"},
	}}
	c := p.DeepCopy()
	c.Spec.NodeSelector.MatchLabels["gw"] = "no"
	c.Spec.RoutedCIDRs[0] = "x"
	if p.Spec.NodeSelector.MatchLabels["gw"] != "yes" || p.Spec.RoutedCIDRs[0] != "10.0.2.0/23" {
		t.Errorf("changing the copy changed the original pool: %+v", p.Spec)
	}
	a := &SiteGatewayPoolAssignment{Spec: SiteGatewayPoolAssignmentSpec{
		Sites: []string{"a", "b"}, GatewayPools: []string{"p"}, RouteNodeCIDRs: &no, UnderlayReachesNodes: &no,
	}}
	d := a.DeepCopy()
	d.Spec.Sites[0], d.Spec.GatewayPools[0] = "x", "x"
	*d.Spec.RouteNodeCIDRs, *d.Spec.UnderlayReachesNodes = true, true
	if a.Spec.Sites[0] != "a" || a.Spec.GatewayPools[0] != "p" || *a.Spec.RouteNodeCIDRs || *a.Spec.UnderlayReachesNodes {
		t.Errorf("changing the copy changed the original assignment: %+v", a.Spec)
	}
}

func TestAddToScheme(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{KindSite, KindSitePeering, KindGatewayPool, KindSiteGatewayPoolAssignment,
		"SiteList", "SitePeeringList", "GatewayPoolList", "SiteGatewayPoolAssignmentList"} {
		if !scheme.Recognizes(GroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not recognize %s", kind)
		}
	}
}
