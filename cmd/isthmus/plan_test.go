package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const seed000 = "../../loader/objects/testdata/seed000"

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
				"TUNNEL ADDRESS  192.168.20.1",
				"aks-nodepool1-0  cluster  10.0.0.4  (none)",
				`- peer Node "aks-nodepool1-1" has no podCIDR yet: no routes to it`,
			},
		},
		{
			golden: "plan-seed000-aks-nodepool1-0.txt",
			args:   []string{"--node", "aks-nodepool1-0", "--objects", seed000, "-o", "table"},
			rows: []string{
				"flex-1           flex-site  192.168.10.10  192.168.20.0/25",
				`192.168.20.0/25  flex-1  192.168.10.10  Node "flex-1" spec.podCIDRs[0]`,
			},
		},
		{
			golden: "plan-endpoint-in-pods-a1.txt",
			args:   []string{"--node", "a1", "--objects", "testdata/endpoint-in-pods"},
			rows: []string{
				"TUNNEL MTU      1400",
				`10.1.0.101/32  b1    10.2.0.1    Node "b1" spec.podCIDRs[0]`,
				`10.1.0.0/25  10.1.0.100  Node "b1" spec.podCIDRs[0]  10.1.0.0/32,10.1.0.2/31,`,
				`- objects.yaml: Site "b": spec.podCidrAssignments[0].cidrBlocks[0]: 10.1.0.5/16 has host bits set; normalized to 10.1.0.0/16`,
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
	for _, field := range []string{`"underlay": "192.168.10.10"`, `"tunnelAddr": "192.168.20.1"`, `"podCIDRs": [`} {
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
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--node", "nope", "--objects", seed000}, `"nope"`},
		{[]string{"--node", "flex-1", "--objects", seed000, "-o", "yaml"}, `unknown format "yaml"`},
		{[]string{"--node", "flex-1", "--objects", bad}, `sites.yaml: Site "s": spec.nodeCidrs[0]: invalid CIDR "10.0.0.0/33"`},
		{[]string{"--node", "flex-1", "--objects", filepath.Join(bad, "missing")}, "read objects directory"},
		{[]string{"--objects", seed000}, `"node" not set`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, _, err := runPlanCmd(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}
