// Package ipam is the node-local address store of the isthmus CNI plugin and
// the wire protocol between the plugin and the agent's IPAM server
// (loader/ipamd). Reservations live on the node's disk, one file per address,
// under an exclusive flock, so they survive agent and plugin restarts, many
// plugin processes may run at once, and the plugin can release addresses (DEL,
// GC) while the agent is down. Only the agent hands out new addresses: it
// alone knows which ranges the API has verified.
package ipam

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultDir is where a node keeps its reservations.
const DefaultDir = "/var/lib/isthmus/ipam"

// ErrExhausted is returned by Reserve when a range has no free address.
var ErrExhausted = errors.New("no free address")

// ErrUnavailable is returned by Reserve when a wanted address cannot be given.
var ErrUnavailable = errors.New("address unavailable")

// Attachment names one interface of one container, as the CNI runtime does.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// Reservation is one reserved address and what holds it.
type Reservation struct {
	Addr netip.Addr `json:"addr"`
	Attachment
	// NetNS is the network namespace path the runtime gave at ADD; HostIface
	// the host side of the pod's veth. The agent's leak collector uses both.
	NetNS     string    `json:"netns,omitempty"`
	HostIface string    `json:"hostIface,omitempty"`
	Created   time.Time `json:"created"`
}

// Store is a directory of reservations. Its methods take an exclusive flock on
// the directory's lock file for their whole run, so they are safe across
// goroutines and processes.
type Store struct {
	Dir string
}

const (
	lockFile   = "lock"
	lastPrefix = "last-"
	addrSuffix = ".json"
)

// locked runs fn holding the store's lock, creating the directory if needed.
func (s Store) locked(fn func() error) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("create ipam dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.Dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open ipam lock: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock ipam dir: %w", err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return fn()
}

// List returns every reservation, sorted by address.
func (s Store) List() ([]Reservation, error) {
	var out []Reservation
	err := s.locked(func() error {
		var err error
		out, err = s.list()
		return err
	})
	return out, err
}

func (s Store) list() ([]Reservation, error) {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("read ipam dir: %w", err)
	}
	var out []Reservation
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), addrSuffix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.Dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read reservation: %w", err)
		}
		var r Reservation
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("decode reservation %s: %w", e.Name(), err)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Reservation) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}

// Reserve returns one address per range for the attachment: the one it
// already holds in that range (ADD is idempotent), else the address of want
// that lies in the range (the runtime's `ips` capability), else the next free
// one after the last address handed out in the range, so a released address
// is not reused at once. It skips the range's network address, its first
// address (the node keeps it, see objects.checkTunnelAddrs) and, for IPv4,
// its broadcast address. A range without a free address fails the whole call
// with ErrExhausted, and a wanted address that is outside every range, not
// usable or held by another attachment with ErrUnavailable; either way
// nothing is reserved.
func (s Store) Reserve(ranges []netip.Prefix, want []netip.Addr, r Reservation) ([]netip.Addr, error) {
	var out []netip.Addr
	err := s.locked(func() error {
		have, err := s.list()
		if err != nil {
			return err
		}
		used := map[netip.Addr]bool{}
		for _, h := range have {
			used[h.Addr] = true
		}
		for _, w := range want {
			if containing(ranges, w) == (netip.Prefix{}) {
				return fmt.Errorf("reserve %s: outside the node's ranges %v: %w", w, ranges, ErrUnavailable)
			}
		}
		var fresh []netip.Addr
		for _, p := range ranges {
			if a, ok := held(have, p, r.Attachment); ok {
				out = append(out, a)
				continue
			}
			a, ok := wanted(want, p)
			switch {
			case ok && !usable(p, a):
				return fmt.Errorf("reserve %s: the network, node or broadcast address of %s: %w", a, p, ErrUnavailable)
			case ok && used[a]:
				return fmt.Errorf("reserve %s: held by another attachment: %w", a, ErrUnavailable)
			case !ok:
				if a, ok = s.next(p, used); !ok {
					return fmt.Errorf("reserve in %s: %w", p, ErrExhausted)
				}
			}
			used[a] = true
			fresh = append(fresh, a)
			out = append(out, a)
		}
		for i, a := range fresh {
			res := r
			res.Addr = a
			if err := s.write(res); err != nil {
				for _, w := range fresh[:i] {
					os.Remove(s.path(w))
				}
				return err
			}
		}
		for _, a := range fresh {
			p := containing(ranges, a)
			writeFileAtomic(filepath.Join(s.Dir, lastPrefix+rangeKey(p)), []byte(a.String()))
		}
		return nil
	})
	return out, err
}

