package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// windowScript runs in a client pod's namespace: it waits (printing "ready" once it
// listens) for the next segment with payload from argv[1]:argv[3] to argv[2]:argv[4],
// takes the client's next sequence number from it (seq + payload), and sends from
// the client's own address, for each further argument: "rst-out" an RST 2^30 past
// that number, "fin-out" a FIN-ACK there (both outside any window the server
// accepts), "rst-in" an RST at exactly that number (the one the server expects:
// RFC 5961 accepts it). Prints "sent" and the number.
const windowScript = `
import sys, time
from scapy.all import IP, TCP, AsyncSniffer, send, conf, L3RawSocket
conf.L3socket = L3RawSocket  # the kernel routes it, as for any socket
src, dst, sport, dport = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def ours(p):
    return (IP in p and TCP in p and p[IP].src == src and p[IP].dst == dst and
            p[TCP].sport == sport and p[TCP].dport == dport and len(p[TCP].payload) > 0)
sn = AsyncSniffer(lfilter=ours, count=1, timeout=20)
sn.start()
time.sleep(1)
print("ready", flush=True)
sn.join()
if not sn.results:
    print("no segment", flush=True)
    sys.exit(1)
p = sn.results[0][TCP]
nxt = (p.seq + len(p.payload)) & 0xffffffff
far = (nxt + 0x40000000) & 0xffffffff
for k in sys.argv[5:]:
    if k == "rst-out":
        seg = TCP(sport=sport, dport=dport, flags="R", seq=far)
    elif k == "fin-out":
        seg = TCP(sport=sport, dport=dport, flags="FA", seq=far, ack=p.ack)
    elif k == "rst-in":
        seg = TCP(sport=sport, dport=dport, flags="R", seq=nxt)
    else:
        sys.exit("unknown segment " + k)
    send(IP(src=src, dst=dst, ttl=64) / seg, verbose=False)
    time.sleep(0.2)
print("sent", nxt, flush=True)
`

// injectSegments starts windowScript in the client pod's namespace for the flow client ->
// dst from sport with the segments kinds, calls trigger (which must make the client
// send data) once the script listens, and waits until it has sent them.
func injectSegments(ctx context.Context, t *testing.T, l *testenv.Lab, client string, sport uint16, dst netip.AddrPort, trigger func() error, kinds ...string) {
	t.Helper()
	args := append([]string{"/usr/bin/python3", "-c", windowScript, l.PodAddr(client).String(), dst.Addr().String(),
		strconv.Itoa(int(sport)), strconv.Itoa(int(dst.Port()))}, kinds...)
	cmd := testenv.Command(ctx, l.PodNS(client), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start injector: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("injector did not start: %q %s", sc.Text(), stderr.String())
	}
	if err := trigger(); err != nil {
		t.Fatal(err)
	}
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "sent ") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("injector: %q %s", sc.Text(), stderr.String())
	}
	t.Logf("injected %v at the client's next sequence number %s", kinds, strings.TrimPrefix(sc.Text(), "sent "))
}

// echoRound sends msg from c, reads it back as s echoes it, within 2 s.
func echoRound(c, s net.Conn, msg []byte) error {
	deadline := time.Now().Add(2 * time.Second)
	c.SetDeadline(deadline)
	s.SetDeadline(deadline)
	defer c.SetDeadline(time.Time{})
	defer s.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("client: send: %w", err)
	}
	if err := readExactly(s, msg); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if _, err := s.Write(msg); err != nil {
		return fmt.Errorf("server: send: %w", err)
	}
	if err := readExactly(c, msg); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return nil
}

