package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/testenv"
)

// sharedLab is a lab built once for every test of the package that uses its
// scenario, and removed by downSharedLabs when the package's tests end.
type sharedLab struct {
	once sync.Once
	name string
	lab  *testenv.Lab
	err  error
}

var (
	sharedMu   sync.Mutex
	sharedLabs = map[string]*sharedLab{}
)

// upShared returns the lab of a built-in scenario shared by the tests that
// leave it as they found it; the first caller builds it (with a unique name),
// and a failed build fails every caller with the same error.
func upShared(t *testing.T, scenario string) *testenv.Lab {
	t.Helper()
	requireSetup(t)
	sharedMu.Lock()
	s := sharedLabs[scenario]
	if s == nil {
		s = &sharedLab{name: labName()}
		sharedLabs[scenario] = s
	}
	sharedMu.Unlock()
	s.once.Do(func() {
		sc, err := testenv.LoadScenario(scenario)
		if err != nil {
			s.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Up removes what it built when it fails.
		s.lab, s.err = testenv.Up(ctx, sc, testenv.Options{Name: s.name, Binary: binary, ReadyTimeout: 30 * time.Second})
	})
	if s.err != nil {
		t.Fatalf("shared lab %s (scenario %s): %v", s.name, scenario, s.err)
	}
	return s.lab
}

// downSharedLabs removes every shared lab (even one whose Up failed half way)
// and reports whether all of them are gone. TestMain calls it after the tests.
func downSharedLabs() bool {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	ok := true
	for scenario, s := range sharedLabs {
		if err := testenv.Down(s.name, testenv.DownOptions{Binary: binary}); err != nil {
			fmt.Fprintf(os.Stderr, "remove shared lab %s (scenario %s): %v\n", s.name, scenario, err)
			ok = false
		}
		ents, _ := os.ReadDir(testenv.NetnsDir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), testenv.NSName(s.name, "")) {
				fmt.Fprintf(os.Stderr, "shared lab %s: namespace %s left after down\n", s.name, e.Name())
				ok = false
			}
		}
		delete(sharedLabs, scenario)
	}
	return ok
}

// requirePairs fails unless every protocol passed between each named pair.
func requirePairs(t *testing.T, m *testenv.Matrix, what string, pairs ...[2]string) {
	t.Helper()
	for _, pr := range pairs {
		for _, proto := range testenv.Protos {
			if p, ok := m.Get(pr[0], pr[1], proto); !ok || !p.OK {
				t.Errorf("%s: %s -> %s %s: probed %v, passed %v (%s)", what, pr[0], pr[1], proto, ok, p.OK, p.Err)
			}
		}
	}
}

// TestSeed003 is seed 003 in gateway mode: flannel's
// `-s 10.16.0.0/12 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully`, FORWARD
// policy DROP and conntrack INVALID drops on every cloud node, members that
// can reach the edge only through master-gw, and yet every pod pair talks
// (member to edge, edge to member, gateway to edge, across members), every
// server sees the original pod address (forwarded traffic never meets the
// rule), and strict rp_filter drops nothing on any node (checkPaths).
func TestSeed003(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testSeed003)
}

// testSeed003 is TestSeed003 with every agent started with --decap decap.
func testSeed003(t *testing.T, decap string) {
	l := upScenarioDecap(t, "seed003", decap)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("rules", func(t *testing.T) {
		for _, n := range l.Scenario.Nodes() {
			if n.Site.Name != "cloud" {
				continue
			}
			nat, err := l.Exec(ctx, l.NodeNS(n.Name), "iptables-save", "-t", "nat")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(nat, "\n-A POSTROUTING -s 10.16.0.0/12 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully\n") {
				t.Errorf("%s: flannel's MASQUERADE --random-fully rule missing:\n%s", n.Name, nat)
			}
			filter, err := l.Exec(ctx, l.NodeNS(n.Name), "iptables-save", "-t", "filter")
			if err != nil {
				t.Fatal(err)
			}
			var forward []string
			for _, line := range strings.Split(filter, "\n") {
				if strings.HasPrefix(line, ":FORWARD ") || strings.HasPrefix(line, "-A FORWARD ") {
					forward = append(forward, line)
				}
			}
			if len(forward) < 2 || !strings.HasPrefix(forward[0], ":FORWARD DROP") ||
				forward[1] != "-A FORWARD -m conntrack --ctstate INVALID -j DROP" {
				t.Errorf("%s: want FORWARD policy DROP and conntrack INVALID dropped first, have:\n%s", n.Name, strings.Join(forward, "\n"))
			}
		}
	})

	m := checkPaths(t, l, "master-gw", "edge-gw", "master-02")
	requireOwnSources(t, l, m)
	requirePairs(t, m, "member to edge", [2]string{"m02-p1", "e01-p1"}, [2]string{"m03-p1", "egw-p1"})
	requirePairs(t, m, "edge to member", [2]string{"e01-p1", "m02-p2"}, [2]string{"egw-p1", "m03-p1"})
	requirePairs(t, m, "gateway to edge", [2]string{"mgw-p1", "e01-p1"}, [2]string{"mgw-p1", "egw-p1"})
	requirePairs(t, m, "across members", [2]string{"m02-p1", "m03-p1"}, [2]string{"m03-p1", "m02-p2"})

	t.Run("members-blocked", func(t *testing.T) {
		// The reason gateways exist here: a member's own packet to the edge
		// underlay dies in the firewall.
		edge, _ := l.Node("edge-01")
		if err := testenv.Ping(l.NodeNS("master-02"), edge.Address, 500*time.Millisecond); err == nil {
			t.Error("master-02 reached edge-01's underlay directly; the lab must force members through the gateway")
		}
	})
}

