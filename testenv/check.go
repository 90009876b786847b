package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Proto is a protocol the check probes with.
type Proto string

// The protocols of a check, in matrix order.
const (
	ICMP Proto = "icmp"
	TCP  Proto = "tcp"
	UDP  Proto = "udp"
)

// Protos lists the protocols of a check in matrix order.
var Protos = []Proto{ICMP, TCP, UDP}

// Family is the address family a probe runs in.
type Family int

const (
	// IPv4 (the zero Family) probes between the pods' addresses.
	IPv4 Family = iota
	// IPv6 probes between the pods' address6 (Scenario.Expectations6).
	IPv6
)

// Families lists the families of a check in matrix order.
var Families = []Family{IPv4, IPv6}

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// label names proto in family f as the output prints it: icmp, tcp, udp for
// IPv4, icmp6, tcp6, udp6 for IPv6.
func (f Family) label(proto Proto) string {
	if f == IPv6 {
		return string(proto) + "6"
	}
	return string(proto)
}

// addr returns the address of pod p in family f: Address or Address6.
func (f Family) addr(p Pod) netip.Addr {
	if f == IPv6 {
		return p.Address6
	}
	return p.Address
}

// Probe is the outcome of one protocol from one pod to another.
type Probe struct {
	Src, Dst string
	Proto    Proto
	// Family is the probe's address family (the zero value: IPv4).
	Family Family
	OK     bool
	// Err says why the last attempt failed.
	Err string
	// Saw is the source address the destination's server reported (TCP, UDP).
	Saw netip.Addr
	// Want is the source address the server had to report: the source pod's
	// own, or its node's tunnel address when return-path SNAT translates it
	// (Scenario.Expectations).
	Want netip.Addr
	// Translated says Want is not the source pod's own address.
	Translated bool
	// Attempts is how many tries it took (or were made).
	Attempts int
	// Errs says why each failed attempt failed, in order.
	Errs []string
}

// Matrix is the result of a check: every probe between the pods.
type Matrix struct {
	Pods   []string
	Probes []Probe
}

// Get returns the IPv4 probe of proto from src to dst.
func (m *Matrix) Get(src, dst string, proto Proto) (Probe, bool) {
	return m.GetFamily(src, dst, proto, IPv4)
}

// GetFamily returns the probe of proto in family f from src to dst.
func (m *Matrix) GetFamily(src, dst string, proto Proto, f Family) (Probe, bool) {
	for _, p := range m.Probes {
		if p.Src == src && p.Dst == dst && p.Proto == proto && p.Family == f {
			return p, true
		}
	}
	return Probe{}, false
}

// has reports whether the matrix holds a probe of family f.
func (m *Matrix) has(f Family) bool {
	return slices.ContainsFunc(m.Probes, func(p Probe) bool { return p.Family == f })
}

// name is how the matrix's lists name the probe: "a1-p1->b1-p1 tcp", with
// tcp6 for IPv6.
func (p Probe) name(sep string) string {
	return p.Src + sep + p.Dst + " " + p.Family.label(p.Proto)
}

// Failures returns the failed probes.
func (m *Matrix) Failures() []Probe {
	var out []Probe
	for _, p := range m.Probes {
		if !p.OK {
			out = append(out, p)
		}
	}
	return out
}

