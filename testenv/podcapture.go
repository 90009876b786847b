package testenv

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"
)

// Frame is one IPv4 packet a pod's interface received, as gopacket decodes it.
type Frame struct {
	Src, Dst netip.Addr
	Proto    layers.IPProtocol
	// Fragment says the packet is a fragment: MF set or a fragment offset.
	Fragment bool
	// ICMPType is the ICMP type of an ICMP packet that is not a later fragment.
	ICMPType uint8
	// Len is the IPv4 total length.
	Len int
}

// PodCapture records every IPv4 packet a pod's eth0 receives (an AF_PACKET
// socket in the pod's namespace, packets it sends left out), decoded by gopacket:
// what reached the pod, whatever its stack then does with it.
type PodCapture struct {
	fd     int
	mu     sync.Mutex
	frames []Frame
	stop   chan struct{}
	done   sync.WaitGroup
}

// StartPodCapture opens a capture on UnderlayDev (eth0) of the named pod
// namespace. Close it.
func StartPodCapture(nsName string) (*PodCapture, error) {
	c := &PodCapture{stop: make(chan struct{})}
	proto := int(htons(unix.ETH_P_ALL))
	err := Do(nsName, func() error {
		ifc, err := net.InterfaceByName(UnderlayDev)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifc.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to %s: %w", UnderlayDev, err)
		}
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return fmt.Errorf("packet socket timeout: %w", err)
		}
		c.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("capture in %s: %w", nsName, err)
	}
	c.done.Add(1)
	go c.read()
	return c, nil
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

func (c *PodCapture) read() {
	defer c.done.Done()
	buf := make([]byte, 65536)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			continue // the timeout, to look at stop again
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		pkt := gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: false, Lazy: false})
		ip, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if !ok {
			continue
		}
		f := Frame{Proto: ip.Protocol, Len: int(ip.Length),
			Fragment: ip.Flags&layers.IPv4MoreFragments != 0 || ip.FragOffset != 0}
		f.Src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
		f.Dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
		if ip.Protocol == layers.IPProtocolICMPv4 && ip.FragOffset == 0 && len(ip.Payload) > 0 {
			f.ICMPType = ip.Payload[0]
		}
		c.mu.Lock()
		c.frames = append(c.frames, f)
		c.mu.Unlock()
	}
}

// Frames returns the packets received since the capture started or was last
// reset that match.
func (c *PodCapture) Frames(match func(Frame) bool) []Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Frame
	for _, f := range c.frames {
		if match(f) {
			out = append(out, f)
		}
	}
	return out
}

// Reset forgets the packets received so far.
func (c *PodCapture) Reset() {
	c.mu.Lock()
	c.frames = nil
	c.mu.Unlock()
}

// Close stops the capture.
func (c *PodCapture) Close() {
	close(c.stop)
	c.done.Wait()
	unix.Close(c.fd)
}
