package controller

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/source"
)

// The other kinds whose status the controller writes: the printer columns of
// `kubectl get gatewaypools` (Gateways, Ready), `sitepeerings` and
// `sitegatewaypoolassignments` (Ready) read it.
var (
	GatewayPoolResource  = source.GatewayPoolsResource
	SitePeeringResource  = source.SitePeeringsResource
	AssignmentResource   = source.SiteGatewayPoolAssignmentsResource
	objectStatusResource = map[string]schema.GroupVersionResource{
		v1alpha1.KindGatewayPool:               GatewayPoolResource,
		v1alpha1.KindSitePeering:               SitePeeringResource,
		v1alpha1.KindSiteGatewayPoolAssignment: AssignmentResource,
	}
)

// ObjectKey names a GatewayPool, SitePeering or SiteGatewayPoolAssignment.
type ObjectKey struct{ Kind, Name string }

// ObjectStatuses returns the status every GatewayPool, SitePeering and
// SiteGatewayPoolAssignment of in should have, only where it differs from
// the current one: a GatewayPoolStatus or an ObjectStatus. Invalid is True
// with the reasons when the agents set the object aside
// (objects.Rules.ValidateSettingAside over every object with the tunnel CIDR
// the agents are given, Nodes in no Site left out as the agents leave them);
// Ready is True when it is valid and, for a pool,
// selects at least one Node.
func ObjectStatuses(in Input) map[ObjectKey]any {
	all := objects.Objects{Sites: in.Sites, Nodes: in.Nodes, GatewayPools: in.GatewayPools,
		SitePeerings: in.SitePeerings, SiteGatewayPoolAssignments: in.Assignments}
	all, _ = all.WithoutUnsitedNodes()
	set, _ := objects.Rules{TunnelCIDR: in.TunnelCIDR}.ValidateSettingAside(all)
	reasons := func(kind, name string) string {
		r := set.Rejection(objects.Label(kind, name))
		if r == nil {
			return ""
		}
		msgs := make([]string, 0, len(r.Reasons))
		for _, e := range r.Reasons {
			msgs = append(msgs, strings.TrimPrefix(e.Error(), objects.Label(kind, name)+": "))
		}
		return strings.Join(msgs, "; ")
	}
	now := in.Now.Rfc3339Copy()
	conditions := func(cur []metav1.Condition, gen int64, invalid string, ready bool, notReady, readyMsg string) []metav1.Condition {
		out := append([]metav1.Condition(nil), cur...)
		set := func(typ string, ok bool, reason, msg string) {
			st := metav1.ConditionFalse
			if ok {
				st = metav1.ConditionTrue
			}
			meta.SetStatusCondition(&out, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg,
				ObservedGeneration: gen, LastTransitionTime: now})
		}
		if invalid != "" {
			set(v1alpha1.ConditionInvalid, true, v1alpha1.ReasonInvalid, invalid)
			set(v1alpha1.ConditionReady, false, v1alpha1.ReasonInvalid, "set aside by the agents: see the Invalid condition")
			return out
		}
		set(v1alpha1.ConditionInvalid, false, v1alpha1.ReasonValid, "passes validation")
		if ready {
			set(v1alpha1.ConditionReady, true, v1alpha1.ReasonInEffect, readyMsg)
		} else {
			set(v1alpha1.ConditionReady, false, notReady, readyMsg)
		}
		return out
	}
	out := make(map[ObjectKey]any)
	for _, p := range in.GatewayPools {
		n := 0
		if p.Spec.NodeSelector != nil {
			if sel, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector); err == nil {
				for i := range in.Nodes {
					if sel.Matches(labels.Set(in.Nodes[i].Labels)) {
						n++
					}
				}
			}
		}
		msg := fmt.Sprintf("selects %d gateway node(s)", n)
		st := v1alpha1.GatewayPoolStatus{ObservedGeneration: p.Generation, Gateways: int32(n),
			Conditions: conditions(p.Status.Conditions, p.Generation, reasons(v1alpha1.KindGatewayPool, p.Name), n > 0, v1alpha1.ReasonNoGateways, msg)}
		if !equality.Semantic.DeepEqual(st, p.Status) {
			out[ObjectKey{v1alpha1.KindGatewayPool, p.Name}] = st
		}
	}
	object := func(kind, name string, gen int64, cur v1alpha1.ObjectStatus) {
		st := v1alpha1.ObjectStatus{ObservedGeneration: gen,
			Conditions: conditions(cur.Conditions, gen, reasons(kind, name), true, "", "in effect: the agents plan with it")}
		if !equality.Semantic.DeepEqual(st, cur) {
			out[ObjectKey{kind, name}] = st
		}
	}
	for _, p := range in.SitePeerings {
		object(v1alpha1.KindSitePeering, p.Name, p.Generation, p.Status)
	}
	for _, a := range in.Assignments {
		object(v1alpha1.KindSiteGatewayPoolAssignment, a.Name, a.Generation, a.Status)
	}
	return out
}
