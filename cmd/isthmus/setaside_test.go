package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/fleet"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

// clusterDump is `kubectl get nodes -o yaml` of a cluster joined to seed
// 000's Sites: seed 000's nodes, a control-plane node in no Site and a node
// whose podCIDR overlaps flex-1's (testdata/cluster-dump/nodes.yaml).
const clusterDump = "testdata/cluster-dump"

// planJSONOf runs plan -o json with args and decodes the NodePlan and the
// objects set aside.
func planJSONOf(t *testing.T, args ...string) (*plan.NodePlan, []plan.SetAside) {
	t.Helper()
	out, stderr, err := runPlanCmd(t, append(args, "-o", "json")...)
	if err != nil {
		t.Fatalf("plan %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	var got struct {
		plan.NodePlan
		SetAside []plan.SetAside `json:"setAside"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not a plan: %v\n%s", err, out)
	}
	return &got.NodePlan, got.SetAside
}

// computed is the plan of node from the objects in dir, all valid.
func computed(t *testing.T, dir, node string) *plan.NodePlan {
	t.Helper()
	set, _, err := objects.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.Compute(set, node)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPlanSetsAsideClusterDump: on a real cluster's Node list, plan sets
// aside the control-plane node in no Site and the node whose podCIDR
// overlaps another, lists both with their reasons, exits 0, and plans every
// other node exactly as from the same objects without them (seed 000);
// --strict fails; the set-aside node itself gets no plan, with the reason.
func TestPlanSetsAsideClusterDump(t *testing.T) {
	for _, node := range []string{"flex-1", "aks-nodepool1-0"} {
		got, aside := planJSONOf(t, "--node", node, "--objects", clusterDump)
		if want := computed(t, seed000, node); !got.Equal(want) {
			t.Errorf("plan of %s from the dump differs from seed 000's plan without the objects set aside", node)
		}
		if len(aside) != 2 || aside[0].Object != `Node "cp-1"` || aside[1].Object != `Node "flex-2"` {
			t.Fatalf("set aside %+v, want cp-1 and flex-2", aside)
		}
		if r := strings.Join(aside[0].Reasons, "; "); r != "status.addresses: InternalIP 172.31.0.10 is in no Site's spec.nodeCidrs" || aside[0].File != "nodes.yaml" {
			t.Errorf("cp-1 set aside for %q (file %q), want its InternalIP in no Site, in nodes.yaml", r, aside[0].File)
		}
		if r := strings.Join(aside[1].Reasons, "; "); !strings.Contains(r, `spec.podCIDRs[0]: 192.168.20.0/26 overlaps Node "flex-1" spec.podCIDRs[0] 192.168.20.0/25`) {
			t.Errorf("flex-2 set aside for %q, want the overlap with flex-1", r)
		}
	}

	out, _, err := runPlanCmd(t, "--node", "flex-1", "--objects", clusterDump)
	if err != nil {
		t.Fatalf("plan of a dump with objects set aside: %v, want exit 0", err)
	}
	for _, row := range []string{
		"SET ASIDE\nOBJECT         FILE        REASON\n",
		`Node "cp-1"    nodes.yaml  status.addresses: InternalIP 172.31.0.10 is in no Site's spec.nodeCidrs` + "\n",
		`Node "flex-2"  nodes.yaml  spec.podCIDRs[0]: 192.168.20.0/26 overlaps Node "flex-1" spec.podCIDRs[0] 192.168.20.0/25 in nodes.yaml` + "\n",
	} {
		if !strings.Contains(out, row) {
			t.Errorf("table lacks %q:\n%s", row, out)
		}
	}
	if strings.Contains(out, "192.168.20.0/26") && !strings.Contains(out, "overlaps") || strings.Contains(out, "10.244.0.0/24") {
		t.Errorf("the plan routes a set-aside node's podCIDR:\n%s", out)
	}

	strictOut, _, err := runPlanCmd(t, "--node", "flex-1", "--objects", clusterDump, "--strict")
	if err == nil || !strings.Contains(err.Error(), "--strict: 2 objects set aside") {
		t.Errorf("plan --strict with objects set aside: %v, want an error counting them", err)
	}
	if strictOut != out {
		t.Errorf("plan --strict printed a different plan:\n%s", strictOut)
	}
	if _, _, err := runPlanCmd(t, "--node", "flex-1", "--objects", seed000, "--strict"); err != nil {
		t.Errorf("plan --strict with nothing set aside: %v", err)
	}

	_, stderr, err := runPlanCmd(t, "--node", "cp-1", "--objects", clusterDump)
	if err == nil || !strings.Contains(err.Error(), `plan node "cp-1": this node's Node is set aside: nodes.yaml: Node "cp-1": status.addresses: InternalIP 172.31.0.10 is in no Site's spec.nodeCidrs`) {
		t.Errorf("plan of the set-aside node: %v, want the reason", err)
	}
	if !strings.Contains(stderr, `set aside: nodes.yaml: Node "flex-2": spec.podCIDRs[0]: 192.168.20.0/26 overlaps`) {
		t.Errorf("stderr of a failed plan does not list what was set aside:\n%s", stderr)
	}
}

// TestPlanExplainSetsAside: --explain (and --from) on the dump explain the
// plan without the objects set aside, as on seed 000, and name them on
// stderr.
func TestPlanExplainSetsAside(t *testing.T) {
	for _, args := range [][]string{
		{"--node", "aks-nodepool1-0", "--explain", "192.168.20.9"},
		{"--node", "flex-1", "--explain", "10.0.2.7", "--from", "192.168.20.6"},
		{"--node", "aks-nodepool1-0", "--explain", "192.168.20.9", "-o", "json"},
	} {
		got, stderr, err := runPlanCmd(t, append(args, "--objects", clusterDump)...)
		if err != nil {
			t.Fatalf("%s on the dump: %v", strings.Join(args, " "), err)
		}
		want, _, err := runPlanCmd(t, append(args, "--objects", seed000)...)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s on the dump:\n%s\nwant as on seed 000:\n%s", strings.Join(args, " "), got, want)
		}
		if !strings.Contains(stderr, `set aside: nodes.yaml: Node "cp-1": status.addresses: InternalIP 172.31.0.10 is in no Site's spec.nodeCidrs`) {
			t.Errorf("stderr does not name cp-1 set aside:\n%s", stderr)
		}
	}
	if _, _, err := runPlanCmd(t, "--node", "flex-1", "--objects", clusterDump, "--explain", "10.0.2.7", "--strict"); err == nil {
		t.Error("plan --explain --strict with objects set aside exited 0")
	}
}

