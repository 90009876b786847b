// Package datapath holds the kernel side effects of the agent, each behind a small
// function: load the BPF collection with its maps pinned by name, attach programs
// through pinned bpf links (tcx and XDP) that a restarted agent updates in place,
// create the overlay device isthmus0, sync the routes into it, set the sysctls the
// datapath needs, and remove all of it again (Uninstall).
//
// Every function acts on the network namespace of the calling OS thread: a caller
// that runs in a namespace other than its process's must lock its goroutine to a
// thread in that namespace (runtime.LockOSThread) and call from it.
package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/bpf"
	"github.com/isthmus-dev/isthmus/maps"
)

// DefaultPinDir is where the agent pins its maps and links unless told otherwise.
const DefaultPinDir = "/sys/fs/bpf/isthmus"

// ErrNotBPFFS is returned (wrapped) when the pin directory is not on a bpf file
// system.
var ErrNotBPFFS = errors.New("not on a bpf file system")

// Datapath is the loaded collection: programs and the pinned maps.
type Datapath struct {
	PinDir     string
	Collection *ebpf.Collection
	Maps       *maps.Set
	// tracer holds the kfree_skb tracer alone, loaded apart from the collection
	// (AttachTracer) because it needs the kernel's BTF to load at all.
	tracer *ebpf.CollectionSpec
}

// Close releases this process's handles. Pinned maps and links stay in the kernel.
func (d *Datapath) Close() {
	if d.Collection != nil {
		d.Collection.Close()
	}
}

// Program returns the program attached at hook h.
func (d *Datapath) Program(h Hook) *ebpf.Program {
	return d.Collection.Programs[h.Program()]
}

// CheckBPFFS returns an error wrapping ErrNotBPFFS unless dir, or its nearest
// existing parent, is on a bpf file system.
func CheckBPFFS(dir string) error {
	p := filepath.Clean(dir)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			if uint32(st.Type) != unix.BPF_FS_MAGIC {
				return fmt.Errorf("pin dir %s: %s is %w (mount one: mount -t bpf bpf /sys/fs/bpf)", dir, p, ErrNotBPFFS)
			}
			return nil
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return fmt.Errorf("stat pin dir %s: %w", p, err)
		}
		p = filepath.Dir(p)
	}
}

// DefaultNatEntries is the default size of the nat and masq_nat maps
// (--snat-table-size).
const DefaultNatEntries = 65536

// DefaultNatSourceFlows returns the default share of one pod source in a nat table
// of entries entries (--snat-flows-per-source): half the flows it holds (each flow
// takes two entries), at least one. Half, not less: a closed TCP flow keeps its place
// for the closing timeout, so the share bounds a client's rate of short connections
// (about share / 10 s sustained); half the default table keeps one such client at
// MASQUERADE's rate in TestRunSNATShort, and never lets one pod take the whole table.
func DefaultNatSourceFlows(entries uint32) uint32 {
	return max(entries/4, 1)
}

// Tables are the sizes of the maps whose entries grow with the fleet: a
// mesh of 20,000 nodes needs 20,000 routes, peers and allowed sources on each
// node, more than the object's sizes (ROUTES_MAX, PEERS_MAX and
// PEER_SOURCES_MAX in bpf/lib/maps.h). A size other than the pinned map's
// migrates the map like a new --snat-table-size does. Routes and PeerSources size
// both families' maps (routes and routes6, peer_sources and peer_sources6).
type Tables struct {
	Routes, Peers, PeerSources uint32
}

func (t Tables) sizes() map[maps.Name]uint32 {
	return map[maps.Name]uint32{maps.MapRoutes: t.Routes, maps.MapRoutes6: t.Routes, maps.MapPeers: t.Peers,
		maps.MapPeers6: t.Peers, maps.MapPeerSources: t.PeerSources, maps.MapPeerSources6: t.PeerSources}
}

