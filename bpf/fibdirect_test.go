package bpf

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// cfgFIBDirect is CFG_F_FIB_DIRECT of lib/types.h: the fast path's FIB lookups may ask
// the main table alone first.
const cfgFIBDirect = 1 << 4

// podIfaceNoPeer is POD_IFACE_F_NO_PEER of lib/types.h: a pod interface that is no
// veth end (a bridge).
const podIfaceNoPeer = 1 << 1

var (
	altGW  = netip.MustParseAddr("192.168.1.253") // a second router on und0
	altMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x01, 0xfd}
)

// policyTable is the routing table of the policy rules these tests add.
const policyTable = 150

// addPolicy adds, in the lab's namespace, routes to policyTable and the rule
// `from src lookup policyTable` at priority 100 (before main).
func addPolicy(t *testing.T, l *lab, src netip.Prefix, routes ...netlink.Route) {
	t.Helper()
	err := inNS(l.ns, func() error {
		for _, r := range routes {
			r.Table = policyTable
			if err := netlink.RouteAdd(&r); err != nil {
				return err
			}
		}
		rule := netlink.NewRule()
		rule.Family, rule.Priority, rule.Table = unix.AF_INET, 100, policyTable
		rule.Src = &net.IPNet{IP: src.Addr().AsSlice(), Mask: net.CIDRMask(src.Bits(), 32)}
		return netlink.RuleAdd(rule)
	})
	if err != nil {
		t.Fatalf("add policy routing from %v: %v", src, err)
	}
}

// TestFIBDirectNextHop: with CFG_F_FIB_DIRECT the next hop toward a peer comes from
// the main table alone; without it, the policy rules decide. The agent sets the flag
// only while no rule but the kernel's and its own exists (datapath.DirectFIB), because
// a rule like this test's would be ignored. The frame's destination MAC says which
// router the lookup chose.
func TestFIBDirectNextHop(t *testing.T) {
	l := newLab(t)
	err := inNS(l.ns, func() error {
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.und.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: altGW.AsSlice(), HardwareAddr: altMAC})
	})
	if err != nil {
		t.Fatal(err)
	}
	addPolicy(t, l, netip.PrefixFrom(underlayIP, 32), netlink.Route{
		Dst: &net.IPNet{IP: net.IPv4(192, 168, 2, 0), Mask: net.CIDRMask(24, 32)},
		Gw:  altGW.AsSlice(), LinkIndex: l.und.Attrs().Index})
	l.ctEstablished(t, podFlow(remotePodIP, 1234))
	for _, tc := range []struct {
		name  string
		flags uint32
		want  net.HardwareAddr
	}{
		{"rules walked", 0, altMAC},
		{"main table", cfgFIBDirect, gwMAC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setConfigFlags(t, l, tc.flags)
			ret, out := l.run(t, l.objs.PodIngress, podFrame(l, remotePodIP, 1234), l.pod.Attrs().Index)
			if ret != tcActRedirect || len(out) < 14 {
				t.Fatalf("verdict %d, %d bytes; want the frame encapsulated and redirected", ret, len(out))
			}
			if !bytes.Equal(out[:6], tc.want) {
				t.Errorf("sent to %v, want %v", net.HardwareAddr(out[:6]), tc.want)
			}
		})
	}
}

// TestFIBDirectFallsBack: with CFG_F_FIB_DIRECT, an answer of the main table that is
// not the fast path's expected one is asked again of the whole FIB, so what the rules
// route elsewhere still arrives. The pod's address is routed only by a policy table
// for sources in remoteNet: the main table knows no route to it, the rules do. Both
// the decapsulated packet for the pod and the pod's own packet (its source check)
// must be handled as without the flag.
func TestFIBDirectFallsBack(t *testing.T) {
	l := newLab(t)
	setTunnelIP(t, l, hostIP)
	podRoute := netlink.Route{Dst: &net.IPNet{IP: podIP.AsSlice(), Mask: net.CIDRMask(32, 32)},
		LinkIndex: l.pod.Attrs().Index, Scope: netlink.SCOPE_LINK}
	if err := inNS(l.ns, func() error { return netlink.RouteDel(&podRoute) }); err != nil {
		t.Fatalf("remove the pod's main route: %v", err)
	}
	addPolicy(t, l, remoteNet, podRoute)
	l.ctEstablished(t, podFlow(remotePodIP, 1234))
	for _, flags := range []uint32{0, cfgFIBDirect} {
		setConfigFlags(t, l, flags)
		// Decapsulated UDP for the pod: delivered through isthmus0 into the stack.
		o := goodOpts(podIP)
		before := l.counts(t)
		ret, _ := l.run(t, l.objs.UnderlayIngress, geneveFrame(l, o, innerEth(innerIPv4(o))), l.und.Attrs().Index)
		d := delta(before, l.counts(t))
		if ret != tcActRedirect || d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)] != 1 {
			t.Errorf("flags %#x: decapsulated packet for the pod: verdict %d, counters %v; want delivered", flags, ret, d)
		}
		// The pod's own segment of an established flow: its source passes the check
		// and it is encapsulated at pod_ingress.
		ret, out := l.run(t, l.objs.PodIngress, podFrame(l, remotePodIP, 1234), l.pod.Attrs().Index)
		if ret != tcActRedirect || len(out) < 6 || !bytes.Equal(out[:6], gwMAC) {
			t.Errorf("flags %#x: pod's segment: verdict %d; want encapsulated toward the router", flags, ret)
		}
	}
}

