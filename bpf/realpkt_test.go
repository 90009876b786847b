package bpf

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Real-packet tests of decapsulation: GENEVE frames written into a tap device in the
// lab namespace reach underlay_ingress (attached with tcx) as the kernel builds them,
// not as BPF_PROG_TEST_RUN does (which always makes the whole packet linear and has
// no GSO segmentation, forwarding or ICMP). The tap is opened with IFF_NAPI_FRAGS:
// the first iovec of each write becomes the skb's linear part and the rest page
// fragments, as a NIC driver that builds skbs with napi_gro_frags leaves them (GRO
// pulls only the outer Ethernet, IPv4 and UDP headers: no GRO handler knows GENEVE
// without a geneve device). The verdicts come from the kernel itself: a pod in its own
// namespace receives the packet on a raw socket or does not, an iptables rule in the
// node's FORWARD chain counts what the stack forwarded, the ICMP error the node's stack
// sends is captured on isthmus0's stand-in and decoded with gopacket.

var (
	realPodIP  = netip.MustParseAddr("10.1.0.6") // a pod in its own namespace, behind pod2h
	realPodMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x0a, 0x06}
)

// realLab is the lab with a tap for the underlay and a pod in a namespace of its own.
type realLab struct {
	*lab
	tap   int          // the tap's file descriptor: writes are frames arriving on it
	tapLk netlink.Link // the tap device
	podNS netns.NsHandle
	podH  netlink.Link // the pod's host-side veth, in pod_ifaces
}

// newNetns returns a new network namespace, closed (and so removed) in Cleanup.
func newNetns(t *testing.T) netns.NsHandle {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("get netns: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("restore netns: %v", err))
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// newRealLab builds a realLab whose pod interface has MTU podMTU, with underlay_ingress
// attached to the tap's tcx ingress and a route for the remote pods into isthmus0's
// stand-in (so the stack can answer them).
func newRealLab(t *testing.T, podMTU int) *realLab {
	t.Helper()
	r := &realLab{lab: newLab(t), podNS: newNetns(t)}
	var attached link.Link
	err := inNS(r.ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		r.tap = fd
		ifr, err := unix.NewIfreq("tap0")
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_NAPI | unix.IFF_NAPI_FRAGS)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("create tap with IFF_NAPI_FRAGS: %w", err)
		}
		if r.tapLk, err = netlink.LinkByName("tap0"); err != nil {
			return fmt.Errorf("find tap0: %w", err)
		}
		if err := netlink.LinkSetUp(r.tapLk); err != nil {
			return fmt.Errorf("set tap0 up: %w", err)
		}
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pod2h", MTU: podMTU}, PeerName: "pod2c", PeerHardwareAddr: realPodMAC}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("add veth pod2h: %w", err)
		}
		if r.podH, err = netlink.LinkByName("pod2h"); err != nil {
			return fmt.Errorf("find pod2h: %w", err)
		}
		peer, err := netlink.LinkByName("pod2c")
		if err != nil {
			return fmt.Errorf("find pod2c: %w", err)
		}
		if err := netlink.LinkSetMTU(peer, podMTU); err != nil {
			return fmt.Errorf("set pod2c MTU: %w", err)
		}
		if err := netlink.LinkSetNsFd(peer, int(r.podNS)); err != nil {
			return fmt.Errorf("move pod2c: %w", err)
		}
		if err := netlink.LinkSetUp(r.podH); err != nil {
			return fmt.Errorf("set pod2h up: %w", err)
		}
		routes := []netlink.Route{
			{Dst: &net.IPNet{IP: realPodIP.AsSlice(), Mask: net.CIDRMask(32, 32)}, LinkIndex: r.podH.Attrs().Index, Scope: netlink.SCOPE_LINK},
			{Dst: &net.IPNet{IP: remoteNet.Addr().AsSlice(), Mask: net.CIDRMask(remoteNet.Bits(), 32)}, LinkIndex: r.ist.Attrs().Index, Scope: netlink.SCOPE_LINK},
		}
		for _, rt := range routes {
			if err := netlink.RouteAdd(&rt); err != nil {
				return fmt.Errorf("add route %s: %w", rt.Dst, err)
			}
		}
		n := &netlink.Neigh{LinkIndex: r.podH.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: realPodIP.AsSlice(), HardwareAddr: realPodMAC}
		if err := netlink.NeighAdd(n); err != nil {
			return fmt.Errorf("add neighbour %s: %w", realPodIP, err)
		}
		// The stack's answers to the remote pods leave through ist0 (ARP off there,
		// as on isthmus0): its own address for every neighbour.
		nr := &netlink.Neigh{LinkIndex: r.ist.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: remotePodIP.AsSlice(), HardwareAddr: r.istMAC}
		if err := netlink.NeighAdd(nr); err != nil {
			return fmt.Errorf("add neighbour %s: %w", remotePodIP, err)
		}
		attached, err = link.AttachTCX(link.TCXOptions{Interface: r.tapLk.Attrs().Index, Program: r.objs.UnderlayIngress, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("attach underlay_ingress to tap0: %w", err)
		}
		return nil
	})
	if r.tap > 0 {
		t.Cleanup(func() { unix.Close(r.tap) })
	}
	if attached != nil {
		t.Cleanup(func() { attached.Close() })
	}
	if err != nil {
		t.Fatalf("real-packet lab: %v", err)
	}
	err = inNS(r.podNS, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		eth, err := netlink.LinkByName("pod2c")
		if err != nil {
			return fmt.Errorf("find pod2c: %w", err)
		}
		a, _ := netlink.ParseAddr(realPodIP.String() + "/32")
		if err := netlink.AddrAdd(eth, a); err != nil {
			return fmt.Errorf("add pod address: %w", err)
		}
		return netlink.LinkSetUp(eth)
	})
	if err != nil {
		t.Fatalf("pod namespace: %v", err)
	}
	if err := r.objs.PodIfaces.Put(uint32(r.podH.Attrs().Index), IsthmusPodIfaceValue{}); err != nil {
		t.Fatalf("put pod iface: %v", err)
	}
	return r
}