// TestSeed000Gateway is seed 000's gateway section: the seed's Sites, no
// SitePeering, a GatewayPool Internal with routedCidrs [10.0.2.0/23] on aks-1
// and the flex node, routeNodeCidrs at its default. The AKS pods and the flex
// pod talk both ways through the gateways, with strict rp_filter dropping
// nothing on any node (checkPaths). The remote site's nodeCidrs are
// routed transit only and whole (docs/gateways.md, "Node addresses"): in the
// datapath's routes map, with the flex node's endpoint 192.168.10.10 on aks-1
// routed to that peer, and in flex-1's pods' table; the host reaches every
// address of them on the underlay (`ip route get` says eth0 for the endpoint,
// for a remote node and for an address no Node holds yet), and ping works
// while the tunnel carries traffic.
func TestSeed000Gateway(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testSeed000Gateway)
}

// testSeed000Gateway is TestSeed000Gateway with every agent started with --decap decap.
func testSeed000Gateway(t *testing.T, decap string) {
	l := upScenarioDecap(t, "seed000gw", decap)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	m := checkPaths(t, l, "aks-1", "aks-2", "flex-1")
	requireOwnSources(t, l, m)
	requirePairs(t, m, "AKS pods <-> flex pod",
		[2]string{"aks1-p1", "flex-p1"}, [2]string{"flex-p1", "aks1-p1"},
		[2]string{"aks2-p1", "flex-p1"}, [2]string{"flex-p1", "aks2-p1"})

	t.Run("plan", func(t *testing.T) {
		for _, c := range []struct {
			node, nodeCidrs, endpoint string
			exception                 bool // else the pods' route to that peer
		}{
			// aks-1's pods (the declared block) reach flex-1's node address
			// through the tunnel, as its answer comes: the pods' route to
			// that peer, no exception.
			{"aks-1", "192.168.10.0/28", "192.168.10.10", false},
			{"flex-1", "10.0.0.0/27", "10.0.0.4", false},
		} {
			out, err := exec.CommandContext(ctx, binary, "plan", "--node", c.node, "--objects", l.ObjectsDir(), "-o", "json").Output()
			if err != nil {
				t.Fatalf("plan %s: %v", c.node, err)
			}
			var p plan.NodePlan
			if err := json.Unmarshal(out, &p); err != nil {
				t.Fatalf("plan %s: %v", c.node, err)
			}
			whole := slices.ContainsFunc(p.Routes, func(r plan.Route) bool {
				return r.Prefix == netip.MustParsePrefix(c.nodeCidrs) && r.TransitOnly && !r.Underlay && len(r.Group) > 0
			})
			if !whole {
				t.Errorf("plan of %s has no transit-only route for the whole %s; routes %+v", c.node, c.nodeCidrs, p.Routes)
			}
			host := netip.PrefixFrom(netip.MustParseAddr(c.endpoint), 32)
			i := slices.IndexFunc(p.Routes, func(r plan.Route) bool { return r.Prefix == host })
			switch {
			case i < 0:
				t.Errorf("plan of %s has no route for the endpoint %s inside %s", c.node, host, c.nodeCidrs)
			case c.exception && !p.Routes[i].Underlay:
				t.Errorf("plan of %s routes the endpoint %s by %+v, want an exception", c.node, host, p.Routes[i])
			case !c.exception && (p.Routes[i].Underlay || !p.Routes[i].TransitOnly || p.Routes[i].Via != host.Addr()):
				t.Errorf("plan of %s routes the endpoint %s by %+v, want the pods' route to that peer", c.node, host, p.Routes[i])
			}
			if !p.Gateway {
				t.Errorf("plan of %s: not a gateway", c.node)
			}
		}
		// What the agent wrote: aks-1's routes map holds the prefix and the
		// endpoint to that peer; flex-1's pods' table the prefix.
		out, err := exec.CommandContext(ctx, binary, "inspect", "routes", "--pin-dir", l.PinDir("aks-1")).CombinedOutput()
		if err != nil || !regexp.MustCompile(`(?m)^192\.168\.10\.0/28\s+-\s+\d+\s.*0x0$`).Match(out) ||
			!regexp.MustCompile(`(?m)^192\.168\.10\.10/32\s+192\.168\.10\.10\s.*0x0$`).Match(out) {
			t.Errorf("isthmus inspect routes on aks-1 (err %v) lacks 192.168.10.0/28 to a group or 192.168.10.10/32 to that peer:\n%s", err, out)
		}
		if out, err := l.Exec(ctx, l.NodeNS("flex-1"), "ip", "route", "show", "table", "201"); err != nil || !strings.Contains(out, "10.0.0.0/27 dev isthmus0") {
			t.Errorf("flex-1: table 201 = %q (%v), want 10.0.0.0/27 dev isthmus0 (the pods' way to the cluster's node addresses)", out, err)
		}
	})

	t.Run("underlay", func(t *testing.T) {
		// Steady traffic through the tunnel, gateway to gateway.
		srv, err := testenv.StartEchoServer(l.PodNS("flex-p1"))
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		var replies atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			to := netip.AddrPortFrom(l.PodAddr("flex-p1"), srv.UDPPort)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := testenv.UDPEcho(l.PodNS("aks1-p1"), to, 200*time.Millisecond); err == nil {
					replies.Add(1)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		defer func() { close(stop); wg.Wait() }()
		time.Sleep(300 * time.Millisecond)
		before := replies.Load()

		// neighbour: an address of the remote site's node CIDRs that is no node's;
		// node: another node of the remote site, whose own traffic with this node
		// stays on the underlay both ways (symmetric paths, docs/gateways.md).
		for _, c := range []struct {
			node, endpoint, neighbour, remoteNode string
		}{
			{"aks-1", "192.168.10.10", "192.168.10.11", ""},
			{"flex-1", "10.0.0.4", "10.0.0.6", "10.0.0.5"},
		} {
			for i := range 3 {
				if err := testenv.Ping(l.NodeNS(c.node), netip.MustParseAddr(c.endpoint), 2*time.Second); err != nil {
					t.Errorf("%s: ping %s (%d): %v", c.node, c.endpoint, i, err)
				}
			}
			out, err := l.Exec(ctx, l.NodeNS(c.node), "ip", "route", "get", c.endpoint)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: ip route get %s: %s", c.node, c.endpoint, strings.TrimSpace(out))
			if strings.Contains(out, "isthmus0") || !strings.Contains(out, "dev "+testenv.UnderlayDev) {
				t.Errorf("%s: ip route get %s = %q: the tunnel endpoint must stay on the underlay", c.node, c.endpoint, out)
			}
			// An address no Node holds yet goes as a known node's: the
			// plan subtest shows the prefix routed for pods and transit.
			out, err = l.Exec(ctx, l.NodeNS(c.node), "ip", "route", "get", c.neighbour)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out, "isthmus0") || !strings.Contains(out, "dev "+testenv.UnderlayDev) {
				t.Errorf("%s: ip route get %s = %q: an address of the remote node CIDR must stay on the underlay for the host, as a known node's", c.node, c.neighbour, out)
			}
			if c.remoteNode == "" {
				continue
			}
			out, err = l.Exec(ctx, l.NodeNS(c.node), "ip", "route", "get", c.remoteNode)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out, "isthmus0") || !strings.Contains(out, "dev "+testenv.UnderlayDev) {
				t.Errorf("%s: ip route get %s = %q: a remote node's address must stay on the underlay, as its own route back does", c.node, c.remoteNode, out)
			}
		}
		time.Sleep(300 * time.Millisecond)
		if got := replies.Load() - before; got < 5 {
			t.Errorf("the tunnel carried %d echoes aks1-p1 -> flex-p1 meanwhile, want steady traffic", got)
		}
	})
}

