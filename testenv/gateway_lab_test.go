package testenv

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// udpSourceAt answers every datagram on port of the namespace with the source
// address it came from.
func udpSourceAt(t *testing.T, ns string, port int) {
	t.Helper()
	udpServerAt(t, ns, port, func(_ []byte, from net.Addr) []byte {
		return []byte(from.(*net.UDPAddr).AddrPort().Addr().Unmap().String() + "\n")
	})
}

// TestGatewayTopology builds gwBase without any datapath and checks the lab's
// gateway features: the firewall passes ICMP and the tunnel port between the
// gateways of different sites only, the router maps each externalAddress 1:1
// to its node (DNAT in, SNAT out of the site, none inside it), the Node object
// carries the ExternalIP, and a node's own MASQUERADE rule is installed
// verbatim.
func TestGatewayTopology(t *testing.T) {
	requireRoot(t)
	sc, err := ParseScenario([]byte(gwBase))
	if err != nil {
		t.Fatal(err)
	}
	l := upScenario(t, sc, DatapathNone, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := netip.MustParseAddr

	// Gateways reach each other, by internal and by external address.
	for _, c := range []struct{ from, to string }{
		{"g1", "192.168.2.10"}, {"g2", "192.168.1.10"}, {"g1", "198.51.100.10"}, {"g2", "203.0.113.10"}, {"m1", "192.168.1.10"},
	} {
		if err := Ping(l.NodeNS(c.from), addr(c.to), 2*time.Second); err != nil {
			t.Errorf("ping %s -> %s: %v", c.from, c.to, err)
		}
	}
	// The source each one is seen with: external out of its site, its own
	// inside.
	udpSourceAt(t, l.NodeNS("g2"), GenevePort)
	udpSourceAt(t, l.NodeNS("g1"), GenevePort)
	for _, c := range []struct{ from, to, saw string }{
		{"g1", "198.51.100.10", "203.0.113.10"},
		{"g1", "192.168.2.10", "203.0.113.10"},
		{"g2", "203.0.113.10", "198.51.100.10"},
		{"m1", "192.168.1.10", "192.168.1.11"},
	} {
		saw, err := UDPEcho(l.NodeNS(c.from), netip.AddrPortFrom(addr(c.to), GenevePort), 2*time.Second)
		if err != nil {
			t.Errorf("udp %s -> %s:%d: %v", c.from, c.to, GenevePort, err)
		} else if saw != addr(c.saw) {
			t.Errorf("udp %s -> %s:%d: seen as %s, want %s", c.from, c.to, GenevePort, saw, c.saw)
		}
	}
	// Members and nodes outside the pools do not cross sites.
	before, err := l.FirewallDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to string }{
		{"m1", "192.168.2.10"}, {"m1", "198.51.100.10"}, {"n3", "192.168.1.10"}, {"g1", "192.168.3.10"},
	} {
		if err := Ping(l.NodeNS(c.from), addr(c.to), 300*time.Millisecond); err == nil {
			t.Errorf("ping %s -> %s passed the firewall; only gateways cross sites", c.from, c.to)
		}
	}
	if _, err := UDPEcho(l.NodeNS("m1"), netip.AddrPortFrom(addr("192.168.2.10"), GenevePort), 300*time.Millisecond); err == nil {
		t.Errorf("udp m1 -> g2:%d passed the firewall; only gateways cross sites", GenevePort)
	}
	after, err := l.FirewallDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 5 {
		t.Errorf("firewall counted %d drops for 5 blocked packets", after-before)
	}

	out, err := l.Exec(ctx, l.NodeNS("g1"), "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE --random-fully\n") || strings.Contains(out, "224.0.0.0/4") {
		t.Errorf("g1 nat table: want exactly the scenario's MASQUERADE rule:\n%s", out)
	}
	if out, _ := l.Exec(ctx, l.NodeNS("m1"), "iptables-save", "-t", "nat"); strings.Contains(out, "MASQUERADE") {
		t.Errorf("m1 has leftover rules, the scenario gives it none:\n%s", out)
	}
}
