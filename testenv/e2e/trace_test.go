package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv"
)

// TestTraceCommand: `isthmus trace` on a running node prints the datapath's
// decisions for a traced prefix live (here: the encapsulation of a pod's pings on
// a1, and the decapsulation and delivery of the replies through the stack), and on
// interrupt leaves tracing switched off again.
func TestTraceCommand(t *testing.T) {
	beside(t, weightLab)
	l := upDefault(t)
	src, dst := l.PodAddr("a1-p1"), l.PodAddr("b1-p1")
	b1, _ := l.Node("b1")
	pin := l.PinDir("a1")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := testenv.Command(ctx, l.NodeNS("a1"), binary, "trace", "--pin-dir", pin, "--prefix", dst.String())
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start isthmus trace: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	// Wait until the tracer has switched tracing on.
	flags := func() uint32 {
		m, err := maps.OpenPinned(pin)
		if err != nil {
			t.Fatalf("open a1's maps: %v", err)
		}
		defer m.Close()
		s, err := m.Read()
		if err != nil {
			t.Fatalf("read a1's maps: %v", err)
		}
		return s.Config.Flags
	}
	for deadline := time.Now().Add(10 * time.Second); flags()&maps.ConfigFlagTrace == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("isthmus trace did not switch tracing on:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	const pings = 3
	for i := 0; i < pings; i++ {
		if err := testenv.Ping(l.PodNS("a1-p1"), dst, 2*time.Second); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	time.Sleep(500 * time.Millisecond) // let the reader print the last events
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("isthmus trace exited with %v:\n%s", err, out.String())
	}
	text := out.String()
	t.Logf("trace output:\n%s", text)
	want := map[string]string{
		// Echo requests open flows: a1's stack takes them to isthmus0, whose
		// overlay_egress encapsulates them.
		"encap": fmt.Sprintf("overlay_egress isthmus0 %s -> %s icmp encap peer %s", src, dst, b1.Address),
		"decap": fmt.Sprintf("underlay_tc eth0 %s -> %s icmp decap peer %s", dst, src, b1.Address),
		// ICMP never goes around the stack: the replies are delivered through
		// isthmus0, where conntrack and the site's filters see them.
		"deliver": fmt.Sprintf("underlay_tc eth0 %s -> %s icmp deliver pod to isthmus0", dst, src),
	}
	for what, line := range want {
		if n := strings.Count(text, line); n < pings {
			t.Errorf("%s: %d lines with %q, want at least %d (one per ping)", what, n, line, pings)
		}
	}
	if f := flags(); f&maps.ConfigFlagTrace != 0 {
		t.Errorf("tracing still on after the tracer exited (config flags %#x)", f)
	}
}
