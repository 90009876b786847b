package bpf

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Small packet builders for the program tests; each returns a fresh slice.

func csum16(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func ethFrame(dst, src net.HardwareAddr, etype uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], etype)
	return append(b, payload...)
}

type ipOpts struct {
	tos, ttl byte
	fragOff  uint16 // flags and offset, host order
	id       uint16
}

func ipv4Packet(src, dst netip.Addr, proto byte, o ipOpts, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	b[0] = 0x45
	b[1] = o.tos
	binary.BigEndian.PutUint16(b[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(b[4:], o.id)
	binary.BigEndian.PutUint16(b[6:], o.fragOff)
	b[8] = o.ttl
	b[9] = proto
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], csum16(b[:20]))
	return append(b, payload...)
}

// ipv6Packet is an IPv6 fixed header (traffic class and flow label 0) before payload.
func ipv6Packet(src, dst netip.Addr, next byte, hopLimit byte, payload []byte) []byte {
	b := make([]byte, 40, 40+len(payload))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(payload)))
	b[6] = next
	b[7] = hopLimit
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	return append(b, payload...)
}

// udpDatagram has a zero checksum (allowed for UDP over IPv4).
func udpDatagram(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...)
}

// tcpSegment is a 20-byte TCP header with flags; the checksum is left zero, the
// programs never read it.
func tcpSegment(sport, dport uint16, flags byte, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = 5 << 4
	b[13] = flags
	binary.BigEndian.PutUint16(b[14:], 65535)
	return append(b, payload...)
}

type geneveOpts struct {
	ver      byte
	critical bool
	proto    uint16
	vni      uint32
	options  []byte // multiple of 4 bytes
	optWords int    // opt_len field; -1: len(options)/4
}

func geneveHeader(o geneveOpts, payload []byte) []byte {
	words := o.optWords
	if words < 0 {
		words = len(o.options) / 4
	}
	b := make([]byte, 8, 8+len(o.options)+len(payload))
	b[0] = o.ver<<6 | byte(words&0x3f)
	if o.critical {
		b[1] = 0x40
	}
	binary.BigEndian.PutUint16(b[2:], o.proto)
	binary.BigEndian.PutUint32(b[4:], o.vni<<8)
	b = append(b, o.options...)
	return append(b, payload...)
}