// TestConntrackFastPathWindow: on the conntrack fast path (both nodes of the default
// lab, with the CNI leftovers' `--ctstate INVALID -j DROP` and the short conntrack
// timeouts of TestConntrackFastPath), the close of a flow cannot be driven by a
// segment outside the window (docs/architecture.md, "The conntrack fast path"):
//   - an RST and a FIN 2^30 past the client's sequence number, sent from the client
//     pod into a live flow, leave it on the fast path on both nodes for longer than
//     the TIME_WAIT and CLOSE timeouts together: every echo round carries data both
//     ways, ct_fast keeps counting it, the INVALID rules drop nothing, and conntrack
//     still gives the flow more than the TIME_WAIT timeout at the end;
//   - an RST at exactly the sequence number the server expects ends the flow: the
//     server's socket is reset, the client's next data is answered with a reset, and
//     the server's node forgets the flow within the CLOSE timeout.
func TestConntrackFastPathWindow(t *testing.T) {
	l := upDefault(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	client, server := "a1-p1", "b1-p1"
	nodes := []string{"a1", "b1"}
	invalid := shortCtTimeouts(ctx, t, l, nodes)
	fast := func() map[string]uint64 {
		m := map[string]uint64{}
		for _, n := range nodes {
			m[n] = counterPackets(t, l, n, "ct_fast", false)
		}
		return m
	}
	msg := bytes.Repeat([]byte("window"), 100)

	t.Run("outside the window", func(t *testing.T) {
		dst := netip.AddrPortFrom(l.PodAddr(server), 5311)
		c, s, sport := connPair(ctx, t, l.PodNS(client), l.PodNS(server), dst)
		for i := 0; i < 3; i++ { // established and assured: on the fast path
			if err := echoRound(c, s, msg); err != nil {
				t.Fatalf("round %d before: %v", i, err)
			}
		}
		invalidBefore, fastBefore := invalid(), fast()
		injectSegments(ctx, t, l, client, sport, dst, func() error { return echoRound(c, s, msg) }, "rst-out", "fin-out")
		// Past TIME_WAIT and CLOSE together: an entry either shortened would be gone.
		rounds := 0
		for end := time.Now().Add(time.Duration(ctTimeWait+ctClose+1) * time.Second); time.Now().Before(end); rounds++ {
			if err := echoRound(c, s, msg); err != nil {
				t.Fatalf("round %d after the segments outside the window: %v\n%s", rounds, err, countersText(t, l, "b1"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		after := fast()
		for _, n := range nodes {
			// Each round is two data segments and their ACKs on each node.
			if d := after[n] - fastBefore[n]; d < uint64(2*rounds) {
				t.Errorf("%s: ct_fast counted %d packets over %d rounds after the injection, want at least %d: the flow left the fast path", n, d, rounds, 2*rounds)
			}
			left, ok := ctTimeout(ctx, t, l, n, sport, dst)
			t.Logf("%s: conntrack gives the flow %d s more (present %v)", n, left, ok)
			if !ok || left <= ctTimeWait {
				t.Errorf("%s: conntrack gives the flow %d s (present %v), want more than the TIME_WAIT %d s: a segment outside the window shortened it", n, left, ok, ctTimeWait)
			}
		}
		if n := invalid(); n != invalidBefore {
			t.Errorf("the INVALID drop rules counted %d packets after the injection", n-invalidBefore)
		}
	})

	t.Run("in the window", func(t *testing.T) {
		dst := netip.AddrPortFrom(l.PodAddr(server), 5312)
		c, s, sport := connPair(ctx, t, l.PodNS(client), l.PodNS(server), dst)
		for i := 0; i < 3; i++ {
			if err := echoRound(c, s, msg); err != nil {
				t.Fatalf("round %d before: %v", i, err)
			}
		}
		fastBefore := fast()
		// The client sends without waiting for the echo: the injected RST follows
		// its last byte, at the number the server expects next.
		injectSegments(ctx, t, l, client, sport, dst, func() error {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			defer c.SetDeadline(time.Time{})
			_, err := c.Write(msg)
			return err
		}, "rst-in")
		if d := fast()["a1"] - fastBefore["a1"]; d == 0 {
			t.Errorf("a1: ct_fast counted nothing of the flow's last segment and the RST: not on the fast path")
		}
		// The server's socket is reset: its reads end in ECONNRESET (after the bytes
		// that came before the RST, if the kernel still hands them over).
		s.SetDeadline(time.Now().Add(3 * time.Second))
		var read int
		var err error
		for err == nil {
			var n int
			n, err = s.Read(make([]byte, 4096))
			read += n
		}
		if !errors.Is(err, syscall.ECONNRESET) || read > len(msg) {
			t.Fatalf("server: after the RST, read %d bytes and then %v; want at most the %d sent and a reset", read, err, len(msg))
		}
		// The server's node forgets the flow within the CLOSE timeout.
		deadline := time.Now().Add(time.Duration(ctClose+3) * time.Second)
		_, ok := ctTimeout(ctx, t, l, "b1", sport, dst)
		for ok && time.Now().Before(deadline) {
			time.Sleep(250 * time.Millisecond)
			_, ok = ctTimeout(ctx, t, l, "b1", sport, dst)
		}
		if ok {
			t.Errorf("b1: conntrack still holds the reset flow %d s after the RST", ctClose+3)
		}
		// The client's next data meets no socket: a reset ends its side too.
		c.SetDeadline(time.Now().Add(3 * time.Second))
		err = nil
		for i := 0; i < 3 && err == nil; i++ {
			if _, err = c.Write(msg); err == nil {
				_, err = c.Read(make([]byte, 1))
			}
		}
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Errorf("client: after the RST the flow still answers (%v), want a reset", err)
		}
	})
}
