package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The oracle (docs/fuzzing.md): every program runs through BPF_PROG_TEST_RUN on
// generated and mutated frames, and each verdict, counter change and output is checked
// against the model of oracle_model_test.go. One fuzz target per program; the generated
// frames are the seeds (they run with every `go test`), findings are kept under
// testdata/fuzz/<target>/ and run as regression tests.

// Addresses the oracle's world adds to the lab's.
var (
	declaredNet = netip.MustParsePrefix("10.0.2.0/23")   // an unmanaged block of peerIP's site
	memberOver  = netip.MustParsePrefix("10.2.0.128/25") // memberIP may send from here too
	memberRoute = netip.MustParsePrefix("10.2.0.64/26")  // more specific than remoteNet, to memberIP
	// notForPodsDst, inside memberRoute, is routed to memberIP for forwarded
	// packets only (ROUTE_F_NOT_FOR_PODS): pods' packets to it have no route.
	notForPodsDst = netip.MustParsePrefix("10.2.0.100/32")
	deadGroupNet  = netip.MustParsePrefix("10.6.0.0/16") // routed to a group with no live member
	groupPeerA    = netip.MustParseAddr("192.168.2.3")
	groupPeerB    = netip.MustParseAddr("192.168.2.4")
	groupSrcNet   = netip.MustParsePrefix("10.5.0.0/16") // what groupPeerA and B may send from
	spoofedIP     = netip.MustParseAddr("6.6.6.6")
	// The site fabric: this site's declared block (fabric_prefixes), the part of it the
	// FIB routes to the fabric router on und0, and another CNI's pods behind cni0h, an
	// interface isthmus does not own.
	siteFabric  = netip.MustParsePrefix("10.1.0.0/16")
	fabricRoute = netip.MustParsePrefix("10.1.128.0/17")
	fabricPod   = netip.MustParseAddr("10.1.200.9") // a pod on another node of the site
	cniNet      = netip.MustParsePrefix("10.200.0.0/24")
	cniPod      = netip.MustParseAddr("10.200.0.9")
	// A second pod behind pod0h whose address is outside snat_exempt: its flows into
	// the tunnel leave from the tunnel address (return-path SNAT of an own pod).
	natPodIP  = netip.MustParseAddr("10.1.2.5")
	natPodMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x0a, 0x25}
	// A Service address in the peer's block whose conntrack entry has the shape IPVS
	// leaves: the reply tuple rewritten to the backend, no NAT status bit.
	ipvsVIP = netip.MustParseAddr("10.2.0.200")

	// The IPv6 side. peerIP owns remoteNet6 (ipv6_test.go); peer6 is on the IPv6
	// underlay (underlay6_test.go), known by handle6, with pods of both families;
	// groupNet6 is routed to the group of groupNet, deadGroupNet6 to the group without
	// a live member. groupPeerA may send from any IPv6 source (a gateway's peer), so
	// only the martian rule stands between it and the pods. The agent never routes
	// link-local or multicast prefixes; the world does (to peerIP), so that "never
	// tunnelled" is seen to hold whatever routes6 says.
	peer6Net4     = netip.MustParsePrefix("10.8.0.0/16")
	peer6Pod4     = netip.MustParseAddr("10.8.0.7")
	peer6Net6     = netip.MustParsePrefix("fd30::/64")
	peer6Pod6     = netip.MustParseAddr("fd30::7")
	groupNet6     = netip.MustParsePrefix("fd50::/64")
	groupDst6     = netip.MustParseAddr("fd50::9")
	deadGroupNet6 = netip.MustParsePrefix("fd60::/64")
	deadGroupDst6 = netip.MustParseAddr("fd60::1")
	ipvsVIP6      = netip.MustParseAddr("fd20::200")
	linkLocalNet6 = netip.MustParsePrefix("fe80::/10")
	multicastNet6 = netip.MustParsePrefix("ff00::/8")
)

// closedFlow is c closed on the fast path.
func closedFlow(c oracleCT) oracleCT { c.closed = true; return c }

// ctFlow is an untranslated conntrack entry of the world: its reply tuple the inverse
// of its original.
func ctFlow(proto uint8, src, dst netip.Addr, sport, dport uint16, assured bool) oracleCT {
	o := oracleTuple{src: src, dst: dst, sport: sport, dport: dport}
	return oracleCT{proto: proto, orig: o, reply: o.inverse(), assured: assured}
}

