package testenv

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// upSeed000 builds the seed000 scenario with datapath dp and no agents.
func upSeed000(t *testing.T, dp Datapath) *Lab {
	t.Helper()
	return upNamed(t, "seed000", dp)
}

// udpEchoAt answers every datagram on port of the namespace with its payload.
func udpEchoAt(t *testing.T, ns string, port int) {
	t.Helper()
	udpServerAt(t, ns, port, func(payload []byte, _ net.Addr) []byte { return payload })
}

// udpServerAt answers every datagram on port of the namespace with what reply
// makes of it, until the test ends.
func udpServerAt(t *testing.T, ns string, port int, reply func(payload []byte, from net.Addr) []byte) {
	t.Helper()
	var pc net.PacketConn
	if err := Do(ns, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)))
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
			pc.WriteTo(reply(buf[:n], from), from)
		}
	}()
}

// udpRoundTrip sends one datagram from ns to `to` and waits for the echo.
func udpRoundTrip(ns string, to netip.AddrPort, timeout time.Duration) error {
	var c *net.UDPConn
	if err := Do(ns, func() error {
		var err error
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("underlay")); err != nil {
		return err
	}
	buf := make([]byte, 64)
	_, err := c.Read(buf)
	return err
}

// TestSeed000Topology checks the unmanaged-CNI lab without any datapath: the
// Azure-CNI-style pods hang off azv-* veths with strict rp_filter, the fabric
// routes each of them (/32) to its node, pods of the cluster site reach each
// other through that fabric with their own addresses, and the router's
// firewall passes node-to-node ICMP and tunnel UDP between the sites (with
// replies) but drops and counts a pod's packet sent straight across.
func TestSeed000Topology(t *testing.T) {
	l := upSeed000(t, DatapathNone)
	ctx := context.Background()
	for _, c := range []struct {
		ns, want string
		argv     []string
	}{
		{l.NodeNS("aks-1"), "10.0.2.128 dev azv-aks1-p1 scope link", []string{"ip", "route"}},
		{l.NodeNS("aks-1"), "10.0.4.10 dev azv-aks1-ext scope link", []string{"ip", "route"}},
		{l.NodeNS("aks-1"), "net.ipv4.conf.azv-aks1-ext.rp_filter = 1", []string{"sysctl", "net.ipv4.conf.azv-aks1-ext.rp_filter"}},
		{l.NodeNS("aks-1"), "net.ipv4.conf.all.rp_filter = 1", []string{"sysctl", "net.ipv4.conf.all.rp_filter"}},
		{l.NodeNS("flex-1"), "192.168.20.6 dev " + l.HostVeth("flex-p1") + " scope link", []string{"ip", "route"}},
		{l.RouterNS(), "10.0.4.10 via 10.0.0.4", []string{"ip", "route"}},
		{l.RouterNS(), "10.0.2.200 via 10.0.0.5", []string{"ip", "route"}},
		{l.RouterNS(), "group 2", []string{"ip", "-d", "link", "show", RouterPort("flex-1")}},
		{l.PodNS("aks1-p1"), "default via 169.254.1.1 dev eth0", []string{"ip", "route"}},
	} {
		out, err := l.Exec(ctx, c.ns, c.argv...)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("%s: %s: want %q in:\n%s", c.ns, strings.Join(c.argv, " "), c.want, out)
		}
	}

	// Inside the cluster site, through the fabric, no tunnel: every pair.
	var pairs [][2]string
	for _, e := range l.Scenario.Expectations() {
		if s, _ := l.Pod(e.Src); s.Site == "cluster" {
			if d, _ := l.Pod(e.Dst); d.Site == "cluster" {
				pairs = append(pairs, [2]string{e.Src, e.Dst})
			}
		}
	}
	if len(pairs) != 6 {
		t.Fatalf("%d same-site pairs in the cluster site, want 6", len(pairs))
	}
	m, err := l.CheckPairs(ctx, pairs, CheckOptions{})
	if err != nil {
		t.Errorf("fabric inside the cluster site: %v\n%s", err, m)
	}

	// Node to node across the firewall: ICMP passes both ways.
	for _, pair := range [][2]string{{"aks-1", "flex-1"}, {"flex-1", "aks-1"}, {"aks-2", "flex-1"}, {"flex-1", "aks-2"}, {"aks-1", "aks-2"}} {
		dst, _ := l.Node(pair[1])
		if err := Ping(l.NodeNS(pair[0]), dst.Address, 2*time.Second); err != nil {
			t.Errorf("node %s -> node %s (%s): %v", pair[0], pair[1], dst.Address, err)
		}
	}
	// Tunnel UDP node to node passes, and so does the reply from port 6081
	// (established); another UDP port does not.
	flex, _ := l.Node("flex-1")
	udpEchoAt(t, l.NodeNS("flex-1"), GenevePort)
	udpEchoAt(t, l.NodeNS("flex-1"), 9997)
	if err := udpRoundTrip(l.NodeNS("aks-1"), netip.AddrPortFrom(flex.Address, GenevePort), 2*time.Second); err != nil {
		t.Errorf("aks-1 -> flex-1 udp %d and back: %v", GenevePort, err)
	}
	before, err := l.FirewallDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := udpRoundTrip(l.NodeNS("aks-1"), netip.AddrPortFrom(flex.Address, 9997), 500*time.Millisecond); err == nil {
		t.Error("aks-1 -> flex-1 udp 9997 passed the firewall")
	}
	// A pod's packet straight across (no tunnel) is dropped, both ways, and
	// counted; the router would route it (10.0.2.128/32 via aks-1) otherwise.
	cross, err := l.CheckPairs(ctx, [][2]string{{"flex-p1", "aks1-p1"}, {"aks1-p1", "flex-p1"}, {"flex-p1", "aks1-ext"}},
		CheckOptions{Timeout: 300 * time.Millisecond, Attempts: 1})
	if err == nil {
		t.Errorf("pods reached each other across sites without a tunnel:\n%s", cross)
	}
	for _, p := range cross.Probes {
		if p.OK {
			t.Errorf("%s -> %s %s passed the firewall without a tunnel", p.Src, p.Dst, p.Proto)
		}
	}
	after, err := l.FirewallDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// udp 9997 (1) + 2 pairs x (icmp, tcp SYN, udp) = 7 at least; aks1-p1 ->
	// flex-p1 dies earlier, in the router: no fabric route to the flex pods.
	t.Logf("firewall drops: %d before the blocked probes, %d after", before, after)
	if after-before < 7 {
		t.Errorf("firewall counted %d drops for 7 blocked packets", after-before)
	}
}

