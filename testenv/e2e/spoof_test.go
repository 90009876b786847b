package e2e

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// receiveScript prints "ready", then the source address and payload of every UDP
// datagram that reaches port argv[1], until a second after the first one tagged
// argv[2] (sent last) or argv[3] seconds: the receiving kernel's socket is the oracle
// of what source a pod was shown.
const receiveScript = `
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(0.2)
print("ready", flush=True)
end = time.time() + float(sys.argv[3])
while time.time() < end:
    try:
        data, addr = s.recvfrom(2048)
    except socket.timeout:
        continue
    tag = data.decode(errors="replace")
    print(addr[0], tag, flush=True)
    if tag == sys.argv[2]:
        end = min(end, time.time() + 1)
`

// sendAsScript sends, for each argument src=tag after argv[1] (destination) and
// argv[2] (port), three UDP datagrams from source src (whatever the interface's
// address is) carrying tag, in order, as a compromised pod with CAP_NET_RAW can.
const sendAsScript = `
import sys
from scapy.all import IP, UDP, Raw, send, conf, L3RawSocket
conf.L3socket = L3RawSocket  # the kernel routes and resolves the gateway, as for any socket
dst, port = sys.argv[1], int(sys.argv[2])
for arg in sys.argv[3:]:
    src, tag = arg.split("=")
    send(IP(src=src, dst=dst, ttl=64) / UDP(sport=40000, dport=port) / Raw(tag.encode()), count=3, inter=0.1, verbose=False)
`

// TestPodSpoofedSource: a pod (a1-p1) sending UDP with the source of its neighbour
// on the same node (a1-p2) to a pod of the other site: the receiver never sees the
// neighbour's address, and a1 counts the drop at pod_ingress: as pod_src_not_reserved,
// since the lab's managed pods are the CNI plugin's (their addresses come from the
// IPAM reservations; the FIB check, pod_src_spoofed, is for other CNIs' interfaces
// and is covered in bpf/harden_test.go).
// The same pod sending from its own address is received, so the receiver works.
func TestPodSpoofedSource(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	sender, neighbour, receiver := "a1-p1", "a1-p2", "b1-p1"
	const port = 7777
	code := dropCode(t, "DROP_POD_SRC_NOT_RESERVED")
	before := packets(nodeMetrics(t, l, "a1"), code, maps.HookPodIngress)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	recv := testenv.Command(ctx, l.PodNS(receiver), "/usr/bin/python3", "-c", receiveScript, strconv.Itoa(port), "own", "60")
	stdout, err := recv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := recv.Start(); err != nil {
		t.Fatalf("start receiver: %v", err)
	}
	t.Cleanup(func() { recv.Process.Kill(); recv.Wait() })
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("receiver in %s did not start: %q", receiver, sc.Text())
	}
	// The forged datagrams first: the receiver stops a second after the first own one.
	if out, err := l.Exec(ctx, l.PodNS(sender), "/usr/bin/python3", "-c", sendAsScript,
		l.PodAddr(receiver).String(), strconv.Itoa(port),
		l.PodAddr(neighbour).String()+"=spoofed", l.PodAddr(sender).String()+"=own"); err != nil {
		t.Fatalf("send from %s: %v\n%s", sender, err, out)
	}
	seen := map[string]int{}
	for sc.Scan() {
		seen[sc.Text()]++
	}
	t.Logf("%s received: %v", receiver, seen)
	own := l.PodAddr(sender).String() + " own"
	if seen[own] == 0 {
		t.Fatalf("%s never received %s's datagrams from its own address: the check proves nothing", receiver, sender)
	}
	for line := range seen {
		if strings.HasPrefix(line, l.PodAddr(neighbour).String()+" ") || strings.HasSuffix(line, " spoofed") {
			t.Errorf("%s received a datagram with a forged source: %q", receiver, line)
		}
	}
	m := nodeMetrics(t, l, "a1")
	if got := packets(m, code, maps.HookPodIngress) - before; got < 3 {
		t.Errorf("a1 counted %d pod_src_not_reserved drops at pod_ingress, want at least 3; counters:\n%s", got, formatMetrics(m))
	}
}