// newOracleWorld is the node the oracle's lab stands for, with the lab's MACs.
func newOracleWorld(undMAC, podHMAC, istMAC net.HardwareAddr) *oracleWorld {
	return &oracleWorld{
		underlay: underlayIP, vni: testVNI, tunnelMTU: oracleTunnelMTU, underlayMTU: 1500,
		peers: []netip.Addr{peerIP, memberIP, groupPeerA, groupPeerB},
		peerSources: map[netip.Addr][]netip.Prefix{
			peerIP:     {remoteNet, declaredNet},
			memberIP:   {memberNet, memberOver},
			groupPeerA: {groupSrcNet},
			groupPeerB: {groupSrcNet},
			handle6:    {peer6Net4},
		},
		underlay6: underlayIP6,
		handles:   map[netip.Addr]netip.Addr{handle6: peer6},
		routes6: []oracleRoute{
			{prefix: remoteNet6, peers: []netip.Addr{peerIP}},
			{prefix: peer6Net6, peers: []netip.Addr{handle6}},
			{prefix: groupNet6, peers: []netip.Addr{peerIP, groupPeerA, groupPeerB}, group: 1},
			{prefix: deadGroupNet6, group: 2},
			{prefix: linkLocalNet6, peers: []netip.Addr{peerIP}},
			{prefix: multicastNet6, peers: []netip.Addr{peerIP}},
		},
		peerSources6: map[netip.Addr][]netip.Prefix{
			peerIP:     {remoteNet6},
			groupPeerA: {netip.MustParsePrefix("::/0")},
			handle6:    {peer6Net6},
		},
		ownPods6: map[netip.Addr]net.HardwareAddr{pod6: podMAC},
		routes: []oracleRoute{
			{prefix: peer6Net4, peers: []netip.Addr{handle6}},
			{prefix: remoteNet, peers: []netip.Addr{peerIP}},
			{prefix: declaredNet, peers: []netip.Addr{peerIP}},
			{prefix: memberRoute, peers: []netip.Addr{memberIP}},
			{prefix: memberNet, peers: []netip.Addr{memberIP}},
			{prefix: notForPodsDst, peers: []netip.Addr{memberIP}, notForPods: true},
			{prefix: groupNet, peers: []netip.Addr{peerIP, groupPeerA, groupPeerB}, group: 1},
			{prefix: deadGroupNet, group: 2},
		},
		ownPods:    map[netip.Addr]net.HardwareAddr{podIP: podMAC, natPodIP: natPodMAC},
		tunnelIP:   hostIP,
		snatExempt: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.PrefixFrom(hostIP, 32)},
		// The agent's range (maps.Config's default, maps/kernel_test.go).
		snatPortMin: 61000, snatPortMax: 65535,
		// Translated flows in nat: return-path SNAT to the tunnel address (another
		// CNI's pod, and this node's pod, as it would be if it were not exempt), egress
		// masquerade to the underlay address, and one flow idle past its timeout.
		// What the health responder claims (health_reach): the default answer on
		// healthPort, another for one site, and an expired claim on another port.
		health: []oracleHealth{
			{port: healthPort, reaches: true},
			{port: healthPort, site: "site-b"},
			{port: healthPort + 1, site: "site-c", reaches: true, expired: true},
		},
		// Flows the stack has seen: to this node's pod (delivery and fabric ingress
		// take them through the stack), from it on routes (pod_ingress leaves them to
		// the stack), and a return-path SNAT flow's own tuple.
		// Established but not assured (created without the status bit), a UDP flow:
		// through the stack whatever the packet.
		conntrack: []oracleCT{
			ctFlow(6, remotePodIP, podIP, 80, 33000, false),
			ctFlow(6, podIP, remotePodIP, 40001, 80, false),
			ctFlow(6, podIP, netip.MustParseAddr("10.6.0.1"), 40002, 80, false),
			ctFlow(17, podIP, netip.MustParseAddr("10.2.0.70"), 4002, 5000, false),
			ctFlow(6, podIP, remotePodIP, 40003, 80, false),
			// The host's own connections from the tunnel and the underlay address,
			// on ports a translation would otherwise take.
			ctFlow(6, hostIP, remotePodIP, 61013, 80, false),
			ctFlow(6, underlayIP, worldIP, 33021, 80, false),
			// Established, assured, untranslated: direct, to the pod and from it, and
			// from the pod outside snat_exempt (translated by the datapath, which
			// conntrack never sees).
			ctFlow(6, remotePodIP, podIP, 80, 33002, true),
			ctFlow(6, podIP, remotePodIP, 40004, 80, true),
			ctFlow(6, natPodIP, remotePodIP, 40010, 80, true),
			// Closed on the fast path (a RST its receiver accepted, or both FINs
			// acknowledged: ct_close says so): the stack judges what still comes, and
			// a bare SYN on the tuple starts a new flow.
			closedFlow(ctFlow(6, remotePodIP, podIP, 80, 33004, true)),
			closedFlow(ctFlow(6, podIP, remotePodIP, 40006, 80, true)),
			// IPVS's shape: the pod dialled the Service address, the backend answers;
			// established and assured, no NAT bit, but translated: the stack.
			{proto: 6, orig: oracleTuple{src: podIP, dst: ipvsVIP, sport: 40005, dport: 80},
				reply: oracleTuple{src: remotePodIP, dst: podIP, sport: 8080, dport: 40005}, assured: true},
			// An IPv4 flow to the IPv6 underlay peer's pod: direct, in GENEVE over IPv6.
			ctFlow(6, podIP, peer6Pod4, 40008, 80, true),
			// IPv6 flows: direct both ways with peerIP's pod, from the pod to the IPv6
			// underlay peer's pod and back, to the group and to the group without a live
			// member (the stack: no next hop); one not assured, one closed on the fast
			// path, IPVS's shape.
			ctFlow(6, remotePod6, pod6, 80, 33002, true),
			ctFlow(6, pod6, remotePod6, 40004, 80, true),
			ctFlow(6, pod6, peer6Pod6, 40007, 80, true),
			ctFlow(6, peer6Pod6, pod6, 80, 33005, true),
			ctFlow(6, pod6, groupDst6, 40011, 80, true),
			ctFlow(6, pod6, deadGroupDst6, 40009, 80, true),
			ctFlow(6, remotePod6, pod6, 80, 33000, false),
			closedFlow(ctFlow(6, pod6, remotePod6, 40006, 80, true)),
			{proto: 6, orig: oracleTuple{src: pod6, dst: ipvsVIP6, sport: 40005, dport: 80},
				reply: oracleTuple{src: remotePod6, dst: pod6, sport: 8080, dport: 40005}, assured: true},
		},
		masquerade: true,
		fibDirect:  true,
		// Each source's share of each table: cniPod holds all of nat's, podIP all of
		// masq_nat's (its expired flow included: the datapath counts a flow until it
		// deletes its entry).
		natSourceFlowsMax: oracleNatSourceFlowsMax,
		// nat has room; masq_nat is one slot short of a new flow's two entries.
		snatNatMax: oracleNatMax, masqNatMax: oracleMasqNatMax,
		nat: []oracleNat{
			{proto: 17, pod: cniPod, podPort: 4000, remote: remotePodIP, remotePort: 5000, addr: hostIP, port: 61001},
			{proto: 6, pod: cniPod, podPort: 40000, remote: remotePodIP, remotePort: 80, addr: hostIP, port: 61002},
			{proto: 1, pod: cniPod, podPort: 0x77, remote: remotePodIP, addr: hostIP, port: 61003},
			{proto: 17, pod: cniPod, podPort: 4002, remote: remotePodIP, remotePort: 5000, addr: hostIP, port: 61012},
			{proto: 6, pod: podIP, podPort: 40000, remote: remotePodIP, remotePort: 80, addr: hostIP, port: 40000},
			{proto: 17, pod: podIP, podPort: 4000, remote: netip.MustParseAddr("10.5.0.1"), remotePort: 5000, addr: hostIP, port: 61004},
			{proto: 1, pod: podIP, podPort: 0x78, remote: remotePodIP, addr: hostIP, port: 0x78},
			{proto: 17, pod: podIP, podPort: 4001, remote: remotePodIP, remotePort: 5000, addr: hostIP, port: 61005, expired: true},
			{proto: 6, pod: podIP, podPort: 40003, remote: remotePodIP, remotePort: 80, addr: hostIP, port: 61008},
			// The pod outside snat_exempt: a direct TCP flow, a UDP flow.
			{proto: 6, pod: natPodIP, podPort: 40010, remote: remotePodIP, remotePort: 80, addr: hostIP, port: 61010},
			{proto: 17, pod: natPodIP, podPort: 4010, remote: remotePodIP, remotePort: 5000, addr: hostIP, port: 61011},
			{proto: 6, pod: podIP, podPort: 33000, remote: worldIP, remotePort: 80, addr: underlayIP, port: 33000},
			{proto: 17, pod: podIP, podPort: 35000, remote: worldIP, remotePort: 53, addr: underlayIP, port: 61006},
			{proto: 1, pod: podIP, podPort: 0x1234, remote: worldIP, addr: underlayIP, port: 0x1234},
			{proto: 17, pod: podIP, podPort: 35001, remote: worldIP, remotePort: 53, addr: underlayIP, port: 61007, expired: true},
		},
		// Masquerade leaves the pod networks and the underlay alone.
		masqExempt:     []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")},
		fabricPrefixes: []netip.Prefix{siteFabric},
		fabricRoutes:   []netip.Prefix{fabricRoute},
		cniRoutes:      []netip.Prefix{cniNet},
		undMAC:         undMAC, podHMAC: podHMAC, istMAC: istMAC, gwMAC: gwMAC, gw6MAC: gwMAC, fabricMAC: fabricMAC,
	}
}

