package maps

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/bpf"
)

// TestCollectNat: one pass deletes the expired entries of a table (both halves),
// keeps the live ones, and rewrites the flow count of every source of that table to
// the flows it holds (a count too high, one missing), leaving the other table's
// counts alone.
func TestCollectNat(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test creates BPF maps and needs root")
	}
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		t.Fatal(err)
	}
	newMap := func(n Name) *ebpf.Map {
		ms := spec.Maps[string(n)].Copy()
		ms.Pinning = ebpf.PinNone
		ms.MaxEntries = 64
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create %s: %v", n, err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	nat, sources := newMap(MapNat), newMap(MapNatSources)
	now, err := MonotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	a, b, remote, tunnel := netip.MustParseAddr("10.0.4.10"), netip.MustParseAddr("10.0.4.11"), netip.MustParseAddr("10.2.0.7"), netip.MustParseAddr("100.64.0.4")
	type entry struct {
		k    NatKey
		v    NatValue
		live bool
	}
	flow := func(pod netip.Addr, sport uint16, proto, state uint8, idle time.Duration) []entry {
		seen := now - uint64(idle)
		live := idle <= NatTimeout(proto, state)
		return []entry{
			{NatKeyFrom(netip.AddrPortFrom(pod, sport), netip.AddrPortFrom(remote, 80), proto),
				NatValue{Addr: AddrToBE32(tunnel), Port: HostToBE16(sport), State: state, LastSeen: seen}, live},
			{NatKeyFrom(netip.AddrPortFrom(remote, 80), netip.AddrPortFrom(tunnel, sport), proto),
				NatValue{Addr: AddrToBE32(pod), Port: HostToBE16(sport), State: state, Flags: NatFlagReply, LastSeen: seen}, live},
		}
	}
	var all []entry
	all = append(all, flow(a, 1000, ProtoTCP, NatStateEstablished, time.Hour)...)      // live: 6 h
	all = append(all, flow(a, 1001, ProtoTCP, NatStateRST, 11*time.Second)...)         // expired: 10 s after an RST
	all = append(all, flow(a, 1002, ProtoUDP, NatStateEstablished, 61*time.Second)...) // expired: 60 s
	all = append(all, flow(b, 1003, ProtoUDP, NatStateNew, time.Second)...)            // live
	for _, e := range all {
		if err := nat.Put(e.k, e.v); err != nil {
			t.Fatal(err)
		}
	}
	// a's count is too high, b's is missing, and a count in the other table stays.
	if err := sources.Put(NatSourceKey{Addr: AddrToBE32(a), Table: NatTableSNAT}, NatSourceValue{Flows: 9}); err != nil {
		t.Fatal(err)
	}
	masqKey := NatSourceKey{Addr: AddrToBE32(a), Table: NatTableMasq}
	if err := sources.Put(masqKey, NatSourceValue{Flows: 5}); err != nil {
		t.Fatal(err)
	}

	res, err := CollectNat(nat, sources, NatTableSNAT, now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 4 {
		t.Errorf("deleted %d entries, want 4", res.Deleted)
	}
	for _, e := range all {
		var v NatValue
		err := nat.Lookup(e.k, &v)
		if e.live != (err == nil) {
			t.Errorf("entry %+v (state %d): present %v, want %v", e.k, e.v.State, err == nil, e.live)
		}
	}
	for _, c := range []struct {
		k    NatSourceKey
		want uint32
	}{
		{NatSourceKey{Addr: AddrToBE32(a), Table: NatTableSNAT}, 1},
		{NatSourceKey{Addr: AddrToBE32(b), Table: NatTableSNAT}, 1},
		{masqKey, 5},
	} {
		var v NatSourceValue
		if err := sources.Lookup(c.k, &v); err != nil || v.Flows != c.want {
			t.Errorf("nat_sources %s/%d = %+v, %v; want %d flows", BE32ToAddr(c.k.Addr), c.k.Table, v, err, c.want)
		}
	}
}
