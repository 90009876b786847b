package bpf

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
)

// cfgFlagTrace is CFG_F_TRACE of lib/types.h (maps.ConfigFlagTrace; maps/flags_test.go
// checks the value against the header).
const cfgFlagTrace = 1 << 1

// setTrace sets or clears CFG_F_TRACE and makes prefixes the only traced prefixes.
func (l *lab) setTrace(t *testing.T, on bool, prefixes ...netip.Prefix) {
	t.Helper()
	var cfg IsthmusDatapathConfig
	if err := l.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	cfg.Flags &^= cfgFlagTrace
	if on {
		cfg.Flags |= cfgFlagTrace
	}
	if err := l.objs.Config.Put(uint32(0), &cfg); err != nil {
		t.Fatalf("write config: %v", err)
	}
	var k IsthmusRouteKey
	var keys []IsthmusRouteKey
	it := l.objs.TracePrefixes.Iterate()
	var v IsthmusTracePrefixValue
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if err := l.objs.TracePrefixes.Delete(&k); err != nil {
			t.Fatalf("delete trace prefix: %v", err)
		}
	}
	for _, p := range prefixes {
		k := IsthmusRouteKey{Prefixlen: uint32(p.Bits()), Addr: be32(p.Masked().Addr())}
		if err := l.objs.TracePrefixes.Put(&k, &IsthmusTracePrefixValue{}); err != nil {
			t.Fatalf("add trace prefix %v: %v", p, err)
		}
	}
}

// traceEvents returns every record waiting in trace_events.
func (l *lab) traceEvents(t *testing.T) []IsthmusTraceEvent {
	t.Helper()
	rd, err := ringbuf.NewReader(l.objs.TraceEvents)
	if err != nil {
		t.Fatalf("open trace_events: %v", err)
	}
	defer rd.Close()
	var evs []IsthmusTraceEvent
	for {
		rd.SetDeadline(time.Now().Add(50 * time.Millisecond))
		rec, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return evs
		}
		if err != nil {
			t.Fatalf("read trace_events: %v", err)
		}
		var ev IsthmusTraceEvent
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &ev); err != nil {
			t.Fatalf("decode trace event: %v", err)
		}
		evs = append(evs, ev)
	}
}

// ntohs returns the host value of a __be16 field.
func ntohs(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

// TestTraceEncap: an encapsulation at pod_ingress (the direct path of an established
// flow) to a traced prefix emits one event naming the flow, the peer and the tunnel
// source port on the wire.
func TestTraceEncap(t *testing.T) {
	l := newLab(t)
	l.ctEstablished(t, podFlow(remotePodIP, 1234))
	l.setTrace(t, true, netip.PrefixFrom(remotePodIP, 32))
	t.Cleanup(func() { l.setTrace(t, false) })
	l.traceEvents(t)

	in := podFrame(l, remotePodIP, 1234)
	ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
	}
	evs := l.traceEvents(t)
	if len(evs) != 1 {
		t.Fatalf("%d events, want one encap: %+v", len(evs), evs)
	}
	ev := evs[0]
	want := IsthmusTraceEvent{
		Timestamp:   ev.Timestamp,
		Code:        int32(IsthmusMetricMETRIC_ENCAP),
		Hook:        uint8(IsthmusHookHOOK_POD_INGRESS),
		Proto:       6,
		TunnelSport: ev.TunnelSport,
		Ifindex:     uint32(l.pod.Attrs().Index),
		Len:         uint32(len(out)),
		Saddr:       be32(podIP),
		Daddr:       be32(remotePodIP),
		Peer:        be32(peerIP),
	}
	if ntohs(ev.Sport) != 1234 || ntohs(ev.Dport) != 80 {
		t.Errorf("ports %d -> %d, want 1234 -> 80", ntohs(ev.Sport), ntohs(ev.Dport))
	}
	want.Sport, want.Dport = ev.Sport, ev.Dport
	if got := ntohs(ev.TunnelSport); got != flowSport(in[14:]) || got != binary.BigEndian.Uint16(out[34:]) {
		t.Errorf("tunnel source port %d, want %d (the one on the wire)", got, flowSport(in[14:]))
	}
	if ev != want {
		t.Errorf("event\n got %+v\nwant %+v", ev, want)
	}
	if ev.Timestamp == 0 {
		t.Errorf("no timestamp")
	}
}

