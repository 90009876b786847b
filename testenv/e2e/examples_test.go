package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// TestExamples brings up every lab of examples/lab, each of which runs one
// examples/ directory's manifests as they are (the scenario's manifests:),
// and checks every pod pair both ways with ICMP, TCP and UDP, with strict
// rp_filter dropping nothing (checkPaths): so each example, applied as it is,
// carries its pods' traffic across its sites. No example translates a source,
// so every server must see the sending pod's own address, and at least one
// probed pair must cross sites.
func TestExamples(t *testing.T) {
	beside(t, weightLab)
	requireSetup(t)
	files, err := filepath.Glob("../../examples/lab/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no lab scenario in examples/lab")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			sc, err := testenv.LoadScenario(f)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			l := upLab(ctx, t, sc, testenv.Options{})
			var nodes []string
			for _, n := range sc.Nodes() {
				nodes = append(nodes, n.Name)
			}
			m := checkPaths(t, l, nodes...)
			requireOwnSources(t, l, m)
			site := map[string]string{}
			for _, p := range sc.Pods() {
				site[p.Name] = p.Site
			}
			crossed := 0
			for _, p := range m.Probes {
				if p.OK && site[p.Src] != site[p.Dst] {
					crossed++
				}
			}
			if crossed == 0 {
				t.Errorf("no probe crossed sites: the example joined nothing")
			}
		})
	}
}
