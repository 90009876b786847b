package controller

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// Input is the cluster as the controller sees it.
type Input struct {
	Sites []v1alpha1.Site
	Nodes []corev1.Node
	// GatewayPools, SitePeerings and Assignments get a status too (see
	// ObjectStatuses).
	GatewayPools []v1alpha1.GatewayPool
	SitePeerings []v1alpha1.SitePeering
	Assignments  []v1alpha1.SiteGatewayPoolAssignment
	// TunnelCIDR is where tunnel addresses come from (IPv4).
	TunnelCIDR netip.Prefix
	// Now stamps conditions whose status changes.
	Now metav1.Time
}

// Decision is what the controller changes: only differences from the Input,
// so an empty Decision means the cluster is where it should be.
type Decision struct {
	// Labels maps a node to the value its isthmus.dev/site label must take;
	// "" removes the label. Nodes already right are absent.
	Labels map[string]string
	// PodCIDRs maps a node without podCIDRs to the ones to set, IPv4 first.
	PodCIDRs map[string][]netip.Prefix
	// TunnelAddrs maps a node to the isthmus.dev/tunnel-ipv4 annotation to add.
	TunnelAddrs map[string]netip.Addr
	// Statuses maps a Site to its new status; Sites whose status is already
	// right are absent.
	Statuses map[string]v1alpha1.SiteStatus
	// ObjectStatuses maps the other kinds to their new status (see
	// ObjectStatuses).
	ObjectStatuses map[ObjectKey]any

	// Exhausted are the nodes a full pool left without a podCIDR.
	Exhausted []Exhaustion
	// TunnelPending are the nodes a full --tunnel-cidr left without a tunnel
	// address.
	TunnelPending []string
}

// Empty reports whether the Decision changes nothing.
func (d *Decision) Empty() bool {
	return len(d.Labels) == 0 && len(d.PodCIDRs) == 0 && len(d.TunnelAddrs) == 0 && len(d.Statuses) == 0 &&
		len(d.ObjectStatuses) == 0
}

// Decide is the controller's whole judgement, a pure function of in: site
// labels (SiteLabels), podCIDRs (AssignPodCIDRs), tunnel addresses
// (AssignTunnelAddrs, over the nodes as they will be once the podCIDRs are
// set, so a node that gets a podCIDR needs no annotation) and Site statuses
// (SiteStatuses). Applying the Decision and deciding again yields an empty
// Decision, apart from Ready conditions that turn True once the nodes have
// what they waited for.
func Decide(in Input) Decision {
	d := Decision{
		Labels:      make(map[string]string),
		TunnelAddrs: make(map[string]netip.Addr),
		Statuses:    make(map[string]v1alpha1.SiteStatus),
	}
	labels := SiteLabels(in.Sites, in.Nodes)
	for i := range in.Nodes {
		n := &in.Nodes[i]
		want := labels[n.Name]
		if have, ok := n.Labels[LabelSite]; have != want || (want == "" && ok) {
			d.Labels[n.Name] = want
		}
	}
	d.PodCIDRs, d.Exhausted = AssignPodCIDRs(in.Sites, in.Nodes)

	after := make([]corev1.Node, len(in.Nodes))
	for i := range in.Nodes {
		after[i] = in.Nodes[i]
		if ps, ok := d.PodCIDRs[in.Nodes[i].Name]; ok {
			after[i].Spec = *in.Nodes[i].Spec.DeepCopy()
			after[i].Spec.PodCIDR = ps[0].String()
			for _, p := range ps {
				after[i].Spec.PodCIDRs = append(after[i].Spec.PodCIDRs, p.String())
			}
		}
	}
	d.TunnelAddrs, d.TunnelPending = AssignTunnelAddrs(in.TunnelCIDR, in.Sites, after)

	problems := problemsBySite(in.Sites, in.Nodes)
	for name, msgs := range foreignAddresses(in.Sites, in.Nodes, in.TunnelCIDR) {
		problems[name] = append(problems[name], msgs...)
	}
	for name, st := range SiteStatuses(in.Sites, in.Nodes, problems, d.Exhausted, d.TunnelPending, in.Now) {
		for i := range in.Sites {
			if in.Sites[i].Name == name && !statusEqual(in.Sites[i].Status, st) {
				d.Statuses[name] = st
			}
		}
	}
	d.ObjectStatuses = ObjectStatuses(in)
	return d
}
