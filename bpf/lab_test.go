package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Addresses of the throwaway network namespace every program test runs in.
var (
	underlayIP  = netip.MustParseAddr("192.168.1.1") // this node, on und0
	underlayGW  = netip.MustParseAddr("192.168.1.254")
	peerIP      = netip.MustParseAddr("192.168.2.2") // a peer behind underlayGW
	strangerIP  = netip.MustParseAddr("192.168.2.9") // routed, but not a peer
	gwMAC       = net.HardwareAddr{0x02, 0, 0, 0, 0x01, 0xfe}
	podIP       = netip.MustParseAddr("10.1.0.5") // local pod behind pod0h
	podMAC      = net.HardwareAddr{0x02, 0, 0, 0, 0x0a, 0x05}
	hostIP      = netip.MustParseAddr("10.99.0.1") // local address on ist0
	remotePodIP = netip.MustParseAddr("10.2.0.7")  // in 10.2.0.0/24, owned by peerIP
	remoteNet   = netip.MustParsePrefix("10.2.0.0/24")
	deniedIP    = netip.MustParseAddr("10.3.0.7") // a source peerIP may not use
	testVNI     = uint32(0x123456)
	tunnelMTU   = uint16(1450)
)

// overlayMark is OVERLAY_MARK of lib/stack.h: the mark of pod packets the programs
// hand to the stack.
const overlayMark = 0x1000

// lab is a network namespace with the interfaces, routes and neighbours the programs
// look up, and the loaded objects with maps filled for it.
type lab struct {
	ns      netns.NsHandle
	objs    IsthmusObjects
	und     netlink.Link // underlay device
	pod     netlink.Link // host side of a pod veth, in pod_ifaces
	ist     netlink.Link // stands in for isthmus0
	undMAC  net.HardwareAddr
	podHMAC net.HardwareAddr
	istMAC  net.HardwareAddr
	mark    uint32 // skb->mark after the last skb run
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("BPF program tests need root (BPF_PROG_TEST_RUN, network namespaces): run go test as root")
	}
}

// inNS runs fn on a thread switched into ns and switches back afterwards.
func inNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("get netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("enter netns: %w", err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("restore netns: %v", err)) // the thread is unusable
		}
	}()
	return fn()
}

func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// newLab builds the namespace and loads the objects; everything is removed in Cleanup.
func newLab(t testing.TB) *lab {
	t.Helper()
	return newLabSpec(t, nil)
}

// newLabSpec is newLab with edit, if not nil, applied to the spec before loading (to
// shrink a map, say).
func newLabSpec(t testing.TB, edit func(*ebpf.CollectionSpec)) *lab {
	t.Helper()
	requireRoot(t)
	l := &lab{}

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get netns: %v", err)
	}
	l.ns, err = netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatalf("create netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("restore netns: %v", err))
	}
	orig.Close()
	runtime.UnlockOSThread()
	t.Cleanup(func() { l.ns.Close() }) // the last handle: the kernel removes the namespace

	if err := inNS(l.ns, l.configure); err != nil {
		t.Fatalf("configure lab netns: %v", err)
	}

	spec, err := LoadIsthmus()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone // tests must not touch bpffs
	}
	if edit != nil {
		edit(spec)
	}
	if err := spec.LoadAndAssign(&l.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load objects: %+v", ve)
		}
		t.Fatalf("load objects: %v", err)
	}
	t.Cleanup(func() { l.objs.Close() })
	l.fillMaps(t)
	return l
}

func (l *lab) configure() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	mkveth := func(name, peer string) (netlink.Link, error) {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
		if err := netlink.LinkAdd(v); err != nil {
			return nil, fmt.Errorf("add veth %s: %w", name, err)
		}
		for _, n := range []string{name, peer} {
			link, err := netlink.LinkByName(n)
			if err != nil {
				return nil, fmt.Errorf("find %s: %w", n, err)
			}
			if err := netlink.LinkSetUp(link); err != nil {
				return nil, fmt.Errorf("set %s up: %w", n, err)
			}
		}
		return netlink.LinkByName(name)
	}
	if l.und, err = mkveth("und0", "und1"); err != nil {
		return err
	}
	if l.pod, err = mkveth("pod0h", "pod0c"); err != nil {
		return err
	}
	if l.ist, err = mkveth("ist0", "ist0p"); err != nil {
		return err
	}
	l.undMAC = l.und.Attrs().HardwareAddr
	l.podHMAC = l.pod.Attrs().HardwareAddr
	l.istMAC = l.ist.Attrs().HardwareAddr

	addr := func(link netlink.Link, p string) error {
		a, err := netlink.ParseAddr(p)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(link, a); err != nil {
			return fmt.Errorf("add address %s: %w", p, err)
		}
		return nil
	}
	if err := addr(l.und, underlayIP.String()+"/24"); err != nil {
		return err
	}
	if err := addr(l.ist, hostIP.String()+"/32"); err != nil {
		return err
	}
	neigh := func(link netlink.Link, ip netip.Addr, mac net.HardwareAddr) error {
		n := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
		if err := netlink.NeighAdd(n); err != nil {
			return fmt.Errorf("add neighbour %s: %w", ip, err)
		}
		return nil
	}
	if err := neigh(l.und, underlayGW, gwMAC); err != nil {
		return err
	}
	if err := neigh(l.pod, podIP, podMAC); err != nil {
		return err
	}
	routes := []netlink.Route{
		{Dst: &net.IPNet{IP: net.IPv4(192, 168, 2, 0), Mask: net.CIDRMask(24, 32)},
			Gw: underlayGW.AsSlice(), LinkIndex: l.und.Attrs().Index},
		{Dst: &net.IPNet{IP: podIP.AsSlice(), Mask: net.CIDRMask(32, 32)},
			LinkIndex: l.pod.Attrs().Index, Scope: netlink.SCOPE_LINK},
	}
	for _, r := range routes {
		if err := netlink.RouteAdd(&r); err != nil {
			return fmt.Errorf("add route %s: %w", r.Dst, err)
		}
	}
	for _, f := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv4/conf/default/forwarding"} {
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding: %w", err)
		}
	}
	return nil
}

