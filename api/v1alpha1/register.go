package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group of every isthmus resource.
const Group = "isthmus.dev"

// GroupVersion is isthmus.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: "v1alpha1"}

// Kind names as they appear in manifests.
const (
	KindSite                      = "Site"
	KindSitePeering               = "SitePeering"
	KindGatewayPool               = "GatewayPool"
	KindSiteGatewayPoolAssignment = "SiteGatewayPoolAssignment"
)

var (
	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds Site, SitePeering, GatewayPool,
	// SiteGatewayPoolAssignment and their lists to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&Site{}, &SiteList{},
		&SitePeering{}, &SitePeeringList{},
		&GatewayPool{}, &GatewayPoolList{},
		&SiteGatewayPoolAssignment{}, &SiteGatewayPoolAssignmentList{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
