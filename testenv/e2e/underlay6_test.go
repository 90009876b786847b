package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// TestUnderlay6Mesh: on the underlay6 scenario (two meshed sites whose nodes have
// IPv6 underlay addresses only, every pod an IPv4 and an IPv6 address from the real
// CNI plugin; on every node strict rp_filter, the strict IPv6 rpfilter rule and a
// CNI's leftover MASQUERADE and FORWARD rules in both families), with TC and with
// XDP decapsulation:
//
//   - every pod's veth has the underlay MTU less 70 (outer IPv6, UDP, GENEVE and the
//     inner Ethernet header) on both ends;
//   - every pod reaches every other in both families over ICMP, TCP and UDP, every
//     server seeing the client pod's own address (checkPaths: one pair at a time from
//     cold neighbour caches, strict rp_filter and the IPv6 rpfilter rule unmoved);
//   - on the router port of a1, between the sites, tshark, an independent decoder,
//     finds an IPv4 and an IPv6 echo request of a1-p1 to b1-p1 in GENEVE over IPv6:
//     outer addresses the nodes' underlay addresses, outer UDP checksum 0, a flow
//     label, our VNI, the pods' own addresses inside;
//   - 4 MiB of TCP from a pod of one site to a pod of the other crosses intact (the
//     receiver's SHA-256 is the sender's) in each family, with segmentation
//     offloads on: what the GSO of an IPv6-encapsulated stream cuts arrives whole;
//   - the strict reverse-path filters of every node (rp_filter, the IPv6 rpfilter
//     rule) dropped nothing from the lab's start to the test's end.
func TestUnderlay6Mesh(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testUnderlay6Mesh)
}