// TestSeed001 is seed 001's kind lab: every pod pair through the gateways
// (checkPaths), and the seed's four paths by name, each with the sending
// pod's own address seen: the remote managed pod r1-p1 to the Calico pod on
// the gateway u-gw, which has no podCIDR, and back; the remote pod to the
// Calico pod on the member u-1, through u-gw, which hands it to the site
// fabric; and the member's pod to the remote pod, through u-gw (the path
// kernel conntrack broke in the seed).
func TestSeed001(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testSeed001)
}

// testSeed001 is TestSeed001 with every agent started with --decap decap.
func testSeed001(t *testing.T, decap string) {
	l := upScenarioDecap(t, "seed001", decap)
	m := checkPaths(t, l, "u-gw", "r-gw", "u-1")
	requireOwnSources(t, l, m)
	requirePairs(t, m, "seed 001's paths",
		[2]string{"r1-p1", "ugw-p1"}, [2]string{"ugw-p1", "r1-p1"},
		[2]string{"r1-p1", "u1-p1"}, [2]string{"u1-p1", "r1-p1"})
}

// TestGatewayFailover: every pod pair first (checkPaths); then member w-1's
// flows to the remote site spread over the gateways gw-w1 and gw-w2 by
// consistent hash; gw-w2's underlay link goes down under steady traffic.
// Flows that never used gw-w2 never stop; the others resume through gw-w1
// within health interval x multiplier + 1s. The gap is measured per flow and
// printed. Strict rp_filter drops nothing meanwhile either.
func TestGatewayFailover(t *testing.T) { eachDecap(t, testGatewayFailover) }

