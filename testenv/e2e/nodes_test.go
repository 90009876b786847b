package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// TestNodeToNodeEveryScenario builds every built-in scenario with
// CheckNodes: every node pings every other node's InternalIP, before the
// agents start and again once they are ready. isthmus routes node addresses
// through the tunnel only where both directions take the same path, so a
// stateful firewall or strict rp_filter between sites passes what it passed
// before (the seed 000 gateway topology broke both directions, issue 12).
func TestNodeToNodeEveryScenario(t *testing.T) {
	requireSetup(t)
	for _, name := range testenv.Builtins() {
		t.Run(name, func(t *testing.T) {
			sc, err := testenv.LoadScenario(name)
			if err != nil {
				t.Fatal(err)
			}
			lab := labName()
			t.Cleanup(func() {
				if err := testenv.Down(lab, testenv.DownOptions{Binary: binary}); err != nil {
					t.Error(err)
				}
				assertGone(t, lab)
			})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if _, err := testenv.Up(ctx, sc, testenv.Options{Name: lab, Binary: binary, ReadyTimeout: 60 * time.Second, CheckNodes: true}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
