package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/isthmus-dev/isthmus/loader/plan"
)

func TestPlanExplain(t *testing.T) {
	for _, tt := range []struct {
		golden string
		args   []string
		// rows must appear whatever the golden says.
		rows []string
	}{{
		golden: "explain-seed000-gateway-aks-2-10.0.2.9.txt",
		args:   []string{"--node", "aks-2", "--objects", seed000Gateway, "--explain", "10.0.2.9"},
		rows: []string{
			"MATCH           local 10.0.2.0/23",
			`- 10.0.2.0/23 would cover this address but 10.0.0.0/16 is local on this node: Site "cluster" spec.localCidrs`,
			"SNAT AS SOURCE  no, exempt: 10.0.2.0/23",
		},
	}, {
		golden: "explain-seed000-aks-nodepool1-0-192.168.20.9.txt",
		args:   []string{"--node", "aks-nodepool1-0", "--objects", seed000, "--explain", "192.168.20.9"},
		rows: []string{
			"MATCH           route 192.168.20.0/25",
			`ORIGIN          Node "flex-1" spec.podCIDRs[0]`,
			"SNAT AS SOURCE  yes, translated to 100.64.0.4",
		},
	}, {
		golden: "explain-seed000-aks-nodepool1-0-8.8.8.8.txt",
		args:   []string{"--node", "aks-nodepool1-0", "--objects", seed000, "--explain", "8.8.8.8"},
		rows:   []string{"MATCH           (none)", "GOES            no route: stays on the underlay"},
	}, {
		// docs/inspect.md shows this pair from both ends.
		golden: "explain-pair-seed000-gateway-aks-2-10.0.2.200-192.168.20.6.txt",
		args:   []string{"--node", "aks-2", "--objects", seed000Gateway, "--explain", "192.168.20.6", "--from", "10.0.2.200"},
		rows: []string{
			"REQUEST  10.0.2.200 -> 192.168.20.6: table fabric, route 192.168.20.0/25 to a group of 1, leaves by underlay",
			"REPLY    192.168.20.6 -> 10.0.2.200: table fabric, route 192.168.20.0/25 to a group of 1, must arrive on underlay",
		},
	}, {
		golden: "explain-pair-seed000-gateway-flex-1-192.168.20.6-10.0.2.200.txt",
		args:   []string{"--node", "flex-1", "--objects", seed000Gateway, "--explain", "10.0.2.200", "--from", "192.168.20.6"},
		rows:   []string{"REQUEST  192.168.20.6 -> 10.0.2.200: table pods, route 10.0.2.0/23 to a group of 1, leaves by isthmus0"},
	}} {
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
				t.Errorf("output differs from %s (-want +got; -update rewrites it):\n%s", path, diff)
			}
		})
	}
}

func TestPlanExplainJSON(t *testing.T) {
	out, _, err := runPlanCmd(t, "--node", "flex-1", "--objects", seed000, "--explain", "10.0.2.9", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var e plan.Explanation
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	if e.Match == nil || e.Match.Kind != plan.MatchRoute || e.Match.Prefix.String() != "10.0.2.0/23" || len(e.Match.Group) != 2 ||
		e.Match.Origin != `Site "cluster" spec.podCidrAssignments[0].cidrBlocks[0]` {
		t.Errorf("match %+v, want the route 10.0.2.0/23 to a group of 2 from the site's pod block", e.Match)
	}
	if !e.SNAT.Translated || e.SNAT.To.String() != "192.168.20.1" {
		t.Errorf("snat %+v, want translated to 192.168.20.1", e.SNAT)
	}
}

func TestPlanExplainErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--explain", "nonsense"}, "parse --explain"},
		{[]string{"--explain", "2001:db8::1", "--from", "10.0.2.9"}, "different families"},
	} {
		_, _, err := runPlanCmd(t, append([]string{"--node", "flex-1", "--objects", seed000}, tt.args...)...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
		}
	}
}

// TestPlanExplainIPv6: an IPv6 address is explained (here one no entry holds: the
// kernel's, not the tunnel's), its SNAT line saying IPv6 is never translated.
func TestPlanExplainIPv6(t *testing.T) {
	out, _, err := runPlanCmd(t, "--node", "flex-1", "--objects", seed000, "--explain", "2001:db8::1", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var e plan.Explanation
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	if e.Addr.String() != "2001:db8::1" || e.Match != nil || !strings.HasPrefix(e.Verdict, "no route") ||
		e.SNAT.Translated || !strings.Contains(e.SNAT.Reason, "IPv4 only") {
		t.Errorf("explanation %+v, want no match, no route, SNAT IPv4 only", e)
	}
}

// TestPlanExplainFromNeedsExplain: --from alone is refused with the reason.
func TestPlanExplainFromNeedsExplain(t *testing.T) {
	if _, _, err := runPlanCmd(t, "--node", "aks-2", "--objects", seed000Gateway, "--from", "10.0.2.200"); err == nil || !strings.Contains(err.Error(), "--from needs --explain") {
		t.Errorf("plan --from without --explain: %v, want an error saying --from needs --explain", err)
	}
}