// resetWorld puts the maps an input changes back as w has them: nat (putNat) and
// ct_close and ct_close6, the fast path's record of closed flows (a FIN or RST of an
// input adds to it).
func resetWorld(t testing.TB, l *lab, w *oracleWorld) {
	t.Helper()
	putNat(t, l, w)
	var k IsthmusCtCloseKey
	var keys []IsthmusCtCloseKey
	for it := l.objs.CtClose.Iterate(); it.Next(&k, new(IsthmusCtCloseValue)); {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if err := l.objs.CtClose.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatalf("delete ct_close %+v: %v", k, err)
		}
	}
	clearMap(t, l.objs.CtClose6, new(IsthmusCtClose6Key), new(IsthmusCtCloseValue))
	for _, c := range w.conntrack {
		if !c.closed {
			continue
		}
		if c.orig.src.Is6() {
			k := IsthmusCtClose6Key{Saddr: addr16(c.orig.src), Daddr: addr16(c.orig.dst), Sport: nport(c.orig.sport), Dport: nport(c.orig.dport)}
			if err := l.objs.CtClose6.Put(k, IsthmusCtCloseValue{Closed: 1}); err != nil {
				t.Fatalf("put ct_close6 %+v: %v", k, err)
			}
			continue
		}
		k := IsthmusCtCloseKey{Saddr: be32(c.orig.src), Daddr: be32(c.orig.dst), Sport: nport(c.orig.sport), Dport: nport(c.orig.dport)}
		if err := l.objs.CtClose.Put(k, IsthmusCtCloseValue{Closed: 1}); err != nil {
			t.Fatalf("put ct_close %+v: %v", k, err)
		}
	}
}

// judgeWorld judges in from w's tables (resetWorld) and puts back the conntrack
// entries it expired (e.reopens: a bare SYN on a closed flow's tuple).
func (l *lab) judgeWorld(t testing.TB, p oracleProg, names map[uint16]string, w *oracleWorld, in []byte, e expectation) error {
	t.Helper()
	resetWorld(t, l, w)
	err := l.judge(t, p, names, in, e)
	for _, c := range e.reopens {
		ctAssured(t, l, c, true)
	}
	return err
}

// The tables a nat_sources entry counts flows in (enum nat_table, lib/types.h).
const (
	natTableSNAT = uint32(0) // nat: return-path SNAT
	natTableMasq = uint32(1) // masq_nat: egress masquerade
)

// oracleTunnelMTU is config.tunnel_mtu in the oracle's lab: the underlay's 1500 less
// 70, as the plan sets it for a site with a node on the IPv6 underlay
// (architecture.md, "IPv6 underlay"), so that every frame the tunnel takes fits the
// underlay over either family.
const oracleTunnelMTU = 1430

// oracleNatSourceFlowsMax is nat_source_flows_max in the oracle's lab: each pod
// source's share of each table. The world's other CNI's pod holds its whole share of
// nat, this node's pod its whole share of masq_nat (docs/architecture.md, "The NAT
// tables").
const oracleNatSourceFlowsMax = 4

// oracleNatMax and oracleMasqNatMax are the sizes of nat and masq_nat in the oracle's
// lab: nat the default, masq_nat one entry more than the world's masquerade flows
// take (oracleLab checks), so a new flow's two entries fit only where the flow
// deletes an expired entry on its way.
const (
	oracleNatMax     = 65536
	oracleMasqNatMax = 9
)

