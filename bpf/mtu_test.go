package bpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Path MTU: ICMP frag needed for DF packets too large for the tunnel, and MSS
// clamping of SYNs entering and leaving it (lib/icmp.h, lib/tcp.h).

// ipv4WithOptions is ipv4Packet with IPv4 options (a multiple of 4 bytes).
func ipv4WithOptions(src, dst netip.Addr, proto byte, o ipOpts, options, payload []byte) []byte {
	b := ipv4Packet(src, dst, proto, o, nil)
	hl := 20 + len(options)
	b = append(b, options...)
	b[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(b[2:], uint16(hl+len(payload)))
	b[10], b[11] = 0, 0
	binary.BigEndian.PutUint16(b[10:], csum16(b[:hl]))
	return append(b, payload...)
}

// icmpFragNeeded is the reply the datapath must build for the IPv4 packet orig:
// from orig's destination to its source, TOS precedence "internetwork control", TTL
// 64, type 3 code 4, next-hop MTU mtu, quoting orig's header and 8 bytes.
func icmpFragNeeded(orig []byte, mtu uint16) []byte {
	hl := int(orig[0]&0x0f) * 4
	icmp := make([]byte, 8, 8+hl+8)
	icmp[0], icmp[1] = 3, 4
	binary.BigEndian.PutUint16(icmp[6:], mtu)
	icmp = append(icmp, orig[:hl+8]...)
	binary.BigEndian.PutUint16(icmp[2:], csum16(icmp))
	src := netip.AddrFrom4([4]byte(orig[16:20]))
	dst := netip.AddrFrom4([4]byte(orig[12:16]))
	return ipv4Packet(src, dst, 1, ipOpts{tos: 0xc0 | orig[1]&0x1e, ttl: 64}, icmp)
}

// bigUDP is a pod's UDP packet of ipLen bytes (IPv4 header included) to dst.
// scapy: Ether(dst=<pod0h MAC>, src="02:00:00:00:0a:05")/IP(src="10.1.0.5", dst=dst, tos=0x10, ttl=64, id=0x4242, flags=<DF or 0>)/UDP(sport=4321, dport=53, chksum=0)/(b"\x5a"*(ipLen-28))
func bigUDP(l *lab, dst netip.Addr, ipLen int, df bool) []byte {
	o := ipOpts{tos: 0x10, ttl: 64, id: 0x4242}
	if df {
		o.fragOff = 0x4000
	}
	return ethFrame(l.podHMAC, podMAC, 0x0800,
		ipv4Packet(podIP, dst, 17, o, udpDatagram(4321, 53, bytes.Repeat([]byte{0x5a}, ipLen-28))))
}

func TestFragNeededReply(t *testing.T) {
	l := newLab(t)
	withOpts := ethFrame(l.podHMAC, podMAC, 0x0800, ipv4WithOptions(podIP, remotePodIP, 17,
		ipOpts{tos: 0x10, ttl: 64, id: 7, fragOff: 0x4000}, []byte{0x01, 0x01, 0x01, 0x00},
		udpDatagram(4321, 53, bytes.Repeat([]byte{0xa5}, 1500-32))))
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"1500 bytes DF", bigUDP(l, remotePodIP, 1500, true)},
		{"1451 bytes DF", bigUDP(l, remotePodIP, int(tunnelMTU)+1, true)},
		{"1500 bytes DF with IP options", withOpts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := l.counts(t)
			ret, out := l.run(t, l.objs.PodIngress, tc.in, l.pod.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}
			want := ethFrame(podMAC, l.podHMAC, 0x0800, icmpFragNeeded(tc.in[14:], tunnelMTU))
			if !bytes.Equal(out, want) {
				t.Fatalf("reply differs\n got %x\nwant %x", out, want)
			}
			// Independent checks of what the byte comparison implies.
			hl := int(tc.in[14]&0x0f) * 4
			if len(out) != 14+20+8+hl+8 {
				t.Errorf("reply is %d bytes, want %d", len(out), 14+20+8+hl+8)
			}
			if csum16(out[14:34]) != 0 || csum16(out[34:]) != 0 {
				t.Errorf("IPv4 or ICMP checksum does not verify")
			}
			if out[34] != 3 || out[35] != 4 || binary.BigEndian.Uint16(out[40:]) != tunnelMTU {
				t.Errorf("ICMP type %d code %d mtu %d, want 3/4/%d", out[34], out[35], binary.BigEndian.Uint16(out[40:]), tunnelMTU)
			}
			if !bytes.Equal(out[42:], tc.in[14:14+hl+8]) {
				t.Errorf("quote %x, want the original header and 8 bytes %x (TTL not yet decremented)", out[42:], tc.in[14:14+hl+8])
			}
			if !bytes.Equal(out[26:30], tc.in[30:34]) || !bytes.Equal(out[30:34], tc.in[26:30]) {
				t.Errorf("addresses %x -> %x, want the original ones swapped", out[26:30], out[30:34])
			}
			d := delta(before, l.counts(t))
			if d[metricKey(IsthmusMetricMETRIC_FRAG_NEEDED_SENT, IsthmusHookHOOK_POD_INGRESS)] != 1 || len(d) != 1 {
				t.Errorf("counters moved %v, want only METRIC_FRAG_NEEDED_SENT +1", d)
			}
		})
	}

	// The largest packet that fits is encapsulated, not answered.
	if ret, out := l.run(t, l.objs.PodIngress, bigUDP(l, remotePodIP, int(tunnelMTU), true), l.pod.Attrs().Index); ret != tcActRedirect || len(out) != 14+int(tunnelMTU)+50 {
		t.Errorf("packet of exactly the tunnel MTU: verdict %d, %d bytes; want encapsulated (%d bytes)", ret, len(out), 14+int(tunnelMTU)+50)
	}
}

