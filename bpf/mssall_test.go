package bpf

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Every MSS option of a SYN is clamped, not only the first: Linux's tcp_parse_options
// reads them all and keeps the last, so a SYN whose later MSS option is the large one
// got past a clamp of the first. The SYNs are built and the frames that leave are
// decoded by gopacket, which shares no code with the programs; the TCP checksum is
// checked against gopacket's own computation over the decoded segment.

// mssSYN builds, with gopacket, a TCP SYN from src to dst with the options opts, and
// returns its IPv4 packet (DF, TTL 64).
func mssSYN(t *testing.T, src, dst netip.Addr, opts []layers.TCPOption) []byte {
	t.Helper()
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolTCP,
		SrcIP: net.IP(src.AsSlice()), DstIP: net.IP(dst.AsSlice())}
	tcp := &layers.TCP{SrcPort: 40000, DstPort: 80, Seq: 0x01020304, SYN: true, Window: 65535, Options: opts}
	if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatalf("set network layer: %v", err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, tcp); err != nil {
		t.Fatalf("serialize SYN: %v", err)
	}
	return buf.Bytes()
}

func mssOption(v uint16) layers.TCPOption {
	return layers.TCPOption{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: binary.BigEndian.AppendUint16(nil, v)}
}

var nopOption = layers.TCPOption{OptionType: layers.TCPOptionKindNop, OptionLength: 1}

// decodedMSS decodes frame (from its Ethernet header; through GENEVE if it is a
// GENEVE frame) with gopacket and returns the inner TCP layer's MSS option values in
// order, with the lengths of MSS options that are not 4 bytes long reported as values
// 0x10000+length. It fails t unless the TCP checksum is the one gopacket computes.
func decodedMSS(t *testing.T, frame []byte) []uint32 {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	if e := pkt.ErrorLayer(); e != nil {
		t.Fatalf("gopacket cannot decode the frame: %v\n%x", e.Error(), frame)
	}
	var ip *layers.IPv4
	var tcp *layers.TCP
	for _, l := range pkt.Layers() {
		switch l := l.(type) {
		case *layers.IPv4:
			ip = l // the last one: the inner header of a GENEVE frame
		case *layers.TCP:
			tcp = l
		}
	}
	if ip == nil || tcp == nil {
		t.Fatalf("no IPv4 and TCP layers in %v\n%x", pkt.Layers(), frame)
	}
	var mss []uint32
	for _, o := range tcp.Options {
		if o.OptionType != layers.TCPOptionKindMSS {
			continue
		}
		if o.OptionLength != 4 {
			mss = append(mss, 0x10000+uint32(o.OptionLength))
			continue
		}
		mss = append(mss, uint32(binary.BigEndian.Uint16(o.OptionData)))
	}
	got := tcp.Checksum
	re := *tcp
	if err := re.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatalf("set network layer: %v", err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, &re, gopacket.Payload(tcp.Payload)); err != nil {
		t.Fatalf("reserialize TCP: %v", err)
	}
	if want := binary.BigEndian.Uint16(buf.Bytes()[16:]); got != want {
		t.Errorf("TCP checksum %#04x, gopacket computes %#04x", got, want)
	}
	return mss
}

func TestMSSClampEveryOption(t *testing.T) {
	l := newLab(t)
	clamped := uint32(tunnelMTU - 40)
	badLen := layers.TCPOption{OptionType: layers.TCPOptionKindMSS, OptionLength: 6, OptionData: []byte{0x23, 0x28, 0, 0}}
	for _, tc := range []struct {
		name string
		opts []layers.TCPOption
		want []uint32
	}{
		// Linux takes 1460, the last: the clamp must reach it.
		{"small then large", []layers.TCPOption{mssOption(1200), mssOption(1460)}, []uint32{1200, clamped}},
		{"large twice, the second at an odd offset", []layers.TCPOption{mssOption(1460), nopOption, mssOption(9000), nopOption, nopOption, nopOption}, []uint32{clamped, clamped}},
		// Linux skips an MSS option of another length by its length and reads on.
		{"malformed length then large", []layers.TCPOption{badLen, nopOption, nopOption, mssOption(1460)}, []uint32{0x10006, clamped}},
		{"ten options", []layers.TCPOption{mssOption(1460), mssOption(1300), mssOption(1460), mssOption(1460), mssOption(1460),
			mssOption(1460), mssOption(1460), mssOption(1460), mssOption(1460), mssOption(65535)},
			[]uint32{clamped, 1300, clamped, clamped, clamped, clamped, clamped, clamped, clamped, clamped}},
	} {
		t.Run("encap/"+tc.name, func(t *testing.T) {
			in := ethFrame(l.podHMAC, podMAC, 0x0800, mssSYN(t, podIP, remotePodIP, tc.opts))
			ret, out, _, _ := l.podSend(t, in)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}
			if got := decodedMSS(t, out); !equalU32(got, tc.want) {
				t.Errorf("MSS options leaving %v, want %v", got, tc.want)
			}
		})
		t.Run("decap/"+tc.name, func(t *testing.T) {
			in := geneveFrame(l, goodOpts(podIP), innerEth(mssSYN(t, remotePodIP, podIP, tc.opts)))
			ret, out := l.run(t, l.objs.UnderlayIngress, in, l.und.Attrs().Index)
			if ret != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}
			if got := decodedMSS(t, out); !equalU32(got, tc.want) {
				t.Errorf("MSS options delivered %v, want %v", got, tc.want)
			}
		})
	}
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
