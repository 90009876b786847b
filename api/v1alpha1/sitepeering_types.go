package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// TunnelProtocol is the encapsulation between peered sites.
//
// +kubebuilder:validation:Enum=GENEVE
type TunnelProtocol string

// TunnelGENEVE is GENEVE (RFC 8926) over UDP 6081, the only protocol today.
const TunnelGENEVE TunnelProtocol = "GENEVE"

// Encryption is what protects the tunnels between the nodes of two joined
// sites on the wire.
//
// +kubebuilder:validation:Enum=None;WireGuard
type Encryption string

const (
	// EncryptionNone sends GENEVE in the clear: the sites share a network the
	// operator trusts.
	EncryptionNone Encryption = "None"
	// EncryptionWireGuard carries every tunnel between the sites' nodes inside
	// WireGuard (GENEVE inside WireGuard; docs/architecture.md, "Encryption").
	EncryptionWireGuard Encryption = "WireGuard"
)

// SitePeering joins the pod networks of two or more sites.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=isthmus
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Sites",type=string,JSONPath=`.spec.sites`
// +kubebuilder:printcolumn:name="Mesh",type=boolean,JSONPath=`.spec.meshNodes`
// +kubebuilder:printcolumn:name="Encryption",type=string,JSONPath=`.spec.encryption`
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

	// Encryption protects the tunnels between nodes of different sites of
	// the peering: None (the default) or WireGuard. With WireGuard nothing
	// between them leaves in the clear: a packet that cannot be encrypted is
	// dropped. Tunnels between nodes of one site are not encrypted.
	//
	// +optional
	// +kubebuilder:default=None
	Encryption Encryption `json:"encryption,omitempty"`
}

// EncryptionOrDefault reports spec.encryption with its default (None) applied.
func (s *SitePeeringSpec) EncryptionOrDefault() Encryption { return encryptionOrDefault(s.Encryption) }

// Encrypts reports whether spec.encryption asks for WireGuard.
func (s *SitePeeringSpec) Encrypts() bool { return s.Encryption == EncryptionWireGuard }

func encryptionOrDefault(e Encryption) Encryption {
	if e == "" {
		return EncryptionNone
	}
	return e
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
