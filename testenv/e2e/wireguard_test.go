package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// wanFrame is one frame tshark decoded on a router port: every IPv4 address in
// it (outer and inner), its protocols, and the WireGuard message types in it.
type wanFrame struct {
	protocols string
	addrs     []string
	wgTypes   []string
}

// captureWAN runs tshark on the router port of node for d while traffic runs,
// decoding UDP port wgPort as WireGuard and 6081 as GENEVE, and returns every
// frame (ARP and IPv6 aside). tshark is the independent judge of what the wire
// carries.
func captureWAN(t *testing.T, l *testenv.Lab, node string, wgPort int, d time.Duration, traffic func()) []wanFrame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+20*time.Second)
	defer cancel()
	args := []string{"-i", testenv.RouterPort(node), "-f", "ip", "-a", fmt.Sprintf("duration:%d", int(d.Seconds())),
		"-d", fmt.Sprintf("udp.port==%d,wg", wgPort), "-d", "udp.port==6081,geneve",
		"-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,",
		"-e", "frame.protocols", "-e", "ip.addr", "-e", "wg.type"}
	out, err := testenv.Capture(ctx, l.RouterNS(), args, traffic)
	if err != nil {
		t.Fatalf("capture on %s: %v\n%s", testenv.RouterPort(node), err, out)
	}
	var frames []wanFrame
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "\t")
		for len(f) < 3 {
			f = append(f, "")
		}
		frames = append(frames, wanFrame{protocols: f[0], addrs: strings.Split(f[1], ","), wgTypes: strings.Split(f[2], ",")})
	}
	return frames
}

// judgeWAN fails t unless every frame between the sites (a site-b address in it)
// is WireGuard and shows no pod address, and returns how many WireGuard
// transport-data messages (type 4) it saw.
func judgeWAN(t *testing.T, frames []wanFrame, siteB netip.Prefix, pods []netip.Prefix) (data int) {
	t.Helper()
	for _, f := range frames {
		cross := false
		for _, a := range f.addrs {
			if ip, err := netip.ParseAddr(a); err == nil && siteB.Contains(ip) {
				cross = true
			}
		}
		if !cross {
			continue
		}
		for _, a := range f.addrs {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				continue
			}
			for _, p := range pods {
				if p.Contains(ip) {
					t.Errorf("pod address %s in the clear between the sites: %s %v", ip, f.protocols, f.addrs)
				}
			}
		}
		if !strings.HasSuffix(f.protocols, ":udp:wg") {
			t.Errorf("frame between the sites is not WireGuard: %s %v", f.protocols, f.addrs)
		}
		for _, w := range f.wgTypes {
			if w == "4" {
				data++
			}
		}
	}
	return data
}

