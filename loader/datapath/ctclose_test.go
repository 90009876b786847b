package datapath

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/maps"
)

// TestLoadKeepsFastPathCloses: ct_close and ct_close6, where the conntrack fast path
// records the IPv4 and IPv6 flows it closed (conntrack itself still holds them
// ESTABLISHED), are pinned: an agent restart (a second Load of the same pin
// directory) finds the closes the first one recorded, in the same maps, which the new
// programs use. Without them a restarted agent would carry a closed flow's late
// packets around the stack and renew its entry to the ESTABLISHED timeout
// (docs/architecture.md, "The conntrack fast path").
func TestLoadKeepsFastPathCloses(t *testing.T) {
	dir := migrationEnv(t)
	dp, err := Load(dir, Options{})
	if err != nil {
		t.Fatalf("first load: %v", err)
	}
	v := maps.CtCloseValue{FinEnd: [2]uint32{1000, 2000}, Fin: [2]uint8{1, 1}, Acked: [2]uint8{1, 1}, Closed: 1}
	keys := map[maps.Name]any{
		maps.MapCtClose: maps.CtCloseKey{Saddr: 0x0500000a, Daddr: 0x0700020a, Sport: 0x3930, Dport: 0x5000},
		maps.MapCtClose6: maps.CtClose6Key{Saddr: [4]uint32{0x10fd, 0, 0, 0x05000000},
			Daddr: [4]uint32{0x20fd, 0, 0, 0x07000000}, Sport: 0x3930, Dport: 0x5000},
	}
	ids := map[maps.Name]ebpf.MapID{}
	for name, k := range keys {
		if err := dp.Maps.Map(name).Update(k, v, ebpf.UpdateAny); err != nil {
			t.Fatalf("record a close in %s: %v", name, err)
		}
		ids[name] = pinnedMapID(t, dir, name)
	}
	dp.Close()

	dp, err = Load(dir, Options{})
	if err != nil {
		t.Fatalf("load after the restart: %v", err)
	}
	defer dp.Close()
	for name, k := range keys {
		var got maps.CtCloseValue
		if err := dp.Maps.Map(name).Lookup(k, &got); err != nil {
			t.Fatalf("%s: the close recorded before the restart: %v", name, err)
		}
		if got != v {
			t.Errorf("%s: the close recorded before the restart reads %+v, want %+v", name, got, v)
		}
		id := ids[name]
		if now := pinnedMapID(t, dir, name); now != id {
			t.Errorf("%s is map %d after the restart, %d before", name, now, id)
		}
		for _, h := range []Hook{HookPodIngress, HookUnderlayIngress} {
			info, err := dp.Program(h).Info()
			if err != nil {
				t.Fatal(err)
			}
			used, _ := info.MapIDs()
			if !slices.Contains(used, id) {
				t.Errorf("program %v after the restart does not use the pinned %s (map %d; uses %v)", h, name, id, used)
			}
		}
	}
}
