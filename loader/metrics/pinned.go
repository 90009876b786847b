package metrics

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/isthmus-dev/isthmus/maps"
)

// LevelMaps are the maps whose fill level isthmus_map_entries reports.
var LevelMaps = []maps.Name{maps.MapRoutes, maps.MapRoutes6, maps.MapPeers, maps.MapPeers6, maps.MapPeerSources, maps.MapPeerSources6, maps.MapNexthopGroups,
	maps.MapFabricPrefixes, maps.MapSNATExempt, maps.MapNat, maps.MapMasqNat, maps.MapNatSources, maps.MapPodIfaces, maps.MapMasqExempt, maps.MapPodAddrs, maps.MapPodAddrs6,
	maps.MapHealthReach, maps.MapHealthProbers, maps.MapTracePrefixes, maps.MapCtClose, maps.MapCtClose6}

// Pinned is a Source reading the maps pinned in Dir. It opens them at every
// scrape and closes them after, so it follows an agent that replaced them and
// needs no handle kept open; before the datapath is loaded it returns errors.
type Pinned struct {
	Dir string
}

func (p Pinned) open(n maps.Name) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(p.Dir, string(n)), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", n, err)
	}
	return m, nil
}

// Counters implements Source.
func (p Pinned) Counters() (map[maps.MetricKey]maps.Counter, error) {
	m, err := p.open(maps.MapMetrics)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	return maps.ReadMetrics(m)
}

// RedirectDrops implements RedirectDropSource: the tracer is attached when its
// link is pinned in Dir.
func (p Pinned) RedirectDrops() (map[maps.RedirectDrop]maps.Counter, bool, error) {
	attached := false
	if l, err := link.LoadPinnedLink(filepath.Join(p.Dir, maps.TracerLinkPin), nil); err == nil {
		l.Close()
		attached = true
	}
	m, err := p.open(maps.MapRedirectDrops)
	if err != nil {
		return nil, attached, err
	}
	defer m.Close()
	c, err := maps.ReadRedirectDrops(m)
	return c, attached, err
}

// MapLevels implements Source. The nat table is an LRU hash the datapath
// writes: its entries are counted by iterating it, which takes a moment per
// scrape for a full table and may be off by the flows created or evicted meanwhile.
func (p Pinned) MapLevels() ([]MapLevel, error) {
	var out []MapLevel
	var errs []error
	for _, n := range LevelMaps {
		m, err := p.open(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c, err := countEntries(n, m)
		if err != nil {
			errs = append(errs, err)
		} else {
			out = append(out, MapLevel{Map: n, Entries: c, Capacity: int(m.MaxEntries())})
		}
		m.Close()
	}
	return out, errors.Join(errs...)
}

// countEntries counts the entries of the map called n. In nexthop_groups, an
// array whose entries always exist, it counts the entries that are not zero.
func countEntries(n maps.Name, m *ebpf.Map) (int, error) {
	switch n {
	case maps.MapRoutes:
		return count[maps.RouteKey, maps.RouteValue](n, m, nil)
	case maps.MapPeers:
		return count[uint32, maps.PeerValue](n, m, nil)
	case maps.MapPeers6:
		return count[maps.Peer6Key, maps.Peer6Value](n, m, nil)
	case maps.MapPeerSources:
		return count[maps.PeerSourceKey, maps.PeerSourceValue](n, m, nil)
	case maps.MapRoutes6:
		return count[maps.Route6Key, maps.RouteValue](n, m, nil)
	case maps.MapPeerSources6:
		return count[maps.PeerSource6Key, maps.PeerSourceValue](n, m, nil)
	case maps.MapNexthopGroups:
		return count[uint32, maps.NexthopGroupValue](n, m, func(v maps.NexthopGroupValue) bool { return v != maps.NexthopGroupValue{} })
	case maps.MapFabricPrefixes:
		return count[maps.RouteKey, maps.FabricPrefixValue](n, m, nil)
	case maps.MapSNATExempt:
		return count[maps.RouteKey, maps.SNATExemptValue](n, m, nil)
	case maps.MapPodAddrs:
		return count[maps.PodAddrKey, maps.PodAddrValue](n, m, nil)
	case maps.MapPodAddrs6:
		return count[maps.PodAddr6Key, maps.PodAddrValue](n, m, nil)
	case maps.MapMasqExempt:
		return count[maps.RouteKey, maps.MasqExemptValue](n, m, nil)
	case maps.MapNat, maps.MapMasqNat:
		return count[maps.NatKey, maps.NatValue](n, m, nil)
	case maps.MapNatSources:
		return count[maps.NatSourceKey, maps.NatSourceValue](n, m, nil)
	case maps.MapPodIfaces:
		return count[uint32, maps.PodIfaceValue](n, m, nil)
	case maps.MapHealthReach:
		return count[maps.HealthKey, maps.HealthReachValue](n, m, nil)
	case maps.MapHealthProbers:
		return count[maps.HealthProberKey, maps.HealthProberValue](n, m, nil)
	case maps.MapTracePrefixes:
		return count[maps.RouteKey, maps.TracePrefixValue](n, m, nil)
	case maps.MapCtClose:
		return count[maps.CtCloseKey, maps.CtCloseValue](n, m, nil)
	case maps.MapCtClose6:
		return count[maps.CtClose6Key, maps.CtCloseValue](n, m, nil)
	}
	return 0, fmt.Errorf("count map %s: unknown map", n)
}

func count[K, V any](n maps.Name, m *ebpf.Map, used func(V) bool) (int, error) {
	var (
		k K
		v V
		c int
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if used == nil || used(v) {
			c++
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("count map %s: %w", n, err)
	}
	return c, nil
}