// putNat writes w's translated flows, both halves of each, seen just now (or two
// minutes ago: an expired one), in the state a reply leaves them in: return-path
// SNAT's (to the tunnel address) in nat, masquerade's (to the underlay address) in
// masq_nat; and in nat_sources each pod source's flows per table, as the datapath
// counts them (one per original entry it inserted and has not deleted, expired ones
// included) and the agent's collection recounts them (maps.CollectNat).
func putNat(t testing.TB, l *lab, w *oracleWorld) {
	t.Helper()
	// Only the world's flows: a translation an earlier input made would take a port
	// and change the next input's outcome.
	clearMap(t, l.objs.Nat, new(IsthmusNatKey), new(IsthmusNatValue))
	clearMap(t, l.objs.MasqNat, new(IsthmusNatKey), new(IsthmusNatValue))
	clearMap(t, l.objs.NatSources, new(IsthmusNatSourceKey), new(IsthmusNatSourceValue))
	now := monoNow(t)
	counts := map[IsthmusNatSourceKey]uint32{}
	for _, f := range w.nat {
		seen := now
		if f.expired && f.proto != 17 {
			t.Fatalf("nat flow %+v: only a UDP flow is past its timeout after two minutes", f)
		}
		if f.expired {
			seen -= uint64(120 * time.Second) // past every UDP timeout (60 s)
		}
		tbl, table := l.objs.Nat, natTableSNAT
		switch f.addr {
		case w.tunnelIP:
		case w.underlay:
			tbl, table = l.objs.MasqNat, natTableMasq
		default:
			t.Fatalf("nat flow %+v: translated to neither the tunnel nor the underlay address", f)
		}
		fk := natKey(f.pod, f.remote, f.podPort, f.remotePort, f.proto)
		rk := natKey(f.remote, f.addr, f.remotePort, f.port, f.proto)
		if f.proto == 1 {
			fk = natKey(f.pod, f.remote, f.podPort, 0, 1)
			rk = natKey(f.remote, f.addr, 0, f.port, 1)
		}
		fv := IsthmusNatValue{Addr: be32(f.addr), Port: nport(f.port), State: natEstablished, LastSeen: seen}
		rv := IsthmusNatValue{Addr: be32(f.pod), Port: nport(f.podPort), State: natEstablished, Flags: natReply, LastSeen: seen}
		if err := tbl.Put(fk, fv); err != nil {
			t.Fatalf("put %v %+v: %v", tbl, fk, err)
		}
		if err := tbl.Put(rk, rv); err != nil {
			t.Fatalf("put %v %+v: %v", tbl, rk, err)
		}
		counts[IsthmusNatSourceKey{Addr: be32(f.pod), Table: table}]++
	}
	for k, n := range counts {
		if err := l.objs.NatSources.Put(k, IsthmusNatSourceValue{Flows: n}); err != nil {
			t.Fatalf("put nat_sources %+v: %v", k, err)
		}
	}
}

// clearMap deletes every entry of m (k and v: pointers to its key and value types).
func clearMap[K, V any](t testing.TB, m *ebpf.Map, k *K, v *V) {
	t.Helper()
	var keys []K
	for it := m.Iterate(); it.Next(k, v); {
		keys = append(keys, *k)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatalf("delete %v %+v: %v", m, k, err)
		}
	}
}

