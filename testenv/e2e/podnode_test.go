package e2e

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// servePeerAddrTCP runs socat in namespace ns, answering every TCP connection on
// port with the address it comes from, and returns once it accepts connections: a
// fixed wait is too short for a process started on a loaded machine, and a pod's
// dial that finds no listener is refused at once.
func servePeerAddrTCP(ctx context.Context, t *testing.T, ns, port string) {
	t.Helper()
	srv := testenv.Command(ctx, ns, "socat", "TCP-LISTEN:"+port+",reuseaddr,fork", "SYSTEM:echo $SOCAT_PEERADDR")
	if err := srv.Start(); err != nil {
		t.Fatalf("start socat in %s: %v", ns, err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := testenv.Do(ns, func() error {
			c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("socat in %s does not listen on port %s: %v", ns, port, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// podNodeCases are pods of seed 003 dialling a node's underlay address, each
// expecting the node's host to see the pod's own address: within the edge
// site (gateway pod to member, member pod to gateway), within the cloud site
// (where flannel's MASQUERADE would give the pod its node's address on the
// underlay), and across the sites through both gateways (the members'
// addresses are not reachable there at all: the firewall passes only what
// the gateways' own addresses send each other).
var podNodeCases = []struct{ pod, node string }{
	{"egw-p1", "edge-01"},
	{"e01-p1", "edge-gw"},
	{"m02-p1", "master-03"},
	{"m02-p1", "edge-01"},
	{"mgw-p1", "edge-01"},
	{"e01-p1", "master-02"},
}

// TestPodToNodeAddress: on seed 003, with strict rp_filter on every node, a
// pod reaches another node's underlay address (a TCP server, socat, in that
// node's host namespace), and the server sees the pod's own address: the
// request goes through the tunnel, as the node's answer does (issue 11; on
// main the SYN arrived on edge-01's underlay from a pod address edge-01
// routes into isthmus0, and rp_filter dropped it). tshark on the router port
// of edge-gw decodes the request crossing the underlay as GENEVE, the pod's
// address inside.
func TestPodToNodeAddress(t *testing.T) {
	beside(t, weightLab)
	l := upScenario(t, "seed003")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const port = "8090"
	for _, n := range l.Scenario.Nodes() {
		if out, err := l.Exec(ctx, l.NodeNS(n.Name), "sysctl", "-n", "net.ipv4.conf.all.rp_filter"); err != nil || strings.TrimSpace(out) != "1" {
			t.Fatalf("%s: net.ipv4.conf.all.rp_filter = %q (%v), want strict (1)", n.Name, strings.TrimSpace(out), err)
		}
		servePeerAddrTCP(ctx, t, l.NodeNS(n.Name), port)
	}
	dial := func(pod string, to netip.Addr) (string, error) {
		var out string
		var err error
		for range 3 {
			if out, err = l.Exec(ctx, l.PodNS(pod), "socat", "-t3", "-T3", "-", "TCP:"+to.String()+":"+port+",connect-timeout=3"); err == nil {
				break
			}
		}
		return strings.TrimSpace(out), err
	}
	for _, c := range podNodeCases {
		n, _ := l.Node(c.node)
		saw, err := dial(c.pod, n.Address)
		if want := l.PodAddr(c.pod).String(); err != nil || saw != want {
			t.Errorf("%s -> %s %s: server saw %q (%v), want the pod's %s", c.pod, c.node, n.Address, saw, err, want)
			continue
		}
		t.Logf("%s -> %s %s: server saw %s", c.pod, c.node, n.Address, saw)
	}

	t.Run("geneve", func(t *testing.T) {
		gw, _ := l.Node("edge-gw")
		member, _ := l.Node("edge-01")
		pod := l.PodAddr("egw-p1")
		out, err := testenv.Capture(ctx, l.RouterNS(), []string{"-i", testenv.RouterPort("edge-gw"),
			"-f", "udp port 6081 and src host " + gw.Address.String() + " and dst host " + member.Address.String(),
			"-d", "udp.port==6081,geneve", "-c", "3", "-T", "fields", "-E", "separator=;",
			"-e", "ip.src", "-e", "ip.dst", "-e", "tcp.dstport"},
			func() { dial("egw-p1", member.Address) })
		if err != nil {
			t.Fatalf("capture: %v\n%s", err, out)
		}
		want := gw.Address.String() + "," + pod.String() + ";" + member.Address.String() + "," + member.Address.String() + ";" + port
		if !strings.Contains(out, want) {
			t.Errorf("tshark saw no GENEVE frame %s (outer,inner source / outer,inner destination / port):\n%s", want, out)
		}
	})
}
