// Package mapstatetest holds the plans and node settings that the tests of
// loader/mapstate and maps build their states from, so both check the same
// fixtures.
package mapstatetest

import (
	"net"
	"net/netip"

	"github.com/isthmus-dev/isthmus/loader/mapstate"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

// The underlay addresses of the unmanaged sites' members in UnmanagedPlan:
// c1..c3 (M1..M3) and d1 (M4).
var (
	M1 = addr("172.16.3.11")
	M2 = addr("172.16.3.12")
	M3 = addr("172.16.3.13")
	M4 = addr("172.16.4.11")
)

// Plan is node a1's plan with two peers of a managed site (b1, b2), b1 with an
// IPv6 pod block too, and a peer at an IPv6 underlay address the maps cannot hold.
func Plan() *plan.NodePlan {
	return &plan.NodePlan{
		Node:       "a1",
		Site:       "a",
		Underlay:   addr("172.16.1.10"),
		TunnelAddr: addr("10.0.1.1"),
		Peers: []plan.Peer{
			{Name: "b1", Underlay: addr("172.16.2.11"), AllowedSources: []netip.Prefix{pfx("10.1.0.0/24"), pfx("fd00:1::/64")}},
			{Name: "b2", Underlay: addr("172.16.2.12"), AllowedSources: []netip.Prefix{pfx("10.1.1.0/24")}},
			{Name: "v6", Underlay: addr("fd00::12"), AllowedSources: []netip.Prefix{pfx("10.9.0.0/24")}},
		},
		Routes: []plan.Route{
			{Prefix: pfx("10.1.0.0/24"), Peer: "b1", Via: addr("172.16.2.11")},
			{Prefix: pfx("10.1.1.0/24"), Peer: "b2", Via: addr("172.16.2.12")},
			{Prefix: pfx("fd00:1::/64"), Peer: "b1", Via: addr("172.16.2.11")},
		},
	}
}

// Node is the kernel side of a1: its devices and two pod interfaces.
func Node() mapstate.NodeConfig {
	return mapstate.NodeConfig{
		VNI: 7, UnderlayIfindex: 2, OverlayIfindex: 5,
		OverlayMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 5}, TunnelMTU: 1450,
		PodIfindexes: []int{9, 11},
	}
}

// UnmanagedPlan is node a1's plan with two unmanaged remote sites (10.0.2.0/23 and
// 10.0.6.0/24 through c1..c3, 10.8.0.0/16 through d1), its own fabric block and
// an SNAT policy.
func UnmanagedPlan() *plan.NodePlan {
	p := Plan()
	p.Peers = append(p.Peers,
		plan.Peer{Name: "c1", Underlay: M1, TunnelAddr: addr("10.250.0.1"), AllowedSources: []netip.Prefix{pfx("10.0.2.0/23"), pfx("10.250.0.1/32")}},
		plan.Peer{Name: "c2", Underlay: M2, TunnelAddr: addr("10.250.0.2"), AllowedSources: []netip.Prefix{pfx("10.0.2.0/23"), pfx("10.250.0.2/32")}},
		plan.Peer{Name: "c3", Underlay: M3, TunnelAddr: addr("10.250.0.3"), AllowedSources: []netip.Prefix{pfx("10.0.2.0/23"), pfx("10.250.0.3/32")}},
		plan.Peer{Name: "d1", Underlay: M4, TunnelAddr: addr("10.251.0.1"), AllowedSources: []netip.Prefix{pfx("10.8.0.0/16")}},
	)
	c := []plan.NextHop{{Peer: "c1", Via: M1}, {Peer: "c2", Via: M2}, {Peer: "c3", Via: M3}}
	p.Routes = append(p.Routes,
		plan.Route{Prefix: pfx("10.0.2.0/23"), Group: c},
		// The same members in another order: the same group.
		plan.Route{Prefix: pfx("10.0.6.0/24"), Group: []plan.NextHop{c[2], c[0], c[1]}},
		plan.Route{Prefix: pfx("10.8.0.0/16"), Group: []plan.NextHop{{Peer: "d1", Via: M4}}},
		plan.Route{Prefix: pfx("10.250.0.1/32"), Peer: "c1", Via: M1},
	)
	p.FabricPrefixes = []netip.Prefix{pfx("10.0.10.0/23")}
	p.SNAT = plan.SNATPolicy{Addr: addr("10.0.1.1"), Exempt: []plan.ExemptSource{
		{Prefix: pfx("10.0.1.0/24"), Origin: "podCIDR"}, {Prefix: pfx("10.0.10.0/23"), Origin: "declared"},
	}}
	return p
}

// Underlay6Plan is node a1 of a site on an IPv6-only underlay (fd00:a::10): b1 and
// b2 are on the IPv6 underlay too, c1 on the IPv4 one (no tunnel between the
// families), and d1 an encrypted peer known by its IPv4 tunnel address.
func Underlay6Plan() *plan.NodePlan {
	return &plan.NodePlan{
		Node:       "a1",
		Site:       "a",
		Underlay:   addr("fd00:a::10"),
		TunnelAddr: addr("10.0.1.1"),
		Peers: []plan.Peer{
			{Name: "b1", Underlay: addr("fd00:b::11"), AllowedSources: []netip.Prefix{pfx("10.1.0.0/24"), pfx("fd00:1::/64")}},
			{Name: "b2", Underlay: addr("fd00:b::12"), AllowedSources: []netip.Prefix{pfx("10.1.1.0/24")}},
			{Name: "c1", Underlay: addr("172.16.3.11"), AllowedSources: []netip.Prefix{pfx("10.2.0.0/24")}},
			{Name: "d1", Underlay: addr("fd00:d::11"), TunnelAddr: addr("10.3.0.1"), Encrypted: true, WireGuardKey: "k",
				AllowedSources: []netip.Prefix{pfx("10.3.0.0/24")}},
		},
		Routes: []plan.Route{
			{Prefix: pfx("10.1.0.0/24"), Peer: "b1", Via: addr("fd00:b::11")},
			{Prefix: pfx("fd00:1::/64"), Peer: "b1", Via: addr("fd00:b::11")},
			{Prefix: pfx("10.1.1.0/24"), Peer: "b2", Via: addr("fd00:b::12")},
			{Prefix: pfx("10.2.0.0/24"), Peer: "c1", Via: addr("172.16.3.11")},
			{Prefix: pfx("10.3.0.0/24"), Peer: "d1", Via: addr("10.3.0.1")},
		},
	}
}