// oracleLab is the lab with the oracle's world installed: every entry of w is written
// to the maps from w itself (w is also what the model reads), the lab's own entries
// included, and remote prefixes routed into ist0 as on a node (so the FIB tells an
// overlay destination from a local one).
func oracleLab(t testing.TB) (*lab, *oracleWorld) {
	t.Helper()
	l := newLabSpec(t, func(s *ebpf.CollectionSpec) {
		v, ok := s.Variables["nat_source_flows_max"]
		if !ok {
			t.Fatalf("no variable nat_source_flows_max")
		}
		if err := v.Set(uint32(oracleNatSourceFlowsMax)); err != nil {
			t.Fatalf("set nat_source_flows_max: %v", err)
		}
		s.Maps["nat"].MaxEntries = oracleNatMax
		s.Maps["masq_nat"].MaxEntries = oracleMasqNatMax
	})
	w := newOracleWorld(l.undMAC, l.podHMAC, l.istMAC)
	if n := 2 * len(slices.DeleteFunc(slices.Clone(w.nat), func(f oracleNat) bool { return f.addr != w.underlay })); n != w.masqNatMax-1 {
		t.Fatalf("the world's masquerade flows take %d entries of masq_nat, not %d", n, w.masqNatMax-1)
	}
	w.undIfindex, w.podIfindex, w.istIfindex = l.und.Attrs().Index, l.pod.Attrs().Index, l.ist.Attrs().Index
	if mtu := l.und.Attrs().MTU; mtu != w.underlayMTU {
		t.Fatalf("lab's und0 has MTU %d, the oracle's world %d", mtu, w.underlayMTU)
	}
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var cfg IsthmusDatapathConfig
	must("read config", l.objs.Config.Lookup(uint32(0), &cfg))
	cfg.TunnelIp = be32(w.tunnelIP)
	cfg.TunnelMtu = uint16(w.tunnelMTU)
	cfg.UnderlayIp6 = addr16(w.underlay6)
	cfg.SnatPortMin, cfg.SnatPortMax = w.snatPortMin, w.snatPortMax
	if w.masquerade {
		cfg.Flags |= cfgMasquerade
	}
	if w.fibDirect {
		cfg.Flags |= cfgFIBDirect
	}
	// Every decision traced: a delivery's record names the interface it redirects to.
	cfg.Flags |= cfgFlagTrace
	must("trace every address", l.objs.TracePrefixes.Put(IsthmusRouteKey{}, IsthmusTracePrefixValue{}))
	must("put config", l.objs.Config.Put(uint32(0), cfg))
	for _, p := range w.snatExempt {
		must("put snat_exempt", l.objs.SnatExempt.Put(IsthmusRouteKey{Prefixlen: uint32(p.Bits()), Addr: be32(p.Addr())}, IsthmusSnatExemptValue{}))
	}
	for _, p := range w.peers {
		must("put peer", l.objs.Peers.Put(be32(p), IsthmusPeerValue{}))
		for _, s := range w.peerSources[p] {
			must("put peer source", l.objs.PeerSources.Put(IsthmusPeerSourceKey{Prefixlen: 32 + uint32(s.Bits()), Peer: be32(p), Src: be32(s.Addr())}, IsthmusPeerSourceValue{}))
		}
	}
	// The peers on the IPv6 underlay: by handle in peers (PEER_F_UNDERLAY6 and the
	// address), their address in peers6, their sources under the handle.
	for h, a := range w.handles {
		must("put peer on the IPv6 underlay", l.objs.Peers.Put(be32(h), IsthmusPeerValue{Flags: peerFlagUnderlay6, Underlay6: addr16(a)}))
		must("put peers6", l.objs.Peers6.Put(IsthmusPeer6Key{Addr: addr16(a)}, IsthmusPeer6Value{Handle: be32(h)}))
		for _, s := range w.peerSources[h] {
			must("put peer source", l.objs.PeerSources.Put(IsthmusPeerSourceKey{Prefixlen: 32 + uint32(s.Bits()), Peer: be32(h), Src: be32(s.Addr())}, IsthmusPeerSourceValue{}))
		}
	}
	for p, srcs := range w.peerSources6 {
		for _, s := range srcs {
			must("put peer source6", l.objs.PeerSources6.Put(IsthmusPeerSource6Key{Prefixlen: 32 + uint32(s.Bits()), Peer: be32(p), Src: addr16(s.Addr())}, IsthmusPeerSourceValue{}))
		}
	}
	routeValue := func(r oracleRoute) IsthmusRouteValue {
		v := IsthmusRouteValue{Group: r.group}
		if r.notForPods {
			v.Flags = routeFNotForPods
		}
		if r.group == 0 {
			v.Peer = be32(r.peers[0])
		} else {
			g := IsthmusNexthopGroup{Live: uint32(len(r.peers))}
			for i := range g.Slots {
				if len(r.peers) > 0 {
					g.Slots[i] = be32(r.peers[i%len(r.peers)])
				}
			}
			must("put group", l.objs.NexthopGroups.Put(r.group, g))
		}
		return v
	}
	for _, r := range w.routes {
		must("put route", l.objs.Routes.Put(IsthmusRouteKey{Prefixlen: uint32(r.prefix.Bits()), Addr: be32(r.prefix.Addr())}, routeValue(r)))
	}
	for _, r := range w.routes6 {
		must("put route6", l.objs.Routes6.Put(IsthmusRoute6Key{Prefixlen: uint32(r.prefix.Bits()), Addr: addr16(r.prefix.Addr())}, routeValue(r)))
	}
	now := monoNow(t)
	for _, c := range w.health {
		k := IsthmusHealthKey{Port: nport(c.port)}
		copy(k.Site[:], c.site)
		v := IsthmusHealthReachValue{Expires: now + uint64(time.Hour)}
		if c.expired {
			v.Expires = now - uint64(time.Second)
		}
		if c.reaches {
			v.Flags = 1 // HEALTH_F_REACHES
		}
		must("put health_reach", l.objs.HealthReach.Put(k, v))
	}
	for _, p := range w.masqExempt {
		must("put masq_exempt", l.objs.MasqExempt.Put(IsthmusRouteKey{Prefixlen: uint32(p.Bits()), Addr: be32(p.Addr())}, IsthmusMasqExemptValue{}))
	}
	for _, p := range w.fabricPrefixes {
		must("put fabric prefix", l.objs.FabricPrefixes.Put(IsthmusRouteKey{Prefixlen: uint32(p.Bits()), Addr: be32(p.Addr())}, IsthmusFabricPrefixValue{}))
	}
	ipnet := func(p netip.Prefix) *net.IPNet {
		return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	}
	// IPv6: this node on the IPv6 underlay (und0's address, no duplicate address
	// detection, the peers' network through the router), the pods' addresses on
	// pod0h with their neighbours (as the CNI plugin makes them), the remote IPv6
	// prefixes into ist0 as the agent routes them, and IPv6 forwarding.
	must("the IPv6 side", inNS(l.ns, func() error {
		if err := netlink.AddrAdd(l.und, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(w.underlay6, 64)), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("add %v to und0: %w", w.underlay6, err)
		}
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.und.Attrs().Index, Family: netlink.FAMILY_V6,
			State: netlink.NUD_PERMANENT, IP: gw6.AsSlice(), HardwareAddr: w.gw6MAC}); err != nil {
			return fmt.Errorf("add the IPv6 router: %w", err)
		}
		for _, a := range w.handles {
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(netip.PrefixFrom(a, 64).Masked()), Gw: gw6.AsSlice(), LinkIndex: l.und.Attrs().Index}); err != nil {
				return fmt.Errorf("route %v via the IPv6 router: %w", a, err)
			}
		}
		for a, mac := range w.ownPods6 {
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(netip.PrefixFrom(a, 128)), LinkIndex: l.pod.Attrs().Index}); err != nil {
				return fmt.Errorf("route pod %v to pod0h: %w", a, err)
			}
			if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.pod.Attrs().Index, Family: netlink.FAMILY_V6,
				State: netlink.NUD_PERMANENT, IP: a.AsSlice(), HardwareAddr: mac}); err != nil {
				return fmt.Errorf("add pod %v's neighbour: %w", a, err)
			}
		}
		for _, r := range w.routes6 {
			if r.prefix.Addr().IsLinkLocalUnicast() || r.prefix.Addr().IsMulticast() {
				continue
			}
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(r.prefix), LinkIndex: l.ist.Attrs().Index}); err != nil {
				return fmt.Errorf("route %v into ist0: %w", r.prefix, err)
			}
		}
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644)
	}))
	must("route 10/8 into ist0, the fabric and another CNI's pods", inNS(l.ns, func() error {
		if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(netip.MustParsePrefix("10.0.0.0/8")),
			LinkIndex: l.ist.Attrs().Index, Scope: netlink.SCOPE_LINK}); err != nil {
			return err
		}
		// A default route through the underlay router, as every node has: a lookup
		// of an address nothing else routes (a handle's, say) finds a next hop.
		if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(netip.MustParsePrefix("0.0.0.0/0")),
			Gw: underlayGW.AsSlice(), LinkIndex: l.und.Attrs().Index}); err != nil {
			return fmt.Errorf("default route: %w", err)
		}
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.und.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: fabricGW.AsSlice(), HardwareAddr: w.fabricMAC}); err != nil {
			return fmt.Errorf("add fabric router: %w", err)
		}
		for a, mac := range w.ownPods {
			if a == podIP {
				continue // the lab's own
			}
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(netip.PrefixFrom(a, 32)), LinkIndex: l.pod.Attrs().Index,
				Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("route pod %v to pod0h: %w", a, err)
			}
			if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.pod.Attrs().Index, Family: netlink.FAMILY_V4,
				State: netlink.NUD_PERMANENT, IP: a.AsSlice(), HardwareAddr: mac}); err != nil {
				return fmt.Errorf("add pod %v's neighbour: %w", a, err)
			}
		}
		for _, p := range w.fabricRoutes {
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(p), Gw: fabricGW.AsSlice(), LinkIndex: l.und.Attrs().Index}); err != nil {
				return fmt.Errorf("route %v to the fabric router: %w", p, err)
			}
		}
		cni := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cni0h"}, PeerName: "cni0c"}
		if err := netlink.LinkAdd(cni); err != nil {
			return fmt.Errorf("add cni0h: %w", err)
		}
		for _, n := range []string{"cni0h", "cni0c"} {
			link, err := netlink.LinkByName(n)
			if err == nil {
				err = netlink.LinkSetUp(link)
			}
			if err != nil {
				return fmt.Errorf("set %s up: %w", n, err)
			}
		}
		link, err := netlink.LinkByName("cni0h")
		if err != nil {
			return fmt.Errorf("find cni0h: %w", err)
		}
		for _, p := range w.cniRoutes {
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(p), LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("route %v to cni0h: %w", p, err)
			}
		}
		return nil
	}))
	// The fast path shortens an entry to this netns's TIME_WAIT timeout on a FIN and
	// to its CLOSE timeout on a RST (bpf/lib/ct.h); the fuzz sends both on the fast
	// entries' tuples, and an entry expiring mid-run (10 s, 120 s by default) would
	// leave the model, which knows no time, wrong about every later frame of it. As
	// long as the entries' own timeout, they never shorten them.
	must("conntrack timeouts", inNS(l.ns, func() error {
		for _, name := range []string{"nf_conntrack_tcp_timeout_time_wait", "nf_conntrack_tcp_timeout_close"} {
			path := "/proc/sys/net/netfilter/" + name
			if err := os.WriteFile(path, []byte(strconv.Itoa(oracleCTTimeout)), 0o644); err != nil {
				return fmt.Errorf("set %s: %w", path, err)
			}
		}
		return nil
	}))
	// Unassured entries through netlink (ESTABLISHED, no ASSURED bit), assured ones
	// with conntrack -I, which can set the status; both with their reply tuple as the
	// world says (IPVS's shape: rewritten, no NAT bit).
	must("fill conntrack", inNS(l.ns, func() error {
		for _, c := range w.conntrack {
			if c.assured {
				continue
			}
			family := uint8(unix.AF_INET)
			if c.orig.src.Is6() {
				family = unix.AF_INET6
			}
			f := &netlink.ConntrackFlow{FamilyType: family, TimeOut: oracleCTTimeout,
				Forward: netlink.IPTuple{Protocol: c.proto, SrcIP: c.orig.src.AsSlice(), DstIP: c.orig.dst.AsSlice(), SrcPort: c.orig.sport, DstPort: c.orig.dport},
				Reverse: netlink.IPTuple{Protocol: c.proto, SrcIP: c.reply.src.AsSlice(), DstIP: c.reply.dst.AsSlice(), SrcPort: c.reply.sport, DstPort: c.reply.dport}}
			if c.proto == 6 {
				f.ProtoInfo = &netlink.ProtoInfoTCP{State: 3} // ESTABLISHED
			}
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(family), f); err != nil {
				return fmt.Errorf("create conntrack flow %+v: %w", c, err)
			}
		}
		return nil
	}))
	for _, c := range w.conntrack {
		if c.assured {
			ctAssured(t, l, c, false)
		}
	}
	putNat(t, l, w)
	return l, w
}

