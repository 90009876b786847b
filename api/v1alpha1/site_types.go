package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// CIDR is an IPv4 or IPv6 prefix in CIDR notation, such as 10.0.2.0/23.
//
// +kubebuilder:validation:MaxLength=49
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.0.2.0/23"
type CIDR string

// Site is a group of nodes that reach each other natively (one VNet, one rack,
// one lab) and share a pod addressing plan.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=isthmus
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="ManageCNI",type=boolean,JSONPath=`.spec.manageCniPlugin`
// +kubebuilder:printcolumn:name="NodeCIDRs",type=string,JSONPath=`.spec.nodeCidrs`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="PoolExhausted",type=string,JSONPath=`.status.conditions[?(@.type=="PoolExhausted")].status`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Site struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SiteSpec `json:"spec"`
	// +optional
	Status SiteStatus `json:"status,omitempty"`
}

// SiteSpec describes a site's nodes and pod addressing.
type SiteSpec struct {
	// NodeCIDRs hold the InternalIPs of the site's nodes: a node belongs to the
	// site whose nodeCidrs contain its InternalIP.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	NodeCIDRs []CIDR `json:"nodeCidrs,omitempty"`

	// PodCIDRAssignments are the pod address blocks of the site and how node
	// blocks are carved from them.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=32
	PodCIDRAssignments []PodCIDRAssignment `json:"podCidrAssignments,omitempty"`

	// ManageCNIPlugin is true (the default) when isthmus owns the pods'
	// addresses; false when another CNI (Azure CNI, Calico) does.
	//
	// +optional
	// +kubebuilder:default=true
	ManageCNIPlugin *bool `json:"manageCniPlugin,omitempty"`

	// LocalCIDRs are prefixes local to the site that must never be sent into a
	// tunnel from a node of this site.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	LocalCIDRs []CIDR `json:"localCidrs,omitempty"`

	// NonMasqueradeCIDRs are destinations pods of this site reach with their own
	// source address.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	NonMasqueradeCIDRs []CIDR `json:"nonMasqueradeCIDRs,omitempty"`

	// TunnelMTU is the MTU of the overlay on the site's nodes; 0 means the
	// underlay MTU minus the encapsulation overhead.
	//
	// +optional
	// +kubebuilder:validation:Minimum=576
	// +kubebuilder:validation:Maximum=65535
	TunnelMTU int32 `json:"tunnelMTU,omitempty"`

	// ReturnPath says how replies reach pod sources in the site's declared pod
	// blocks when another CNI owns the pods (manageCniPlugin false): Fabric (the
	// default) keeps the sources, and remote sites route the blocks back into
	// the site through its agent nodes; SNAT translates them to the node's
	// tunnel address, for fabrics that cannot deliver a pod address arriving at
	// any node. Ignored when isthmus manages the CNI.
	//
	// +optional
	// +kubebuilder:default=Fabric
	ReturnPath ReturnPath `json:"returnPath,omitempty"`
}

// ReturnPath is how replies find pod sources of a site whose pods another CNI
// owns.
//
// +kubebuilder:validation:Enum=Fabric;SNAT
type ReturnPath string

const (
	// ReturnPathFabric keeps pod sources: remote sites route the site's declared
	// pod blocks to its agent nodes, which hand the packets to the site fabric.
	ReturnPathFabric ReturnPath = "Fabric"
	// ReturnPathSNAT translates every pod source of the site to the tunnel
	// address of the node it leaves from.
	ReturnPathSNAT ReturnPath = "SNAT"
)

// AnnotationTunnelIPv4 is the Node annotation that gives a node its tunnel
// address (an IPv4 address, such as 100.64.0.4) when it has no IPv4 podCIDR to
// take the first address of; it wins over the podCIDR when both exist.
const AnnotationTunnelIPv4 = "isthmus.dev/tunnel-ipv4"

// AnnotationWireGuardPublicKey is the Node annotation where the node's agent
// publishes its WireGuard public key (base64, as `wg pubkey` prints it). Peers
// of an encrypted pair configure it; the private key never leaves the node.
const AnnotationWireGuardPublicKey = "isthmus.dev/wireguard-public-key"

// NodeAnnotations are the Node annotations isthmus reads: an agent replans
// when one of them changes on any Node, and ignores every other annotation.
var NodeAnnotations = []string{AnnotationTunnelIPv4, AnnotationWireGuardPublicKey}

// PodCIDRAssignment is one block of pod addresses of a site.
type PodCIDRAssignment struct {
	// CIDRBlocks are the prefixes of this assignment.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	CIDRBlocks []CIDR `json:"cidrBlocks"`

	// NodeBlockSizes are the prefix lengths of the per-node blocks carved from
	// CIDRBlocks.
	//
	// +optional
	NodeBlockSizes *NodeBlockSizes `json:"nodeBlockSizes,omitempty"`

	// AssignmentEnabled says whether node blocks are assigned from this
	// assignment; unset follows manageCniPlugin.
	//
	// +optional
	AssignmentEnabled *bool `json:"assignmentEnabled,omitempty"`

	// Priority orders assignments when several match a node; higher first.
	//
	// +optional
	Priority int32 `json:"priority,omitempty"`

	// NodeRegex limits the assignment to nodes whose name matches.
	//
	// +optional
	NodeRegex string `json:"nodeRegex,omitempty"`
}

// Default node block sizes, used when nodeBlockSizes or one of its fields is
// unset.
const (
	DefaultNodeBlockSizeIPv4 = 24
	DefaultNodeBlockSizeIPv6 = 64
)

// BlockSizes reports the assignment's per-node prefix lengths (IPv4, IPv6)
// with the defaults (/24, /64) applied to unset fields.
func (a *PodCIDRAssignment) BlockSizes() (ipv4, ipv6 int) {
	ipv4, ipv6 = DefaultNodeBlockSizeIPv4, DefaultNodeBlockSizeIPv6
	if a.NodeBlockSizes != nil {
		if a.NodeBlockSizes.IPv4 != 0 {
			ipv4 = int(a.NodeBlockSizes.IPv4)
		}
		if a.NodeBlockSizes.IPv6 != 0 {
			ipv6 = int(a.NodeBlockSizes.IPv6)
		}
	}
	return ipv4, ipv6
}

// AssignsIn reports whether node blocks are assigned from this assignment of
// the given site: assignmentEnabled when set, else the site's
// manageCniPlugin (with its default, true).
func (a *PodCIDRAssignment) AssignsIn(site *SiteSpec) bool {
	if a.AssignmentEnabled != nil {
		return *a.AssignmentEnabled
	}
	return site.ManagesCNIPlugin()
}

// NodeBlockSizes are per-family prefix lengths of a node's pod block.
type NodeBlockSizes struct {
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	IPv4 int32 `json:"ipv4,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	IPv6 int32 `json:"ipv6,omitempty"`
}

// ManagesCNIPlugin reports spec.manageCniPlugin with its default (true) applied.
func (s *SiteSpec) ManagesCNIPlugin() bool {
	return s.ManageCNIPlugin == nil || *s.ManageCNIPlugin
}

// ReturnPathOrDefault reports spec.returnPath with its default (Fabric)
// applied. It does not check the value: a Set from objects.Load holds only
// Fabric or SNAT.
func (s *SiteSpec) ReturnPathOrDefault() ReturnPath {
	if s.ReturnPath == "" {
		return ReturnPathFabric
	}
	return s.ReturnPath
}

// SiteList is a list of Sites.
//
// +kubebuilder:object:root=true
type SiteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Site `json:"items"`
}
