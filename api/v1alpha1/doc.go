// Package v1alpha1 holds the isthmus.dev/v1alpha1 resource types: Site,
// SitePeering, GatewayPool and SiteGatewayPoolAssignment.
//
// Field names follow the manifests users already run (see DESIGN.md), so an
// existing Site or SitePeering carries over with only apiVersion changed. All
// resources are cluster-scoped. Defaults are declared as kubebuilder markers for
// CRD generation and applied by the accessor methods (ManagesCNIPlugin,
// MeshesNodes, Protocol, RoutesNodeCIDRs, ReachesNodesOnUnderlay), because objects read from files
// never pass through an API server that would fill them in.
//
// +kubebuilder:object:generate=true
// +groupName=isthmus.dev
package v1alpha1