// ctAssured creates c in the lab's conntrack, ESTABLISHED and ASSURED, with
// conntrack -I (netlink's ConntrackFlow cannot set the status), replacing the entry of
// its tuple if replace.
func ctAssured(t testing.TB, l *lab, c oracleCT, replace bool) {
	t.Helper()
	if c.proto != 6 {
		t.Fatalf("conntrack flow %+v: only TCP entries are assured in the world", c)
	}
	ns := fmt.Sprintf("--net=/proc/%d/fd/%d", os.Getpid(), int(l.ns))
	orig := []string{"-p", "tcp", "-s", c.orig.src.String(), "-d", c.orig.dst.String(),
		"--sport", strconv.Itoa(int(c.orig.sport)), "--dport", strconv.Itoa(int(c.orig.dport))}
	if replace {
		// Gone already (expired) is as good as deleted.
		exec.Command("nsenter", append([]string{ns, "conntrack", "-D"}, orig...)...).Run()
	}
	args := append([]string{ns, "conntrack", "-I"}, orig...)
	args = append(args, "-r", c.reply.src.String(), "-q", c.reply.dst.String(),
		"--reply-port-src", strconv.Itoa(int(c.reply.sport)), "--reply-port-dst", strconv.Itoa(int(c.reply.dport)),
		"--state", "ESTABLISHED", "--status", "ASSURED", "--timeout", strconv.Itoa(oracleCTTimeout))
	if out, err := exec.Command("nsenter", args...).CombinedOutput(); err != nil {
		t.Fatalf("create assured conntrack flow %+v: %v: %s", c, err, out)
	}
}

