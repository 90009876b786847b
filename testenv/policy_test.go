package testenv

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// setPodPolicy gives a scenario pod its ingress and egress policies.
func setPodPolicy(t *testing.T, sc *Scenario, pod string, ingress, egress *Policy) {
	t.Helper()
	for i := range sc.Sites {
		for j := range sc.Sites[i].Nodes {
			for k := range sc.Sites[i].Nodes[j].Pods {
				if p := &sc.Sites[i].Nodes[j].Pods[k]; p.Name == pod {
					p.Ingress, p.Egress = ingress, egress
					return
				}
			}
		}
	}
	t.Fatalf("no pod %s", pod)
}

// TestPolicyCases: seed 000 with the policies of the e2e TestSitePolicy (aks1-p1
// denies the flex block in and allows flex-p1 out; aks2-p1 allows flex-p1 in and
// denies the rest of the block, and denies the block out). Every policy direction
// is a case judged on the pod's node in its chain; the denied pair, its control
// (no policy denies it, it shares the denied pair's source, else its destination,
// and crosses sites) and the revoked flow are the ones isthmus carries: the AKS
// pods reach each other through the VNet, never isthmus, and aks1-ext shares
// aks1-p1's node. A policy that denies its only remote peer revokes a flow its
// pod opens (reverse).
func TestPolicyCases(t *testing.T) {
	sc, err := LoadScenario("seed000")
	if err != nil {
		t.Fatal(err)
	}
	flexBlock := netip.MustParsePrefix("192.168.20.0/24")
	flexP1 := netip.MustParsePrefix("192.168.20.6/32")
	setPodPolicy(t, sc, "aks1-p1", &Policy{Deny: []netip.Prefix{flexBlock}}, &Policy{Allow: []netip.Prefix{flexP1}})
	setPodPolicy(t, sc, "aks2-p1", &Policy{Allow: []netip.Prefix{flexP1}, Deny: []netip.Prefix{flexBlock}}, &Policy{Deny: []netip.Prefix{flexBlock}})
	want := []PolicyCase{
		{Pod: "aks1-p1", Dir: PolicyIngress, Node: "aks-1", Chain: "isl-tw-aks1-p1",
			Denied: [2]string{"flex-p1", "aks1-p1"}, Control: [2]string{"flex-p1", "aks2-p1"},
			Revoke: [2]string{"flex-p1", "aks1-p1"}, RevokeReverse: true, RevokeMatch: []string{"-s", "192.168.20.6/32"}},
		{Pod: "aks1-p1", Dir: PolicyEgress, Node: "aks-1", Chain: "isl-fw-aks1-p1",
			Revoke: [2]string{"aks1-p1", "flex-p1"}, RevokeMatch: []string{"-d", "192.168.20.6/32"}},
		{Pod: "aks2-p1", Dir: PolicyIngress, Node: "aks-2", Chain: "isl-tw-aks2-p1",
			Revoke: [2]string{"flex-p1", "aks2-p1"}, RevokeMatch: []string{"-s", "192.168.20.6/32"}},
		{Pod: "aks2-p1", Dir: PolicyEgress, Node: "aks-2", Chain: "isl-fw-aks2-p1",
			Denied: [2]string{"aks2-p1", "flex-p1"}, Control: [2]string{"aks1-p1", "flex-p1"},
			Revoke: [2]string{"aks2-p1", "flex-p1"}, RevokeReverse: true, RevokeMatch: []string{"-d", "192.168.20.6/32"}},
	}
	if diff := cmp.Diff(want, sc.PolicyCases()); diff != "" {
		t.Errorf("PolicyCases (-want +got):\n%s", diff)
	}
	var denied []string
	for _, e := range sc.Expectations() {
		if sc.PolicyDenies(e) {
			denied = append(denied, e.Src+"->"+e.Dst)
		}
	}
	// aks1-ext -> flex-p1 is seen as aks-1's tunnel address, outside every
	// policy; aks2-p1 -> aks1-p1 crosses no policy of the flex block.
	if diff := cmp.Diff([]string{"aks2-p1->flex-p1", "flex-p1->aks1-p1"}, denied); diff != "" {
		t.Errorf("pairs PolicyDenies denies (-want +got):\n%s", diff)
	}

	// The opening table's shape: aks1-p1 accepts nothing from the remote site
	// and has no egress policy; a flow it opens is the one revoked.
	sc, _ = LoadScenario("seed000")
	setPodPolicy(t, sc, "aks1-p1", &Policy{Deny: []netip.Prefix{flexBlock}}, nil)
	want = []PolicyCase{{Pod: "aks1-p1", Dir: PolicyIngress, Node: "aks-1", Chain: "isl-tw-aks1-p1",
		Denied: [2]string{"flex-p1", "aks1-p1"}, Control: [2]string{"flex-p1", "aks2-p1"},
		Revoke: [2]string{"flex-p1", "aks1-p1"}, RevokeReverse: true, RevokeMatch: []string{"-s", "192.168.20.6/32"}}}
	if diff := cmp.Diff(want, sc.PolicyCases()); diff != "" {
		t.Errorf("PolicyCases, ingress only (-want +got):\n%s", diff)
	}

	// No policy, no case.
	sc, _ = LoadScenario("seed000")
	if got := sc.PolicyCases(); len(got) != 0 {
		t.Errorf("PolicyCases without policies = %+v, want none", got)
	}
}