func testUnderlay6Mesh(t *testing.T, decap string) {
	l := upScenarioDecap(t, "underlay6", decap)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if !l.Scenario.Underlay6() {
		t.Fatal("scenario underlay6: the sites' subnets are not IPv6")
	}
	for _, n := range l.Scenario.Nodes() {
		if !n.Address.Is6() {
			t.Fatalf("node %s: underlay address %s, want IPv6", n.Name, n.Address)
		}
		// No IPv4 underlay address at all: the agents can only run GENEVE over
		// IPv6.
		out, err := l.Exec(ctx, l.NodeNS(n.Name), "ip", "-4", "-o", "addr", "show", "dev", testenv.UnderlayDev)
		if err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("node %s: IPv4 on %s (%v): %q, want none", n.Name, testenv.UnderlayDev, err, out)
		}
	}

	// The pods' MTU, computed here from the scenario's underlay MTU, not asked of
	// the lab or the plan.
	wantMTU := l.Scenario.Underlay.MTU - 70
	if l.Scenario.Underlay.MTU != 1500 || wantMTU != 1430 {
		t.Fatalf("underlay MTU %d: the scenario promises 1500, pods at 1430", l.Scenario.Underlay.MTU)
	}
	for _, p := range l.Scenario.Pods() {
		for _, end := range [][2]string{{l.PodNS(p.Name), testenv.UnderlayDev}, {l.NodeNS(p.Node), l.HostVeth(p.Name)}} {
			if got := linkMTU(ctx, t, l, end[0], end[1]); got != wantMTU {
				t.Errorf("pod %s: %s in %s has MTU %d, want %d (underlay %d less 70)", p.Name, end[1], end[0], got, wantMTU, l.Scenario.Underlay.MTU)
			}
		}
	}

	m := checkPaths(t, l, "a1", "b1")
	v4, v6 := 0, 0
	for _, p := range m.Probes {
		src, _ := l.Pod(p.Src)
		want := src.Address
		if p.Family == testenv.IPv6 {
			want = src.Address6
			v6++
		} else {
			v4++
		}
		if p.OK && p.Proto != testenv.ICMP && p.Saw != want {
			t.Errorf("%s -> %s %s %v: server saw %s, want the pod's own %s", p.Src, p.Dst, p.Proto, p.Family, p.Saw, want)
		}
	}
	// Eight pods: 56 ordered pairs, three protocols, in each family.
	if v4 != 56*3 || v6 != 56*3 {
		t.Errorf("%d IPv4 and %d IPv6 probes, want %d of each", v4, v6, 56*3)
	}

	src, _ := l.Pod("a1-p1")
	dst, _ := l.Pod("b1-p1")
	srcNode, _ := l.Node(src.Node)
	dstNode, _ := l.Node(dst.Node)
	vni := fmt.Sprintf("0x%06x", l.Scenario.VNI) // as tshark prints it
	for _, c := range []struct {
		family     string
		filter     string
		to         netip.Addr
		innerField string // the inner header: ip or ipv6
		inner      [2]string
	}{
		{"IPv4", "icmp.type==8", dst.Address, "ip", [2]string{src.Address.String(), dst.Address.String()}},
		{"IPv6", "icmpv6.type==128", dst.Address6, "ipv6", [2]string{src.Address6.String(), dst.Address6.String()}},
	} {
		// Fields separated by |, the occurrences of one field by ;: ipv6.src
		// holds the outer source, and the inner one after it for an IPv6
		// inner packet; ip.src the inner IPv4 source.
		out, err := testenv.Capture(ctx, l.RouterNS(), []string{"-i", testenv.RouterPort(src.Node),
			"-f", "udp port 6081", "-d", "udp.port==6081,geneve", "-Y", "geneve && " + c.filter, "-c", "1",
			"-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=;",
			"-e", "frame.protocols", "-e", "ipv6.src", "-e", "ipv6.dst", "-e", "ipv6.flow", "-e", "udp.dstport", "-e", "udp.checksum",
			"-e", "geneve.vni", "-e", "ip.src", "-e", "ip.dst"},
			func() {
				if err := testenv.Ping(l.PodNS(src.Name), c.to, time.Second); err != nil {
					t.Logf("ping %s: %v", c.to, err)
				}
			})
		if err != nil {
			t.Fatalf("%s inside GENEVE over IPv6: capture: %v\n%s", c.family, err, out)
		}
		f := strings.Split(strings.TrimSpace(out), "|")
		if len(f) != 9 {
			t.Fatalf("%s inside GENEVE over IPv6: tshark printed %q, want 9 fields", c.family, out)
		}
		t.Logf("%s echo request %s -> %s on %s: %s", c.family, src.Name, dst.Name, testenv.RouterPort(src.Node), strings.TrimSpace(out))
		first := func(s string) string { return strings.Split(s, ";")[0] }
		last := func(s string) string { parts := strings.Split(s, ";"); return parts[len(parts)-1] }
		protos := f[0]
		if !strings.HasPrefix(protos, "eth:ethertype:ipv6:udp:geneve:eth:ethertype:"+c.innerField+":") || strings.Contains(protos, "malformed") {
			t.Errorf("%s: frame protocols %q, want eth:ethertype:ipv6:udp:geneve:eth:ethertype:%s:... and nothing malformed", c.family, protos, c.innerField)
		}
		if got, want := first(f[1])+" -> "+first(f[2]), srcNode.Address.String()+" -> "+dstNode.Address.String(); got != want {
			t.Errorf("%s: outer IPv6 %s, want the nodes' underlay addresses %s", c.family, got, want)
		}
		if label, err := strconv.ParseUint(first(f[3]), 0, 32); err != nil || label == 0 || label > 0xfffff {
			t.Errorf("%s: outer flow label %q, want a non-zero 20-bit label (%v)", c.family, first(f[3]), err)
		}
		if f[4] != "6081" {
			t.Errorf("%s: outer UDP destination port %q, want 6081", c.family, f[4])
		}
		if f[5] != "0x0000" {
			t.Errorf("%s: outer UDP checksum %q, want 0x0000 (zero over IPv6, RFC 8926 3.3 under RFC 6935)", c.family, f[5])
		}
		if f[6] != vni {
			t.Errorf("%s: VNI %q, want %s", c.family, f[6], vni)
		}
		innerSrc, innerDst := f[7], f[8]
		switch c.innerField {
		case "ip":
			if strings.Contains(f[1], ";") || strings.Contains(f[2], ";") {
				t.Errorf("%s: IPv6 sources %q and destinations %q, want the outer header's alone", c.family, f[1], f[2])
			}
		case "ipv6":
			if strings.Count(f[1], ";") != 1 || strings.Count(f[2], ";") != 1 || innerSrc != "" || innerDst != "" {
				t.Errorf("%s: IPv6 sources %q and destinations %q (IPv4 %q, %q), want outer;inner and no IPv4", c.family, f[1], f[2], innerSrc, innerDst)
			}
			innerSrc, innerDst = last(f[1]), last(f[2])
		}
		if got, want := innerSrc+" -> "+innerDst, c.inner[0]+" -> "+c.inner[1]; got != want {
			t.Errorf("%s: inner %s, want the pods' own %s", c.family, got, want)
		}
	}

	// 4 MiB of TCP across the sites, in each family, from a1-p1 to b2-p2: the
	// sender's offloads stay on, so the stream leaves the pod in GSO segments the
	// datapath encapsulates in IPv6 whole.
	data := make([]byte, 4<<20)
	rng := rand.NewChaCha8([32]byte{'u', 'n', 'd', 'e', 'r', 'l', 'a', 'y', '6'})
	rng.Read(data)
	sum := sha256.Sum256(data)
	from, to := "a1-p1", "b2-p2"
	fromPod, _ := l.Pod(from)
	toPod, _ := l.Pod(to)
	for _, c := range []struct {
		family   string
		src, dst netip.Addr
	}{{"IPv4", fromPod.Address, toPod.Address}, {"IPv6", fromPod.Address6, toPod.Address6}} {
		start := time.Now()
		got, n, saw, err := transferIntact(ctx, l.PodNS(from), l.PodNS(to), c.dst, data)
		if err != nil {
			t.Errorf("%s: 4 MiB %s -> %s: %v", c.family, from, to, err)
			continue
		}
		t.Logf("%s: 4 MiB %s -> %s in %s", c.family, from, to, time.Since(start).Round(time.Millisecond))
		if n != int64(len(data)) || got != sum {
			t.Errorf("%s: %s -> %s: received %d bytes with SHA-256 %x, sent %d with %x", c.family, from, to, n, got, len(data), sum)
		}
		if saw != c.src {
			t.Errorf("%s: %s -> %s: the receiver saw the stream from %s, want the pod's own %s", c.family, from, to, saw, c.src)
		}
	}

	// Nothing of the above (nor of the lab's start) met a strict reverse-path
	// filter: rp_filter's counter (checkPaths reads it again when the test ends)
	// and the IPv6 rpfilter rule's, which every node of the IPv6 underlay has.
	drops6, err := l.RPFilter6Drops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Scenario.Nodes() {
		got, ok := drops6[n.Name]
		switch {
		case !ok:
			t.Errorf("node %s: no strict IPv6 rpfilter rule (ip6tables -t raw %s)", n.Name, testenv.RPFilter6Rule)
		case got != 0:
			t.Errorf("node %s: the strict IPv6 rpfilter rule dropped %d packets", n.Name, got)
		}
	}
	drops, err := l.RPFilterDrops()
	if err != nil {
		t.Fatal(err)
	}
	for n, got := range drops {
		if got != 0 {
			t.Errorf("node %s: %s %d", n, testenv.RPFilterCounter, got)
		}
	}
}