// oracleCTTimeout is the life, in seconds, of the oracle lab's conntrack entries:
// it outlives any run.
const oracleCTTimeout = 7 * 24 * 3600

// dropNames returns the name of every drop reason in the object's BTF by its metrics
// code (the reasons issue-10 work adds included).
func dropNames(tb testing.TB) map[uint16]string {
	tb.Helper()
	spec, err := LoadIsthmus()
	if err != nil {
		tb.Fatalf("load spec: %v", err)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName("drop_reason", &e); err != nil {
		tb.Fatalf("find drop_reason in BTF: %v", err)
	}
	names := map[uint16]string{}
	for _, v := range e.Values {
		names[uint16(-int32(uint32(v.Value)))] = v.Name
	}
	return names
}

// oracleProg is one program under the oracle.
type oracleProg struct {
	name    string
	prog    *ebpf.Program
	ifindex int // 0 for XDP
	hook    IsthmusHook
	xdp     bool
	trace   *ringbuf.Reader // trace_events, every decision of the lab's programs
}

// newOracleProg is p reading l's trace_events (closed when t ends).
func newOracleProg(t testing.TB, l *lab, p oracleProg) oracleProg {
	t.Helper()
	rd, err := ringbuf.NewReader(l.objs.TraceEvents)
	if err != nil {
		t.Fatalf("open trace_events: %v", err)
	}
	t.Cleanup(func() { rd.Close() })
	p.trace = rd
	return p
}

// targets drains p's trace records and returns the interfaces the deliveries among
// them redirected to (METRIC_DELIVER_*, METRIC_FABRIC_INGRESS).
func (p oracleProg) targets(t testing.TB) []int {
	t.Helper()
	var ifs []int
	for {
		p.trace.SetDeadline(time.Now())
		rec, err := p.trace.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return ifs
		}
		if err != nil {
			t.Fatalf("read trace_events: %v", err)
		}
		var ev IsthmusTraceEvent
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &ev); err != nil {
			t.Fatalf("decode trace event: %v", err)
		}
		switch IsthmusMetric(ev.Code) {
		case IsthmusMetricMETRIC_DELIVER_POD, IsthmusMetricMETRIC_DELIVER_HOST,
			IsthmusMetricMETRIC_DELIVER_FABRIC, IsthmusMetricMETRIC_FABRIC_INGRESS:
			ifs = append(ifs, int(ev.TargetIfindex))
		}
	}
}

// judge runs p on in and returns why what it did is not the outcome e names (nil if
// it is).
func (l *lab) judge(t testing.TB, p oracleProg, names map[uint16]string, in []byte, e expectation) error {
	t.Helper()
	if n := e.outcomes(); n != 1 && !(e.hashed && n == 2) {
		return fmt.Errorf("%s: the model names %d outcomes for this input, not one: %s\ninput  %x", p.name, n, e.why, in)
	}
	p.targets(t) // what an earlier run left
	before := l.counts(t)
	ret, out := l.run(t, p.prog, in, p.ifindex)
	d := delta(before, l.counts(t))
	targets := p.targets(t)
	marked := !p.xdp && l.mark&overlayMark != 0
	var drops []string
	var reason IsthmusDropReason
	for k, n := range d {
		if name, ok := names[k.Code]; ok {
			drops = append(drops, fmt.Sprintf("%s+%d@hook%d", name, n, k.Hook))
			reason = IsthmusDropReason(uint32(-int32(k.Code)))
			if n != 1 || k.Hook != uint8(p.hook) {
				reason = 0
			}
		}
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%s: %s\nmodel: %s\ncounters: %v\ninput  %x", p.name, fmt.Sprintf(format, a...), e.why, d, in)
	}
	passRet, dropRet := uint32(tcActOK), uint32(tcActShot)
	if p.xdp {
		passRet, dropRet = xdpPass, xdpDrop
	}
	switch {
	case ret == passRet && bytes.Equal(out, in):
		if !e.pass {
			return fail("passed to the stack untouched; the model does not allow that")
		}
		if len(drops) > 0 {
			return fail("passed, but counted drops %v", drops)
		}
		if marked != e.mark {
			return fail("passed with OVERLAY_MARK %v; the model wants %v", marked, e.mark)
		}
	case ret == dropRet:
		if len(drops) != 1 || reason == 0 {
			return fail("dropped with drop counters %v; want exactly one named drop +1 at this hook", drops)
		}
		if !e.allows(reason) {
			return fail("dropped with %s; the model wants drop=%v %v", drops[0], e.drop, reasonNames(names, e.reasons))
		}
	case (p.xdp && ret == xdpPass) || (!p.xdp && (ret == tcActRedirect || ret == tcActOK)):
		// Redirected, popped (XDP) or, rewritten, returned to the stack (TC_ACT_OK).
		toStack := !p.xdp && ret == tcActOK
		if e.formDrop != 0 && (len(drops) != 1 || reason != e.formDrop) {
			return fail("verdict %d with drops counted %v; want exactly %s +1 at this hook", ret, drops, names[uint16(-int32(e.formDrop))])
		}
		if e.formDrop == 0 && len(drops) > 0 {
			return fail("verdict %d with drops counted %v", ret, drops)
		}
		if len(e.forms) == 0 {
			return fail("verdict %d, output %x: the model allows no output for this frame", ret, out)
		}
		var errs []string
		for _, f := range e.forms {
			if f.toStack != toStack {
				errs = append(errs, f.name+": not this verdict")
				continue
			}
			err := f.check(out)
			if err == nil && marked != f.mark {
				err = fmt.Errorf("OVERLAY_MARK %v, want %v", marked, f.mark)
			}
			if err == nil && f.target != 0 && !slices.Equal(targets, []int{f.target}) {
				err = fmt.Errorf("delivered to ifindex %v (trace), want %d", targets, f.target)
			}
			if err == nil {
				if os.Getenv("ORACLE_DEBUG") != "" {
					t.Logf("%s: %s: %s", p.name, f.name, e.why)
				}
				return nil
			}
			errs = append(errs, f.name+": "+err.Error())
		}
		return fail("verdict %d, output matches no allowed form:\n%s", ret, strings.Join(errs, "\n"))
	default:
		return fail("verdict %d (output changed: %v)", ret, !bytes.Equal(out, in))
	}
	return nil
}

