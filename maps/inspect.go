package maps

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// NatFlagReply is NAT_F_REPLY of bpf/lib/types.h: the entry is the reply direction.
const NatFlagReply uint8 = 1 << 0

// The NAT_STATE_* values of enum nat_state in bpf/lib/types.h.
const (
	NatStateNew         uint8 = 0
	NatStateEstablished uint8 = 1
	NatStateClosing     uint8 = 2
	NatStateFinOrig     uint8 = 3
	NatStateFinReply    uint8 = 4
	NatStateRST         uint8 = 5
	NatStateRSTOrig     uint8 = 6
	NatStateRSTReply    uint8 = 7
)

// The NAT_TABLE_* values of enum nat_table in bpf/lib/types.h: the table a
// nat_sources entry counts flows in.
const (
	NatTableSNAT uint32 = 0
	NatTableMasq uint32 = 1
)

// The idle timeouts of bpf/lib/conntrack.h (NAT_*_TIMEOUT defaults): an entry
// idle for longer is expired, and the datapath reuses its port.
const (
	NatTCPSynTimeout     = 60 * time.Second
	NatTCPEstTimeout     = 6 * time.Hour
	NatTCPClosingTimeout = 10 * time.Second
	NatUDPTimeout        = 60 * time.Second
	NatICMPTimeout       = 30 * time.Second
)

// IP protocol numbers of a nat key.
const (
	ProtoICMP uint8 = 1
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
)

// NatTimeout returns the idle timeout of an entry of protocol proto in state
// state, as ct_timeout in bpf/lib/conntrack.h.
func NatTimeout(proto, state uint8) time.Duration {
	switch proto {
	case ProtoTCP:
		switch state {
		case NatStateEstablished, NatStateFinOrig, NatStateFinReply:
			return NatTCPEstTimeout
		case NatStateClosing, NatStateRST, NatStateRSTOrig, NatStateRSTReply:
			return NatTCPClosingTimeout
		}
		return NatTCPSynTimeout
	case ProtoUDP:
		return NatUDPTimeout
	}
	return NatICMPTimeout
}

// ProtoName returns "tcp", "udp", "icmp" or the number.
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMP:
		return "icmp"
	}
	return fmt.Sprint(p)
}

// NatStateName returns "new", "established", "closing", "fin_orig", "fin_reply",
// "rst", "rst_orig", "rst_reply" or the number.
func NatStateName(s uint8) string {
	switch s {
	case NatStateNew:
		return "new"
	case NatStateEstablished:
		return "established"
	case NatStateClosing:
		return "closing"
	case NatStateFinOrig:
		return "fin_orig"
	case NatStateFinReply:
		return "fin_reply"
	case NatStateRST:
		return "rst"
	case NatStateRSTOrig:
		return "rst_orig"
	case NatStateRSTReply:
		return "rst_reply"
	}
	return fmt.Sprintf("state_%d", s)
}

// NatEntry is one entry of the nat map in host order: the tuple of the packet it
// matches (Src, Dst, Proto; ports hold the ICMP identifier for ICMP) and what the
// datapath writes (the source on the forward direction, the destination on
// replies).
type NatEntry struct {
	Src, Dst netip.AddrPort
	Proto    uint8
	// To is the address and port written into the packet.
	To    netip.AddrPort
	State uint8
	Reply bool
	// LastSeen is bpf_ktime_get_ns() (CLOCK_MONOTONIC) of the last packet either way.
	LastSeen uint64
}

// NatKeyFrom returns the kernel key of e's tuple, for tests and tools that write
// entries.
func NatKeyFrom(src, dst netip.AddrPort, proto uint8) NatKey {
	return NatKey{Saddr: AddrToBE32(src.Addr()), Daddr: AddrToBE32(dst.Addr()),
		Sport: HostToBE16(src.Port()), Dport: HostToBE16(dst.Port()), Proto: proto}
}