// TestWireGuardBetweenSites: on the wireguard scenario (two sites across a
// router, the peering encrypted) every pod pair reaches every other both ways
// with its own address under strict rp_filter (checkPaths); on the WAN, decoded by
// tshark, everything between the sites is WireGuard and no pod address shows. With
// WireGuard's port blocked on the router, the pods lose each other and still
// nothing leaves in the clear; unblocked, they are back within 30 s.
func TestWireGuardBetweenSites(t *testing.T) {
	beside(t, weightLab)
	l := upScenario(t, "wireguard")
	checkPaths(t, l, "a1", "b1")
	siteB := netip.MustParsePrefix("172.16.2.0/24")
	pods := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.245.0.0/16")}
	dst := l.PodAddr("b1-p1")
	ping := func() {
		if err := testenv.Ping(l.PodNS("a1-p1"), dst, time.Second); err != nil {
			t.Logf("ping a1-p1 -> b1-p1: %v", err)
		}
	}
	frames := captureWAN(t, l, "a1", 51820, 4*time.Second, ping)
	if n := judgeWAN(t, frames, siteB, pods); n == 0 {
		t.Errorf("no WireGuard transport data between the sites in %d frames", len(frames))
	}
	checkInspectWireGuard(t, l, "a1", 2)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	block := []string{"iptables", "-w", "-I", "FORWARD", "-p", "udp", "--dport", "51820", "-j", "DROP"}
	if out, err := l.Exec(ctx, l.RouterNS(), block...); err != nil {
		t.Fatalf("block WireGuard on the router: %v: %s", err, out)
	}
	// Sessions time out or not, every new packet meets the block.
	blocked := captureWAN(t, l, "a1", 51820, 4*time.Second, ping)
	judgeWAN(t, blocked, siteB, pods)
	if err := testenv.Ping(l.PodNS("a1-p1"), dst, 2*time.Second); err == nil {
		t.Error("a1-p1 reached b1-p1 with WireGuard blocked on the router")
	}
	unblock := append([]string{"iptables", "-w", "-D"}, block[3:]...)
	if out, err := l.Exec(ctx, l.RouterNS(), unblock...); err != nil {
		t.Fatalf("unblock WireGuard: %v: %s", err, out)
	}
	start := time.Now()
	for {
		if err := testenv.Ping(l.PodNS("a1-p1"), dst, time.Second); err == nil {
			t.Logf("back %s after the unblock", time.Since(start).Round(100*time.Millisecond))
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("a1-p1 still cannot reach b1-p1 30 s after WireGuard was unblocked")
		}
	}
}