// wanted returns the address of want that lies in p, if there is one.
func wanted(want []netip.Addr, p netip.Prefix) (netip.Addr, bool) {
	for _, w := range want {
		if p.Contains(w) {
			return w, true
		}
	}
	return netip.Addr{}, false
}

// held returns the attachment's address in p, if it has one.
func held(have []Reservation, p netip.Prefix, att Attachment) (netip.Addr, bool) {
	for _, h := range have {
		if h.Attachment == att && p.Contains(h.Addr) {
			return h.Addr, true
		}
	}
	return netip.Addr{}, false
}

func containing(ranges []netip.Prefix, a netip.Addr) netip.Prefix {
	for _, p := range ranges {
		if p.Contains(a) {
			return p
		}
	}
	return netip.Prefix{}
}

// firstUsable is the first address of p a pod may get: the network and node
// addresses are skipped.
func firstUsable(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next().Next() }

// usable reports whether a pod may get a in p: inside p, from firstUsable on,
// and not the IPv4 broadcast address.
func usable(p netip.Prefix, a netip.Addr) bool {
	if !a.IsValid() || !p.Contains(a) || a.Less(firstUsable(p)) {
		return false
	}
	return !a.Is4() || p.Contains(a.Next())
}

// next walks p from after its last handed-out address, wrapping once.
func (s Store) next(p netip.Prefix, used map[netip.Addr]bool) (netip.Addr, bool) {
	first := firstUsable(p)
	usable := func(a netip.Addr) bool { return usable(p, a) }
	if !usable(first) {
		return netip.Addr{}, false
	}
	start := first
	if b, err := os.ReadFile(filepath.Join(s.Dir, lastPrefix+rangeKey(p))); err == nil {
		if last, err := netip.ParseAddr(strings.TrimSpace(string(b))); err == nil && usable(last.Next()) {
			start = last.Next()
		}
	}
	// An IPv6 /64 cannot be walked whole; a free address is never far.
	const maxScan = 1 << 20
	a := start
	for range maxScan {
		if !used[a] {
			return a, true
		}
		if a = a.Next(); !usable(a) {
			a = first
		}
		if a == start {
			break
		}
	}
	return netip.Addr{}, false
}

// Release removes every reservation of the attachment and returns what it
// freed; an attachment without reservations is not an error (DEL is
// idempotent).
func (s Store) Release(att Attachment) ([]Reservation, error) {
	return s.ReleaseIf(func(r Reservation) bool { return r.Attachment == att })
}

// ReleaseExcept removes every reservation whose attachment is not in keep
// (the CNI GC verb's valid attachments) and returns what it freed.
func (s Store) ReleaseExcept(keep []Attachment) ([]Reservation, error) {
	return s.ReleaseIf(func(r Reservation) bool { return !slices.Contains(keep, r.Attachment) })
}

// ReleaseIf removes every reservation for which drop returns true, deciding
// under the lock, and returns what it freed.
func (s Store) ReleaseIf(drop func(Reservation) bool) ([]Reservation, error) {
	var freed []Reservation
	err := s.locked(func() error {
		have, err := s.list()
		if err != nil {
			return err
		}
		for _, r := range have {
			if !drop(r) {
				continue
			}
			if err := os.Remove(s.path(r.Addr)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("release %s: %w", r.Addr, err)
			}
			freed = append(freed, r)
		}
		return nil
	})
	return freed, err
}

func (s Store) path(a netip.Addr) string {
	return filepath.Join(s.Dir, strings.ReplaceAll(a.String(), ":", "_")+addrSuffix)
}

func (s Store) write(r Reservation) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode reservation: %w", err)
	}
	return writeFileAtomic(s.path(r.Addr), b)
}

func rangeKey(p netip.Prefix) string {
	return strings.NewReplacer(":", "_", "/", "_").Replace(p.String())
}

// writeFileAtomic writes name through a temporary file and a rename, so a
// crash leaves the old content or the new, never a torn file.
func writeFileAtomic(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(name), err)
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rename %s: %w", filepath.Base(name), err)
	}
	return nil
}

// HostIfacePrefix starts the host side of every pod veth the plugin makes.
const HostIfacePrefix = "pod-"

// HostIface is the host-side name of the attachment's veth: stable, so DEL and
// CHECK find it without state, and at most 15 bytes.
func HostIface(containerID, ifname string) string {
	h := sha256.Sum256([]byte(containerID + "/" + ifname))
	return HostIfacePrefix + hex.EncodeToString(h[:])[:11]
}
