package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// NatCollection is what one CollectNat pass over a table did.
type NatCollection struct {
	// Deleted counts the expired entries removed (both directions).
	Deleted int
	// Live counts the flows (original-direction entries) left, per pod source.
	Live map[uint32]uint32
}

// CollectNat removes the expired entries of the nat table m (MapNat or MapMasqNat,
// table NatTableSNAT or NatTableMasq) as of now (CLOCK_MONOTONIC nanoseconds, the
// clock of bpf_ktime_get_ns), with the timeouts of bpf/lib/conntrack.h (NatTimeout),
// then rewrites the flow count of every source of that table in sources
// (MapNatSources) to the flows it holds now. The tables are hashes, not LRUs: without
// this pass an expired entry stays until its own tuple or port is reused, and a pod's
// share (--snat-flows-per-source) would stay used by flows long gone. A count the
// datapath changed during the pass is off by those flows until the next pass.
func CollectNat(m, sources *ebpf.Map, table uint32, now uint64) (NatCollection, error) {
	res := NatCollection{Live: map[uint32]uint32{}}
	var (
		k       NatKey
		v       NatValue
		expired []NatKey
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if now-v.LastSeen > uint64(NatTimeout(k.Proto, v.State)) {
			expired = append(expired, k)
			continue
		}
		if v.Flags&NatFlagReply == 0 {
			res.Live[k.Saddr]++
		}
	}
	if err := it.Err(); err != nil {
		return res, fmt.Errorf("collect nat table %s: %w", m, err)
	}
	for _, k := range expired {
		err := m.Delete(k)
		switch {
		case err == nil:
			res.Deleted++
		case errors.Is(err, ebpf.ErrKeyNotExist):
		default:
			return res, fmt.Errorf("collect nat table %s: delete: %w", m, err)
		}
	}
	var (
		sk    NatSourceKey
		sv    NatSourceValue
		fixes = map[NatSourceKey]uint32{}
	)
	seen := map[uint32]bool{}
	sit := sources.Iterate()
	for sit.Next(&sk, &sv) {
		if sk.Table != table {
			continue
		}
		seen[sk.Addr] = true
		if want := res.Live[sk.Addr]; sv.Flows != want {
			fixes[sk] = want
		}
	}
	if err := sit.Err(); err != nil {
		return res, fmt.Errorf("collect nat sources: %w", err)
	}
	for addr, n := range res.Live {
		if !seen[addr] {
			fixes[NatSourceKey{Addr: addr, Table: table}] = n
		}
	}
	for sk, n := range fixes {
		if err := sources.Update(sk, NatSourceValue{Flows: n}, ebpf.UpdateAny); err != nil {
			return res, fmt.Errorf("collect nat sources: update: %w", err)
		}
	}
	return res, nil
}