func (l *lab) fillMaps(t testing.TB) {
	t.Helper()
	cfg := IsthmusDatapathConfig{
		Vni:             testVNI,
		UnderlayIp:      be32(underlayIP),
		UnderlayIfindex: uint32(l.und.Attrs().Index),
		OverlayIfindex:  uint32(l.ist.Attrs().Index),
		TunnelMtu:       tunnelMTU,
	}
	copy(cfg.OverlayMac[:], l.istMAC)
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("put config", l.objs.Config.Put(uint32(0), cfg))
	must("put route", l.objs.Routes.Put(IsthmusRouteKey{Prefixlen: uint32(remoteNet.Bits()), Addr: be32(remoteNet.Addr())},
		IsthmusRouteValue{Peer: be32(peerIP)}))
	must("put peer", l.objs.Peers.Put(be32(peerIP), IsthmusPeerValue{}))
	must("put peer source", l.objs.PeerSources.Put(IsthmusPeerSourceKey{Prefixlen: 32 + 24, Peer: be32(peerIP), Src: be32(remoteNet.Addr())},
		IsthmusPeerSourceValue{}))
	must("put pod iface", l.objs.PodIfaces.Put(uint32(l.pod.Attrs().Index), IsthmusPodIfaceValue{}))
}

// skbCtx is the head of struct __sk_buff up to ifindex, the part a test run may set.
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTci, VlanProto uint32
	Priority, IngressIfindex, Ifindex                                           uint32
}

// run runs prog on a copy of in inside the lab namespace (bpf_fib_lookup uses the
// caller's namespace). ifindex is the interface the skb pretends to arrive on (0 for XDP);
// for an skb run, l.mark is then the skb's mark after it.
func (l *lab) run(t testing.TB, prog *ebpf.Program, in []byte, ifindex int) (uint32, []byte) {
	t.Helper()
	var ctx any
	if ifindex != 0 {
		ctx = skbCtx{Ifindex: uint32(ifindex)}
	}
	return l.runCtx(t, prog, in, ctx)
}

// runCtx is run with the context ctx (nil: none) as the program's input context.
func (l *lab) runCtx(t testing.TB, prog *ebpf.Program, in []byte, ctx any) (uint32, []byte) {
	t.Helper()
	var (
		ret uint32
		out = make([]byte, len(in)+512)
	)
	err := inNS(l.ns, func() error {
		opts := &ebpf.RunOptions{Data: in, DataOut: out, Context: ctx}
		// The kernel refuses a context out shorter than its whole __sk_buff.
		var ctxOut [256]byte
		switch c := ctx.(type) {
		case skbCtx:
			opts.ContextOut = &ctxOut
		case []byte: // a whole __sk_buff (runGSO)
			if len(c) >= 192 {
				opts.ContextOut = &ctxOut
			}
		}
		var err error
		ret, err = prog.Run(opts)
		out = opts.DataOut
		l.mark = binary.NativeEndian.Uint32(ctxOut[8:]) // __sk_buff.mark (0 without an skb context)
		return err
	})
	if err != nil {
		t.Fatalf("run %s: %v", prog, err)
	}
	return ret, out
}

// counts returns packets per (code, hook) summed over CPUs, for every slot of the
// metrics array that counted any.
func (l *lab) counts(t testing.TB) map[IsthmusMetricsKey]uint64 {
	t.Helper()
	res := map[IsthmusMetricsKey]uint64{}
	for i, n := range slotPackets(t, l.objs.Metrics) {
		if n != 0 {
			res[metricsKeyOfSlot(i)] = n
		}
	}
	return res
}

