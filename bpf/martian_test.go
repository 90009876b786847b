package bpf

import (
	"net/netip"
	"testing"
)

// TestDecapInnerMartian: a frame from a known peer whose inner source no peer may ever
// use (0/8, 127/8, 224/4, 240/4 with 255.255.255.255, this node's own underlay and
// tunnel addresses) is DROP_INNER_MARTIAN at TC and at XDP, even when peer_sources
// lets that peer send from anywhere (a gateway's peer routing 0.0.0.0/0). An ordinary
// source under the same 0.0.0.0/0 entry is still delivered, so the drops are the
// martian test's and not the lookup's.
func TestDecapInnerMartian(t *testing.T) {
	l := newLab(t)
	tunnelIP := netip.MustParseAddr("10.99.0.9")
	setTunnelIP(t, l, tunnelIP)
	anywhere := IsthmusPeerSourceKey{Prefixlen: 32, Peer: be32(peerIP)}
	if err := l.objs.PeerSources.Put(anywhere, IsthmusPeerSourceValue{}); err != nil {
		t.Fatalf("put peer source 0.0.0.0/0: %v", err)
	}
	hooks := []struct {
		name     string
		hook     IsthmusHook
		drop, ok uint32
		ifindex  int
		xdp      bool
	}{
		{"tc", IsthmusHookHOOK_UNDERLAY_TC, tcActShot, tcActRedirect, l.und.Attrs().Index, false},
		{"xdp", IsthmusHookHOOK_UNDERLAY_XDP, xdpDrop, xdpPass, 0, true},
	}
	for _, src := range []string{"0.0.0.0", "0.1.2.3", "127.0.0.1", "127.255.255.254", "224.0.0.1",
		"239.255.255.250", "240.0.0.1", "255.255.255.255", underlayIP.String(), tunnelIP.String()} {
		o := goodOpts(podIP)
		o.innerSrc = netip.MustParseAddr(src)
		in := geneveFrame(l, o, innerEth(innerIPv4(o)))
		for _, h := range hooks {
			t.Run(h.name+"/"+src, func(t *testing.T) {
				prog := l.objs.UnderlayIngress
				if h.xdp {
					prog = l.objs.UnderlayXdp
				}
				before := l.counts(t)
				ret, _ := l.run(t, prog, in, h.ifindex)
				d := delta(before, l.counts(t))
				if ret != h.drop {
					t.Fatalf("verdict %d, want drop %d", ret, h.drop)
				}
				if k := dropKey(IsthmusDropReasonDROP_INNER_MARTIAN, h.hook); d[k] != 1 || len(d) != 1 {
					t.Errorf("counters moved %v, want only %v +1", d, k)
				}
			})
		}
	}
	// The control: a source that is no martian, allowed by the same entry.
	o := goodOpts(podIP)
	o.innerSrc = netip.MustParseAddr("8.8.8.8")
	in := geneveFrame(l, o, innerEth(innerIPv4(o)))
	for _, h := range hooks {
		prog := l.objs.UnderlayIngress
		if h.xdp {
			prog = l.objs.UnderlayXdp
		}
		before := l.counts(t)
		ret, _ := l.run(t, prog, in, h.ifindex)
		d := delta(before, l.counts(t))
		if ret != h.ok || d[metricKey(IsthmusMetricMETRIC_DECAP, h.hook)] != 1 {
			t.Errorf("%s: 8.8.8.8 under 0.0.0.0/0: verdict %d counters %v, want %d and METRIC_DECAP", h.name, ret, d, h.ok)
		}
	}
}
