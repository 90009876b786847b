package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/maps"
)

// tempSuffix marks a migrated map pinned next to the one it replaces until the
// swap renames it over the old pin (bpffs refuses dots in names).
const tempSuffix = ":migrating"

// Converter copies the entries of a pinned map of an older layout (from) into the
// map of this build (to) and returns how many it copied and how many it dropped.
type Converter func(from, to *ebpf.Map, fromVersion uint32) (copied, dropped int, err error)

// converters are the per-map converters for key or value layouts that changed
// between layout versions. A map without one is copied entry by entry when its key
// and value sizes are unchanged (a new max_entries or flags) and otherwise starts
// empty: the maps the agent owns are rewritten from the plan (Options.Fill) before
// any link switches to the new programs; nat and metrics lose what does not convert.
var converters = map[maps.Name]Converter{
	maps.MapMetrics: convertMetrics,
}

// convertMetrics moves the counters of a metrics map pinned by layout 5 or older, a
// per-CPU hash keyed by struct metrics_key, into this build's per-CPU array at
// maps.MetricSlot of each key, CPU by CPU (the sizes are alike, so a byte copy would
// misplace them: a key's bytes read as a slot index). A code or hook without a slot
// adds to the out-of-range slot that counts it. An array (a later layout that
// resized it) is copied slot by slot: the slot of a pair has not moved while
// maps.MetricCodes has not changed. Nothing is dropped.
func convertMetrics(from, to *ebpf.Map, _ uint32) (copied, dropped int, err error) {
	if from.Type() == ebpf.PerCPUArray {
		return copyEntries(from, to)
	}
	if from.Type() != ebpf.PerCPUHash || from.KeySize() != uint32(binary.Size(maps.MetricsKey{})) ||
		from.ValueSize() != uint32(binary.Size(maps.MetricsValue{})) {
		return 0, 0, fmt.Errorf("convert metrics: a %s of key/value sizes %d/%d is no layout of metrics",
			from.Type(), from.KeySize(), from.ValueSize())
	}
	var (
		k   maps.MetricsKey
		vs  []maps.MetricsValue
		sum []maps.MetricsValue
	)
	it := from.Iterate()
	for it.Next(&k, &vs) {
		slot := maps.MetricSlot(maps.MetricKey{Code: k.Code, Hook: maps.Hook(k.Hook)})
		if err := to.Lookup(slot, &sum); err != nil {
			return copied, dropped, fmt.Errorf("convert metrics: read slot %d: %w", slot, err)
		}
		for cpu := range min(len(sum), len(vs)) {
			sum[cpu].Packets += vs[cpu].Packets
			sum[cpu].Bytes += vs[cpu].Bytes
		}
		if err := to.Update(slot, sum, ebpf.UpdateAny); err != nil {
			return copied, dropped, fmt.Errorf("convert metrics: write slot %d: %w", slot, err)
		}
		copied++
	}
	if err := it.Err(); err != nil {
		return copied, dropped, fmt.Errorf("convert metrics: %w", err)
	}
	return copied, dropped, nil
}

// agentOwned are the maps the agent rewrites from the plan on every sync.
var agentOwned = map[maps.Name]bool{
	maps.MapRoutes: true, maps.MapPeers: true, maps.MapPeerSources: true, maps.MapConfig: true,
	maps.MapPodIfaces: true, maps.MapNexthopGroups: true, maps.MapFabricPrefixes: true, maps.MapSNATExempt: true,
	maps.MapMasqExempt: true, maps.MapPodAddrs: true, maps.MapPodAddrs6: true,
	maps.MapRoutes6: true, maps.MapPeerSources6: true, maps.MapPeers6: true,
}

// copyEntries copies every entry of from into to, byte for byte; both must have the
// same key and value sizes. Entries that do not fit (a smaller hash) are counted as
// dropped; an LRU map evicts its oldest instead.
func copyEntries(from, to *ebpf.Map) (copied, dropped int, err error) {
	if from.KeySize() != to.KeySize() || from.ValueSize() != to.ValueSize() {
		return 0, 0, fmt.Errorf("copy entries: key/value sizes %d/%d and %d/%d differ",
			from.KeySize(), from.ValueSize(), to.KeySize(), to.ValueSize())
	}
	perCPU := hasPerCPUValue(from.Type())
	var (
		key []byte
		val []byte
		pcv [][]byte
	)
	if perCPU {
		n, err := ebpf.PossibleCPU()
		if err != nil {
			return 0, 0, fmt.Errorf("copy entries: %w", err)
		}
		pcv = make([][]byte, n)
	}
	it := from.Iterate()
	for {
		var ok bool
		if perCPU {
			ok = it.Next(&key, pcv)
		} else {
			ok = it.Next(&key, &val)
		}
		if !ok {
			break
		}
		var err error
		if perCPU {
			err = to.Update(key, pcv, ebpf.UpdateAny)
		} else {
			err = to.Update(key, val, ebpf.UpdateAny)
		}
		switch {
		case err == nil:
			copied++
		case errors.Is(err, unix.E2BIG):
			// Full, or an array index past the new size.
			dropped++
		default:
			return copied, dropped, fmt.Errorf("copy entries: %w", err)
		}
	}
	if err := it.Err(); err != nil {
		return copied, dropped, fmt.Errorf("copy entries: %w", err)
	}
	return copied, dropped, nil
}