// checkInspectWireGuard fails t unless `isthmus inspect wireguard` on node agrees
// with `wg show DEVICE dump` (wireguard-tools, the reference): the same peers with
// the same endpoints, allowed IPs and latest handshake, and byte counts that only
// grew between the two reads; and unless the node has want peers, each with a
// handshake.
func checkInspectWireGuard(t *testing.T, l *testenv.Lab, node string, want int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dev := testenv.WireGuardDevice(l.Name, node)
	out, err := l.Exec(ctx, l.NodeNS(node), l.Binary, "inspect", "wireguard", "--wireguard-device", dev, "-o", "json")
	if err != nil {
		t.Fatalf("inspect wireguard on %s: %v\n%s", node, err, out)
	}
	var got struct {
		PublicKey string `json:"publicKey"`
		Peers     []struct {
			PublicKey       string    `json:"publicKey"`
			Endpoint        string    `json:"endpoint"`
			AllowedIPs      []string  `json:"allowedIPs"`
			LatestHandshake time.Time `json:"latestHandshake"`
			ReceiveBytes    int64     `json:"receiveBytes"`
			TransmitBytes   int64     `json:"transmitBytes"`
		} `json:"peers"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("inspect wireguard -o json: %v\n%s", err, out)
	}
	devKey, wgPeers := wgShowDump(t, l, node)
	if devKey != got.PublicKey {
		t.Errorf("device public key: wg %q, inspect %q", devKey, got.PublicKey)
	}
	if len(got.Peers) != len(wgPeers) || len(got.Peers) != want {
		t.Errorf("%s: inspect shows %d peers, wg %d, want %d", node, len(got.Peers), len(wgPeers), want)
	}
	for _, p := range got.Peers {
		f, ok := wgPeers[p.PublicKey]
		if !ok {
			t.Errorf("peer %s in inspect, not in wg show", p.PublicKey)
			continue
		}
		allowed := strings.Split(f[3], ",")
		slices.Sort(allowed)
		mine := slices.Sorted(slices.Values(p.AllowedIPs))
		hs, _ := strconv.ParseInt(f[4], 10, 64)
		rx, _ := strconv.ParseInt(f[5], 10, 64)
		tx, _ := strconv.ParseInt(f[6], 10, 64)
		if f[2] != p.Endpoint || !slices.Equal(allowed, mine) || hs != p.LatestHandshake.Unix() || rx < p.ReceiveBytes || tx < p.TransmitBytes {
			t.Errorf("peer %s: inspect endpoint %s allowed %v handshake %d rx %d tx %d; wg %v",
				p.PublicKey, p.Endpoint, mine, p.LatestHandshake.Unix(), p.ReceiveBytes, p.TransmitBytes, f)
		}
		if hs == 0 {
			t.Errorf("peer %s (%v): no handshake", p.PublicKey, mine)
		}
	}
}

// wgShowDump reads node's WireGuard device with `wg show DEVICE dump`
// (wireguard-tools, the reference): its public key, and each peer's fields by
// public key (public key, preshared key, endpoint, allowed IPs, latest
// handshake, bytes received, bytes sent, keepalive).
func wgShowDump(t *testing.T, l *testenv.Lab, node string) (string, map[string][]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dev := testenv.WireGuardDevice(l.Name, node)
	dump, err := l.Exec(ctx, l.NodeNS(node), "wg", "show", dev, "dump")
	if err != nil {
		t.Fatalf("wg show %s dump: %v\n%s", dev, err, dump)
	}
	lines := strings.Split(strings.TrimSpace(dump), "\n")
	f := strings.Split(lines[0], "\t")
	if len(f) < 2 {
		t.Fatalf("wg show %s dump: device line %q", dev, lines[0])
	}
	peers := map[string][]string{}
	for _, line := range lines[1:] {
		if pf := strings.Split(line, "\t"); len(pf) == 8 {
			peers[pf[0]] = pf
		}
	}
	return f[1], peers
}

// TestWireGuardBehindNAT: on the wgnat scenario an edge site sits behind a
// masquerading NAT that lets nothing in it did not open, and its gateway has no
// address the cloud can reach; the assignment is encrypted. Traffic from the
// cloud reaches the edge as soon as the agents are up, before any edge pod has
// spoken (the edge gateway's keepalive opens the NAT, the cloud gateway learns
// its endpoint); every pod pair then works both ways under strict rp_filter; on
// the cloud gateway's WAN port, decoded by tshark, everything to and from the
// NAT's address is WireGuard with no pod address in sight; and after the NAT
// forgets its mappings (conntrack flushed in the router) traffic comes back
// within 30 s by itself. Gateway failover works through the NAT: flows from the
// cloud move from one edge gateway to the other when it fails, and back.
func TestWireGuardBehindNAT(t *testing.T) {
	beside(t, weightLab)
	l := upScenario(t, "wgnat")
	reach := func(what string, limit time.Duration) {
		t.Helper()
		start := time.Now()
		for {
			if err := testenv.Ping(l.PodNS("cl1-p1"), l.PodAddr("ed1-p1"), time.Second); err == nil {
				t.Logf("%s: cl1-p1 reached ed1-p1 after %s", what, time.Since(start).Round(100*time.Millisecond))
				return
			}
			if time.Since(start) > limit {
				t.Fatalf("%s: cl1-p1 cannot reach ed1-p1 after %s", what, limit)
			}
		}
	}
	reach("cloud first", 30*time.Second)
	checkPaths(t, l, "cl-gw", "ed-gw")

	nat := netip.MustParsePrefix("203.0.113.50/32")
	pods := []netip.Prefix{netip.MustParsePrefix("10.72.0.0/16"), netip.MustParsePrefix("10.73.0.0/16")}
	frames := captureWAN(t, l, "cl-gw", 51820, 4*time.Second, func() {
		if err := testenv.Ping(l.PodNS("ed1-p1"), l.PodAddr("cl1-p1"), time.Second); err != nil {
			t.Logf("ping ed1-p1 -> cl1-p1: %v", err)
		}
	})
	if n := judgeWAN(t, frames, nat, pods); n == 0 {
		t.Errorf("no WireGuard transport data to or from the NAT's address in %d frames", len(frames))
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := l.Exec(ctx, l.RouterNS(), "conntrack", "-F"); err != nil {
		t.Fatalf("flush the NAT's mappings: %v: %s", err, out)
	}
	reach("after the NAT forgot its mappings", 30*time.Second)

	// Failover through the NAT: the cloud gateway spreads flows to the edge
	// over both edge gateways; with ed-gw's link down its health checks
	// (through WireGuard, to an endpoint learnt through the NAT) move them to
	// ed-gw2, and back when it heals.
	measureFailover(t, l, failover{SrcPod: "cl1-p1", DstPod: "ed1-p1", Flows: 16, FailNode: "ed-gw",
		Heal: func(ctx context.Context) error {
			n, _ := l.Node("ed-gw")
			if _, err := l.Exec(ctx, l.NodeNS("ed-gw"), "ip", "link", "set", testenv.UnderlayDev, "up"); err != nil {
				return err
			}
			_, err := l.Exec(ctx, l.NodeNS("ed-gw"), "ip", "route", "replace", "default", "via", n.Site.Gateway.String())
			return err
		},
		Logs: []string{"cl-gw", "ed-gw", "ed-gw2", "ed-1"}})
}

// TestWireGuardTwoNATs: on the wgrelay scenario two edge sites, each behind its
// own masquerading NAT with no inbound path, reach each other through the cloud
// gateway: every pod pair both ways with its own source under strict rp_filter
// (checkPaths). Neither edge gateway has a WireGuard peer in the other edge;
// each has only the cloud gateway, at its ExternalIP. On the cloud gateway's
// WAN port, decoded by tshark, what the edges exchange arrives and leaves as
// WireGuard data to and from both NATs' addresses, and no pod address shows.
func TestWireGuardTwoNATs(t *testing.T) {
	beside(t, weightLab)
	l := upScenario(t, "wgrelay")
	start := time.Now()
	for testenv.Ping(l.PodNS("sh1-p1"), l.PodAddr("ho1-p1"), time.Second) != nil {
		if time.Since(start) > 30*time.Second {
			t.Fatal("sh1-p1 cannot reach ho1-p1 through the cloud gateway after 30 s")
		}
	}
	checkPaths(t, l, "cl-gw", "sh-gw", "ho-gw")

	cloudKey, _ := wgShowDump(t, l, "cl-gw")
	for _, gw := range []string{"sh-gw", "ho-gw"} {
		_, peers := wgShowDump(t, l, gw)
		if cl, ok := peers[cloudKey]; len(peers) != 1 || !ok || cl[2] != "198.51.100.31:51820" {
			t.Errorf("%s's WireGuard peers %v, want only cl-gw (%s) at 198.51.100.31:51820", gw, peers, cloudKey)
		}
	}

	pods := []netip.Prefix{netip.MustParsePrefix("10.74.0.0/16"), netip.MustParsePrefix("10.75.0.0/16"), netip.MustParsePrefix("10.76.0.0/16")}
	frames := captureWAN(t, l, "cl-gw", 51820, 4*time.Second, func() {
		for _, pair := range [][2]string{{"sh1-p1", "ho1-p1"}, {"ho1-p1", "sh1-p1"}} {
			if err := testenv.Ping(l.PodNS(pair[0]), l.PodAddr(pair[1]), time.Second); err != nil {
				t.Logf("ping %s -> %s: %v", pair[0], pair[1], err)
			}
		}
	})
	for _, nat := range []string{"203.0.113.51/32", "203.0.113.52/32"} {
		if n := judgeWAN(t, frames, netip.MustParsePrefix(nat), pods); n == 0 {
			t.Errorf("no WireGuard transport data to or from the NAT %s in %d frames", nat, len(frames))
		}
	}
}

// readFile returns the content of path, failing t if it cannot be read.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wireGuardStreams starts steady UDP both ways between a1-p1 and b1-p1 of the
// wireguard scenario, every interval, after checking the pair answers pings.
func wireGuardStreams(t *testing.T, l *testenv.Lab, interval time.Duration) []*stream {
	t.Helper()
	for _, pr := range [][2]string{{"a1-p1", "b1-p1"}, {"b1-p1", "a1-p1"}} {
		if err := testenv.Ping(l.PodNS(pr[0]), l.PodAddr(pr[1]), 2*time.Second); err != nil {
			t.Fatalf("ping %s -> %s: %v", pr[0], pr[1], err)
		}
	}
	return []*stream{
		startStream(t, l, "a1-p1", "b1-p1", interval),
		startStream(t, l, "b1-p1", "a1-p1", interval),
	}
}

// TestWireGuardAgentRestarts: three restarts of the agents of a1 and b1 under
// 200 packets per second each way between their pods, encrypted, lose nothing:
// the WireGuard devices are processes of their own, their sessions outlive the
// agents, and each restarted agent adopts its device.
func TestWireGuardAgentRestarts(t *testing.T) {
	l := upScenario(t, "wireguard")
	const interval = 5 * time.Millisecond
	streams := wireGuardStreams(t, l, interval)
	time.Sleep(300 * time.Millisecond)
	restarted := []string{"a1", "b1"}
	for round := 1; round <= 3; round++ {
		restartAgents(t, l, round, restarted)
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	checkNoLoss(t, streams, interval, "restarts with encryption on")
	for _, n := range restarted {
		if got := strings.Count(readFile(t, l.AgentLog(n)), "adopted=true"); got != 3 {
			t.Errorf("%s: %d starts adopted the WireGuard device, want 3:\n%s", n, got, tailFile(l.AgentLog(n)))
		}
	}
}

// TestWireGuardKeyRotation: a node's key is rotated under 200 packets per
// second each way between its pod and a pod of the other site, as the docs say
// (`isthmus wireguard-key --rotate` on the node, then the new public key in the
// Node's annotation): the node's device takes the new key at once, its peers
// replace the old key by the new one and complete a handshake, and the streams
// lose nothing (what waits for the handshake is queued in the devices).
func TestWireGuardKeyRotation(t *testing.T) {
	l := upScenario(t, "wireguard")
	old, _ := wgShowDump(t, l, "a1")
	const interval = 5 * time.Millisecond
	streams := wireGuardStreams(t, l, interval)
	time.Sleep(300 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := l.Exec(ctx, l.NodeNS("a1"), l.Binary, "wireguard-key", "--rotate", "--state-dir", l.NodeStateDir("a1"))
	if err != nil {
		t.Fatalf("wireguard-key --rotate: %v\n%s", err, out)
	}
	rotated := strings.TrimSpace(out)
	if rotated == old {
		t.Fatalf("--rotate printed the old key %s", old)
	}
	start := time.Now()
	for {
		if dev, _ := wgShowDump(t, l, "a1"); dev == rotated {
			break
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("a1's device does not have the rotated key after 2 s (the agent's watch of its key directory)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("a1's device took the new key after %s", time.Since(start).Round(time.Millisecond))
	if err := l.PublishWireGuardKey("a1"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for _, peer := range []string{"b1", "b2"} {
		for {
			_, peers := wgShowDump(t, l, peer)
			_, stale := peers[old]
			if f, ok := peers[rotated]; ok && !stale && f[4] != "0" {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s has not replaced a1's key by the new one with a handshake after 10 s: %v", peer, peers)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Logf("b1 and b2 handshook with a1's new key %s after publishing", time.Since(start).Round(time.Millisecond))
	// The streams go on under the new sessions (checkNoLoss wants 500
	// datagrams each, the rotation takes well under a second).
	time.Sleep(3 * time.Second)
	checkNoLoss(t, streams, interval, "key rotation")
	if !strings.Contains(readFile(t, l.AgentLog("a1")), "WireGuard key rotated") {
		t.Errorf("a1's agent did not log the rotation:\n%s", tailFile(l.AgentLog("a1")))
	}
}