// String renders the matrix: a row per source, a column per destination, each
// cell one mark per protocol (icmp tcp udp): "+" passed, "x" failed, "." not
// probed; then every failure in detail. With IPv6 probes, a second grid
// follows the IPv4 one, headed "IPv6 (address6)", and the lists name IPv6
// probes icmp6, tcp6, udp6.
func (m *Matrix) String() string {
	var b strings.Builder
	if m.has(IPv6) {
		b.WriteString("IPv4 (address to address):\n")
	}
	m.grid(&b, IPv4)
	if m.has(IPv6) {
		b.WriteString("IPv6 (address6 to address6):\n")
		m.grid(&b, IPv6)
	}
	fails := m.Failures()
	var cells string
	if m.has(IPv6) {
		cells = " (IPv6: icmp6 tcp6 udp6)"
	}
	fmt.Fprintf(&b, "cells: icmp tcp udp%s, + ok, x failed, . not probed (no path by design); %d probes, %d failed\n", cells, len(m.Probes), len(fails))
	var translated []string
	for _, p := range m.Probes {
		if p.Proto == TCP && p.Translated {
			translated = append(translated, fmt.Sprintf("%s->%s as %s", p.Src, p.Dst, p.Want))
		}
	}
	if len(translated) > 0 {
		fmt.Fprintf(&b, "translated sources (return-path SNAT), seen as: %s\n", strings.Join(translated, ", "))
	}
	if retried := m.Retried(); len(retried) > 0 {
		var list []string
		for _, p := range retried {
			list = append(list, fmt.Sprintf("%s on attempt %d (first: %s)", p.name("->"), p.Attempts, p.Errs[0]))
		}
		fmt.Fprintf(&b, "passed only after a retry: %s\n", strings.Join(list, ", "))
	}
	for _, f := range fails {
		fmt.Fprintf(&b, "FAIL %s after %d attempts: %s\n", f.name(" -> "), f.Attempts, f.Err)
	}
	return b.String()
}

// grid writes the rows of family f's probes.
func (m *Matrix) grid(b *strings.Builder, f Family) {
	width := 5
	for _, p := range m.Pods {
		width = max(width, len(p))
	}
	fmt.Fprintf(b, "%-*s", width+2, "src\\dst")
	for _, d := range m.Pods {
		fmt.Fprintf(b, " %-*s", width, d)
	}
	b.WriteString("\n")
	for _, s := range m.Pods {
		fmt.Fprintf(b, "%-*s", width+2, s)
		for _, d := range m.Pods {
			cell := ""
			for _, proto := range Protos {
				p, ok := m.GetFamily(s, d, proto, f)
				switch {
				case !ok:
					cell += "."
				case p.OK:
					cell += "+"
				default:
					cell += "x"
				}
			}
			if s == d {
				cell = "-"
			}
			fmt.Fprintf(b, " %-*s", width, cell)
		}
		b.WriteString("\n")
	}
}

// Retried returns the probes that passed, but not on their first attempt.
func (m *Matrix) Retried() []Probe {
	var out []Probe
	for _, p := range m.Probes {
		if p.OK && p.Attempts > 1 {
			out = append(out, p)
		}
	}
	return out
}

// CheckOptions tune a check.
type CheckOptions struct {
	// Timeout of one attempt; default 1s.
	Timeout time.Duration
	// Attempts per probe; default 3.
	Attempts int
	// Parallel probes at once; default 16.
	Parallel int
	// Family the pairs are probed in: IPv4 (the default) between the pods'
	// addresses, or IPv6 between their address6.
	Family Family
}

// Check probes with ICMP echo, TCP and UDP every ordered pair of distinct pods
// that should talk (Scenario.Expectations: every pair, unless unmanaged pods
// outside any routed block or unpeered sites are involved), and then over IPv6
// every pair Lab.Expectations6 names. TCP and UDP
// servers in the destination pod report the source address they saw, which
// must be the one the expectation names: the source pod's own, or its node's
// tunnel address for a source that return-path SNAT translates. The error is
// non-nil when any probe failed or passed only after a retry (the matrix says
// which, and after how many attempts) or the check could not run.
func (l *Lab) Check(ctx context.Context) (*Matrix, error) {
	var pairs, pairs6 [][2]string
	for _, e := range l.Scenario.Expectations() {
		pairs = append(pairs, [2]string{e.Src, e.Dst})
	}
	es6, _ := l.Expectations6()
	for _, e := range es6 {
		pairs6 = append(pairs6, [2]string{e.Src, e.Dst})
	}
	m, err := l.CheckPairs(ctx, pairs, CheckOptions{})
	if m == nil || len(pairs6) == 0 {
		return m, err
	}
	m6, err6 := l.CheckPairs(ctx, pairs6, CheckOptions{Family: IPv6})
	if m6 == nil {
		return m, errors.Join(err, err6)
	}
	m.Probes = append(m.Probes, m6.Probes...)
	return m, m.result(l.Name)
}

