package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// serviceFlowScript opens a TCP connection to argv[1]:argv[2] (a ClusterIP) and
// prints "SPORT NEXTSEQ": its source port and the sequence number its next byte
// will carry (the SYN's, read off the pod's own interface with a packet socket,
// plus one). It sends nothing, so that sequence number is the only one a
// legitimate ICMP error about the flow can quote (Linux ignores an error quoting
// one outside snd_una..snd_nxt). It keeps the connection open until stdin closes.
const serviceFlowScript = `
import socket, struct, sys
vip, port = sys.argv[1], int(sys.argv[2])
# ETH_P_ALL: only taps of every protocol see the packets this host sends.
raw = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0003))
raw.settimeout(5)
s = socket.create_connection((vip, port), timeout=5)
sport = s.getsockname()[1]
while True:
    ip, addr = raw.recvfrom(65535)
    if addr[1] != 0x0800:
        continue
    ihl = (ip[0] & 15) * 4
    if ip[9] != 6 or socket.inet_ntoa(ip[16:20]) != vip:
        continue
    tcp = ip[ihl:]
    sp, = struct.unpack("!H", tcp[0:2])
    if sp == sport and tcp[13] & 0x12 == 0x02:
        seq, = struct.unpack("!I", tcp[4:8])
        break
print(sport, (seq + 1) & 0xffffffff, flush=True)
sys.stdin.read()
s.close()
`

// fragNeededScript sends, from the backend pod, the ICMP frag-needed a router on
// the path back to the client would send about the client's segment argv[1]:argv[3]
// -> argv[2]:argv[4] with sequence argv[5], announcing an MTU of argv[6]. The
// quoted header is the one on the wire: after kube-proxy's DNAT, to the backend.
const fragNeededScript = `
import sys
from scapy.all import IP, ICMP, TCP, send, conf, L3RawSocket
conf.verb = 0
conf.L3socket = L3RawSocket
client, backend = sys.argv[1], sys.argv[2]
sport, dport, seq, mtu = (int(a) for a in sys.argv[3:7])
quoted = IP(src=client, dst=backend, flags="DF", ttl=63, len=1450, proto=6)/TCP(sport=sport, dport=dport, seq=seq, flags="A")
send(IP(src=backend, dst=client)/ICMP(type=3, code=4, nexthopmtu=mtu)/bytes(quoted)[:28], count=1)
`

// checkServiceFragNeeded proves that an ICMP error about a Service flow reaches the
// client translated back: client opens a TCP connection to svc's ClusterIP, whose
// only backend is the pod backend on a remote node; the backend's side sends the
// frag-needed a router on the path would (quoting the segment as it travels, to the
// backend's own address), and the client's kernel must lower its path MTU to the
// ClusterIP. Only conntrack's RELATED handling on the client's node, where
// kube-proxy's DNAT happened, rewrites the quoted destination back to the
// ClusterIP; an error delivered around the stack quotes an address the client never
// dialled, its kernel finds no socket for it, and path MTU discovery black-holes.
// The client's kernel is the oracle: `ip route get` shows the MTU it learnt.
func checkServiceFragNeeded(ctx context.Context, t *testing.T, l *testenv.Lab, client, backend string, svc testenv.Service, backendPort uint16) {
	t.Helper()
	const mtu = 1234
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := l.Exec(ctx, l.PodNS(client), "ip", "route", "flush", "cache"); err != nil {
		t.Fatalf("flush %s's route cache: %v\n%s", client, err, out)
	}
	cmd := testenv.Command(ctx, l.PodNS(client), "/usr/bin/python3", "-c", serviceFlowScript,
		svc.ClusterIP.String(), strconv.Itoa(int(svc.Port)))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the client's flow in %s: %v", client, err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil && err != io.EOF {
		t.Fatalf("%s -> %s:%d: %v", client, svc.ClusterIP, svc.Port, err)
	}
	var sport, seq uint64
	if _, err := fmt.Sscan(line, &sport, &seq); err != nil {
		stdin.Close()
		_ = cmd.Wait()
		t.Fatalf("%s -> %s:%d: no connection (%q): %s", client, svc.ClusterIP, svc.Port, line, stderr.String())
	}
	if out, err := l.Exec(ctx, l.PodNS(backend), "/usr/bin/python3", "-c", fragNeededScript,
		l.PodAddr(client).String(), l.PodAddr(backend).String(), strconv.FormatUint(sport, 10),
		strconv.Itoa(int(backendPort)), strconv.FormatUint(seq, 10), strconv.Itoa(mtu)); err != nil {
		t.Fatalf("send frag-needed from %s: %v\n%s", backend, err, out)
	}
	want := "mtu " + strconv.Itoa(mtu)
	var route string
	for deadline := time.Now().Add(3 * time.Second); ; {
		out, err := l.Exec(ctx, l.PodNS(client), "ip", "-4", "route", "get", svc.ClusterIP.String())
		if err != nil {
			t.Fatalf("ip route get in %s: %v\n%s", client, err, out)
		}
		route = strings.Join(strings.Fields(out), " ")
		if strings.Contains(route, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(route, want) {
		t.Errorf("frag-needed (%d) about %s:%d -> %s (%s:%d, sequence %d) from %s: %s never learnt it for the ClusterIP: %s",
			mtu, l.PodAddr(client), sport, l.PodAddr(backend), svc.ClusterIP, svc.Port, seq, backend, client, route)
		return
	}
	t.Logf("frag-needed about %s -> %s (backend %s): %s learnt %q", client, svc.ClusterIP, backend, client, route)
}
