package bpf

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// routeFUnderlay is ROUTE_F_UNDERLAY of lib/types.h (maps.RouteFlagUnderlay;
// maps.TestConfigFlagsMatchHeader checks the Go mirror against the header).
const routeFUnderlay uint32 = 1 << 1

// routeFNotForPods is ROUTE_F_NOT_FOR_PODS of lib/types.h (maps.RouteFlagNotForPods).
const routeFNotForPods uint32 = 1 << 2

// encapsulatedTo decodes frame with gopacket and returns the outer IPv4
// destination of the GENEVE frame it is, or fails.
func encapsulatedTo(t *testing.T, frame []byte) netip.Addr {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	ip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if pkt.Layer(layers.LayerTypeGeneve) == nil || ip == nil {
		t.Fatalf("not a GENEVE frame: %v", pkt)
	}
	dst, _ := netip.AddrFromSlice(ip.DstIP)
	return dst
}

// putException puts an Underlay exception for addr/32 inside remoteNet, which
// the lab routes to peerIP.
func putException(t *testing.T, l *lab, addr netip.Addr) {
	t.Helper()
	k := IsthmusRouteKey{Prefixlen: 32, Addr: be32(addr)}
	if err := l.objs.Routes.Put(k, IsthmusRouteValue{Flags: routeFUnderlay}); err != nil {
		t.Fatalf("put exception: %v", err)
	}
}

// requirePodLeftToStack runs pod_ingress on the pod frame in and fails unless it
// leaves the frame to the stack: TC_ACT_OK, unchanged, nothing encapsulated.
func requirePodLeftToStack(t *testing.T, l *lab, in []byte) {
	t.Helper()
	before := l.counts(t)
	ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
	if ret != tcActOK || !bytes.Equal(out, in) {
		t.Fatalf("verdict %d, changed %v; want TC_ACT_OK, unchanged (left to the stack)", ret, !bytes.Equal(out, in))
	}
	if d := delta(before, l.counts(t)); d[metricKey(IsthmusMetricMETRIC_ENCAP, IsthmusHookHOOK_POD_INGRESS)] != 0 {
		t.Errorf("counters moved %v: encapsulated", d)
	}
}

// TestUnderlayExceptionIsAMiss: a /32 with ROUTE_F_UNDERLAY inside a tunnelled
// prefix (a tunnel endpoint inside a remote site's nodeCidrs, plan.Route.Underlay)
// is not tunnelled by any reader of routes: a pod's packet to it goes to the stack
// untouched, the host's on isthmus0 is dropped as having no overlay route, and a
// gateway does not transit GENEVE for it. Its neighbour in the same prefix is
// tunnelled as before, so the exception is exactly one address wide.
func TestUnderlayExceptionIsAMiss(t *testing.T) {
	l := newLab(t)
	except := remotePodIP
	neighbour := remotePodIP.Next()
	putException(t, l, except)

	t.Run("pod_ingress", func(t *testing.T) {
		// Both flows are established in conntrack, so that only the route decides:
		// the neighbour's takes the direct path, the exception's does not.
		l.ctEstablished(t, podFlow(except, 4321))
		l.ctEstablished(t, podFlow(neighbour, 4321))
		requirePodLeftToStack(t, l, podFrame(l, except, 4321))
		ret, out := l.run(t, l.objs.PodIngress, podFrame(l, neighbour, 4321), l.pod.Attrs().Index)
		if ret != tcActRedirect || len(out) < 34 || netip.AddrFrom4([4]byte(out[30:34])) != peerIP {
			t.Fatalf("neighbour %s: verdict %d; want TC_ACT_REDIRECT encapsulated to %s", neighbour, ret, peerIP)
		}
	})
	t.Run("overlay_egress", func(t *testing.T) {
		before := l.counts(t)
		if ret, _ := l.run(t, l.objs.OverlayEgress, podFrame(l, except, 4321), l.ist.Attrs().Index); ret != tcActShot {
			t.Fatalf("verdict %d, want TC_ACT_SHOT", ret)
		}
		d := delta(before, l.counts(t))
		if k := dropKey(IsthmusDropReasonDROP_NO_OVERLAY_ROUTE, IsthmusHookHOOK_OVERLAY_EGRESS); d[k] != 1 || len(d) != 1 {
			t.Errorf("counters moved %v, want only %v +1", d, k)
		}
		if ret, _ := l.run(t, l.objs.OverlayEgress, podFrame(l, neighbour, 4321), l.ist.Attrs().Index); ret != tcActRedirect {
			t.Fatalf("neighbour %s: verdict %d, want TC_ACT_REDIRECT", neighbour, ret)
		}
	})
	t.Run("transit", func(t *testing.T) {
		addMember(t, l)
		setTransit(t, l, true)
		defer setTransit(t, l, false)
		transit := metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)
		// The exception must do exactly what a destination no route holds does.
		outcome := func(dst netip.Addr) (uint32, map[IsthmusMetricsKey]uint64) {
			o := transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: dst, innerTTL: 63, sport: 1234}
			before := l.counts(t)
			ret, _ := l.run(t, l.objs.UnderlayIngress, transitFrame(l, o), l.und.Attrs().Index)
			return ret, delta(before, l.counts(t))
		}
		missRet, miss := outcome(netip.MustParseAddr("10.77.0.1"))
		ret, got := outcome(except)
		if ret != missRet || len(got) != len(miss) || got[transit] != 0 {
			t.Fatalf("verdict %d, counters moved %v; a destination without a route gives %d, %v", ret, got, missRet, miss)
		}
		for k, v := range miss {
			if got[k] != v {
				t.Fatalf("counters moved %v; a destination without a route moves %v", got, miss)
			}
		}
		o := transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: neighbour, innerTTL: 63, sport: 1234}
		before := l.counts(t)
		if ret, _ := l.run(t, l.objs.UnderlayIngress, transitFrame(l, o), l.und.Attrs().Index); ret != tcActRedirect || delta(before, l.counts(t))[transit] != 1 {
			t.Fatalf("neighbour %s: verdict %d, want a transit", neighbour, ret)
		}
	})
}