// slotPackets returns the packets of every slot of the per-CPU array m (metrics),
// summed over CPUs, read in batches: the oracle reads the counters around every
// input, and an entry-by-entry walk of the 2,049 slots made a fuzz target run 30
// inputs a second instead of thousands.
func slotPackets(t testing.TB, m *ebpf.Map) map[uint32]uint64 {
	t.Helper()
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatalf("possible CPUs: %v", err)
	}
	n := int(m.MaxEntries())
	keys, vals := make([]uint32, n), make([]IsthmusMetricsValue, n*ncpu)
	res := map[uint32]uint64{}
	var cursor ebpf.MapBatchCursor
	for {
		got, err := m.BatchLookup(&cursor, keys, vals, nil)
		for j := range got {
			var sum uint64
			for _, v := range vals[j*ncpu : (j+1)*ncpu] {
				sum += v.Packets
			}
			if sum != 0 {
				res[keys[j]] = sum
			}
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist), err == nil && got == 0:
			return res
		case err != nil:
			t.Fatalf("read %s: %v", m, err)
		}
	}
}

// metricsKeyOfSlot returns what slot i of the metrics array counts (enum
// metric_slots): slot hook * METRIC_CODES + code.
func metricsKeyOfSlot(i uint32) IsthmusMetricsKey {
	codes := uint32(IsthmusMetricSlotsMETRIC_CODES)
	return IsthmusMetricsKey{Code: uint16(i % codes), Hook: uint8(i / codes)}
}

// perCPUPackets returns the packets of every entry of m, a per-CPU map of
// metrics_value with keys K, summed over CPUs.
func perCPUPackets[K comparable](t testing.TB, m *ebpf.Map) map[K]uint64 {
	t.Helper()
	res := map[K]uint64{}
	var (
		k  K
		vs []IsthmusMetricsValue
	)
	it := m.Iterate()
	for it.Next(&k, &vs) {
		for _, v := range vs {
			res[k] += v.Packets
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("iterate %s: %v", m, err)
	}
	return res
}

// delta returns the counters that changed between two snapshots.
func delta(before, after map[IsthmusMetricsKey]uint64) map[IsthmusMetricsKey]uint64 {
	d := map[IsthmusMetricsKey]uint64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

func dropKey(r IsthmusDropReason, h IsthmusHook) IsthmusMetricsKey {
	return IsthmusMetricsKey{Code: uint16(-int32(r)), Hook: uint8(h)}
}

func metricKey(m IsthmusMetric, h IsthmusHook) IsthmusMetricsKey {
	return IsthmusMetricsKey{Code: uint16(m), Hook: uint8(h)}
}

// wantXDPPassWhole runs underlay_xdp on in and fails unless it passes the frame
// untouched, without metadata and uncounted: underlay_ingress handles it (transit,
// a health probe).
func (l *lab) wantXDPPassWhole(t *testing.T, what string, in []byte) {
	t.Helper()
	before := l.counts(t)
	ret, out := l.run(t, l.objs.UnderlayXdp, in, 0)
	if ret != xdpPass || !bytes.Equal(out, in) {
		t.Fatalf("%s: XDP verdict %d, changed %v; want XDP_PASS, untouched (no metadata)", what, ret, !bytes.Equal(out, in))
	}
	if d := delta(before, l.counts(t)); len(d) != 0 {
		t.Fatalf("%s: XDP counted %v, want nothing", what, d)
	}
}

// podSend runs a pod's frame in through the node as the kernel would: pod_ingress,
// and when that leaves it to the stack (a packet the stack must see,
// docs/architecture.md "Netfilter": untouched and marked, else the test fails), the
// stack's forwarding into isthmus0 (stackForwarded) and overlay_egress. Returns the
// last program's verdict and output, the frame that program ran on, and its hook.
func (l *lab) podSend(t testing.TB, in []byte) (uint32, []byte, []byte, IsthmusHook) {
	t.Helper()
	ret, out := l.run(t, l.objs.PodIngress, in, l.pod.Attrs().Index)
	if ret != tcActOK {
		return ret, out, in, IsthmusHookHOOK_POD_INGRESS
	}
	if l.mark&overlayMark == 0 || !bytes.Equal(out, in) {
		t.Fatalf("pod_ingress passed the frame to the stack with mark %#x (want %#x), changed %v", l.mark, overlayMark, !bytes.Equal(out, in))
	}
	fwd := stackForwarded(l, in)
	ret, out = l.run(t, l.objs.OverlayEgress, fwd, l.ist.Attrs().Index)
	return ret, out, fwd, IsthmusHookHOOK_OVERLAY_EGRESS
}

// stackForwarded is the frame the stack sends on isthmus0 when it forwards the IPv4
// packet of frame in there: TTL decremented, header checksum updated, and both MAC
// addresses isthmus0's own (the device has ARP off: its neighbours resolve to its own
// address).
func stackForwarded(l *lab, in []byte) []byte {
	ip := append([]byte{}, in[14:]...)
	hlen := int(ip[0]&0x0f) * 4
	ip[8]--
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:], csum16(ip[:hlen]))
	return ethFrame(l.istMAC, l.istMAC, 0x0800, ip)
}