// TestFIBDirectSourceSpoofed: the pod source check refuses the same sources with
// CFG_F_FIB_DIRECT as without (TestPodSourceSpoofed's cases), and still accepts the
// pod's own.
func TestFIBDirectSourceSpoofed(t *testing.T) {
	l := newLab(t)
	setConfigFlags(t, l, cfgFIBDirect)
	for _, src := range []netip.Addr{remotePodIP, netip.MustParseAddr("10.1.0.77"), forgedIP, hostIP} {
		in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(src, remotePodIP, 17, ipOpts{ttl: 64}, udpDatagram(4000, 5000, []byte("spoof"))))
		wantDrop(t, l, l.objs.PodIngress, l.pod.Attrs().Index, in, IsthmusDropReasonDROP_POD_SRC_SPOOFED, IsthmusHookHOOK_POD_INGRESS)
	}
	l.ctEstablished(t, podFlow(remotePodIP, 1234))
	if ret, _ := l.run(t, l.objs.PodIngress, podFrame(l, remotePodIP, 1234), l.pod.Attrs().Index); ret != tcActRedirect {
		t.Fatalf("own source: verdict %d, want TC_ACT_REDIRECT", ret)
	}
}

// TestFIBDirectBridgeOwnAddress: a bridge among the pod interfaces (cni0 of the
// bridge plugin or flannel, POD_IFACE_F_NO_PEER) holds the node's own address in the
// subnet it routes, often the tunnel address too (the first of the node's podCIDR).
// The main table alone answers that address with the bridge, where the whole FIB
// answers "local": so with CFG_F_FIB_DIRECT a frame for the tunnel address went to
// the bridge and on to a pod, and a pod behind the bridge could send from the
// node's address (seen in the conformance suite on seed003cni: the API server's
// connections from a gateway of the bridge site to a remote pod hung). Both must be
// as without the flag: delivered to the host, refused as spoofed.
func TestFIBDirectBridgeOwnAddress(t *testing.T) {
	l := newLab(t)
	bridgeIP := netip.MustParseAddr("10.1.0.1")
	err := inNS(l.ns, func() error {
		a, err := netlink.ParseAddr(bridgeIP.String() + "/24")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l.pod, a)
	})
	if err != nil {
		t.Fatalf("give the bridge stand-in its address: %v", err)
	}
	if err := l.objs.PodIfaces.Put(uint32(l.pod.Attrs().Index), IsthmusPodIfaceValue{Flags: podIfaceNoPeer}); err != nil {
		t.Fatal(err)
	}
	setTunnelIP(t, l, bridgeIP)
	// A rule of isthmus' kind (sources of remote pod blocks, a table of its own): with
	// any rule besides the kernel's, the kernel keeps the local table apart from main.
	addPolicy(t, l, netip.MustParsePrefix("10.200.0.0/24"), netlink.Route{
		Dst: &net.IPNet{IP: net.IPv4(10, 201, 0, 0), Mask: net.CIDRMask(24, 32)}, LinkIndex: l.ist.Attrs().Index})
	for _, flags := range []uint32{0, cfgFIBDirect} {
		setConfigFlags(t, l, flags)
		o := goodOpts(bridgeIP)
		before := l.counts(t)
		ret, _ := l.run(t, l.objs.UnderlayIngress, geneveFrame(l, o, innerEth(innerIPv4(o))), l.und.Attrs().Index)
		d := delta(before, l.counts(t))
		if ret != tcActRedirect || d[metricKey(IsthmusMetricMETRIC_DELIVER_HOST, IsthmusHookHOOK_UNDERLAY_TC)] != 1 ||
			d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)] != 0 {
			t.Errorf("flags %#x: frame for the tunnel address: verdict %d, counters %v; want delivered to the host", flags, ret, d)
		}
		in := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4Packet(bridgeIP, remotePodIP, 17, ipOpts{ttl: 64}, udpDatagram(4000, 5000, []byte("spoof"))))
		wantDrop(t, l, l.objs.PodIngress, l.pod.Attrs().Index, in, IsthmusDropReasonDROP_POD_SRC_SPOOFED, IsthmusHookHOOK_POD_INGRESS)
	}
}