// TablesFor sizes the growing maps for a node whose maps are to hold s: each
// keeps the object's size, or twice what s needs rounded up to a power of two
// when that is more, so the fleet may grow by as much again before the agent
// must resize them (maps.ErrCapacity; it migrates them in place). The power of two keeps the size,
// and so the pinned map, the same while the fleet changes a little.
func TablesFor(s maps.State) (Tables, error) {
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		return Tables{}, fmt.Errorf("load bpf spec: %w", err)
	}
	size := func(n maps.Name) uint32 {
		base := spec.Maps[string(n)].MaxEntries
		need := uint32(1)
		for need < 2*uint32(s.Counts()[n]) {
			need <<= 1
		}
		return max(base, need)
	}
	return Tables{Routes: max(size(maps.MapRoutes), size(maps.MapRoutes6)), Peers: size(maps.MapPeers),
		PeerSources: max(size(maps.MapPeerSources), size(maps.MapPeerSources6))}, nil
}

// Options are the load-time settings of the collection.
type Options struct {
	// NatEntries is the size of the nat and masq_nat maps (both directions of
	// every translated flow take one entry each); 0 means DefaultNatEntries.
	NatEntries uint32
	// NatSourceFlows is how many flows one pod source may hold in each of them
	// (nat_source_flows_max in bpf/lib/nat.h); 0 means
	// DefaultNatSourceFlows(NatEntries).
	NatSourceFlows uint32
	// Tables sizes the maps that grow with the fleet (TablesFor); zero
	// fields keep the object's sizes.
	Tables Tables
	// Log receives what Load reuses and migrates; nil means slog.Default().
	Log *slog.Logger
	// Fill, if set, is called during a migration with the new maps, after the
	// convertible entries are copied and before any link switches to the new
	// programs: the agent writes the maps it owns from its plan, so that the new
	// programs never see a map the migration could not convert.
	Fill func(*maps.Set) error
}

// Load loads the BPF collection with every map pinned by name in pinDir and
// returns it with its programs loaded but not attached.
//
// A map already pinned there (by an earlier run) is reused with its contents, a
// missing one is created and pinned. A pinned map whose layout differs from this
// build's (another key, value, type, flags or size: a new build, or a new
// --snat-table-size for nat) is migrated: a new map is created and pinned under a
// temporary name, the entries that convert are copied into it (Converter; same key
// and value sizes copy byte for byte), opts.Fill rewrites the agent's own maps,
// every pinned link is updated in place to the new programs, which use the new
// maps, and only then the temporary pins are renamed over the old ones, which
// frees the old maps. Traffic never meets a program without its maps. After a
// successful load the layout record (<pinDir>/layout) holds this build's
// maps.LayoutVersion and spec hash.
func Load(pinDir string, opts Options) (*Datapath, error) {
	if err := CheckBPFFS(pinDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(pinDir, "links"), 0o700); err != nil {
		return nil, fmt.Errorf("create pin dir: %w", err)
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		return nil, fmt.Errorf("load bpf spec: %w", err)
	}
	tracer := splitTracer(spec)
	layout, err := maps.CurrentLayout(spec)
	if err != nil {
		return nil, fmt.Errorf("load bpf spec: %w", err)
	}
	if opts.NatEntries == 0 {
		opts.NatEntries = DefaultNatEntries
	}
	for _, n := range []maps.Name{maps.MapNat, maps.MapMasqNat} {
		ms, ok := spec.Maps[string(n)]
		if !ok {
			return nil, fmt.Errorf("load bpf spec: no map %s", n)
		}
		ms.MaxEntries = opts.NatEntries
	}
	if opts.NatSourceFlows == 0 {
		opts.NatSourceFlows = DefaultNatSourceFlows(opts.NatEntries)
	}
	share, ok := spec.Variables["nat_source_flows_max"]
	if !ok {
		return nil, fmt.Errorf("load bpf spec: no variable nat_source_flows_max")
	}
	if err := share.Set(opts.NatSourceFlows); err != nil {
		return nil, fmt.Errorf("set nat_source_flows_max: %w", err)
	}
	// A pin dir from before masq_nat: its nat holds masquerade's entries too, which
	// the migration of nat moves there (natSplit).
	split := newNatSplit(pinDir)
	for n, size := range opts.Tables.sizes() {
		if ms := spec.Maps[string(n)]; ms != nil && size > 0 {
			ms.MaxEntries = size
		}
	}

	old, hadLayout := readLayout(pinDir)
	var migs []*migration
	defer func() {
		for _, m := range migs {
			m.close()
		}
	}()
	for _, n := range maps.AllMaps {
		ms := spec.Maps[string(n)]
		if ms == nil {
			return nil, fmt.Errorf("load bpf spec: no map %s", n)
		}
		ms.Pinning = ebpf.PinByName
		// A temporary pin left by an interrupted migration: the old pin is still
		// the one in use, so start over.
		os.Remove(filepath.Join(pinDir, string(n)) + tempSuffix)
		m, why, err := checkPinned(pinDir, string(n), ms)
		if err != nil {
			return nil, err
		}
		if m != nil {
			migs = append(migs, &migration{name: n, old: m, why: why})
		}
	}
	if len(migs) == 0 {
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
			Maps: ebpf.MapOptions{PinPath: pinDir},
		})
		if err != nil {
			return nil, fmt.Errorf("load bpf collection: %w", err)
		}
		return finish(pinDir, coll, tracer, layout, old, hadLayout, log)
	}

	log.Info("pinned maps differ from this build: migrating", "from_layout", old.Version, "to_layout", layout.Version, "maps", len(migs))
	repl := map[string]*ebpf.Map{}
	for _, m := range migs {
		ms := spec.Maps[string(m.name)]
		if err := m.prepare(pinDir, ms, old, split, log); err != nil {
			removeTemp(pinDir, migs)
			return nil, err
		}
		repl[string(m.name)] = m.new
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: pinDir},
		MapReplacements: repl,
	})
	if err != nil {
		removeTemp(pinDir, migs)
		return nil, fmt.Errorf("load bpf collection: %w", err)
	}
	fail := func(err error) (*Datapath, error) {
		coll.Close()
		removeTemp(pinDir, migs)
		return nil, err
	}
	if err := split.moveMasq(coll, migs, log); err != nil {
		return fail(err)
	}
	if opts.Fill != nil {
		set, err := maps.FromCollection(coll)
		if err != nil {
			return fail(err)
		}
		if err := opts.Fill(set); err != nil {
			return fail(fmt.Errorf("fill migrated maps: %w", err))
		}
	}
	switched, err := switchLinks(pinDir, coll)
	if err != nil {
		// Links already switched run the new programs on the new maps, which they
		// hold; the next start migrates again from the old pins.
		return fail(err)
	}
	for _, m := range migs {
		late := m.topUp(split, coll)
		path := filepath.Join(pinDir, string(m.name))
		if err := os.Rename(path+tempSuffix, path); err != nil {
			return fail(fmt.Errorf("swap pinned map %s: %w", path, err))
		}
		log.Info("pinned map migrated", "map", m.name, "copied_during_swap", late)
	}
	log.Info("datapath migrated", "from_layout", old.Version, "to_layout", layout.Version, "links_switched", switched)
	return finish(pinDir, coll, tracer, layout, old, hadLayout, log)
}

