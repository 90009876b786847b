package e2e

import (
	"context"
	be "encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/testenv"
)

// natSprayScenario is seed 000's mesh shape cut down to what the test needs: one
// AKS node with two pods from a pool the Site does not declare, so return-path SNAT
// translates both to the node's tunnel address, and a flex node with a managed pod.
const natSprayScenario = `
name: natspray
underlay:
  mtu: 1500
sites:
  - name: cluster
    subnet: 10.0.0.0/27
    objects: |
      apiVersion: isthmus.dev/v1alpha1
      kind: Site
      metadata: {name: cluster}
      spec:
        manageCniPlugin: false
        nodeCidrs: [10.0.0.0/27]
        podCidrAssignments:
          - cidrBlocks: [10.0.2.0/23]
        localCidrs: [10.0.0.0/16]
        nonMasqueradeCIDRs: [0.0.0.0/0]
    nodes:
      - name: aks-1
        address: 10.0.0.4
        annotations: {isthmus.dev/tunnel-ipv4: 100.64.0.4}
        pods:
          - {name: aks1-tcp, address: 10.0.4.10, unmanaged: true}
          - {name: aks1-spray, address: 10.0.4.11, unmanaged: true}
  - name: flex-site
    subnet: 192.168.10.0/28
    objects: |
      apiVersion: isthmus.dev/v1alpha1
      kind: Site
      metadata: {name: flex-site}
      spec:
        nodeCidrs: [192.168.10.0/28]
        podCidrAssignments:
          - cidrBlocks: [192.168.20.0/24]
            nodeBlockSizes: {ipv4: 25}
        nonMasqueradeCIDRs: [192.168.20.0/24]
    nodes:
      - name: flex-1
        address: 192.168.10.10
        podCIDR: 192.168.20.0/25
        pods:
          - {name: flex-p1, address: 192.168.20.6}
objects: |
  apiVersion: isthmus.dev/v1alpha1
  kind: SitePeering
  metadata: {name: cluster-flex}
  spec:
    sites: [cluster, flex-site]
    meshNodes: true
    tunnelProtocol: GENEVE
`

// natSprayFlows is how many UDP flows the spraying pod opens.
const natSprayFlows = 100000

// pingPong is a long-lived TCP connection from a pod (client) to a server in
// another pod, over which the server sends first: every exchange is the server's
// numbered message, answered by the client. A reply to the translated address that
// the node could not translate back ends it: the host resets it.
type pingPong struct {
	server, client net.Conn
	seq            uint64
}

// exchangeDeadline bounds one round. A lost translation ends the connection at once
// (the host resets it) and a stalled one never recovers, so the bound only has to
// outlast TCP's retransmission backoff when a loaded machine drops a few segments
// in a row (the fourth retransmission leaves 3 s after the first send): losing
// segments to a full backlog is congestion, not a broken flow.
const exchangeDeadline = 15 * time.Second

// exchange runs one round both ways with a deadline and returns the error, if any.
func (p *pingPong) exchange() error {
	p.seq++
	var msg, back [8]byte
	be.BigEndian.PutUint64(msg[:], p.seq)
	deadline := time.Now().Add(exchangeDeadline)
	p.server.SetDeadline(deadline)
	p.client.SetDeadline(deadline)
	if _, err := p.server.Write(msg[:]); err != nil {
		return fmt.Errorf("round %d: server write: %w", p.seq, err)
	}
	if _, err := io.ReadFull(p.client, back[:]); err != nil {
		return fmt.Errorf("round %d: client read: %w", p.seq, err)
	}
	if back != msg {
		return fmt.Errorf("round %d: client read %x, want %x", p.seq, back, msg)
	}
	if _, err := p.client.Write(back[:]); err != nil {
		return fmt.Errorf("round %d: client write: %w", p.seq, err)
	}
	if _, err := io.ReadFull(p.server, back[:]); err != nil {
		return fmt.Errorf("round %d: server read: %w", p.seq, err)
	}
	if back != msg {
		return fmt.Errorf("round %d: server read %x, want %x", p.seq, back, msg)
	}
	return nil
}

// TestNATSprayKeepsOtherFlows: one pod (aks1-spray) sends 100,000 UDP flows (distinct
// destination ports, two source ports) through return-path SNAT while another pod
// (aks1-tcp) of the same node holds two TCP connections through it to a remote pod,
// one exchanging data both ways every 250 ms throughout, one before and after the
// spray only, with the remote side sending first, so a lost translation shows as
// the host's reset. The spraying pod
// gets its share of the nat table (--snat-flows-per-source) and no more: its other
// flows are dropped as nat_source_limit, neither TCP connection breaks, and the
// other pod's new flows still get translated.
func TestNATSprayKeepsOtherFlows(t *testing.T) {
	requireSetup(t)
	sc, err := testenv.ParseScenario([]byte(natSprayScenario))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := upLab(ctx, t, sc, testenv.Options{})
	sprayKeepsFlow(t, l, "aks-1", "aks1-tcp", "aks1-spray", l.PodNS("flex-p1"), l.PodAddr("flex-p1"), "100.64.0.4")
}

// TestMasqSprayKeepsOtherFlows is TestNATSprayKeepsOtherFlows through egress
// masquerade (masq_nat): on the egress scenario's node a1, pod a1-p1 sprays 100,000
// UDP flows to the world while a1-p2's TCP connection to the world, masqueraded to
// a1's underlay address, keeps working.
func TestMasqSprayKeepsOtherFlows(t *testing.T) {
	l := upScenario(t, "egress")
	n, _ := l.Node("a1")
	sprayKeepsFlow(t, l, "a1", "a1-p2", "a1-p1", l.WorldNS(), testenv.WorldAddr, n.Address.String())
}

