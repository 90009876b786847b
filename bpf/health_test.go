package bpf

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Program tests for the datapath's health responder (lib/health.h, docs/gateways.md
// "Answers across an agent restart"): a probe in the wire format of loader/health,
// GENEVE from peerIP to this node's tunnel address, is answered by underlay_ingress
// from health_reach. The expected answers are built and the outputs decoded with
// gopacket, which computes every checksum itself: the oracle shares no code with the
// program or with loader/health.

const healthPort = 9997

var (
	proberIP  = netip.MustParseAddr("10.2.0.1") // the peer's tunnel address, in remoteNet
	proberMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x02, 0x01}
	ownMAC    = net.HardwareAddr{0x02, 0, 0, 0, 0x63, 0x01} // what the peer's encap put
)

// healthMsg is a loader/health message: magic, kind, round, site.
func healthMsg(kind byte, round uint64, site string) []byte {
	b := append([]byte("isthmus-health1\x00"), kind)
	b = binary.BigEndian.AppendUint64(b, round)
	return append(b, site...)
}

// probeSide is one end of a probe or answer: outer (underlay) and inner (tunnel)
// addresses, MACs and the inner UDP port.
type probeSide struct {
	outerMAC, innerMAC net.HardwareAddr
	outer, inner       netip.Addr
	port               uint16
}

// healthFrame builds, with gopacket, GENEVE (VNI testVNI, outer UDP port 50000 to
// 6081) from src to dst carrying an inner UDP datagram with payload. The inner UDP
// checksum is computed unless zeroCsum; the outer UDP one is computed when outerCsum,
// else zero.
// scapy: Ether(src=src.outerMAC, dst=dst.outerMAC)/IP(src=src.outer, dst=dst.outer, ttl=ttl, flags="DF", id=7)/UDP(sport=50000, dport=6081)/GENEVE(vni=0x123456, proto=0x6558)/Ether(src=src.innerMAC, dst=dst.innerMAC)/IP(src=src.inner, dst=dst.inner, ttl=64, id=9)/UDP(sport=src.port, dport=dst.port)/payload
func healthFrame(t *testing.T, src, dst probeSide, ttl uint8, payload []byte, zeroCsum, outerCsum bool) []byte {
	t.Helper()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	iip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Id: 9, Protocol: layers.IPProtocolUDP,
		SrcIP: src.inner.AsSlice(), DstIP: dst.inner.AsSlice()}
	iudp := &layers.UDP{SrcPort: layers.UDPPort(src.port), DstPort: layers.UDPPort(dst.port)}
	iudp.SetNetworkLayerForChecksum(iip)
	inner := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(inner, opts,
		&layers.Ethernet{SrcMAC: src.innerMAC, DstMAC: dst.innerMAC, EthernetType: layers.EthernetTypeIPv4},
		iip, iudp, gopacket.Payload(payload)); err != nil {
		t.Fatalf("serialize inner frame: %v", err)
	}
	in := inner.Bytes()
	if zeroCsum {
		binary.BigEndian.PutUint16(in[14+20+6:], 0)
	}
	oip := &layers.IPv4{Version: 4, IHL: 5, TTL: ttl, Id: 7, Flags: layers.IPv4DontFragment,
		Protocol: layers.IPProtocolUDP, SrcIP: src.outer.AsSlice(), DstIP: dst.outer.AsSlice()}
	oudp := &layers.UDP{SrcPort: 50000, DstPort: 6081}
	oudp.SetNetworkLayerForChecksum(oip)
	frame := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(frame, opts,
		&layers.Ethernet{SrcMAC: src.outerMAC, DstMAC: dst.outerMAC, EthernetType: layers.EthernetTypeIPv4},
		oip, oudp, gopacket.Payload(geneveHeader(geneveOpts{proto: 0x6558, vni: testVNI, optWords: -1}, in))); err != nil {
		t.Fatalf("serialize frame: %v", err)
	}
	out := frame.Bytes()
	if !outerCsum {
		binary.BigEndian.PutUint16(out[14+20+6:], 0)
	}
	return out
}

// claim writes a health_reach entry for (port, site) with a deadline of expires.
func claim(t *testing.T, l *lab, port uint16, site string, reaches bool, expires uint64) {
	t.Helper()
	k := IsthmusHealthKey{Port: binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, port))}
	copy(k.Site[:], site)
	v := IsthmusHealthReachValue{Expires: expires}
	if reaches {
		v.Flags = 1 // HEALTH_F_REACHES; maps/ checks the Go mirror against types.h
	}
	if err := l.objs.HealthReach.Put(k, v); err != nil {
		t.Fatalf("put health_reach: %v", err)
	}
}

