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

// TestNotifierMaxWait: pokes that never leave the burst's quiet time quiet
// still fire within MaxWaitFactor debounce times of the first, and every poke
// counts one generation. The measured burst begins right after a fire, so it
// is a storm and its quiet time is the debounce time (a fresh notifier's
// first burst would have Settle, too short to outrun a loaded scheduler). A
// fire before the maximum wait is a failure only if the pokes really were
// constant: on a loaded machine the poking loop itself can stall past the
// quiet time, and then the notifier is right to fire; such a round is
// measured again (at most five times).
func TestNotifierMaxWait(t *testing.T) {
	const debounce = 40 * time.Millisecond
	for round := 1; ; round++ {
		early, stalled := notifierRound(t, debounce)
		if !early {
			return
		}
		// The loop reads the time just before each poke; the notifier reads
		// it inside: allow their difference.
		if stalled < debounce-2*time.Millisecond {
			t.Fatalf("fired before the maximum wait although no two pokes were %v apart (largest gap %v)", debounce, stalled)
		}
		if round == 5 {
			t.Fatalf("the poking loop stalled past the debounce time in %d rounds (largest gap %v): the machine is too loaded to measure", round, stalled)
		}
		t.Logf("round %d: the poking loop stalled %v (debounce %v): the early fire was right; measuring again", round, stalled, debounce)
	}
}

// notifierRound fires a new notifier once, then pokes it every few
// milliseconds until it fires again and reports whether that was before the
// maximum wait, and the largest gap between two pokes before it.
func notifierRound(t *testing.T, debounce time.Duration) (early bool, largestGap time.Duration) {
	t.Helper()
	n := newNotifier(debounce)
	defer n.stop()
	n.poke()
	select {
	case <-n.ch:
	case <-time.After(time.Second):
		t.Fatal("a lone poke did not fire within a second")
	}
	start := time.Now()
	deadline := start.Add(MaxWaitFactor*debounce + 150*time.Millisecond)
	pokes := 1
	last := start
	for {
		now := time.Now()
		if gap := now.Sub(last); gap > largestGap {
			largestGap = gap
		}
		last = now
		n.poke()
		pokes++
		select {
		case <-n.ch:
			if got := n.gen.Load(); got != uint64(pokes) {
				t.Errorf("generation %d after %d pokes", got, pokes)
			}
			return time.Since(start) < MaxWaitFactor*debounce-5*time.Millisecond, largestGap
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no fire within %v of constant pokes", deadline.Sub(start))
		}
	}
}