// write sends frame into the tap (as arriving from the wire), its first linear bytes
// in the skb's linear part and the rest in page fragments (linear 0: all linear).
func (r *realLab) write(t *testing.T, frame []byte, linear int) {
	t.Helper()
	iov := [][]byte{frame}
	if linear > 0 && linear < len(frame) {
		iov = [][]byte{frame[:linear], frame[linear:]}
	}
	if _, err := unix.Writev(r.tap, iov); err != nil {
		t.Fatalf("write frame into tap0: %v", err)
	}
}

// frame is a GENEVE frame from peerIP to this node carrying the IPv4 packet inner,
// addressed to the tap.
func (r *realLab) frame(inner []byte) []byte {
	f := geneveFrame(r.lab, goodOpts(realPodIP), innerEth(inner))
	copy(f[:6], r.tapLk.Attrs().HardwareAddr)
	return f
}

// rawSocket opens, in ns, a raw IPv4 socket for protocol proto: it receives a copy of
// every such packet the namespace's stack takes in, headers included.
func rawSocket(t *testing.T, ns netns.NsHandle, proto int) int {
	t.Helper()
	var fd int
	err := inNS(ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		return err
	})
	if err != nil {
		t.Fatalf("open raw socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.Timeval{Usec: 300000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatalf("set receive timeout: %v", err)
	}
	return fd
}

// received returns the IPv4 packets fd receives from src until it has been quiet for
// its timeout.
func received(fd int, src netip.Addr) [][]byte {
	var pkts [][]byte
	buf := make([]byte, 65536)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil {
			return pkts
		}
		if n >= 20 && bytes.Equal(buf[12:16], src.AsSlice()) {
			pkts = append(pkts, append([]byte{}, buf[:n]...))
		}
	}
}

