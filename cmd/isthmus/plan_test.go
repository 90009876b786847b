package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const (
	seed000        = "../../loader/objects/testdata/seed000"
	seed000Gateway = "../../loader/objects/testdata/seed000-gateway"
)

func runPlanCmd(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := newPlanCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestPlanTable(t *testing.T) {
	tests := []struct {
		golden string
		args   []string
		// rows must appear in the output whatever the golden says, so a
		// careless -update cannot bless a wrong plan.
		rows []string
	}{
		{
			golden: "plan-seed000-flex-1.txt",
			args:   []string{"--node", "flex-1", "--objects", seed000},
			rows: []string{
				"UNDERLAY        192.168.10.10",
				`TUNNEL ADDRESS  192.168.20.1 from Node "flex-1" spec.podCIDRs[0]`,
				"aks-nodepool1-0  cluster  10.0.0.4  100.64.0.4      10.0.0.4/32,10.0.2.0/23,100.64.0.4/32",
				`10.0.2.0/23    group of 2       (see ROUTE GROUPS)  Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]`,
				`100.64.0.4/32  aks-nodepool1-0  10.0.0.4            Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"]`,
				"ROUTE GROUPS\nPREFIX       SITE  MEMBERS\n10.0.2.0/23  -     aks-nodepool1-0 10.0.0.4, aks-nodepool1-1 10.0.0.5\n",
				"sources translated to 192.168.20.1 on this node: everything except\nPREFIX           ORIGIN\n192.168.20.0/25  Node \"flex-1\" spec.podCIDRs[0]\n\n",
				"LOCAL           (none)\nFABRIC          (none)\n",
			},
		},
		{
			golden: "plan-seed000-aks-nodepool1-0.txt",
			args:   []string{"--node", "aks-nodepool1-0", "--objects", seed000, "-o", "table"},
			rows: []string{
				`TUNNEL ADDRESS  100.64.0.4 from Node "aks-nodepool1-0" metadata.annotations["isthmus.dev/tunnel-ipv4"]`,
				"LOCAL           10.0.0.0/16,10.0.2.0/23\nFABRIC          10.0.2.0/23\n",
				"flex-1           flex-site  192.168.10.10  192.168.20.1    192.168.10.10/32,192.168.20.0/25",
				`192.168.20.0/25   flex-1           192.168.10.10  Node "flex-1" spec.podCIDRs[0]`,
				"ROUTE GROUPS\n(none)\n",
				"sources translated to 100.64.0.4 on this node: everything except\n" +
					"PREFIX         ORIGIN\n" +
					"10.0.2.0/23    Site \"cluster\" spec.podCidrAssignments[0].cidrBlocks[0]\n" +
					"100.64.0.4/32  Node \"aks-nodepool1-0\" metadata.annotations[\"isthmus.dev/tunnel-ipv4\"]\n\n",
				"WARNINGS\n(none)\n",
			},
		},
		{
			golden: "plan-endpoint-in-pods-a1.txt",
			args:   []string{"--node", "a1", "--objects", "testdata/endpoint-in-pods"},
			rows: []string{
				"TUNNEL MTU      1400",
				`10.1.0.101/32  b1    10.2.0.1    Node "b1" spec.podCIDRs[0]`,
				`10.1.0.0/25  underlay 10.1.0.100  Node "b1" spec.podCIDRs[0]  10.1.0.0/29,10.1.0.8/31,10.1.0.11/32,`,
				`- objects.yaml: Site "b": spec.podCidrAssignments[0].cidrBlocks[0]: 10.1.0.5/16 has host bits set; normalized to 10.1.0.0/16`,
			},
		},
		{
			// Seed 000's gateway section: the canary routes the flex site's
			// nodeCidrs transit only, whole, and the tunnel endpoint inside
			// to that peer, for what its pods and it forward.
			golden: "plan-seed000-gateway-aks-1.txt",
			args:   []string{"--node", "aks-1", "--objects", seed000Gateway},
			rows: []string{
				"ROLE            gateway of GatewayPool gateways (transit)\n",
				"FABRIC          10.0.0.0/27,10.0.2.0/23\n",
				"flex-1  flex-site  192.168.10.10  192.168.20.1    192.168.10.0/28,192.168.20.0/25",
				`192.168.10.0/28   group of 1  (see ROUTE GROUPS)  Site "flex-site" spec.nodeCidrs[0] (transit only: pods and forwarded traffic, not the host's)`,
				`192.168.10.10/32  flex-1      192.168.10.10       Node "flex-1" status.addresses[InternalIP] (transit only: pods and forwarded traffic, not the host's)`,
				`192.168.20.0/25   flex-1      192.168.10.10       Node "flex-1" spec.podCIDRs[0]`,
				"192.168.10.0/28  flex-site  flex-1 192.168.10.10\n",
			},
		},
		{
			golden: "plan-seed000-gateway-aks-2.txt",
			args:   []string{"--node", "aks-2", "--objects", seed000Gateway},
			rows: []string{
				"ROLE            member\n",
				"aks-1  cluster  10.0.0.4  100.64.0.4      10.0.2.0/23,100.64.0.4/32,192.168.10.0/28,192.168.20.0/25",
				`192.168.20.0/25  group of 1  (see ROUTE GROUPS)  Node "flex-1" spec.podCIDRs[0] (via fabric: FABRIC EGRESS sources leave by the underlay device)`,
				"192.168.20.0/25  flex-site  aks-1 10.0.0.4\n",
				"FABRIC EGRESS   10.0.2.0/23\n",
			},
		},
		{
			golden: "plan-seed000-gateway-flex-1.txt",
			args:   []string{"--node", "flex-1", "--objects", seed000Gateway},
			rows: []string{
				"ROLE            gateway of GatewayPool gateways (transit)\n",
				`10.0.2.0/23    group of 1  (see ROUTE GROUPS)  Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]`,
				`100.64.0.4/32  aks-1       10.0.0.4            Node "aks-1" metadata.annotations["isthmus.dev/tunnel-ipv4"]`,
				"10.0.2.0/23    cluster  aks-1 10.0.0.4\n",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			out, _, err := runPlanCmd(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			for _, row := range tt.rows {
				if !strings.Contains(out, row) {
					t.Errorf("output lacks %q:\n%s", row, out)
				}
			}
			path := filepath.Join("testdata", tt.golden)
			if *update {
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), out); diff != "" {
				t.Errorf("output differs from %s (-want +got; go test -run TestPlanTable -update rewrites it):\n%s", path, diff)
			}
		})
	}
}

func TestPlanJSON(t *testing.T) {
	out, _, err := runPlanCmd(t, "--node", "flex-1", "--objects", seed000, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got plan.NodePlan
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not a NodePlan: %v\n%s", err, out)
	}
	set, _, err := objects.LoadDir(seed000)
	if err != nil {
		t.Fatal(err)
	}
	want, err := plan.Compute(set, "flex-1")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(want) {
		t.Errorf("JSON round trip differs:\n%s", out)
	}
	if g := slices.IndexFunc(got.Routes, func(r plan.Route) bool { return r.Group != nil }); g < 0 || len(got.Routes[g].Group) != 2 || len(got.SNAT.Exempt) != 1 {
		t.Errorf("JSON lost the route group or the SNAT exemptions:\n%s", out)
	}
	for _, field := range []string{
		`"underlay": "192.168.10.10"`, `"tunnelAddr": "192.168.20.1"`, `"podCIDRs": [`,
		`"tunnelAddrOrigin": "Node \"flex-1\" spec.podCIDRs[0]"`,
		`"group": [`, `"peer": "aks-nodepool1-0"`, `"via": "10.0.0.4"`,
		`"snat": {`, `"addr": "192.168.20.1"`, `"exempt": [`,
	} {
		if !strings.Contains(out, field) {
			t.Errorf("JSON lacks %s:\n%s", field, out)
		}
	}
}

func TestPlanJSONUnmanaged(t *testing.T) {
	out, _, err := runPlanCmd(t, "--node", "aks-nodepool1-0", "--objects", seed000, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got plan.NodePlan
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not a NodePlan: %v\n%s", err, out)
	}
	set, _, err := objects.LoadDir(seed000)
	if err != nil {
		t.Fatal(err)
	}
	want, err := plan.Compute(set, "aks-nodepool1-0")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(want) {
		t.Errorf("JSON round trip differs:\n%s", out)
	}
	for _, field := range []string{
		`"localPrefixes": [
    "10.0.0.0/16",
    "10.0.2.0/23"
  ]`,
		`"fabricPrefixes": [
    "10.0.2.0/23"
  ]`,
		`"tunnelAddr": "100.64.0.5"`,
	} {
		if !strings.Contains(out, field) {
			t.Errorf("JSON lacks %s:\n%s", field, out)
		}
	}
}

func TestPlanErrors(t *testing.T) {
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "sites.yaml"), []byte("apiVersion: isthmus.dev/v1alpha1\nkind: Site\nmetadata: {name: s}\nspec: {nodeCidrs: [10.0.0.0/33]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Seed 000 plus a cluster node without a tunnel address.
	noTunnel := t.TempDir()
	for _, name := range []string{"sites.yaml", "nodes.yaml"} {
		data, err := os.ReadFile(filepath.Join(seed000, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(noTunnel, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(noTunnel, "more.yaml"), []byte("apiVersion: v1\nkind: Node\nmetadata: {name: aks-nodepool1-2}\nstatus: {addresses: [{type: InternalIP, address: 10.0.0.6}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--node", "nope", "--objects", seed000}, `"nope"`},
		{[]string{"--node", "flex-1", "--objects", seed000, "-o", "yaml"}, `unknown format "yaml"`},
		// The invalid Site is set aside (on stderr, see below); flex-1 is not there.
		{[]string{"--node", "flex-1", "--objects", bad}, `plan node "flex-1": no Node of that name`},
		{[]string{"--node", "flex-1", "--objects", filepath.Join(bad, "missing")}, "read objects directory"},
		{[]string{"--objects", seed000}, `"node" not set`},
		{[]string{"--node", "aks-nodepool1-2", "--objects", noTunnel}, `plan node "aks-nodepool1-2": the node has no tunnel address`},
		{[]string{"--node", "aks-nodepool1-2", "--objects", noTunnel}, `set the annotation isthmus.dev/tunnel-ipv4`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, _, err := runPlanCmd(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
	// A plan that fails still lists what was set aside, with the reasons.
	_, stderr, _ := runPlanCmd(t, "--node", "flex-1", "--objects", bad)
	if want := `set aside: sites.yaml: Site "s": spec.nodeCidrs[0]: invalid CIDR "10.0.0.0/33"`; !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr)
	}
}

func TestPlanJSONGateway(t *testing.T) {
	out, _, err := runPlanCmd(t, "--node", "aks-1", "--objects", seed000Gateway, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got plan.NodePlan
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not a NodePlan: %v\n%s", err, out)
	}
	set, _, err := objects.LoadDir(seed000Gateway)
	if err != nil {
		t.Fatal(err)
	}
	want, err := plan.Compute(set, "aks-1")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(want) {
		t.Errorf("JSON round trip differs:\n%s", out)
	}
	for _, field := range []string{`"gateway": true`, "\"gatewayPools\": [\n    \"gateways\"\n  ]", `"notForPods": true`, `"transitOnly": true`} {
		if !strings.Contains(out, field) {
			t.Errorf("JSON lacks %s:\n%s", field, out)
		}
	}
}