// clearHealth empties health_reach and health_probers.
func clearHealth(t *testing.T, l *lab) {
	t.Helper()
	for _, m := range []*ebpf.Map{l.objs.HealthReach, l.objs.HealthProbers} {
		var keys [][]byte
		k := make([]byte, m.KeySize())
		it := m.Iterate()
		for it.Next(&k, new([]byte)) {
			keys = append(keys, append([]byte(nil), k...))
		}
		if err := it.Err(); err != nil {
			t.Fatalf("iterate %v: %v", m, err)
		}
		for _, k := range keys {
			if err := m.Delete(k); err != nil {
				t.Fatalf("delete from %v: %v", m, err)
			}
		}
	}
}

// decodeAnswer decodes frame with gopacket down to the inner UDP layer and its payload,
// failing with what it found when a layer is missing.
func decodeAnswer(t *testing.T, frame []byte) (oip *layers.IPv4, oudp *layers.UDP, iip *layers.IPv4, iudp *layers.UDP) {
	t.Helper()
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	var ips []*layers.IPv4
	var udps []*layers.UDP
	for _, ly := range p.Layers() {
		switch v := ly.(type) {
		case *layers.IPv4:
			ips = append(ips, v)
		case *layers.UDP:
			udps = append(udps, v)
		}
	}
	if len(ips) != 2 || len(udps) != 2 || p.Layer(layers.LayerTypeGeneve) == nil {
		t.Fatalf("answer does not decode as GENEVE with inner IPv4/UDP: %v", p)
	}
	return ips[0], udps[0], ips[1], udps[1]
}

