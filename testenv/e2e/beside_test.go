package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sync/semaphore"
)

// The package's tests run in two phases.
//
// First the sequential tests, one at a time: those that judge time, loss or
// throughput (a stream across an agent restart or a rolling update, a
// failover's gap, a bulk flow's stalls, conntrack's timeouts), which a busy
// machine would distort. On two cores, another lab beside them is enough to
// lose datagrams that isthmus did not lose.
//
// Then every test that calls beside, several at a time: they judge paths,
// drops, addresses and counters, with retries and timeouts sized for a loaded
// machine, and most of their time is spent waiting (agents, kubelets, the
// network), which other labs fill. How many run at once is a budget of slots
// (defaultBesideSlots, or $ISTHMUS_E2E_SLOTS), where a whole cluster (an API
// server, a scheduler, a controller-manager, containerd and a kubelet on every
// node) weighs weightCluster and a lab of namespaces and agents weighs
// weightLab: a cluster and a lab, or three labs. With four slots (two
// clusters, or four labs) both cores were busy for the whole phase, the load
// average above 20: more would only stretch every test's timeouts. Each test
// holds its slots until its cleanups (the lab's removal) have run.

const (
	weightLab     = 1
	weightCluster = 2
	// defaultBesideSlots is the budget on the project's 2-core machines.
	defaultBesideSlots = 3
	// besideSlotsEnv overrides the budget (a bigger machine: more; 2: one
	// test at a time, clusters included).
	besideSlotsEnv = "ISTHMUS_E2E_SLOTS"
)

var besideSem *semaphore.Weighted

// initBeside sizes the budget from the environment and lifts go test's own
// limit on parallel tests (GOMAXPROCS, 2 here) unless -test.parallel was
// given, so the budget alone decides. It must run in TestMain before m.Run.
func initBeside() error {
	slots := int64(defaultBesideSlots)
	if v := os.Getenv(besideSlotsEnv); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < weightCluster {
			return fmt.Errorf("%s=%q: want a whole number of slots, at least %d (a whole cluster's weight)", besideSlotsEnv, v, weightCluster)
		}
		slots = n
	}
	besideSem = semaphore.NewWeighted(slots)
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		// Every test of the parallel phase waits on the budget instead.
		if err := flag.Set("test.parallel", "256"); err != nil {
			return fmt.Errorf("lift -test.parallel: %w", err)
		}
	}
	return nil
}

// beside runs t in the parallel phase (t.Parallel) once weight slots of the
// budget are free, and gives them back after t's cleanups.
func beside(t *testing.T, weight int64) {
	t.Helper()
	t.Parallel()
	if besideSem == nil {
		t.Fatal("the budget of parallel tests was not set up (initBeside in TestMain)")
	}
	// Waits as long as the tests before it take; go test's -timeout bounds it.
	if err := besideSem.Acquire(context.Background(), weight); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after every later cleanup.
	t.Cleanup(func() { besideSem.Release(weight) })
}