// TestSeed000VXLAN checks the benchmark's alternative on the seed topology:
// kernel VXLAN between the nodes (UDP 4789 through the firewall), vxlan0 holding
// the tunnel address on the AKS nodes, and MASQUERADE of the undeclared pod, so
// the flex pod sees aks-1's tunnel address, as with isthmus' return-path SNAT.
func TestSeed000VXLAN(t *testing.T) {
	l := upSeed000(t, DatapathVXLAN)
	ctx := context.Background()
	out, err := l.Exec(ctx, l.NodeNS("aks-1"), "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "-A POSTROUTING -s 10.0.4.10/32 -o vxlan0 -j MASQUERADE") {
		t.Errorf("aks-1 nat table lacks the MASQUERADE of 10.0.4.10:\n%s", out)
	}
	if out, err := l.Exec(ctx, l.NodeNS("aks-1"), "ip", "-br", "addr", "show", VXLANDev); err != nil || !strings.Contains(out, "100.64.0.4/32") {
		t.Errorf("aks-1 %s: %v %s, want 100.64.0.4/32", VXLANDev, err, out)
	}
	m, err := l.CheckPairs(ctx, [][2]string{{"aks1-ext", "flex-p1"}}, CheckOptions{})
	if err != nil {
		t.Fatalf("%v\n%s", err, m)
	}
	if p, _ := m.Get("aks1-ext", "flex-p1", TCP); p.Saw != netip.MustParseAddr("100.64.0.4") {
		t.Errorf("flex-p1 saw %s, want 100.64.0.4", p.Saw)
	}
	// The connection-rate loop of the SNAT benchmark, briefly, on this path.
	cr, err := ConnRate(ctx, l.PodNS("aks1-ext"), l.PodNS("flex-p1"), l.PodAddr("flex-p1"), 2, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d connections in %s (%.0f/s), %d failed, seen as %s", cr.Conns, cr.Duration.Round(time.Millisecond), cr.PerSecond(), cr.Failed, cr.Saw)
	if cr.Saw != netip.MustParseAddr("100.64.0.4") || cr.Conns < 100 || cr.Failed > 0 {
		t.Errorf("connection rate: %+v, want 100.64.0.4, at least 100 connections, none failed", cr)
	}
}