// linkMTU returns the MTU of dev in the namespace ns.
func linkMTU(ctx context.Context, t *testing.T, l *testenv.Lab, ns, dev string) int {
	t.Helper()
	out, err := l.Exec(ctx, ns, "ip", "-j", "link", "show", "dev", dev)
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		MTU int `json:"mtu"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("%s: ip -j link show dev %s: %v: %s", ns, dev, err, out)
	}
	return links[0].MTU
}

// transferIntact sends data over one TCP connection from the namespace srcNS to
// a receiver it opens in dstNS on dst, and returns the SHA-256 and length of what
// the receiver read, and the source address the receiver saw.
func transferIntact(ctx context.Context, srcNS, dstNS string, dst netip.Addr, data []byte) ([32]byte, int64, netip.Addr, error) {
	netw := "tcp4"
	if dst.Is6() {
		netw = "tcp6"
	}
	var ln net.Listener
	if err := testenv.Do(dstNS, func() (err error) {
		ln, err = net.Listen(netw, netip.AddrPortFrom(dst, 0).String())
		return err
	}); err != nil {
		return [32]byte{}, 0, netip.Addr{}, fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	type result struct {
		sum  [32]byte
		n    int64
		from netip.Addr
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: fmt.Errorf("accept: %w", err)}
			return
		}
		defer c.Close()
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
		defer stop()
		h := sha256.New()
		n, err := io.Copy(h, c)
		var r result
		copy(r.sum[:], h.Sum(nil))
		r.n, r.from = n, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		if err != nil {
			r.err = fmt.Errorf("receive after %d bytes: %w", n, err)
		} else if _, err := c.Write([]byte("ok")); err != nil {
			r.err = fmt.Errorf("acknowledge: %w", err)
		}
		done <- r
	}()
	var c net.Conn
	if err := testenv.Do(srcNS, func() (err error) {
		c, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, netw, ln.Addr().String())
		return err
	}); err != nil {
		return [32]byte{}, 0, netip.Addr{}, fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
		return [32]byte{}, 0, netip.Addr{}, fmt.Errorf("send: %w", err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return [32]byte{}, 0, netip.Addr{}, fmt.Errorf("close write: %w", err)
	}
	ack := make([]byte, 2)
	_, ackErr := io.ReadFull(c, ack)
	r := <-done
	if err := errors.Join(r.err, ackErr); err != nil {
		return r.sum, r.n, r.from, err
	}
	return r.sum, r.n, r.from, nil
}
