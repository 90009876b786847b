package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// TestNodeToNodeEveryScenario builds every built-in scenario with
// CheckNodes: every node pings every other node's InternalIP, before the
// agents start and again once they are ready; no pair may lose its replies,
// and none may reach one way only. isthmus routes node addresses through the
// tunnel only where both directions take the same path, so a stateful
// firewall or strict rp_filter between sites passes what it passed before.
// Then every pod pair of the scenario (checkPaths), so the pods of a scenario
// variant that only this test builds, and of any scenario added later, are
// checked under strict rp_filter too.
// seed000gw-open is seed 000's gateway setup with a firewall that passes
// node-to-node traffic, where the member aks-2 and the flex gateway flex-1 once
// lost each other both ways.
// Each scenario is a lab of its own, run beside the package's other labs.
func TestNodeToNodeEveryScenario(t *testing.T) {
	requireSetup(t)
	t.Parallel()
	for _, name := range append(testenv.Builtins(), "seed000gw-open") {
		t.Run(name, func(t *testing.T) {
			beside(t, weightLab)
			base, open := strings.CutSuffix(name, "-open")
			sc, err := testenv.LoadScenario(base)
			if err != nil {
				t.Fatal(err)
			}
			if open {
				sc.Underlay.CrossSite = testenv.CrossSiteAll
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var log strings.Builder
			l := upLab(ctx, t, sc, testenv.Options{ReadyTimeout: 60 * time.Second, CheckNodes: true, Log: &log})
			checkPaths(t, l)
			if open {
				// The pair reaches each other both ways, before
				// and with the agents.
				for _, pair := range []string{"aks-2 -> flex-1: ok", "flex-1 -> aks-2: ok"} {
					if n := strings.Count(log.String(), pair); n != 2 {
						t.Errorf("%q %d times in the lab log, want before and with the agents:\n%s", pair, n, log.String())
					}
				}
			}
		})
	}
}
