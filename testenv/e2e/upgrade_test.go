package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// pinnedNat returns the id and size of a node's pinned nat map.
func pinnedNat(t *testing.T, l *testenv.Lab, node string) (ebpf.MapID, uint32) {
	t.Helper()
	return pinnedMap(t, l, node, maps.MapNat)
}

// pinnedMap returns the id and size of a node's pinned map n.
func pinnedMap(t *testing.T, l *testenv.Lab, node string, n maps.Name) (ebpf.MapID, uint32) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(l.PinDir(node), string(n)), nil)
	if err != nil {
		t.Fatalf("node %s: open pinned %s: %v", node, n, err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id, m.MaxEntries()
}

// TestUpgradeWithoutLoss: like TestRestartWithoutLoss, but every restart replaces
// the agents of a1 and b1 by a run whose nat map has another layout (another
// --snat-table-size: a new max_entries, the migration path a new build with a
// changed map takes): steady UDP both ways between a1-p1 and b1-p1 loses nothing
// across three upgrades, the pod links keep their ids and run new programs, the
// pinned nat and masq_nat maps are new ones of the new size, nat_sources (whose
// layout the size does not change) is kept, and no counter goes back.
func TestUpgradeWithoutLoss(t *testing.T) {
	l := upDefault(t)
	upgraded := []string{"a1", "b1"}
	for _, pr := range [][2]string{{"a1-p1", "b1-p1"}, {"b1-p1", "a1-p1"}} {
		if err := testenv.Ping(l.PodNS(pr[0]), l.PodAddr(pr[1]), 2*time.Second); err != nil {
			t.Fatalf("ping %s -> %s before the upgrades: %v", pr[0], pr[1], err)
		}
	}
	beforeLinks := map[string]map[string][2]uint32{}
	beforeNat := map[string]ebpf.MapID{}
	beforeMasq := map[string]ebpf.MapID{}
	sources := map[string]ebpf.MapID{}
	for _, n := range upgraded {
		beforeLinks[n] = podLinks(t, l, n)
		beforeNat[n], _ = pinnedNat(t, l, n)
		beforeMasq[n], _ = pinnedMap(t, l, n, maps.MapMasqNat)
		sources[n], _ = pinnedMap(t, l, n, maps.MapNatSources)
	}

	const interval = 2 * time.Millisecond
	streams := []*stream{
		startStream(t, l, "a1-p1", "b1-p1", interval),
		startStream(t, l, "b1-p1", "a1-p1", interval),
	}
	time.Sleep(300 * time.Millisecond)

	sizes := []uint32{32768, 16384, 65536}
	for round, size := range sizes {
		round++
		counters := map[string]map[maps.MetricKey]maps.Counter{}
		for _, n := range upgraded {
			if err := l.StopAgent(n); err != nil {
				t.Fatalf("round %d: stop agent %s: %v", round, n, err)
			}
			// Read with no agent running: the programs still count, so the
			// counters after the upgrade can only be larger.
			counters[n] = nodeMetrics(t, l, n)
		}
		time.Sleep(200 * time.Millisecond)
		for _, n := range upgraded {
			if err := l.StartAgent(n, "--snat-table-size", strconv.FormatUint(uint64(size), 10)); err != nil {
				t.Fatalf("round %d: start agent %s: %v", round, n, err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		err := l.WaitReady(ctx, 30*time.Second)
		cancel()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, n := range upgraded {
			id, got := pinnedNat(t, l, n)
			if got != size {
				t.Errorf("round %d: %s: pinned nat has %d entries, want %d", round, n, got, size)
			}
			if id == beforeNat[n] {
				t.Errorf("round %d: %s: nat map %d kept: no migration happened", round, n, id)
			}
			beforeNat[n] = id
			if id, got := pinnedMap(t, l, n, maps.MapMasqNat); got != size || id == beforeMasq[n] {
				t.Errorf("round %d: %s: pinned masq_nat %d has %d entries, want a new map (was %d) of %d", round, n, id, got, beforeMasq[n], size)
			} else {
				beforeMasq[n] = id
			}
			if id, _ := pinnedMap(t, l, n, maps.MapNatSources); id != sources[n] {
				t.Errorf("round %d: %s: nat_sources replaced (%d, was %d): its layout did not change", round, n, id, sources[n])
			}
			after := nodeMetrics(t, l, n)
			for k, c := range counters[n] {
				if a := after[k]; a.Packets < c.Packets || a.Bytes < c.Bytes {
					t.Errorf("round %d: %s: counter %s/%s went from %d to %d packets across the upgrade", round, n, k.Name(), k.Hook, c.Packets, a.Packets)
				}
			}
			links := podLinks(t, l, n)
			checkLinksUpdated(t, fmt.Sprintf("round %d: %s (nat %d entries)", round, n, got), "upgrade", beforeLinks[n], links)
			beforeLinks[n] = links
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)

	checkNoLoss(t, streams, interval, "upgrades")
	if t.Failed() {
		for _, n := range upgraded {
			t.Logf("counters of %s:\n%s\nagent log:\n%s", n, formatMetrics(nodeMetrics(t, l, n)), tailFile(l.AgentLog(n)))
		}
	}
}