// oracleSeeds returns seeds for f.Add: all of them, or with ORACLE_SEEDS=passing only
// those the program already does as the model says (judged by run), so that a fuzz
// run can explore past findings not fixed yet (a failing seed stops a run before any
// mutation). The skipped ones are logged.
func oracleSeeds(f *testing.F, seeds [][]byte, run func(in []byte) error) [][]byte {
	if os.Getenv("ORACLE_SEEDS") != "passing" {
		return seeds
	}
	var keep [][]byte
	for i, in := range seeds {
		in, ok := runnable(in)
		if !ok {
			continue
		}
		if err := run(in); err != nil {
			f.Logf("seed %d left out (it fails): %v", i, err)
			continue
		}
		keep = append(keep, in)
	}
	return keep
}

func reasonNames(names map[uint16]string, rs []IsthmusDropReason) []string {
	var s []string
	for _, r := range rs {
		s = append(s, names[uint16(-int32(r))])
	}
	return s
}

// runnable trims in to what BPF_PROG_TEST_RUN takes and reports whether it takes it at
// all: at most 1514 bytes (a 1500-byte link), and no IPv4 or IPv6 frame shorter than its
// fixed header (the kernel refuses such skbs; no wire carries them).
func runnable(in []byte) ([]byte, bool) {
	if len(in) > 1514 {
		in = in[:1514]
	}
	if len(in) < 14 {
		return nil, false
	}
	switch binary.BigEndian.Uint16(in[12:]) {
	case 0x0800:
		return in, len(in) >= 14+20
	case 0x86dd:
		return in, len(in) >= 14+40
	}
	return in, true
}

// fuzzUnderlay runs one underlay program against the model, as a member and as a gateway.
func fuzzUnderlay(f *testing.F, xdp bool) {
	l, w := oracleLab(f)
	names := dropNames(f)
	p := oracleProg{name: "underlay_ingress", prog: l.objs.UnderlayIngress, ifindex: l.und.Attrs().Index, hook: IsthmusHookHOOK_UNDERLAY_TC}
	if xdp {
		p = oracleProg{name: "underlay_xdp", prog: l.objs.UnderlayXdp, hook: IsthmusHookHOOK_UNDERLAY_XDP, xdp: true}
	}
	p = newOracleProg(f, l, p)
	seeds := oracleSeeds(f, underlaySeeds(l), func(in []byte) error {
		for _, transit := range []bool{false, true} {
			setTransit(f, l, transit)
			w.transit = transit
			if err := l.judgeWorld(f, p, names, w, in, modelUnderlay(w, in, xdp)); err != nil {
				return err
			}
		}
		return nil
	})
	for _, in := range seeds {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		in, ok := runnable(in)
		if !ok {
			return
		}
		for _, transit := range []bool{false, true} {
			// Every input starts from the world's nat table: a reply refreshes its
			// entries and a FIN or RST changes their state.
			setTransit(t, l, transit)
			w.transit = transit
			q := p
			if transit {
				q.name += " (gateway)"
			}
			if err := l.judgeWorld(t, q, names, w, in, modelUnderlay(w, in, xdp)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func FuzzOracleUnderlayTC(f *testing.F)  { fuzzUnderlay(f, false) }
func FuzzOracleUnderlayXDP(f *testing.F) { fuzzUnderlay(f, true) }

// fuzzEncap runs pod_ingress (fromPod) or overlay_egress against the model.
func fuzzEncap(f *testing.F, fromPod bool) {
	l, w := oracleLab(f)
	names := dropNames(f)
	p := oracleProg{name: "overlay_egress", prog: l.objs.OverlayEgress, ifindex: l.ist.Attrs().Index, hook: IsthmusHookHOOK_OVERLAY_EGRESS}
	if fromPod {
		p = oracleProg{name: "pod_ingress", prog: l.objs.PodIngress, ifindex: l.pod.Attrs().Index, hook: IsthmusHookHOOK_POD_INGRESS}
	}
	p = newOracleProg(f, l, p)
	for _, in := range oracleSeeds(f, encapSeeds(l, fromPod), func(in []byte) error {
		return l.judgeWorld(f, p, names, w, in, modelEncap(w, in, fromPod))
	}) {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		in, ok := runnable(in)
		if !ok {
			return
		}
		// Every input starts from the world's nat table (a translation takes a port).
		if err := l.judgeWorld(t, p, names, w, in, modelEncap(w, in, fromPod)); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzOraclePodIngress(f *testing.F)    { fuzzEncap(f, true) }
func FuzzOracleOverlayEgress(f *testing.F) { fuzzEncap(f, false) }

// FuzzOracleUnderlayEgress runs underlay_egress (egress masquerade) against the model,
// each input from the world's nat table.
func FuzzOracleUnderlayEgress(f *testing.F) {
	l, w := oracleLab(f)
	names := dropNames(f)
	p := newOracleProg(f, l, oracleProg{name: "underlay_egress", prog: l.objs.UnderlayEgress, ifindex: l.und.Attrs().Index, hook: IsthmusHookHOOK_UNDERLAY_EGRESS})
	for _, in := range oracleSeeds(f, masqSeeds(l), func(in []byte) error {
		return l.judgeWorld(f, p, names, w, in, modelMasq(w, in))
	}) {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		in, ok := runnable(in)
		if !ok {
			return
		}
		if err := l.judgeWorld(t, p, names, w, in, modelMasq(w, in)); err != nil {
			t.Fatal(err)
		}
	})
}