// finish writes the layout record and wraps the loaded collection.
func finish(pinDir string, coll *ebpf.Collection, tracer *ebpf.CollectionSpec, layout, old maps.LayoutRecord, hadLayout bool, log *slog.Logger) (*Datapath, error) {
	set, err := maps.FromCollection(coll)
	if err != nil {
		coll.Close()
		return nil, err
	}
	if !hadLayout || old != layout {
		if err := writeLayout(pinDir, layout); err != nil {
			coll.Close()
			return nil, err
		}
		log.Info("layout record written", "layout", layout.Version, "previous", old.Version, "had_record", hadLayout)
	}
	return &Datapath{PinDir: pinDir, Collection: coll, Maps: set, tracer: tracer}, nil
}

// removeTemp removes the temporary pins of an abandoned migration.
func removeTemp(pinDir string, migs []*migration) {
	for _, m := range migs {
		os.Remove(filepath.Join(pinDir, string(m.name)) + tempSuffix)
	}
}

var mapNames = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, n := range maps.AllMaps {
		m[string(n)] = struct{}{}
	}
	return m
}()

// checkPinned opens the map pinned as name in pinDir and returns it with the reason
// when it must be migrated to ms; nil when there is none or it is reused as is.
func checkPinned(pinDir, name string, ms *ebpf.MapSpec) (*ebpf.Map, error, error) {
	path := filepath.Join(pinDir, name)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open pinned map %s: %w (remove it with: isthmus uninstall --pin-dir %s)", path, err, pinDir)
	}
	if err := ms.Compatible(m); err != nil {
		return m, err, nil
	}
	m.Close()
	return nil, nil, nil
}