// HostToBE16 returns the __be16 form of a port: a uint16 whose in-memory bytes are
// the port in network order.
func HostToBE16(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// BE16ToHost is the inverse of HostToBE16.
func BE16ToHost(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

func natEntryFromKernel(k NatKey, v NatValue) NatEntry {
	return NatEntry{
		Src:      netip.AddrPortFrom(BE32ToAddr(k.Saddr), BE16ToHost(k.Sport)),
		Dst:      netip.AddrPortFrom(BE32ToAddr(k.Daddr), BE16ToHost(k.Dport)),
		Proto:    k.Proto,
		To:       netip.AddrPortFrom(BE32ToAddr(v.Addr), BE16ToHost(v.Port)),
		State:    v.State,
		Reply:    v.Flags&NatFlagReply != 0,
		LastSeen: v.LastSeen,
	}
}

// ReadNat returns every entry of the nat map m, sorted by protocol and tuple.
func ReadNat(m *ebpf.Map) ([]NatEntry, error) {
	var (
		out []NatEntry
		k   NatKey
		v   NatValue
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, natEntryFromKernel(k, v))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read map nat: %w", err)
	}
	slices.SortFunc(out, func(a, b NatEntry) int {
		return cmp.Or(cmp.Compare(a.Proto, b.Proto), a.Src.Compare(b.Src), a.Dst.Compare(b.Dst), boolCmp(a.Reply, b.Reply))
	})
	return out, nil
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// NatFlow is one translated connection: the forward entry (pod to destination,
// source rewritten to Translated) and its reply entry (destination to Translated,
// rewritten back to Pod), either of which may be missing when the LRU table
// evicted it.
type NatFlow struct {
	Proto uint8
	// Pod is the pod's source, Dst the destination, Translated the source the
	// pod's packets leave with (the node's tunnel address and a port).
	Pod, Dst, Translated netip.AddrPort
	Forward, Reply       *NatEntry
}

// State is the TCP state of the flow (the forward entry's, else the reply's).
func (f NatFlow) State() uint8 {
	if f.Forward != nil {
		return f.Forward.State
	}
	return f.Reply.State
}

// LastSeen is the later last_seen of the two entries.
func (f NatFlow) LastSeen() uint64 {
	var t uint64
	if f.Forward != nil {
		t = f.Forward.LastSeen
	}
	if f.Reply != nil {
		t = max(t, f.Reply.LastSeen)
	}
	return t
}

// Idle is how long the flow has seen no packet at monotonic time now (ns); a
// last_seen in the future gives a negative duration.
func (f NatFlow) Idle(now uint64) time.Duration {
	return time.Duration(int64(now - f.LastSeen()))
}

// Live reports whether the flow is within its timeout at now, as ct_live in
// bpf/lib/conntrack.h does (a last_seen in the future counts as expired).
func (f NatFlow) Live(now uint64) bool {
	return now-f.LastSeen() <= uint64(NatTimeout(f.Proto, f.State()))
}

// PairNat joins forward and reply entries into flows: a forward entry
// (pod, dst) -> translated pairs with the reply entry (dst, translated) -> pod.
// An entry without its other half is a flow of its own. The result is sorted by
// protocol, pod and destination.
func PairNat(entries []NatEntry) []NatFlow {
	type tuple struct {
		src, dst netip.AddrPort
		proto    uint8
	}
	replies := map[tuple]int{}
	for i, e := range entries {
		if e.Reply {
			replies[tuple{e.Src, e.Dst, e.Proto}] = i
		}
	}
	used := map[int]bool{}
	var out []NatFlow
	for i := range entries {
		e := &entries[i]
		if e.Reply {
			continue
		}
		f := NatFlow{Proto: e.Proto, Pod: e.Src, Dst: e.Dst, Translated: e.To, Forward: e}
		if j, ok := replies[tuple{e.Dst, e.To, e.Proto}]; ok && entries[j].To == e.Src {
			f.Reply = &entries[j]
			used[j] = true
		}
		out = append(out, f)
	}
	for i := range entries {
		e := &entries[i]
		if e.Reply && !used[i] {
			out = append(out, NatFlow{Proto: e.Proto, Pod: e.To, Dst: e.Src, Translated: e.Dst, Reply: e})
		}
	}
	slices.SortFunc(out, func(a, b NatFlow) int {
		return cmp.Or(cmp.Compare(a.Proto, b.Proto), a.Pod.Compare(b.Pod), a.Dst.Compare(b.Dst))
	})
	return out
}

// MonotonicNow returns CLOCK_MONOTONIC in nanoseconds, the clock of
// bpf_ktime_get_ns() and so of nat last_seen.
func MonotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read CLOCK_MONOTONIC: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// ReadGroups returns the nexthop_groups entries of m that have a live member,
// by id.
func ReadGroups(m *ebpf.Map) (map[uint32]NexthopGroup, error) {
	out := map[uint32]NexthopGroup{}
	var (
		k uint32
		v NexthopGroupValue
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if g := groupFromKernel(v); !g.IsZero() {
			out[k] = g
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read map nexthop_groups: %w", err)
	}
	return out, nil
}

// Owners returns how many slots each member of g owns, members sorted.
func (g NexthopGroup) Owners() []SlotOwner {
	n := map[netip.Addr]int{}
	for _, a := range g.Slots {
		if a.IsValid() && !a.IsUnspecified() {
			n[a]++
		}
	}
	var out []SlotOwner
	for a, c := range n {
		out = append(out, SlotOwner{Member: a, Slots: c})
	}
	slices.SortFunc(out, func(a, b SlotOwner) int { return a.Member.Compare(b.Member) })
	return out
}

// SlotOwner is a member of a next-hop group and the number of slots it owns.
type SlotOwner struct {
	Member netip.Addr `json:"member"`
	Slots  int        `json:"slots"`
}