// connectPingPong connects from pod to the listener ln at to and checks the server
// sees the connection from seen (node's translated address). Both ends are closed
// when the test ends.
func connectPingPong(t *testing.T, l *testenv.Lab, ln net.Listener, pod string, to netip.AddrPort, node, seen string) *pingPong {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	p := &pingPong{}
	if err := testenv.Do(l.PodNS(pod), func() (err error) {
		p.client, err = net.DialTimeout("tcp4", to.String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("connect %s -> %s: %v", pod, to, err)
	}
	t.Cleanup(func() { p.client.Close() })
	select {
	case p.server = <-accepted:
	case <-time.After(5 * time.Second):
	}
	if p.server == nil {
		t.Fatal("the server accepted no connection")
	}
	t.Cleanup(func() { p.server.Close() })
	if got := p.server.RemoteAddr().(*net.TCPAddr).IP.String(); got != seen {
		t.Fatalf("the server sees the connection from %s, want %s's translated address %s", got, node, seen)
	}
	return p
}

// sprayKeepsFlow runs the spray test on node: tcpPod connects to a server in
// serverNS at serverAddr, which must see it from seen (the translated address),
// while sprayPod sprays natSprayFlows UDP flows to serverAddr.
func sprayKeepsFlow(t *testing.T, l *testenv.Lab, node, tcpPod, sprayPod, serverNS string, serverAddr netip.Addr, seen string) {
	t.Helper()
	flexAddr := serverAddr
	var ln net.Listener
	if err := testenv.Do(serverNS, func() (err error) {
		ln, err = net.Listen("tcp4", ":0")
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", serverNS, err)
	}
	defer ln.Close()
	to := netip.AddrPortFrom(flexAddr, uint16(ln.Addr().(*net.TCPAddr).Port))
	// Two connections: p exchanges every 250 ms throughout, idle only before and
	// after the spray, as an idle connection of a pool would be: a kernel LRU keeps
	// a busy flow's entries, not an idle one's.
	p := connectPingPong(t, l, ln, tcpPod, to, node, seen)
	idle := connectPingPong(t, l, ln, tcpPod, to, node, seen)
	for _, c := range []*pingPong{p, idle} {
		if err := c.exchange(); err != nil {
			t.Fatalf("before the spray: %v", err)
		}
	}

	// p's exchanges go on every 250 ms during the spray.
	stop := make(chan struct{})
	var (
		wg      sync.WaitGroup
		tcpErr  error
		rounds  int
		started = time.Now()
	)
	var slowest time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			began := time.Now()
			if err := p.exchange(); err != nil {
				tcpErr = err
				return
			}
			slowest = max(slowest, time.Since(began))
			rounds++
		}
	}()

	var sent int
	err := testenv.Do(l.PodNS(sprayPod), func() error {
		for _, sport := range []int{40001, 40002} {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: sport})
			if err != nil {
				return err
			}
			msg := []byte("spray")
			for i := 0; i < natSprayFlows/2; i++ {
				dst := netip.AddrPortFrom(flexAddr, uint16(1+i))
				if _, err := c.WriteToUDPAddrPort(msg, dst); err == nil {
					sent++
				}
			}
			c.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("spray from %s: %v", sprayPod, err)
	}
	sprayed := time.Since(started)
	// Let the exchanges run a while after the spray too.
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	if tcpErr != nil {
		t.Fatalf("the TCP connection of %s broke during the spray of %d flows (after %d rounds, %v): %v", tcpPod, sent, rounds, time.Since(started).Round(time.Millisecond), tcpErr)
	}
	if err := p.exchange(); err != nil {
		t.Fatalf("after the spray: %v", err)
	}
	if err := idle.exchange(); err != nil {
		t.Fatalf("the connection of %s idle during the spray, after it: %v", tcpPod, err)
	}
	t.Logf("%d datagrams sprayed in %v; %d exchanges during and after, all answered, the slowest in %v", sent, sprayed.Round(time.Millisecond), rounds, slowest.Round(time.Millisecond))
	if sent < natSprayFlows*9/10 {
		t.Fatalf("only %d of %d datagrams left the spraying pod", sent, natSprayFlows)
	}

	// The spraying pod was held to its share, counted.
	var limited, created uint64
	for k, c := range nodeMetrics(t, l, node) {
		switch {
		case k.IsDrop() && k.Name() == "nat_source_limit":
			limited += c.Packets
		case k.Name() == "snat_new":
			created += c.Packets
		}
	}
	t.Logf("%s: %d new translations, %d packets dropped as nat_source_limit", node, created, limited)
	share := uint64(datapath.DefaultNatSourceFlows(datapath.DefaultNatEntries)) // the agent's default --snat-flows-per-source
	if want := uint64(sent) - share - 64; limited < want {
		t.Errorf("%s dropped %d packets as nat_source_limit, want at least %d (%d sent, share %d)", node, limited, want, sent, share)
	}
	// The lab's sum over every node (what the SNAT benchmark checks its rounds
	// with) sees the same drops.
	if sum, err := l.DatapathCount("nat_source_limit"); err != nil || sum < limited {
		t.Errorf("Lab.DatapathCount(nat_source_limit) = %d, %v, want at least %s's %d", sum, err, node, limited)
	}
	// And the other pod can still open flows: a new TCP connection is translated.
	var c2 net.Conn
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	if err := testenv.Do(l.PodNS(tcpPod), func() (err error) {
		c2, err = net.DialTimeout("tcp4", to.String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("a new connection from %s after the spray: %v", tcpPod, err)
	}
	c2.Close()
}
