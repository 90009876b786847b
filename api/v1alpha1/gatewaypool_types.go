package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// GatewayPoolType says which address of a gateway remote gateways tunnel to.
//
// +kubebuilder:validation:Enum=Internal;External
type GatewayPoolType string

const (
	// GatewayPoolInternal gateways are reached by their InternalIP: the sites
	// share a routed underlay.
	GatewayPoolInternal GatewayPoolType = "Internal"
	// GatewayPoolExternal gateways are reached by their ExternalIP, such as a
	// cloud public address in front of a NAT.
	GatewayPoolExternal GatewayPoolType = "External"
)

// GatewayPool picks the gateway nodes through which sites that do not mesh
// reach each other (docs/gateways.md).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=isthmus
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="RoutedCIDRs",type=string,JSONPath=`.spec.routedCidrs`
// +kubebuilder:printcolumn:name="Gateways",type=integer,JSONPath=`.status.gateways`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GatewayPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec GatewayPoolSpec `json:"spec"`
	// +optional
	Status GatewayPoolStatus `json:"status,omitempty"`
}

// GatewayPoolSpec says which nodes are gateways, how remote gateways reach
// them, and what else lies behind them.
type GatewayPoolSpec struct {
	// Type is Internal (gateways are reached by their InternalIP) or External
	// (by their ExternalIP).
	Type GatewayPoolType `json:"type"`

	// NodeSelector picks the gateway nodes, in any site. It must select
	// something specific: an empty selector would make every node a gateway.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector"`

	// RoutedCIDRs are extra prefixes reachable through the pool's gateways,
	// such as an Azure pod subnet. Remote sites route them to the pool's
	// gateways in each site of an assignment where the pool has gateways.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	RoutedCIDRs []CIDR `json:"routedCidrs,omitempty"`
}

// GatewayPoolList is a list of GatewayPools.
//
// +kubebuilder:object:root=true
type GatewayPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GatewayPool `json:"items"`
}

// SiteGatewayPoolAssignment says that its sites reach each other through the
// gateways of its pools: members of a site send to the site's gateways, and
// the gateways of different sites tunnel to each other.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=isthmus
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Sites",type=string,JSONPath=`.spec.sites`
// +kubebuilder:printcolumn:name="Pools",type=string,JSONPath=`.spec.gatewayPools`
// +kubebuilder:printcolumn:name="Encryption",type=string,JSONPath=`.spec.encryption`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SiteGatewayPoolAssignment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SiteGatewayPoolAssignmentSpec `json:"spec"`
	// +optional
	Status ObjectStatus `json:"status,omitempty"`
}

// SiteGatewayPoolAssignmentSpec names the sites and the pools that join them.
type SiteGatewayPoolAssignmentSpec struct {
	// Sites are the names of the joined Sites; every one of them needs a
	// gateway of one of the pools.
	//
	// +kubebuilder:validation:MinItems=2
	// +listType=set
	Sites []string `json:"sites"`

	// GatewayPools are the names of the GatewayPools whose gateways carry the
	// traffic between the sites.
	//
	// +kubebuilder:validation:MinItems=1
	// +listType=set
	GatewayPools []string `json:"gatewayPools"`

	// RouteNodeCIDRs is true (the default) when each remote site's nodeCidrs
	// are routed through the gateways too, so nodes reach remote nodes'
	// addresses. The tunnel endpoints inside them are always cut out.
	//
	// +optional
	// +kubebuilder:default=true
	RouteNodeCIDRs *bool `json:"routeNodeCidrs,omitempty"`

	// UnderlayReachesNodes is true (the default) when the sites' underlays
	// reach each other's node addresses: a node's own traffic to a remote
	// node's address then stays on the underlay both ways, and only what it
	// forwards (its pods', a gateway's transit) takes the gateways. False
	// declares that the underlay reaches only the gateways' tunnel
	// endpoints: host traffic to the remote sites' nodeCidrs then goes
	// through the gateways too, in both directions, from the node's tunnel
	// address. False needs routeNodeCidrs true.
	//
	// +optional
	// +kubebuilder:default=true
	UnderlayReachesNodes *bool `json:"underlayReachesNodes,omitempty"`

	// Encryption protects the tunnels between gateways of different sites
	// of the assignment: None (the default) or WireGuard. A member's tunnel
	// to a gateway of its own site is not encrypted.
	//
	// +optional
	// +kubebuilder:default=None
	Encryption Encryption `json:"encryption,omitempty"`
}

// EncryptionOrDefault reports spec.encryption with its default (None) applied.
func (s *SiteGatewayPoolAssignmentSpec) EncryptionOrDefault() Encryption {
	return encryptionOrDefault(s.Encryption)
}

// Encrypts reports whether spec.encryption asks for WireGuard.
func (s *SiteGatewayPoolAssignmentSpec) Encrypts() bool {
	return s.Encryption == EncryptionWireGuard
}

// ReachesNodesOnUnderlay reports spec.underlayReachesNodes with its default
// (true) applied.
func (s *SiteGatewayPoolAssignmentSpec) ReachesNodesOnUnderlay() bool {
	return s.UnderlayReachesNodes == nil || *s.UnderlayReachesNodes
}

// RoutesNodeCIDRs reports spec.routeNodeCidrs with its default (true) applied.
func (s *SiteGatewayPoolAssignmentSpec) RoutesNodeCIDRs() bool {
	return s.RouteNodeCIDRs == nil || *s.RouteNodeCIDRs
}

// SiteGatewayPoolAssignmentList is a list of SiteGatewayPoolAssignments.
//
// +kubebuilder:object:root=true
type SiteGatewayPoolAssignmentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SiteGatewayPoolAssignment `json:"items"`
}