func TestFragNeededDrops(t *testing.T) {
	l := newLab(t)
	for _, tc := range []struct {
		name string
		prog *ebpf.Program
		ifx  int
		in   []byte
		hook IsthmusHook
	}{
		// Fragmenting in BPF is out of scope: no DF, too big, dropped and counted.
		{"no DF from a pod", l.objs.PodIngress, l.pod.Attrs().Index, bigUDP(l, remotePodIP, 1500, false), IsthmusHookHOOK_POD_INGRESS},
		// isthmus0: the host stack already applied the device MTU; no ICMP from here.
		{"DF on isthmus0", l.objs.OverlayEgress, l.ist.Attrs().Index, bigUDP(l, remotePodIP, 1500, true), IsthmusHookHOOK_OVERLAY_EGRESS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := l.counts(t)
			if ret, _ := l.run(t, tc.prog, tc.in, tc.ifx); ret != tcActShot {
				t.Fatalf("verdict %d, want TC_ACT_SHOT", ret)
			}
			d := delta(before, l.counts(t))
			if k := dropKey(IsthmusDropReasonDROP_FRAG_NEEDED, tc.hook); d[k] != 1 || len(d) != 1 {
				t.Errorf("counters moved %v, want only %v +1", d, k)
			}
		})
	}
}

// TestFragNeededRedirectLive attaches pod_ingress to the pod veth and sends a
// too-large DF frame into it from the pod side: the ICMP reply must come back
// out of the same veth, which BPF_PROG_TEST_RUN cannot show (it reports the
// verdict, not the redirect target).
func TestFragNeededRedirectLive(t *testing.T) {
	l := newLab(t)
	var (
		lk   link.Link
		fd   int
		peer int
	)
	err := inNS(l.ns, func() error {
		var err error
		lk, err = link.AttachTCX(link.TCXOptions{Interface: l.pod.Attrs().Index, Program: l.objs.PodIngress, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		c, err := netlink.LinkByName("pod0c")
		if err != nil {
			return err
		}
		peer = c.Attrs().Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: peer})
	})
	if err != nil {
		t.Fatalf("attach and open packet socket: %v", err)
	}
	defer lk.Close()
	defer unix.Close(fd)

	in := bigUDP(l, remotePodIP, 1500, true)
	before := l.counts(t)
	if err := unix.Sendto(fd, in, 0, &unix.SockaddrLinklayer{Ifindex: peer, Halen: 6}); err != nil {
		t.Fatalf("send on pod0c: %v", err)
	}
	want := ethFrame(podMAC, l.podHMAC, 0x0800, icmpFragNeeded(in[14:], tunnelMTU))
	tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue // our own frame
		}
		if bytes.Equal(buf[:n], want) {
			d := delta(before, l.counts(t))
			if d[metricKey(IsthmusMetricMETRIC_FRAG_NEEDED_SENT, IsthmusHookHOOK_POD_INGRESS)] != 1 {
				t.Errorf("counters moved %v, want METRIC_FRAG_NEEDED_SENT +1", d)
			}
			return
		}
		t.Logf("pod0c saw another frame: %x", buf[:n])
	}
	t.Fatalf("no ICMP frag needed came back to pod0c; counters moved %v", delta(before, l.counts(t)))
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