// packetSocket opens, in ns, a packet socket bound to device ifindex: it sees every
// frame the device sends.
func packetSocket(t *testing.T, ns netns.NsHandle, ifindex int) int {
	t.Helper()
	proto := int(htons(unix.ETH_P_ALL))
	var fd int
	err := inNS(ns, func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifindex})
	})
	if err != nil {
		t.Fatalf("open packet socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.Timeval{Usec: 300000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatalf("set receive timeout: %v", err)
	}
	return fd
}

// nsCmd runs name with args in the lab's namespace and returns its output.
func (r *realLab) nsCmd(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{fmt.Sprintf("--net=/proc/%d/fd/%d", os.Getpid(), int(r.ns)), name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

// forwardDrops returns the packet count of the FORWARD rule whose comment is tag.
func (r *realLab) forwardDrops(t *testing.T, tag string) int {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(r.nsCmd(t, "iptables", "-w", "-L", "FORWARD", "-v", "-x", "-n")))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 2 && strings.Contains(sc.Text(), tag) {
			n, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatalf("parse iptables counter %q: %v", sc.Text(), err)
			}
			return n
		}
	}
	t.Fatalf("no FORWARD rule %q", tag)
	return 0
}

// TestDecapNonlinearHeaders: a GENEVE frame whose skb holds only the outer Ethernet,
// IPv4 and UDP headers in its linear part (the rest in page fragments) is decapsulated
// and judged as a linear one is: a TCP SYN reaches the node's FORWARD chain (where the
// site's policy drops it) instead of going around it into the pod because its flags
// were out of reach, and an inner packet with IPv4 options is delivered instead of
// dropped as DROP_INNER_INVALID. The linear control shows the harness sees the rule.
func TestDecapNonlinearHeaders(t *testing.T) {
	r := newRealLab(t, 1450)
	const tag = "isthmus-test-policy"
	r.nsCmd(t, "iptables", "-w", "-A", "FORWARD", "-d", realPodIP.String(), "-p", "tcp", "--syn", "-m", "comment", "--comment", tag, "-j", "DROP")
	tcpRaw := rawSocket(t, r.podNS, unix.IPPROTO_TCP)
	udpRaw := rawSocket(t, r.podNS, unix.IPPROTO_UDP)
	syn := ipv4Packet(remotePodIP, realPodIP, 6, ipOpts{ttl: 64, fragOff: 0x4000}, tcpWithOptions(remotePodIP, realPodIP, 40000, 80, tcpSYN, nil))
	outerHdrs := 14 + 20 + 8 // what GRO leaves linear

	for _, tc := range []struct {
		name   string
		linear int
	}{{"linear", 0}, {"outer headers linear", outerHdrs}, {"up to the inner IPv4 header", outerHdrs + 8 + 14 + 20}} {
		t.Run("SYN/"+tc.name, func(t *testing.T) {
			before, counts := r.forwardDrops(t, tag), r.counts(t)
			r.write(t, r.frame(syn), tc.linear)
			if got := received(tcpRaw, remotePodIP); len(got) != 0 {
				t.Errorf("the pod received %d SYN(s) past the FORWARD policy", len(got))
			}
			if n := r.forwardDrops(t, tag) - before; n != 1 {
				t.Errorf("FORWARD policy dropped %d SYNs, want 1 (the SYN must pass the stack)", n)
			}
			d := delta(counts, r.counts(t))
			if d[metricKey(IsthmusMetricMETRIC_DECAP, IsthmusHookHOOK_UNDERLAY_TC)] != 1 || d[metricKey(IsthmusMetricMETRIC_DELIVER_POD, IsthmusHookHOOK_UNDERLAY_TC)] != 1 {
				t.Errorf("counters moved %v, want METRIC_DECAP and METRIC_DELIVER_POD", d)
			}
		})
	}

	// scapy: IP(src="10.2.0.7", dst="10.1.0.6", options=[IPOption_NOP()]*3 + [IPOption_EOL()])/UDP(sport=4000, dport=5000)/b"payload"
	opts := withIPOptions(ipv4Packet(remotePodIP, realPodIP, 17, ipOpts{ttl: 64}, udpDatagram(4000, 5000, []byte("payload"))), []byte{1, 1, 1, 0})
	for _, tc := range []struct {
		name   string
		linear int
	}{{"linear", 0}, {"outer headers linear", outerHdrs}, {"up to the fixed inner IPv4 header", outerHdrs + 8 + 14 + 20}} {
		t.Run("IPv4 options/"+tc.name, func(t *testing.T) {
			counts := r.counts(t)
			r.write(t, r.frame(opts), tc.linear)
			got := received(udpRaw, remotePodIP)
			if len(got) != 1 {
				t.Errorf("the pod received %d datagrams, want 1", len(got))
			}
			for _, p := range got {
				pkt := gopacket.NewPacket(p, layers.LayerTypeIPv4, gopacket.Default)
				ip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
				if ip == nil || udp == nil || ip.IHL != 6 || string(udp.Payload) != "payload" {
					t.Errorf("the pod received %x, want the datagram with its options", p)
				}
			}
			if d := delta(counts, r.counts(t)); d[dropKey(IsthmusDropReasonDROP_INNER_INVALID, IsthmusHookHOOK_UNDERLAY_TC)] != 0 {
				t.Errorf("counters moved %v: dropped as DROP_INNER_INVALID", d)
			}
		})
	}
}

