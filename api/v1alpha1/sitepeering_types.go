package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// TunnelProtocol is the encapsulation between peered sites.
//
// +kubebuilder:validation:Enum=GENEVE
type TunnelProtocol string

// TunnelGENEVE is GENEVE (RFC 8926) over UDP 6081, the only protocol today.
const TunnelGENEVE TunnelProtocol = "GENEVE"

// SitePeering joins the pod networks of two or more sites.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=isthmus
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Sites",type=string,JSONPath=`.spec.sites`
// +kubebuilder:printcolumn:name="Mesh",type=boolean,JSONPath=`.spec.meshNodes`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SitePeering struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SitePeeringSpec `json:"spec"`
	// +optional
	Status ObjectStatus `json:"status,omitempty"`
}

// SitePeeringSpec names the peered sites and how their nodes connect.
type SitePeeringSpec struct {
	// Sites are the names of the peered Sites.
	//
	// +kubebuilder:validation:MinItems=2
	// +listType=set
	Sites []string `json:"sites"`

	// MeshNodes is true (the default) when every node of one site tunnels
	// straight to every node of the others; false leaves the sites to gateways.
	//
	// +optional
	// +kubebuilder:default=true
	MeshNodes *bool `json:"meshNodes,omitempty"`

	// TunnelProtocol is the encapsulation; GENEVE (the default) is the only one.
	//
	// +optional
	// +kubebuilder:default=GENEVE
	TunnelProtocol TunnelProtocol `json:"tunnelProtocol,omitempty"`
}

// MeshesNodes reports spec.meshNodes with its default (true) applied.
func (s *SitePeeringSpec) MeshesNodes() bool {
	return s.MeshNodes == nil || *s.MeshNodes
}

// Protocol reports spec.tunnelProtocol with its default (GENEVE) applied.
func (s *SitePeeringSpec) Protocol() TunnelProtocol {
	if s.TunnelProtocol == "" {
		return TunnelGENEVE
	}
	return s.TunnelProtocol
}

// SitePeeringList is a list of SitePeerings.
//
// +kubebuilder:object:root=true
type SitePeeringList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SitePeering `json:"items"`
}