// Expectations6 returns what Scenario.Expectations6 does for an isthmus lab
// and for the plain and VXLAN baselines, which route IPv6 pods too; in a lab of
// another datapath (plain WireGuard routes IPv4 only) no pair, and every pair of
// pods with an address6 that has an IPv4 expectation among the unprobed ones.
func (l *Lab) Expectations6() ([]Expectation, []Unprobed6) {
	es, skipped := l.Scenario.Expectations6()
	switch l.Datapath {
	case DatapathIsthmus, "", DatapathPlain, DatapathVXLAN:
		return es, skipped
	}
	var all []Unprobed6
	for _, e := range l.Scenario.Expectations() {
		src, _ := l.Scenario.pod(e.Src)
		dst, _ := l.Scenario.pod(e.Dst)
		if src.Address6.IsValid() && dst.Address6.IsValid() {
			all = append(all, Unprobed6{Src: e.Src, Dst: e.Dst, Why: fmt.Sprintf("the %s datapath routes IPv4 only", l.Datapath)})
		}
	}
	return nil, all
}

// CheckPairs probes the given (source, destination) pod pairs; see Check. A
// pair without an expectation must see the source pod's own address.
func (l *Lab) CheckPairs(ctx context.Context, pairs [][2]string, opts CheckOptions) (*Matrix, error) {
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	if opts.Attempts == 0 {
		opts.Attempts = 3
	}
	if opts.Parallel == 0 {
		opts.Parallel = 16
	}
	fam := opts.Family
	m := &Matrix{}
	for _, p := range l.Scenario.Pods() {
		m.Pods = append(m.Pods, p.Name)
	}
	// One server pair per destination pod.
	servers := map[string]*EchoServer{}
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for _, pr := range pairs {
		for _, name := range pr {
			p, ok := l.Pod(name)
			if !ok {
				return nil, fmt.Errorf("check: no pod %q", name)
			}
			if !fam.addr(p.Pod).IsValid() {
				return nil, fmt.Errorf("check: pod %q has no %s address", name, fam)
			}
		}
		if servers[pr[1]] != nil {
			continue
		}
		srv, err := startEchoServer(l.PodNS(pr[1]), fam)
		if err != nil {
			return nil, fmt.Errorf("check: %w", err)
		}
		servers[pr[1]] = srv
	}

	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, opts.Parallel)
	for _, pr := range pairs {
		src, _ := l.Pod(pr[0])
		dst, _ := l.Pod(pr[1])
		srv := servers[pr[1]]
		for _, proto := range Protos {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				own, to := fam.addr(src.Pod), fam.addr(dst.Pod)
				p := Probe{Src: src.Name, Dst: dst.Name, Proto: proto, Family: fam, Want: own}
				expect := l.Scenario.Expect
				if fam == IPv6 {
					expect = l.Scenario.Expect6
				}
				if e, ok := expect(src.Name, dst.Name); ok {
					p.Want, p.Translated = e.Saw, e.Saw != own
				}
				for p.Attempts < opts.Attempts && ctx.Err() == nil {
					p.Attempts++
					var err error
					switch proto {
					case ICMP:
						err = Ping(l.PodNS(src.Name), to, opts.Timeout)
					case TCP:
						p.Saw, err = TCPEcho(l.PodNS(src.Name), netip.AddrPortFrom(to, srv.TCPPort), opts.Timeout)
					case UDP:
						p.Saw, err = UDPEcho(l.PodNS(src.Name), netip.AddrPortFrom(to, srv.UDPPort), opts.Timeout)
					}
					if err == nil && proto != ICMP && p.Saw != p.Want {
						if p.Want == own {
							err = fmt.Errorf("server saw source %s, want the pod's own %s", p.Saw, own)
						} else {
							err = fmt.Errorf("server saw source %s, want %s (the tunnel address of node %s: the pod is translated)", p.Saw, p.Want, src.Node)
						}
					}
					if err == nil {
						p.OK, p.Err = true, ""
						break
					}
					p.Err = err.Error()
					p.Errs = append(p.Errs, p.Err)
				}
				if ctx.Err() != nil && !p.OK && p.Err == "" {
					p.Err = ctx.Err().Error()
				}
				mu.Lock()
				m.Probes = append(m.Probes, p)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return m, m.result(l.Name)
}

// result sorts the probes (IPv4 first, then by source, destination and
// protocol in matrix order) and returns the check's error: non-nil when a
// probe failed or passed only after a retry.
func (m *Matrix) result(lab string) error {
	order := map[string]int{}
	for i, p := range m.Pods {
		order[p] = i
	}
	protoOrder := map[Proto]int{ICMP: 0, TCP: 1, UDP: 2}
	sort.SliceStable(m.Probes, func(i, j int) bool {
		a, b := m.Probes[i], m.Probes[j]
		if a.Family != b.Family {
			return a.Family < b.Family
		}
		if a.Src != b.Src {
			return order[a.Src] < order[b.Src]
		}
		if a.Dst != b.Dst {
			return order[a.Dst] < order[b.Dst]
		}
		return protoOrder[a.Proto] < protoOrder[b.Proto]
	})
	if n := len(m.Failures()); n > 0 {
		return fmt.Errorf("check lab %s: %d of %d probes failed", lab, n, len(m.Probes))
	}
	// A path that loses its first packets is broken even when a retry hides it.
	if r := m.Retried(); len(r) > 0 {
		return fmt.Errorf("check lab %s: %d of %d probes passed only after a retry (the matrix names them and their attempts)", lab, len(r), len(m.Probes))
	}
	return nil
}

// EchoServer is a TCP and a UDP server in a pod's namespace that answer every
// connection or datagram with the source address they saw ("10.244.1.10\n").
type EchoServer struct {
	TCPPort, UDPPort uint16
	tcp              net.Listener
	udp              net.PacketConn
	wg               sync.WaitGroup
}

// StartEchoServer opens both servers in the named namespace on ephemeral
// ports, for IPv4.
func StartEchoServer(nsName string) (*EchoServer, error) { return startEchoServer(nsName, IPv4) }

// StartEchoServer6 is StartEchoServer for IPv6 (only: the sockets are
// IPV6_V6ONLY).
func StartEchoServer6(nsName string) (*EchoServer, error) { return startEchoServer(nsName, IPv6) }

func startEchoServer(nsName string, f Family) (*EchoServer, error) {
	s := &EchoServer{}
	tcp, udp, wildcard := "tcp4", "udp4", "0.0.0.0:0"
	if f == IPv6 {
		tcp, udp, wildcard = "tcp6", "udp6", "[::]:0"
	}
	err := Do(nsName, func() error {
		var err error
		if s.tcp, err = net.Listen(tcp, wildcard); err != nil {
			return fmt.Errorf("listen tcp: %w", err)
		}
		if s.udp, err = net.ListenPacket(udp, wildcard); err != nil {
			s.tcp.Close()
			return fmt.Errorf("listen udp: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("start echo server in %s: %w", nsName, err)
	}
	s.TCPPort = uint16(s.tcp.Addr().(*net.TCPAddr).Port)
	s.UDPPort = uint16(s.udp.LocalAddr().(*net.UDPAddr).Port)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				ap := c.RemoteAddr().(*net.TCPAddr).AddrPort()
				fmt.Fprintf(c, "%s\n", ap.Addr().Unmap())
			}()
		}
	}()
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 2048)
		for {
			_, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			ap := from.(*net.UDPAddr).AddrPort()
			s.udp.WriteTo([]byte(ap.Addr().Unmap().String()+"\n"), from)
		}
	}()
	return s, nil
}

