package maps

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Set holds the datapath's maps, open in this process. It implements Writer.
// A Set is not safe for concurrent writes from several goroutines that expect an
// order between them; each call is one syscall.
type Set struct {
	maps map[Name]*ebpf.Map
	own  bool
}

// FromCollection returns the maps of a loaded collection. The Set does not own them:
// Close leaves them open for the collection.
func FromCollection(c *ebpf.Collection) (*Set, error) {
	s := &Set{maps: map[Name]*ebpf.Map{}}
	for _, n := range AllMaps {
		m, ok := c.Maps[string(n)]
		if !ok {
			return nil, fmt.Errorf("find map %s: not in the collection", n)
		}
		s.maps[n] = m
	}
	return s, nil
}

// OpenPinned opens the maps pinned in dir. Close releases them (the pins stay).
func OpenPinned(dir string) (*Set, error) {
	s := &Set{maps: map[Name]*ebpf.Map{}, own: true}
	for _, n := range AllMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, string(n)), nil)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", n, err)
		}
		s.maps[n] = m
	}
	return s, nil
}

// Close closes the maps if the Set opened them.
func (s *Set) Close() error {
	if !s.own {
		return nil
	}
	var errs []error
	for _, m := range s.maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// Map returns the map called n, or nil.
func (s *Set) Map(n Name) *ebpf.Map { return s.maps[n] }

// Update writes one entry (BPF_ANY).
func (s *Set) Update(n Name, key, value any) error {
	m := s.maps[n]
	if m == nil {
		return fmt.Errorf("update %s: no such map", n)
	}
	return m.Update(key, value, ebpf.UpdateAny)
}

// Delete removes one entry; a missing entry returns an error wrapping
// ebpf.ErrKeyNotExist (Apply treats it as success). In nexthop_groups, an array
// whose entries always exist, it writes the zero entry instead.
func (s *Set) Delete(n Name, key any) error {
	m := s.maps[n]
	if m == nil {
		return fmt.Errorf("delete %s: no such map", n)
	}
	if n == MapNexthopGroups {
		return m.Update(key, NexthopGroupValue{}, ebpf.UpdateExist)
	}
	return m.Delete(key)
}

// Read returns the current contents of the writable maps, so that a restarted agent
// diffs against what the kernel holds rather than against an empty State.
func (s *Set) Read() (State, error) {
	st := NewState()
	if err := readMap[RouteKey, RouteValue](s, MapRoutes, &st); err != nil {
		return st, err
	}
	if err := readMap[Route6Key, RouteValue](s, MapRoutes6, &st); err != nil {
		return st, err
	}
	if err := readMap[uint32, PeerValue](s, MapPeers, &st); err != nil {
		return st, err
	}
	if err := readMap[Peer6Key, Peer6Value](s, MapPeers6, &st); err != nil {
		return st, err
	}
	if err := readMap[PeerSourceKey, PeerSourceValue](s, MapPeerSources, &st); err != nil {
		return st, err
	}
	if err := readMap[PeerSource6Key, PeerSourceValue](s, MapPeerSources6, &st); err != nil {
		return st, err
	}
	if err := readMap[uint32, PodIfaceValue](s, MapPodIfaces, &st); err != nil {
		return st, err
	}
	if err := readMap[uint32, NexthopGroupValue](s, MapNexthopGroups, &st); err != nil {
		return st, err
	}
	if err := readMap[RouteKey, FabricPrefixValue](s, MapFabricPrefixes, &st); err != nil {
		return st, err
	}
	if err := readMap[RouteKey, SNATExemptValue](s, MapSNATExempt, &st); err != nil {
		return st, err
	}
	if err := readMap[RouteKey, MasqExemptValue](s, MapMasqExempt, &st); err != nil {
		return st, err
	}
	if err := readMap[PodAddrKey, PodAddrValue](s, MapPodAddrs, &st); err != nil {
		return st, err
	}
	if err := readMap[PodAddr6Key, PodAddrValue](s, MapPodAddrs6, &st); err != nil {
		return st, err
	}
	var cfg DatapathConfig
	if err := s.maps[MapConfig].Lookup(uint32(0), &cfg); err != nil {
		return st, fmt.Errorf("read map config: %w", err)
	}
	st.Config = configFromKernel(cfg)
	st.resolveHandles()
	return st, nil
}

func readMap[K, V any](s *Set, n Name, st *State) error {
	m := s.maps[n]
	if m == nil {
		return fmt.Errorf("read map %s: not open", n)
	}
	var (
		k K
		v V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if err := st.insert(n, k, v); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read map %s: %w", n, err)
	}
	return nil
}
