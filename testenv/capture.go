package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// CaptureGeneve pings dstPod from srcPod while tshark listens on the router port
// of srcPod's node, and returns tshark's decode of the first two GENEVE frames (the
// request leaving, the reply arriving): the overlay as an independent decoder sees
// it on the wire. It needs tshark.
func (l *Lab) CaptureGeneve(ctx context.Context, srcPod, dstPod string) (string, error) {
	src, ok := l.Pod(srcPod)
	if !ok {
		return "", fmt.Errorf("capture: no pod %q", srcPod)
	}
	dst := l.PodAddr(dstPod)
	if !dst.IsValid() {
		return "", fmt.Errorf("capture: no pod %q", dstPod)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return Capture(ctx, l.RouterNS(), []string{"-i", RouterPort(src.Node),
		"-f", "udp port 6081", "-d", "udp.port==6081,geneve", "-c", "2", "-O", "geneve"},
		func() {
			if err := Ping(l.PodNS(srcPod), dst, time.Second); err != nil {
				l.logf("capture: ping %s -> %s: %v", srcPod, dstPod, err)
			}
		})
}

// Capture runs tshark -n -l with args (an interface, a filter and a packet count
// -c, so that it ends) in the namespace nsName and, once it listens, calls traffic
// every 200 ms until tshark exits or ctx ends. It returns tshark's output: an
// independent decoder's view of the wire. It needs tshark.
func Capture(ctx context.Context, nsName string, args []string, traffic func()) (string, error) {
	cmd := Command(ctx, nsName, append([]string{"tshark", "-n", "-l"}, args...)...)
	var out strings.Builder
	cmd.Stdout = &out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", fmt.Errorf("capture: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("capture: start tshark: %w", err)
	}
	started := make(chan struct{})
	var errText strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			errText.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "Capturing on") {
				close(started)
				break
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	select {
	case <-started:
		// tshark says so a moment before its capture process really listens.
		time.Sleep(time.Second)
	case <-ctx.Done():
		cmd.Process.Kill()
		cmd.Wait()
		return "", fmt.Errorf("capture: tshark did not start: %s", errText.String())
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		traffic()
		select {
		case err := <-done:
			if err != nil {
				return out.String(), fmt.Errorf("capture: tshark: %w", err)
			}
			return out.String(), nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}
