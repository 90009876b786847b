package testenv

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// udp6EchoAt answers every datagram on port of the namespace, over IPv6, with
// its payload, until the test ends.
func udp6EchoAt(t *testing.T, ns string, port int) {
	t.Helper()
	var pc net.PacketConn
	if err := Do(ns, func() (err error) {
		pc, err = net.ListenPacket("udp6", net.JoinHostPort("::", strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// udpRoundTripTo sends one datagram from ns to `to` (either family) and waits
// for the echo.
func udpRoundTripTo(ns string, to netip.AddrPort, timeout time.Duration) error {
	var c *net.UDPConn
	if err := Do(ns, func() (err error) {
		c, err = net.DialUDP(network("udp", to.Addr()), nil, net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("underlay6")); err != nil {
		return err
	}
	buf := make([]byte, 64)
	_, err := c.Read(buf)
	return err
}

// TestUnderlay6Wiring builds the underlay6 scenario with no datapath and the
// router's firewall on, and asks the kernels what the IPv6 underlay must be,
// whatever carries the pods: every router port holds its site's gateway (/128,
// not tentative: the link-local addresses may be for a moment, duplicate address
// detection off or not), routes its node's address (/128) down the port and answers
// for the site's other nodes by proxy NDP, with IPv6 forwarding on; every node's
// eth0 holds its IPv6 address (not tentative) and no IPv4 one, with a default
// route via the gateway, strict rp_filter and the strict IPv6 rpfilter rule. Every
// node reaches every other (ICMPv6, both ways: the site's through proxy NDP, the
// other site's through the firewall), the underlay's neighbour caches flush in
// IPv6 too, the firewall (ip6tables) passes tunnel UDP and ICMPv6 between the
// sites and other UDP inside a site, and drops and counts other UDP between the
// sites; hand-made pods get the underlay MTU less 70; the rpfilter rule dropped
// nothing. The plain WireGuard datapath, which routes over an IPv4 underlay, is
// refused before anything is built.
func TestUnderlay6Wiring(t *testing.T) {
	requireRoot(t)
	sc, err := LoadScenario("underlay6")
	if err != nil {
		t.Fatal(err)
	}
	for _, dp := range []Datapath{DatapathWireGuard} {
		name := uniqueLab(t)
		_, err := Up(context.Background(), sc, Options{Name: name, Datapath: dp, Binary: "/nonexistent/isthmus"})
		if want := "datapath runs over an IPv4 underlay only"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Up with datapath %s = %v, want an error containing %q", dp, err, want)
		}
		assertGone(t, name)
	}

	sc.Underlay.Firewall = true
	l := upScenario(t, sc, DatapathNone, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	checks := []struct {
		ns, want, not string
		argv          []string
	}{
		{l.RouterNS(), "inet6 fd00:100:1::1/128", "tentative", []string{"ip", "-6", "addr", "show", "dev", "n-a2", "scope", "global"}},
		{l.RouterNS(), "inet6 fd00:100:2::1/128", "tentative", []string{"ip", "-6", "addr", "show", "dev", "n-b1", "scope", "global"}},
		{l.RouterNS(), "fd00:100:1::11 dev n-a1", "", []string{"ip", "-6", "route", "show", "fd00:100:1::11"}},
		{l.RouterNS(), "fd00:100:1::12 dev n-a1 proxy", "", []string{"ip", "-6", "neigh", "show", "proxy"}},
		{l.RouterNS(), "fd00:100:2::11 dev n-b2 proxy", "", []string{"ip", "-6", "neigh", "show", "proxy"}},
		{l.RouterNS(), "net.ipv6.conf.all.forwarding = 1", "", []string{"sysctl", "net.ipv6.conf.all.forwarding"}},
		{l.NodeNS("a1"), "inet6 fd00:100:1::11/64", "tentative", []string{"ip", "-6", "addr", "show", "dev", "eth0", "scope", "global"}},
		{l.NodeNS("a1"), "default via fd00:100:1::1 dev eth0", "", []string{"ip", "-6", "route", "show", "default"}},
		{l.NodeNS("a1"), "rpfilter invert", "", []string{"ip6tables", "-w", "-t", "raw", "-L", "PREROUTING", "-n"}},
		{l.NodeNS("b2"), "inet6 fd00:100:2::12/64", "tentative", []string{"ip", "-6", "addr", "show", "dev", "eth0", "scope", "global"}},
	}
	for _, c := range checks {
		out, err := l.Exec(ctx, c.ns, c.argv...)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if !strings.Contains(out, c.want) || (c.not != "" && strings.Contains(out, c.not)) {
			t.Errorf("%s: %s: want %q (and no %q) in:\n%s", c.ns, strings.Join(c.argv, " "), c.want, c.not, out)
		}
	}
	for _, n := range sc.Nodes() {
		if out, err := l.Exec(ctx, l.NodeNS(n.Name), "ip", "-4", "-o", "addr", "show", "dev", "eth0"); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("node %s: IPv4 on eth0 (%v): %q, want none", n.Name, err, out)
		}
	}
	if bad, err := l.RPFilterNotStrict(); err != nil || len(bad) > 0 {
		t.Errorf("rp_filter not strict: %v (%v)", bad, err)
	}
	for _, p := range sc.Pods() {
		h, _, err := handleAt(l.PodNS(p.Name))
		if err != nil {
			t.Fatal(err)
		}
		link, err := h.LinkByName(UnderlayDev)
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := link.Attrs().MTU; got != 1430 {
			t.Errorf("pod %s: MTU %d, want 1430 (1500 less 70)", p.Name, got)
		}
	}

	reach := l.NodeReach()
	for pair, ok := range reach {
		if !ok {
			t.Errorf("node %s -> %s: no echo reply over the IPv6 underlay", pair[0], pair[1])
		}
	}
	if len(reach) != 12 {
		t.Errorf("%d node pairs pinged, want 12", len(reach))
	}
	// The pings left IPv6 neighbour entries on every node's eth0; the check's
	// flush before each pair removes them.
	count := func() int {
		h, _, err := handleAt(l.NodeNS("a1"))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		link, err := h.LinkByName(UnderlayDev)
		if err != nil {
			t.Fatal(err)
		}
		nbs, err := h.NeighList(link.Attrs().Index, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, nb := range nbs {
			if nb.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) == 0 {
				n++
			}
		}
		return n
	}
	if n := count(); n == 0 {
		t.Errorf("a1: no IPv6 neighbour entry on eth0 after pinging every node")
	}
	if err := l.flushUnderlayNeighbours(); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("a1: %d IPv6 neighbour entries on eth0 after the flush, want 0", n)
	}

	a2, _ := l.Node("a2")
	b1, _ := l.Node("b1")
	udp6EchoAt(t, l.NodeNS("b1"), GenevePort)
	udp6EchoAt(t, l.NodeNS("b1"), 7000)
	udp6EchoAt(t, l.NodeNS("a2"), 7000)
	before, err := l.FirewallDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := udpRoundTripTo(l.NodeNS("a1"), netip.AddrPortFrom(b1.Address, GenevePort), time.Second); err != nil {
		t.Errorf("a1 -> b1 UDP %d (the tunnel's, across the sites): %v", GenevePort, err)
	}
	if err := udpRoundTripTo(l.NodeNS("a1"), netip.AddrPortFrom(a2.Address, 7000), time.Second); err != nil {
		t.Errorf("a1 -> a2 UDP 7000 (inside the site): %v", err)
	}
	if err := udpRoundTripTo(l.NodeNS("a1"), netip.AddrPortFrom(b1.Address, 7000), 500*time.Millisecond); err == nil {
		t.Errorf("a1 -> b1 UDP 7000 across the sites got an answer through the firewall")
	}
	after, err := l.FirewallDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before+1 {
		t.Errorf("firewall drops %d -> %d, want one more (a1 -> b1 UDP 7000)", before, after)
	}

	drops6, err := l.RPFilter6Drops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(drops6) != 4 {
		t.Errorf("IPv6 rpfilter rule on %d nodes (%v), want all 4", len(drops6), drops6)
	}
	for n, v := range drops6 {
		if v != 0 {
			t.Errorf("node %s: the IPv6 rpfilter rule dropped %d packets", n, v)
		}
	}
}