// TestDecapOverPodMTU: a decapsulated packet longer than the pod interface's MTU (here
// 1400, the tunnel's 1450) goes to the node's stack, which answers a DF packet with ICMP
// frag needed announcing the pod's MTU to the sender (back toward the tunnel, through
// isthmus0's stand-in, where it is captured and decoded with gopacket) and fragments
// one without DF, which the pod reassembles. One that fits reaches the pod whole and
// draws no ICMP. Before, both long packets were dropped (DROP_NOT_LOCAL) and path MTU
// discovery toward the pod black-holed.
func TestDecapOverPodMTU(t *testing.T) {
	const podMTU = 1400
	r := newRealLab(t, podMTU)
	udpRaw := rawSocket(t, r.podNS, unix.IPPROTO_UDP)
	ist := packetSocket(t, r.ns, r.ist.Attrs().Index)
	for _, tc := range []struct {
		name     string
		len      int // of the inner IPv4 packet
		df       bool
		wantPod  int // datagrams the pod receives
		wantICMP bool
	}{
		{"DF, 1450 bytes", 1450, true, 0, true},
		{"no DF, 1450 bytes", 1450, false, 1, false},
		{"DF, 1400 bytes", 1400, true, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ipOpts{ttl: 64, id: 0x4242}
			if tc.df {
				o.fragOff = 0x4000
			}
			inner := ipv4Packet(remotePodIP, realPodIP, 17, o, udpDatagram(4000, 5000, bytes.Repeat([]byte{0xab}, tc.len-28)))
			counts := r.counts(t)
			r.write(t, r.frame(inner), 0)
			got := received(udpRaw, remotePodIP)
			if len(got) != tc.wantPod {
				t.Errorf("the pod received %d datagrams, want %d", len(got), tc.wantPod)
			}
			for _, p := range got {
				if len(p) != tc.len {
					t.Errorf("the pod received %d bytes, want %d (reassembled)", len(p), tc.len)
				}
			}
			icmp, quoted := icmpTo(ist, remotePodIP)
			if !tc.wantICMP {
				if len(icmp) != 0 {
					t.Errorf("the node sent %d ICMP messages to the sender, want none", len(icmp))
				}
				if d := delta(counts, r.counts(t)); d[dropKey(IsthmusDropReasonDROP_NOT_LOCAL, IsthmusHookHOOK_UNDERLAY_TC)] != 0 {
					t.Errorf("counters moved %v: dropped as DROP_NOT_LOCAL", d)
				}
				return
			}
			if len(icmp) != 1 {
				t.Fatalf("the node sent %d ICMP messages to the sender, want 1 frag needed (counters moved %v)", len(icmp), delta(counts, r.counts(t)))
			}
			ic := icmp[0]
			if ic.TypeCode != layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded) {
				t.Errorf("ICMP %v, want destination unreachable / fragmentation needed", ic.TypeCode)
			}
			if mtu := ic.Seq; mtu != podMTU { // gopacket reads the next-hop MTU word as Seq
				t.Errorf("next-hop MTU %d, want the pod's %d", mtu, podMTU)
			}
			if q := quoted[0]; q == nil || !q.DstIP.Equal(realPodIP.AsSlice()) || q.Id != 0x4242 || q.Length != uint16(tc.len) {
				t.Errorf("the ICMP quotes %v, want the refused packet's header (to %v, id 0x4242, length %d)", q, realPodIP, tc.len)
			}
		})
	}

	// A GSO packet whose segments (40 bytes of headers and 1400 of payload) are longer
	// than the pod's MTU, as a veth or a virtio NIC delivers a TCP stream's frames: the
	// stack answers frag needed, the pod gets nothing over its MTU, even for a TCP
	// ACK that could otherwise take the direct path.
	t.Run("GSO, segments of 1440 bytes", func(t *testing.T) {
		tap, _ := vnetTap(t, r.lab, "tapv1")
		tcpRaw := rawSocket(t, r.podNS, unix.IPPROTO_TCP)
		// scapy: <GENEVE frame from peerIP>/IP(src="10.2.0.7", dst="10.1.0.6", flags="DF", id=0x4343)/TCP(sport=4000, dport=5000, flags="A")/(b"\x00"*2800)
		inner := ipv4Packet(remotePodIP, realPodIP, 6, ipOpts{ttl: 64, fragOff: 0x4000, id: 0x4343}, tcpWithOptions(remotePodIP, realPodIP, 4000, 5000, tcpACK, nil))
		inner = ipv4Packet(remotePodIP, realPodIP, 6, ipOpts{ttl: 64, fragOff: 0x4000, id: 0x4343}, append(inner[20:], make([]byte, 2800)...))
		counts := r.counts(t)
		if _, err := unix.Write(tap, append(vnetTunnelHdr(1400), r.frame(inner)...)); err != nil {
			t.Fatalf("write GSO frame: %v", err)
		}
		if got := received(tcpRaw, remotePodIP); len(got) != 0 {
			t.Errorf("the pod received %d packets (%d bytes) over its MTU", len(got), len(got[0]))
		}
		icmp, quoted := icmpTo(ist, remotePodIP)
		if len(icmp) != 1 {
			t.Fatalf("the node sent %d ICMP messages to the sender, want 1 frag needed (counters moved %v)", len(icmp), delta(counts, r.counts(t)))
		}
		if icmp[0].TypeCode != layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded) || icmp[0].Seq != podMTU {
			t.Errorf("ICMP %v MTU %d, want frag needed with %d", icmp[0].TypeCode, icmp[0].Seq, podMTU)
		}
		if q := quoted[0]; q == nil || !q.DstIP.Equal(realPodIP.AsSlice()) || q.Id != 0x4343 {
			t.Errorf("the ICMP quotes %v, want the refused packet's header", q)
		}
	})
}

// icmpTo returns the ICMP messages to dst that the packet socket fd sees until it has
// been quiet for its timeout, decoded with gopacket, and the IPv4 header each quotes.
func icmpTo(fd int, dst netip.Addr) ([]*layers.ICMPv4, []*layers.IPv4) {
	var icmp []*layers.ICMPv4
	var quoted []*layers.IPv4
	buf := make([]byte, 65536)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil {
			return icmp, quoted
		}
		pkt := gopacket.NewPacket(append([]byte{}, buf[:n]...), layers.LayerTypeEthernet, gopacket.Default)
		ip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		ic, _ := pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if ip == nil || ic == nil || !ip.DstIP.Equal(dst.AsSlice()) {
			continue
		}
		icmp = append(icmp, ic)
		q := gopacket.NewPacket(ic.Payload, layers.LayerTypeIPv4, gopacket.Default)
		qip, _ := q.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		quoted = append(quoted, qip)
	}
}