// migration is one pinned map being replaced by a map of this build's layout.
type migration struct {
	name maps.Name
	old  *ebpf.Map
	new  *ebpf.Map
	why  error
}

func (m *migration) close() {
	if m.old != nil {
		m.old.Close()
	}
	if m.new != nil {
		m.new.Close()
	}
}

// prepare creates the new map, copies what converts and pins it at its temporary
// path.
func (m *migration) prepare(pinDir string, ms *ebpf.MapSpec, from maps.LayoutRecord, split *natSplit, log *slog.Logger) error {
	spec := ms.Copy()
	spec.Pinning = ebpf.PinNone
	nm, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("create map %s for migration: %w", m.name, err)
	}
	m.new = nm
	var copied, dropped int
	switch conv, ok := converters[m.name]; {
	case m.name == maps.MapNat && split.active:
		copied, dropped, err = split.copySNAT(m.old, nm)
	case ok:
		copied, dropped, err = conv(m.old, nm, from.Version)
	case m.old.KeySize() == nm.KeySize() && m.old.ValueSize() == nm.ValueSize():
		copied, dropped, err = copyEntries(m.old, nm)
	case agentOwned[m.name]:
		// Rewritten from the plan before the links switch.
	default:
		log.Warn("pinned map has no converter: its entries are dropped", "map", m.name, "from_layout", from.Version, "to_layout", maps.LayoutVersion)
	}
	if err != nil {
		return fmt.Errorf("migrate map %s: %w", m.name, err)
	}
	log.Info("migrating pinned map", "map", m.name, "reason", m.why, "copied", copied, "dropped", dropped)
	path := filepath.Join(pinDir, string(m.name)) + tempSuffix
	os.Remove(path)
	if err := nm.Pin(path); err != nil {
		return fmt.Errorf("pin map %s: %w", path, err)
	}
	return nil
}

// topUp copies into the new map the entries the old programs created after the
// first copy (nat only: a translation made during the swap; masquerade's go to
// coll's masq_nat while split is active); existing entries of the new map win.
func (m *migration) topUp(split *natSplit, coll *ebpf.Collection) int {
	if m.name != maps.MapNat || m.old.KeySize() != m.new.KeySize() || m.old.ValueSize() != m.new.ValueSize() {
		return 0
	}
	var (
		k maps.NatKey
		v maps.NatValue
	)
	n := 0
	now, _ := maps.MonotonicNow()
	it := m.old.Iterate()
	for it.Next(&k, &v) {
		if natExpired(k, v, now) {
			continue // collected already, or about to be
		}
		to := m.new
		if split.active && split.isMasq(k, v) {
			to = coll.Maps[string(maps.MapMasqNat)]
		}
		if to.Update(k, v, ebpf.UpdateNoExist) == nil {
			n++
		}
	}
	return n
}

// natExpired reports whether nat entry k, v is past its timeout at now (0: never).
func natExpired(k maps.NatKey, v maps.NatValue, now uint64) bool {
	return now != 0 && now-v.LastSeen > uint64(maps.NatTimeout(k.Proto, v.State))
}

// natSplit moves egress masquerade's entries out of a nat map pinned by a build from
// before masq_nat (layout 3 and older), where both kinds shared nat: an entry is
// masquerade's when it translates to the node's underlay address (read from the
// pinned config), every other one stays in nat.
type natSplit struct {
	// active: masq_nat is not pinned yet and nat is.
	active   bool
	underlay uint32 // __be32; 0: no config, nothing is masquerade's
}

// newNatSplit inspects pinDir before a load.
func newNatSplit(pinDir string) *natSplit {
	s := &natSplit{}
	if _, err := os.Stat(filepath.Join(pinDir, string(maps.MapMasqNat))); !errors.Is(err, os.ErrNotExist) {
		return s
	}
	if _, err := os.Stat(filepath.Join(pinDir, string(maps.MapNat))); err != nil {
		return s
	}
	s.active = true
	cfg, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, string(maps.MapConfig)), nil)
	if err != nil {
		return s
	}
	defer cfg.Close()
	// struct datapath_config starts with vni, then underlay_ip, in every layout.
	val := make([]byte, cfg.ValueSize())
	if len(val) >= 8 && cfg.Lookup(uint32(0), &val) == nil {
		s.underlay = binary.NativeEndian.Uint32(val[4:8])
	}
	return s
}

// isMasq reports whether nat entry k, v translates to the underlay address.
func (s *natSplit) isMasq(k maps.NatKey, v maps.NatValue) bool {
	if s.underlay == 0 {
		return false
	}
	if v.Flags&maps.NatFlagReply != 0 {
		return k.Daddr == s.underlay
	}
	return v.Addr == s.underlay
}