func TestHealthResponder(t *testing.T) {
	l := newLab(t)
	setTunnelIP(t, l, hostIP)
	prober := probeSide{outerMAC: gwMAC, innerMAC: proberMAC, outer: peerIP, inner: proberIP, port: 40000}
	self := probeSide{outerMAC: l.undMAC, innerMAC: ownMAC, outer: underlayIP, inner: hostIP, port: healthPort}
	answered := metricKey(IsthmusMetricMETRIC_HEALTH_ANSWERED, IsthmusHookHOOK_UNDERLAY_TC)
	expiredKey := metricKey(IsthmusMetricMETRIC_HEALTH_EXPIRED, IsthmusHookHOOK_UNDERLAY_TC)
	toHost := metricKey(IsthmusMetricMETRIC_DELIVER_HOST, IsthmusHookHOOK_UNDERLAY_TC)
	const far = ^uint64(0) // a deadline that never passes

	// Each case starts from empty maps and writes its claims.
	type claimArgs struct {
		port    uint16
		site    string
		reaches bool
		expires uint64
	}
	for _, tc := range []struct {
		name      string
		claims    []claimArgs
		probe     []byte
		zeroCsum  bool
		outerCsum bool
		want      byte // the answer's kind; 0: not answered, decapsulated to the host
	}{
		{name: "reaches", claims: []claimArgs{{healthPort, "east", true, far}, {healthPort, "", false, far}},
			probe: healthMsg('P', 42, "east"), want: 'R'},
		{name: "does not reach", claims: []claimArgs{{healthPort, "east", false, far}, {healthPort, "", true, far}},
			probe: healthMsg('P', 42, "east"), want: 'N'},
		{name: "claim expired", claims: []claimArgs{{healthPort, "east", true, 1}},
			probe: healthMsg('P', 7, "east"), want: 'N'},
		{name: "other site: the default claim", claims: []claimArgs{{healthPort, "east", false, far}, {healthPort, "", true, far}},
			probe: healthMsg('P', 1<<40+3, "north"), want: 'R'},
		{name: "liveness probe", claims: []claimArgs{{healthPort, "", true, far}},
			probe: healthMsg('P', 5, ""), want: 'R'},
		{name: "zero inner checksum stays zero", claims: []claimArgs{{healthPort, "east", true, far}},
			probe: healthMsg('P', 42, "east"), zeroCsum: true, want: 'R'},
		{name: "outer UDP checksum", claims: []claimArgs{{healthPort, "east", true, far}},
			probe: healthMsg('P', 42, "east"), outerCsum: true, want: 'R'},
		{name: "longest site name", claims: []claimArgs{{healthPort, strings.Repeat("s", 64), true, far}},
			probe: healthMsg('P', 42, strings.Repeat("s", 64)), want: 'R'},
		{name: "no claims: the agent answers", probe: healthMsg('P', 42, "east")},
		{name: "claims of another port", claims: []claimArgs{{healthPort + 1, "east", true, far}, {healthPort + 1, "", true, far}},
			probe: healthMsg('P', 42, "east")},
		{name: "site name too long", claims: []claimArgs{{healthPort, "", true, far}},
			probe: healthMsg('P', 42, strings.Repeat("s", 65))},
		{name: "an answer is not answered", claims: []claimArgs{{healthPort, "", true, far}},
			probe: healthMsg('R', 42, "east")},
		{name: "first-version probe", claims: []claimArgs{{healthPort, "", true, far}},
			probe: append([]byte("isthmus-health1\x00"), 0, 0, 0, 0, 0, 0, 0, 9)},
		{name: "another magic", claims: []claimArgs{{healthPort, "", true, far}},
			probe: append([]byte("isthmus-health2\x00"), healthMsg('P', 1, "east")[16:]...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearHealth(t, l)
			for _, c := range tc.claims {
				claim(t, l, c.port, c.site, c.reaches, c.expires)
			}
			in := healthFrame(t, prober, self, 61, tc.probe, tc.zeroCsum, tc.outerCsum)
			before := l.counts(t)
			ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			d := delta(before, l.counts(t))
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT (counters %v)", ret, d)
			}
			if tc.want == 0 {
				if d[answered] != 0 || d[toHost] != 1 {
					t.Fatalf("counters moved %v, want deliver_host +1 and no health answer", d)
				}
				return
			}
			// The answer, as the agent's responder would send it through its encap,
			// but back on the probe's path: everything swapped, outer TTL 64, outer
			// UDP checksum 0, the round and site echoed, the kind set.
			payload := append([]byte(nil), tc.probe...)
			payload[16] = tc.want
			want := healthFrame(t, self, prober, 64, payload, tc.zeroCsum, false)
			if !bytes.Equal(out, want) {
				t.Errorf("answer differs from gopacket's:\n got %x\nwant %x", out, want)
			}
			oip, oudp, iip, iudp := decodeAnswer(t, out)
			if oip.DstIP.String() != peerIP.String() || oudp.Checksum != 0 || oudp.DstPort != 6081 ||
				iip.DstIP.String() != proberIP.String() || iudp.SrcPort != healthPort || iudp.DstPort != 40000 ||
				!bytes.Equal(iudp.Payload, payload) {
				t.Errorf("decoded answer: outer to %v udp %d csum %#x, inner to %v %d->%d payload %q; want to %v:40000 from %d, payload %q",
					oip.DstIP, oudp.DstPort, oudp.Checksum, iip.DstIP, iudp.SrcPort, iudp.DstPort, iudp.Payload, proberIP, healthPort, payload)
			}
			wantD := map[IsthmusMetricsKey]uint64{answered: 1}
			if tc.name == "claim expired" {
				wantD[expiredKey] = 1
			}
			if len(d) != len(wantD) || d[answered] != 1 || d[expiredKey] != wantD[expiredKey] {
				t.Errorf("counters moved %v, want %v", d, wantD)
			}
			// The prober is recorded for the agent's pushes.
			pk := IsthmusHealthProberKey{Addr: be32(proberIP), Port: binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, 40000))}
			copy(pk.Site[:], tc.probe[25:])
			var pv IsthmusHealthProberValue
			if err := l.objs.HealthProbers.Lookup(pk, &pv); err != nil || pv.Seen == 0 {
				t.Errorf("health_probers entry for %v:40000 site %q: %+v, %v", proberIP, tc.probe[25:], pv, err)
			}
		})
	}
}

// TestHealthResponderXDP: underlay_xdp leaves a probe whole and without metadata, so
// underlay_ingress answers it as without XDP; other UDP for the tunnel address takes
// the same path (decapsulated at TC).
func TestHealthResponderXDP(t *testing.T) {
	l := newLab(t)
	setTunnelIP(t, l, hostIP)
	claim(t, l, healthPort, "", true, ^uint64(0))
	prober := probeSide{outerMAC: gwMAC, innerMAC: proberMAC, outer: peerIP, inner: proberIP, port: 40000}
	self := probeSide{outerMAC: l.undMAC, innerMAC: ownMAC, outer: underlayIP, inner: hostIP, port: healthPort}
	in := healthFrame(t, prober, self, 61, healthMsg('P', 3, "east"), false, false)
	l.wantXDPPassWhole(t, "probe", in)
	ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("TC verdict %d, want TC_ACT_REDIRECT", ret)
	}
	if _, _, _, iudp := decodeAnswer(t, out); len(iudp.Payload) < 17 || iudp.Payload[16] != 'R' {
		t.Errorf("TC after XDP: payload %q, want an answer of kind R", iudp.Payload)
	}
}