// Close stops both servers.
func (s *EchoServer) Close() {
	s.tcp.Close()
	s.udp.Close()
	s.wg.Wait()
}

// TCPEcho connects from the named namespace to an EchoServer and returns the
// source address the server saw.
func TCPEcho(nsName string, to netip.AddrPort, timeout time.Duration) (netip.Addr, error) {
	var c net.Conn
	err := Do(nsName, func() error {
		var err error
		c, err = net.DialTimeout(network("tcp", to.Addr()), to.String(), timeout)
		return err
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read reply: %w", err)
	}
	saw, err := netip.ParseAddr(strings.TrimSpace(line))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read reply: %w", err)
	}
	return saw, nil
}

// UDPEcho sends a datagram from the named namespace to an EchoServer and returns
// the source address the server saw.
func UDPEcho(nsName string, to netip.AddrPort, timeout time.Duration) (netip.Addr, error) {
	var c *net.UDPConn
	err := Do(nsName, func() error {
		var err error
		c, err = net.DialUDP(network("udp", to.Addr()), nil, net.UDPAddrFromAddrPort(to))
		return err
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("open udp: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("who am i\n")); err != nil {
		return netip.Addr{}, fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read reply: %w", err)
	}
	saw, err := netip.ParseAddr(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read reply: %w", err)
	}
	return saw, nil
}

// network returns the Go network of kind ("tcp", "udp") for a's family.
func network(kind string, a netip.Addr) string {
	if a.Is6() && !a.Is4In6() {
		return kind + "6"
	}
	return kind + "4"
}

// Ping sends one ICMP echo request (ICMPv6 to an IPv6 address) from the named
// namespace and waits for the matching reply from to.
func Ping(nsName string, to netip.Addr, timeout time.Duration) error {
	netw, laddr, proto := "ip4:icmp", "0.0.0.0", 1
	var echo, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if to.Is6() {
		// The kernel fills in the ICMPv6 checksum of a raw socket.
		netw, laddr, proto = "ip6:ipv6-icmp", "::", 58
		echo, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	var c *icmp.PacketConn
	err := Do(nsName, func() error {
		var err error
		c, err = icmp.ListenPacket(netw, laddr)
		return err
	})
	if err != nil {
		return fmt.Errorf("open icmp socket: %w", err)
	}
	defer c.Close()
	id, seq := rand.IntN(1<<16), rand.IntN(1<<16)
	req, err := (&icmp.Message{Type: echo, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("isthmus lab")}}).Marshal(nil)
	if err != nil {
		return fmt.Errorf("build echo: %w", err)
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.WriteTo(req, &net.IPAddr{IP: to.AsSlice()}); err != nil {
		return fmt.Errorf("send echo: %w", err)
	}
	buf := make([]byte, 1500)
	var last string
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			if last != "" {
				return fmt.Errorf("no echo reply (last ICMP: %s): %w", last, err)
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return errors.New("no echo reply: timeout")
			}
			return fmt.Errorf("read: %w", err)
		}
		msg, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			continue
		}
		switch body := msg.Body.(type) {
		case *icmp.Echo:
			if msg.Type == reply && body.ID == id && body.Seq == seq {
				if got, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP); got.Unmap() != to {
					return fmt.Errorf("echo reply from %s, want %s", got, to)
				}
				return nil
			}
		case *icmp.DstUnreach, *icmp.TimeExceeded, *icmp.PacketTooBig:
			last = fmt.Sprintf("%v from %s", msg.Type, from)
		}
	}
}