// copySNAT is nat's converter while the split is active: every live entry but
// masquerade's.
func (s *natSplit) copySNAT(from, to *ebpf.Map) (copied, dropped int, err error) {
	var (
		k maps.NatKey
		v maps.NatValue
	)
	now, _ := maps.MonotonicNow()
	it := from.Iterate()
	for it.Next(&k, &v) {
		if s.isMasq(k, v) || natExpired(k, v, now) {
			continue
		}
		switch err := to.Update(k, v, ebpf.UpdateAny); {
		case err == nil:
			copied++
		case errors.Is(err, unix.E2BIG):
			dropped++
		default:
			return copied, dropped, fmt.Errorf("copy nat entries: %w", err)
		}
	}
	if err := it.Err(); err != nil {
		return copied, dropped, fmt.Errorf("copy nat entries: %w", err)
	}
	return copied, dropped, nil
}

// moveMasq copies masquerade's live entries of the old nat (its migration in migs) into
// coll's masq_nat, then counts every source's flows in nat_sources
// (maps.CollectNat), before any link switches to the new programs.
func (s *natSplit) moveMasq(coll *ebpf.Collection, migs []*migration, log *slog.Logger) error {
	if !s.active {
		return nil
	}
	var old *ebpf.Map
	for _, m := range migs {
		if m.name == maps.MapNat {
			old = m.old
		}
	}
	masq, nat, sources := coll.Maps[string(maps.MapMasqNat)], coll.Maps[string(maps.MapNat)], coll.Maps[string(maps.MapNatSources)]
	if old == nil || masq == nil || nat == nil || sources == nil {
		return nil
	}
	var (
		k      maps.NatKey
		v      maps.NatValue
		copied int
	)
	now, err := maps.MonotonicNow()
	if err != nil {
		return err
	}
	it := old.Iterate()
	for it.Next(&k, &v) {
		if !s.isMasq(k, v) || natExpired(k, v, now) {
			continue
		}
		if err := masq.Update(k, v, ebpf.UpdateAny); err != nil && !errors.Is(err, unix.E2BIG) {
			return fmt.Errorf("move masquerade entries to %s: %w", maps.MapMasqNat, err)
		}
		copied++
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("move masquerade entries to %s: %w", maps.MapMasqNat, err)
	}
	for _, t := range []struct {
		m     *ebpf.Map
		table uint32
	}{{nat, maps.NatTableSNAT}, {masq, maps.NatTableMasq}} {
		if _, err := maps.CollectNat(t.m, sources, t.table, now); err != nil {
			return err
		}
	}
	log.Info("masquerade entries moved out of nat", "map", maps.MapMasqNat, "copied", copied)
	return nil
}

// switchLinks updates every pinned link under pinDir to the program of its hook in
// coll. A link that cannot be opened is left to the agent's attach and prune.
func switchLinks(pinDir string, coll *ebpf.Collection) (int, error) {
	pins, err := ListLinks(pinDir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pins {
		prog := coll.Programs[p.Hook.Program()]
		if !p.Hook.valid() || prog == nil {
			continue
		}
		l, err := link.LoadPinnedLink(p.Path, nil)
		if err != nil {
			continue
		}
		err = l.Update(prog)
		l.Close()
		if err != nil {
			return n, fmt.Errorf("update link %s: %w", p.Path, err)
		}
		n++
	}
	return n, nil
}

// readLayout returns the pinned layout record, false if there is none (a first
// start, or a pin dir from before layout records).
func readLayout(pinDir string) (maps.LayoutRecord, bool) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, string(maps.MapLayout)), nil)
	if err != nil {
		return maps.LayoutRecord{}, false
	}
	defer m.Close()
	var r maps.LayoutRecord
	if err := m.Lookup(uint32(0), &r); err != nil {
		return maps.LayoutRecord{}, false
	}
	return r, true
}

// writeLayout pins (or rewrites) the layout record; a pinned record of another
// shape is replaced.
func writeLayout(pinDir string, r maps.LayoutRecord) error {
	path := filepath.Join(pinDir, string(maps.MapLayout))
	spec := &ebpf.MapSpec{Name: string(maps.MapLayout), Type: ebpf.Array, KeySize: 4,
		ValueSize: uint32(binarySize(r)), MaxEntries: 1}
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err == nil && spec.Compatible(m) != nil {
		m.Close()
		os.Remove(path)
		err = os.ErrNotExist
	}
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			os.Remove(path)
		}
		if m, err = ebpf.NewMap(spec); err != nil {
			return fmt.Errorf("create layout record: %w", err)
		}
		if err := m.Pin(path); err != nil {
			m.Close()
			return fmt.Errorf("pin layout record: %w", err)
		}
	}
	defer m.Close()
	if err := m.Update(uint32(0), r, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write layout record: %w", err)
	}
	return nil
}

func hasPerCPUValue(t ebpf.MapType) bool {
	switch t {
	case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUCPUHash, ebpf.PerCPUCGroupStorage:
		return true
	}
	return false
}

func binarySize(maps.LayoutRecord) int { return 4 + 4 + 32 }
