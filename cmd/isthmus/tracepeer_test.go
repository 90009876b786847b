package main

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/maps"
)

// TestTracePeerNames: a trace event's peer prints as its address: an IPv4 one as it
// is, a handle (a peer on the IPv6 underlay) as the IPv6 address of its peers
// entry, and a handle without one as the handle.
func TestTracePeerNames(t *testing.T) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 24, MaxEntries: 4})
	if err != nil {
		t.Fatalf("create map (needs root): %v", err)
	}
	defer m.Close()
	h, v6 := netip.MustParseAddr("0.0.0.1"), netip.MustParseAddr("fd00:2::2")
	if err := m.Put(maps.AddrToBE32(h), maps.PeerValue{Flags: maps.PeerFlagUnderlay6, Underlay6: maps.AddrTo16(v6)}); err != nil {
		t.Fatal(err)
	}
	p := peerNames{m: m, cache: map[uint32]netip.Addr{}}
	for in, want := range map[string]string{"172.16.2.11": "172.16.2.11", "0.0.0.1": "fd00:2::2", "0.0.0.2": "0.0.0.2"} {
		if got := p.addr(maps.AddrToBE32(netip.MustParseAddr(in))); got.String() != want {
			t.Errorf("peer %s prints as %v, want %s", in, got, want)
		}
	}
}