// testGatewayFailover is TestGatewayFailover with every agent started with --decap decap.
func testGatewayFailover(t *testing.T, decap string) {
	l := upScenarioDecap(t, "gwfailover", decap)
	checkPaths(t, l, "w-1", "gw-w1", "gw-w2", "gw-e1")
	// 32 flows: the chance that none, or all, of them touch gw-w2 (either
	// direction) is below 1e-4.
	measureFailover(t, l, failover{SrcPod: "w1-p1", DstPod: "e1-p1", Flows: 32, FailNode: "gw-w2",
		Logs: []string{"w-1", "gw-w1", "gw-e1"}})
}

// TestGatewayExternal: the gateways of an External pool sit behind 1:1 NAT
// and tunnel to each other's ExternalIPs. Every pod pair talks with its own
// source and strict rp_filter dropping nothing (checkPaths), each gateway's
// plan has the other as a peer at its ExternalIP, and the tunnel between the
// sites runs between the public addresses on the wire (outside the router's
// NAT: on the remote gateway's port the outer source is the sender's public
// address).
func TestGatewayExternal(t *testing.T) {
	beside(t, weightLab)
	eachDecap(t, testGatewayExternal)
}

// testGatewayExternal is TestGatewayExternal with every agent started with --decap decap.
func testGatewayExternal(t *testing.T, decap string) {
	l := upScenarioDecap(t, "gwexternal", decap)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("plan", func(t *testing.T) {
		for _, c := range []struct{ node, peer, at string }{
			{"dc-gw", "cl-gw", "198.51.100.20"},
			{"cl-gw", "dc-gw", "203.0.113.10"},
		} {
			out, err := exec.CommandContext(ctx, binary, "plan", "--node", c.node, "--objects", l.ObjectsDir(), "-o", "json").Output()
			if err != nil {
				t.Fatalf("plan %s: %v", c.node, err)
			}
			var p plan.NodePlan
			if err := json.Unmarshal(out, &p); err != nil {
				t.Fatalf("plan %s: %v", c.node, err)
			}
			i := slices.IndexFunc(p.Peers, func(x plan.Peer) bool { return x.Name == c.peer })
			if i < 0 || p.Peers[i].Underlay != netip.MustParseAddr(c.at) {
				t.Errorf("plan of %s: want peer %s at its ExternalIP %s; peers %+v", c.node, c.peer, c.at, p.Peers)
			}
		}
	})

	m := checkPaths(t, l, "dc-gw", "cl-gw", "dc-1")
	requireOwnSources(t, l, m)
	requirePairs(t, m, "member to remote member", [2]string{"dc1-p1", "cl1-p1"}, [2]string{"cl1-p1", "dc1-p1"})

	t.Run("wire", func(t *testing.T) {
		// Between the sites the tunnel's outer source, as the receiving
		// gateway sees it, is the sender's public address.
		wait := capture(t, l.RouterNS(), testenv.RouterPort("cl-gw"), 4*time.Second)
		for i := range 5 {
			if err := testenv.Ping(l.PodNS("dc1-p1"), l.PodAddr("cl1-p1"), 500*time.Millisecond); err != nil {
				t.Errorf("ping %d of 5 dc1-p1 -> cl1-p1: %v", i+1, err)
			}
		}
		frames := wait()
		var fromDC int
		for _, f := range frames {
			if len(f.ipSrc) > 0 && len(f.ipDst) > 0 && f.ipSrc[0] == "203.0.113.10" && f.ipDst[0] == "172.24.0.10" {
				fromDC++
			}
			if len(f.ipSrc) > 0 && strings.HasPrefix(f.ipSrc[0], "172.23.") {
				t.Errorf("frame to cl-gw with dc's private outer source %s: the NAT was bypassed", f.ipSrc[0])
			}
		}
		if fromDC == 0 {
			t.Errorf("no GENEVE frame from 203.0.113.10 reached cl-gw (%d frames captured)", len(frames))
		}
	})
}
