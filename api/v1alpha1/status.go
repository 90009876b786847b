package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Condition types written on the status of isthmus objects. Each is a
// metav1.Condition in status.conditions, keyed by type.
const (
	// ConditionReady is True when the object is valid and in effect: for a
	// Site, every node of the site has what it needs (its site label, a
	// podCIDR where assignment is enabled, a tunnel address otherwise).
	ConditionReady = "Ready"
	// ConditionPoolExhausted is True on a Site when a node of the site should
	// get a podCIDR and every pool it may take one from is full; the message
	// names the nodes.
	ConditionPoolExhausted = "PoolExhausted"
	// ConditionInvalid is True when the object fails the validation that
	// objects.Validate runs (overlapping or invalid CIDRs, unknown sites or
	// pools); the message names the objects and fields involved.
	ConditionInvalid = "Invalid"
)

// Condition reasons used with the condition types above. Reasons are
// CamelCase, as metav1.Condition requires.
const (
	ReasonValid          = "Valid"
	ReasonInvalid        = "Invalid"
	ReasonNodesReady     = "NodesReady"
	ReasonNodesPending   = "NodesPending"
	ReasonPoolExhausted  = "PoolExhausted"
	ReasonPoolsAvailable = "PoolsAvailable"
	// ReasonInEffect: a GatewayPool, SitePeering or SiteGatewayPoolAssignment
	// passed validation and the agents plan with it.
	ReasonInEffect = "InEffect"
	// ReasonNoGateways: a GatewayPool that selects no Node.
	ReasonNoGateways = "NoGateways"
)

// SiteStatus is what the controller last observed and did for a Site.
type SiteStatus struct {
	// ObservedGeneration is the metadata.generation of the Site the status
	// was computed from.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions are Ready, PoolExhausted and Invalid.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Nodes is the number of Nodes whose InternalIP lies in the site's
	// nodeCidrs.
	//
	// +optional
	Nodes int32 `json:"nodes,omitempty"`

	// PodCIDRsAssigned is the number of the site's Nodes whose podCIDR lies in
	// one of the site's podCidrAssignments.
	//
	// +optional
	PodCIDRsAssigned int32 `json:"podCidrsAssigned,omitempty"`

	// TunnelAddresses is the number of the site's Nodes that carry a tunnel
	// address annotation (isthmus.dev/tunnel-ipv4).
	//
	// +optional
	TunnelAddresses int32 `json:"tunnelAddresses,omitempty"`
}

// ObjectStatus is the status of a SitePeering or SiteGatewayPoolAssignment:
// whether the controller found it valid.
type ObjectStatus struct {
	// ObservedGeneration is the metadata.generation of the object the status
	// was computed from.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions are Ready and Invalid.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// GatewayPoolStatus is the status of a GatewayPool.
type GatewayPoolStatus struct {
	// ObservedGeneration is the metadata.generation of the GatewayPool the
	// status was computed from.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions are Ready and Invalid.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Gateways is the number of Nodes the pool's nodeSelector selects.
	//
	// +optional
	Gateways int32 `json:"gateways,omitempty"`
}