// TestNotForPodsRoute: a route with ROUTE_F_NOT_FOR_PODS (the route a gateway of
// a site whose pods another CNI owns has to a node of its own site,
// plan.Route.NotForPods) serves forwarded packets only. A pod's packet to it is
// left to the stack untouched, as the kernel's pods' table leaves it out: the
// pod's answers to that node's connections go back over the site's fabric, the
// way the requests came, not into the tunnel. GENEVE a gateway forwards to it is
// still sent on to its peer. Without the flag the same pod packet is
// encapsulated, so the flag alone decides.
func TestNotForPodsRoute(t *testing.T) {
	l := newLab(t)
	node := netip.MustParseAddr("172.31.9.11")
	put := func(flags uint32) {
		t.Helper()
		k := IsthmusRouteKey{Prefixlen: 32, Addr: be32(node)}
		if err := l.objs.Routes.Put(k, IsthmusRouteValue{Peer: be32(peerIP), Flags: flags}); err != nil {
			t.Fatalf("put route: %v", err)
		}
	}
	// Established in conntrack, so only the route decides (the first packets of a
	// flow go through the stack whatever the route).
	l.ctEstablished(t, podFlow(node, 4321))

	t.Run("pod_ingress", func(t *testing.T) {
		put(routeFNotForPods)
		requirePodLeftToStack(t, l, podFrame(l, node, 4321))
		put(0)
		ret, out := l.run(t, l.objs.PodIngress, podFrame(l, node, 4321), l.pod.Attrs().Index)
		if ret != tcActRedirect {
			t.Fatalf("without the flag: verdict %d, want TC_ACT_REDIRECT", ret)
		}
		if dst := encapsulatedTo(t, out); dst != peerIP {
			t.Fatalf("without the flag: encapsulated to %s, want %s", dst, peerIP)
		}
	})
	t.Run("transit", func(t *testing.T) {
		put(routeFNotForPods)
		addMember(t, l)
		setTransit(t, l, true)
		defer setTransit(t, l, false)
		o := transitOpts{outerSrc: memberIP, innerSrc: memberPod, innerDst: node, innerTTL: 63, sport: 1234}
		before := l.counts(t)
		ret, out := l.run(t, l.objs.UnderlayIngress, transitFrame(l, o), l.und.Attrs().Index)
		if ret != tcActRedirect || delta(before, l.counts(t))[metricKey(IsthmusMetricMETRIC_TRANSIT, IsthmusHookHOOK_UNDERLAY_TC)] != 1 {
			t.Fatalf("verdict %d, counters %v; want a transit", ret, delta(before, l.counts(t)))
		}
		if dst := encapsulatedTo(t, out); dst != peerIP {
			t.Fatalf("sent on to %s, want the route's peer %s", dst, peerIP)
		}
	})
}
