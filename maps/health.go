package maps

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/bpf"
)

// The maps of the datapath's health responder (bpf/lib/health.h): the claims the
// agent refreshes, and the nodes the datapath answered.
type (
	HealthKey         = bpf.IsthmusHealthKey
	HealthReachValue  = bpf.IsthmusHealthReachValue
	HealthProberKey   = bpf.IsthmusHealthProberKey
	HealthProberValue = bpf.IsthmusHealthProberValue
)

const (
	// MapHealthReach holds the responder's claims per (port, site); the agent owns
	// its entries, which outlive it until their deadline.
	MapHealthReach Name = "health_reach"
	// MapHealthProbers is LRU-bounded; the datapath owns its entries.
	MapHealthProbers Name = "health_probers"
)

// HealthSiteMax is HEALTH_SITE_MAX of bpf/lib/types.h: the longest site name the
// datapath answers for (TestHealthConstants compares them).
const HealthSiteMax = len(HealthKey{}.Site)

// HealthFlagReaches is HEALTH_F_REACHES of bpf/lib/types.h.
const HealthFlagReaches uint32 = 1 << 0

// HealthResponder writes the datapath responder's claims and reads who it
// answered. Its methods are safe for concurrent use.
type HealthResponder struct {
	ReachMap, ProbersMap *ebpf.Map
}

// HealthResponderOf returns the responder maps of s.
func HealthResponderOf(s *Set) HealthResponder {
	return HealthResponder{ReachMap: s.Map(MapHealthReach), ProbersMap: s.Map(MapHealthProbers)}
}

func healthSite(site string) ([HealthSiteMax]uint8, bool) {
	var b [HealthSiteMax]uint8
	if len(site) > HealthSiteMax {
		return b, false
	}
	copy(b[:], site)
	return b, true
}

// Claim writes that the responder on port reaches site (or not) until the
// CLOCK_MONOTONIC time until (nanoseconds, MonotonicNow's clock). A site longer
// than HealthSiteMax is not written (the agent's own socket answers it) and
// returns false.
func (h HealthResponder) Claim(port uint16, site string, reaches bool, until uint64) (bool, error) {
	s, ok := healthSite(site)
	if !ok {
		return false, nil
	}
	v := HealthReachValue{Expires: until}
	if reaches {
		v.Flags = HealthFlagReaches
	}
	if err := h.ReachMap.Update(HealthKey{Port: HostToBE16(port), Site: s}, v, ebpf.UpdateAny); err != nil {
		return false, fmt.Errorf("write health claim for site %q: %w", site, err)
	}
	return true, nil
}

// Unclaim removes the claim of port for site; a missing one is no error.
func (h HealthResponder) Unclaim(port uint16, site string) error {
	s, ok := healthSite(site)
	if !ok {
		return nil
	}
	err := h.ReachMap.Delete(HealthKey{Port: HostToBE16(port), Site: s})
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove health claim for site %q: %w", site, err)
	}
	return nil
}

// Claims returns the sites the responder on port holds claims for, with
// whether each says it reaches the site (expired or not).
func (h HealthResponder) Claims(port uint16) (map[string]bool, error) {
	var (
		k   HealthKey
		v   HealthReachValue
		out = map[string]bool{}
	)
	it := h.ReachMap.Iterate()
	for it.Next(&k, &v) {
		if k.Port == HostToBE16(port) {
			out[string(bytes.TrimRight(k.Site[:], "\x00"))] = v.Flags&HealthFlagReaches != 0
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read map %s: %w", MapHealthReach, err)
	}
	return out, nil
}

// Probers returns the nodes (tunnel address and UDP port) the datapath answered
// about site at or after the CLOCK_MONOTONIC time since.
func (h HealthResponder) Probers(site string, since uint64) ([]netip.AddrPort, error) {
	s, ok := healthSite(site)
	if !ok {
		return nil, nil
	}
	var (
		k   HealthProberKey
		v   HealthProberValue
		out []netip.AddrPort
	)
	it := h.ProbersMap.Iterate()
	for it.Next(&k, &v) {
		if k.Site == s && v.Seen >= since {
			out = append(out, netip.AddrPortFrom(BE32ToAddr(k.Addr), BE16ToHost(k.Port)))
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read map %s: %w", MapHealthProbers, err)
	}
	return out, nil
}
