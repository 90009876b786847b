package testenv

import (
	"net/netip"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/ipamd"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

// Every managed pod of every built-in scenario is created through the CNI
// plugin, which asks the node's IPAM for the scenario's address (and
// address6): the agent's
// own verification (ipamd.Verify, run here on the objects the lab writes)
// must publish a range on the pod's node that holds the address, or `lab up`
// would fail. Unmanaged sites must not verify: the other CNI keeps them.
// Every scenario with pods has a managed one, so the plugin path is covered.
func TestBuiltinManagedPodsVerify(t *testing.T) {
	for _, name := range Builtins() {
		sc, err := LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if err := sc.WriteObjects(dir); err != nil {
			t.Fatal(err)
		}
		set, _, err := objects.LoadDir(dir)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		managed := 0
		for _, n := range sc.Nodes() {
			v := ipamd.Verify(set, n.Name, sc.Underlay.mtu())
			for _, p := range n.Pods {
				if p.Unmanaged {
					continue
				}
				managed++
				if !v.Ready() {
					t.Errorf("%s: pod %s: the IPAM of %s does not verify: %s", name, p.Name, n.Name, v.Reason)
					continue
				}
				for _, a := range []netip.Addr{p.Address, p.Address6} {
					if a.IsValid() && !containsAddr(v.Ranges, a) {
						t.Errorf("%s: pod %s: %s is outside %s's verified ranges %v", name, p.Name, a, n.Name, v.Ranges)
					}
				}
				if want := sc.PodMTU(n.Site.Name, p); v.MTU != want && p.MTU == 0 {
					t.Errorf("%s: pod %s: the plugin gives MTU %d, the lab's pods have %d", name, p.Name, v.MTU, want)
				}
			}
			if v.Ready() && n.Site.semantics().unmanaged {
				t.Errorf("%s: node %s of an unmanaged site verifies", name, n.Name)
			}
		}
		// A scenario without any pod is one whose pods a test creates
		// through the API with kubelets (seed003cni): their nodes' CNI makes
		// them there, isthmus-cni on the managed site.
		if managed == 0 && len(sc.Pods()) > 0 {
			t.Errorf("%s: no managed pod: the plugin path is not covered", name)
		}
	}
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) && a != p.Masked().Addr() && a != p.Masked().Addr().Next() {
			return true
		}
	}
	return false
}

// TestOverheadsMatchThePlan: the lab's overheads are the plan's.
func TestOverheadsMatchThePlan(t *testing.T) {
	if GeneveOverhead != plan.GeneveOverhead || WireGuardOverhead != plan.WireGuardOverhead {
		t.Errorf("lab overheads %d, %d; plan's %d, %d", GeneveOverhead, WireGuardOverhead, plan.GeneveOverhead, plan.WireGuardOverhead)
	}
	if GeneveOverhead6 != plan.GeneveOverhead6 || WireGuardOverhead6 != plan.WireGuardOverhead6 {
		t.Errorf("lab overheads over IPv6 %d, %d; plan's %d, %d", GeneveOverhead6, WireGuardOverhead6, plan.GeneveOverhead6, plan.WireGuardOverhead6)
	}
}
