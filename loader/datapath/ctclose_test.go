package datapath

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/maps"
)

// TestLoadKeepsFastPathCloses: ct_close, where the conntrack fast path records the
// flows it closed (conntrack itself still holds them ESTABLISHED), is pinned: an
// agent restart (a second Load of the same pin directory) finds the closes the
// first one recorded, in the same map, which the new programs use. Without it a
// restarted agent would carry a closed flow's late packets around the stack and
// renew its entry to the ESTABLISHED timeout (docs/architecture.md, "The conntrack
// fast path").
func TestLoadKeepsFastPathCloses(t *testing.T) {
	dir := migrationEnv(t)
	dp, err := Load(dir, Options{})
	if err != nil {
		t.Fatalf("first load: %v", err)
	}
	k := maps.CtCloseKey{Saddr: 0x0500000a, Daddr: 0x0700020a, Sport: 0x3930, Dport: 0x5000}
	v := maps.CtCloseValue{FinEnd: [2]uint32{1000, 2000}, Fin: [2]uint8{1, 1}, Acked: [2]uint8{1, 1}, Closed: 1}
	if err := dp.Maps.Map(maps.MapCtClose).Update(k, v, ebpf.UpdateAny); err != nil {
		t.Fatalf("record a close: %v", err)
	}
	id := pinnedMapID(t, dir, maps.MapCtClose)
	dp.Close()

	dp, err = Load(dir, Options{})
	if err != nil {
		t.Fatalf("load after the restart: %v", err)
	}
	defer dp.Close()
	var got maps.CtCloseValue
	if err := dp.Maps.Map(maps.MapCtClose).Lookup(k, &got); err != nil {
		t.Fatalf("the close recorded before the restart: %v", err)
	}
	if got != v {
		t.Errorf("the close recorded before the restart reads %+v, want %+v", got, v)
	}
	if now := pinnedMapID(t, dir, maps.MapCtClose); now != id {
		t.Errorf("ct_close is map %d after the restart, %d before", now, id)
	}
	for _, h := range []Hook{HookPodIngress, HookUnderlayIngress} {
		info, err := dp.Program(h).Info()
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := info.MapIDs()
		if !slices.Contains(ids, id) {
			t.Errorf("program %v after the restart does not use the pinned ct_close (map %d; uses %v)", h, id, ids)
		}
	}
}