func TestTraceDropUnknownPeer(t *testing.T) {
	l := newLab(t)
	l.setTrace(t, true, netip.PrefixFrom(podIP, 32))
	t.Cleanup(func() { l.setTrace(t, false) })
	l.traceEvents(t)

	o := goodOpts(podIP)
	o.outerSrc = strangerIP
	in := geneveFrame(l, o, innerEth(innerIPv4(o)))
	for _, tc := range []struct {
		name    string
		xdp     bool
		hook    IsthmusHook
		ifindex int
		want    uint32
	}{
		{"tc", false, IsthmusHookHOOK_UNDERLAY_TC, l.und.Attrs().Index, tcActShot},
		{"xdp", true, IsthmusHookHOOK_UNDERLAY_XDP, 0, xdpDrop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := l.objs.UnderlayIngress
			if tc.xdp {
				prog = l.objs.UnderlayXdp
			}
			if ret, _ := l.run(t, prog, in, tc.ifindex); ret != tc.want {
				t.Fatalf("verdict %d, want drop %d", ret, tc.want)
			}
			evs := l.traceEvents(t)
			if len(evs) != 1 {
				t.Fatalf("%d events, want one drop: %+v", len(evs), evs)
			}
			ev, reason := evs[0], IsthmusDropReasonDROP_UNKNOWN_PEER
			if ev.Code != int32(reason) || ev.Hook != uint8(tc.hook) {
				t.Errorf("code %d hook %d, want DROP_UNKNOWN_PEER at %d", ev.Code, ev.Hook, tc.hook)
			}
			if ev.Saddr != be32(remotePodIP) || ev.Daddr != be32(podIP) || ev.Proto != 17 ||
				ntohs(ev.Sport) != 4000 || ntohs(ev.Dport) != 5000 {
				t.Errorf("inner tuple %+v, want %v:4000 -> %v:5000 udp", ev, remotePodIP, podIP)
			}
			if ev.Peer != be32(strangerIP) || ntohs(ev.TunnelSport) != 50000 || ev.Len != uint32(len(in)) {
				t.Errorf("peer %v tunnel sport %d len %d, want %v 50000 %d",
					beToAddr(ev.Peer), ntohs(ev.TunnelSport), ev.Len, strangerIP, len(in))
			}
		})
	}
}

// TestTraceSilent: a packet outside trace_prefixes, or any packet with CFG_F_TRACE
// clear, emits nothing, and is handled as without tracing (an established flow's
// segment encapsulated at pod_ingress, a frame from a stranger dropped).
func TestTraceSilent(t *testing.T) {
	l := newLab(t)
	l.ctEstablished(t, podFlow(remotePodIP, 1234))
	for _, tc := range []struct {
		name     string
		on       bool
		prefixes []netip.Prefix
	}{
		{"untraced prefix", true, []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}},
		{"flag off", false, []netip.Prefix{netip.PrefixFrom(remotePodIP, 32), netip.PrefixFrom(podIP, 32)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l.setTrace(t, tc.on, tc.prefixes...)
			t.Cleanup(func() { l.setTrace(t, false) })
			l.traceEvents(t)
			if ret, _ := l.run(t, l.objs.PodIngress, podFrame(l, remotePodIP, 1234), l.pod.Attrs().Index); ret != tcActRedirect {
				t.Fatalf("encap verdict %d, want TC_ACT_REDIRECT", ret)
			}
			o := goodOpts(podIP)
			o.outerSrc = strangerIP
			if ret, _ := l.run(t, l.objs.UnderlayIngress, geneveFrame(l, o, innerEth(innerIPv4(o))), l.und.Attrs().Index); ret != tcActShot {
				t.Fatalf("drop verdict %d, want TC_ACT_SHOT", ret)
			}
			if evs := l.traceEvents(t); len(evs) != 0 {
				t.Errorf("%d events, want none: %+v", len(evs), evs)
			}
		})
	}
}

func beToAddr(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}