// TestPlanFleetOneBadNode: in a fleet of 5,000 nodes (50 sites of 100), one
// Node of site 40 whose podCIDR overlaps another's is set aside and the plan
// of a node of site 3 is the plan of the fleet without it.
func TestPlanFleetOneBadNode(t *testing.T) {
	sh := fleet.Shape{Sites: 50, NodesPerSite: 100, Topology: fleet.Mesh}
	in, err := fleet.Objects(sh)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFleet(t, filepath.Join(dir, "fleet.yaml"), in)
	bad := fleet.Node(sh, 40, 100)
	bad.Name = "site-040-node-bad"
	bad.CreationTimestamp = metav1.NewTime(time.Now().Truncate(time.Second)) // after every other: it is the one set aside
	overlap := fleet.PodCIDR(40, 7).String()
	bad.Spec.PodCIDR, bad.Spec.PodCIDRs = overlap, []string{overlap}
	writeFleet(t, filepath.Join(dir, "zz-bad.yaml"), objects.Objects{Nodes: []corev1.Node{bad}})

	node := fleet.NodeName(3, 0)
	got, aside := planJSONOf(t, "--node", node, "--objects", dir)
	if len(aside) != 1 || aside[0].Object != `Node "site-040-node-bad"` || aside[0].File != "zz-bad.yaml" ||
		!strings.Contains(strings.Join(aside[0].Reasons, "; "), "spec.podCIDRs[0]: "+overlap+` overlaps Node "site-040-node-007"`) {
		t.Fatalf("set aside %+v, want the bad node of site 40 and its overlap", aside)
	}
	set, _, err := objects.Validate(in)
	if err != nil {
		t.Fatal(err)
	}
	want, err := plan.Compute(set, node)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(want) {
		t.Errorf("plan of %s differs from the fleet's plan without the bad node", node)
	}
	if len(got.Peers) != sh.Sites*sh.NodesPerSite-1 {
		t.Errorf("%d peers, want %d", len(got.Peers), sh.Sites*sh.NodesPerSite-1)
	}
}

// writeFleet writes in to path as one multi-document YAML file.
func writeFleet(t *testing.T, path string, in objects.Objects) {
	t.Helper()
	var buf bytes.Buffer
	add := func(apiVersion, kind string, obj any) {
		js, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(js, &m); err != nil {
			t.Fatal(err)
		}
		m["apiVersion"], m["kind"] = apiVersion, kind
		y, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		buf.WriteString("---\n")
		buf.Write(y)
	}
	gv := v1alpha1.GroupVersion.String()
	for _, o := range in.Sites {
		add(gv, v1alpha1.KindSite, o)
	}
	for _, o := range in.SitePeerings {
		add(gv, v1alpha1.KindSitePeering, o)
	}
	for _, o := range in.GatewayPools {
		add(gv, v1alpha1.KindGatewayPool, o)
	}
	for _, o := range in.SiteGatewayPoolAssignments {
		add(gv, v1alpha1.KindSiteGatewayPoolAssignment, o)
	}
	for _, o := range in.Nodes {
		add("v1", "Node", o)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
