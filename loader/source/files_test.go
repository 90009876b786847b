package source

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

const filesSites = `apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: a}
spec: {nodeCidrs: [10.1.0.0/24]}
---
apiVersion: v1
kind: Node
metadata: {name: a1}
status:
  addresses: [{type: InternalIP, address: 10.1.0.1}]
`

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sites.yaml", filesSites)
	f, err := NewFiles(dir, objects.Rules{}, 10*time.Millisecond, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wantSummary(t, f, "site a 10.1.0.0/24", "node a1@a ")

	// Three writes in a burst are one change.
	write("b.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: a2}\nstatus:\n  addresses: [{type: InternalIP, address: 10.1.0.2}]\n")
	write("notes.txt", "ignored\n")
	write("b.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: a2}\nspec: {podCIDRs: [10.10.2.0/24]}\nstatus:\n  addresses: [{type: InternalIP, address: 10.1.0.2}]\n")
	waitChanged(t, f, "files were written")
	noChange(t, f, "one burst")
	wantSummary(t, f, "site a 10.1.0.0/24", "node a1@a ", "node a2@a 10.10.2.0/24")

	write("b.yaml", "kind: Gadget\n")
	waitChanged(t, f, "a bad file was written")
	// The bad document is set aside, naming its file; the rest still loads.
	if set, _, err := f.Snapshot(); err != nil || len(set.Rejected) != 1 || set.Rejected[0].File != "b.yaml" || set.Node("a1") == nil {
		t.Errorf("snapshot of a bad file: %+v, %v; want a1 kept and b.yaml's document set aside", set, err)
	}
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, f, "a file was removed")
	wantSummary(t, f, "site a 10.1.0.0/24", "node a1@a ")
	if err := f.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

func TestFilesMissingDir(t *testing.T) {
	if _, err := NewFiles(filepath.Join(t.TempDir(), "nope"), objects.Rules{}, 0, nil); err == nil {
		t.Error("NewFiles of a missing directory succeeded")
	}
}

// TestNotifierMaxWait: pokes that never leave the debounce time quiet still
// fire within MaxWaitFactor debounce times of the first, and every poke
// counts one generation.
func TestNotifierMaxWait(t *testing.T) {
	n := newNotifier(20 * time.Millisecond)
	defer n.stop()
	start := time.Now()
	deadline := start.Add(MaxWaitFactor*20*time.Millisecond + 150*time.Millisecond)
	pokes := 0
	for {
		n.poke()
		pokes++
		select {
		case <-n.ch:
			if waited := time.Since(start); waited < MaxWaitFactor*20*time.Millisecond-5*time.Millisecond {
				t.Errorf("fired after %v of constant pokes, before the maximum wait", waited)
			}
			if got := n.gen.Load(); got != uint64(pokes) {
				t.Errorf("generation %d after %d pokes", got, pokes)
			}
			return
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no fire within %v of constant pokes", deadline.Sub(start))
		}
	}
}
