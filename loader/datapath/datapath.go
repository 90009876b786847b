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

// DefaultNatEntries is the default size of the nat map (--snat-table-size).
const DefaultNatEntries = 65536

// Options are the load-time settings of the collection.
type Options struct {
	// NatEntries is the size of the nat map (both directions of every translated
	// flow take one entry each); 0 means DefaultNatEntries.
	NatEntries uint32
}

// Load loads the BPF collection with every map pinned by name in pinDir: a map
// already pinned there (by an earlier run) is reused with its contents, a missing
// one is created and pinned. A pinned map that does not match this build is an
// error naming it. The nat map is created with opts.NatEntries entries; a pinned
// one of another size is an error that says so: resizing would drop every live
// translation, so it takes an explicit `isthmus uninstall`. Programs are loaded but
// not attached.
func Load(pinDir string, opts Options) (*Datapath, error) {
	if err := CheckBPFFS(pinDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(pinDir, "links"), 0o700); err != nil {
		return nil, fmt.Errorf("create pin dir: %w", err)
	}
	spec, err := bpf.LoadIsthmus()
	if err != nil {
		return nil, fmt.Errorf("load bpf spec: %w", err)
	}
	if opts.NatEntries == 0 {
		opts.NatEntries = DefaultNatEntries
	}
	nat, ok := spec.Maps[string(maps.MapNat)]
	if !ok {
		return nil, fmt.Errorf("load bpf spec: no map %s", maps.MapNat)
	}
	nat.MaxEntries = opts.NatEntries
	for name, ms := range spec.Maps {
		if _, ours := mapNames[name]; !ours {
			continue // .rodata and friends
		}
		ms.Pinning = ebpf.PinByName
		if err := checkPinned(pinDir, name, ms); err != nil {
			return nil, err
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Maps: ebpf.MapOptions{PinPath: pinDir},
	})
	if err != nil {
		return nil, fmt.Errorf("load bpf collection: %w", err)
	}
	set, err := maps.FromCollection(coll)
	if err != nil {
		coll.Close()
		return nil, err
	}
	return &Datapath{PinDir: pinDir, Collection: coll, Maps: set}, nil
}

var mapNames = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, n := range maps.AllMaps {
		m[string(n)] = struct{}{}
	}
	return m
}()

func checkPinned(pinDir, name string, ms *ebpf.MapSpec) error {
	path := filepath.Join(pinDir, name)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned map %s: %w (remove it with: isthmus uninstall --pin-dir %s)", path, err, pinDir)
	}
	defer m.Close()
	if name == string(maps.MapNat) {
		if info, err := m.Info(); err == nil && info.MaxEntries != ms.MaxEntries {
			return fmt.Errorf("reuse pinned map %s: it has %d entries, --snat-table-size asks for %d; resizing drops every live translation, so remove the old datapath first (isthmus uninstall --pin-dir %s) or keep the old size", path, info.MaxEntries, ms.MaxEntries, pinDir)
		}
	}
	if err := ms.Compatible(m); err != nil {
		return fmt.Errorf("reuse pinned map %s: %w (this build needs another layout; remove the old datapath with: isthmus uninstall --pin-dir %s)", path, err, pinDir)
	}
	return nil
}
