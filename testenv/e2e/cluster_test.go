package e2e

import (
	"context"
	"os"
	"testing"

	"github.com/isthmus-dev/isthmus/testenv/cluster"
)

// upCluster brings up a whole cluster (testenv/cluster) as a lab with a
// fresh name and the test's binary, logging to the test, and takes it down
// when the test ends, checking that nothing of the lab is left.
func upCluster(ctx context.Context, t *testing.T, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	requireSetup(t)
	opts.Name, opts.Binary, opts.Log = labName(), binary, t.Logf
	c, err := cluster.Up(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Down(); err != nil {
			t.Error(err)
		}
		assertGone(t, opts.Name)
	})
	return c
}

// tempWork returns a new temporary directory named prefix..., removed when
// the test ends (after the cleanups registered later). The name is short:
// unix sockets under it must fit in 108 bytes.
func tempWork(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
