package cri

// Kernel test: needs root, network namespaces and containerd with runc (hack/
// install-deps.sh); run it under the shared kernel lock
// (flock /tmp/isthmus-kernel.lock go test ./testenv/cri/).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// TestContainerdRunsLocalImages: a private containerd in a namespace of its
// own imports the locally built images, runs a pod on that namespace's
// network (no CNI) with a probe server and reaches it through crictl exec;
// Stop leaves no directory, shim or mount behind.
func TestContainerdRunsLocalImages(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("containerd test: needs root (network namespaces, containerd, runc); run as root under flock /tmp/isthmus-kernel.lock")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	crictl, err := kubebin.Crictl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pause, probe, err := BuildImages(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("iscri%d", os.Getpid()%100000)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}
	dir, err := os.MkdirTemp("", "iscri-")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Dir: dir, NetNS: "/run/netns/" + ns, CNIBinDir: filepath.Join(dir, "cni-bin"), CNIConfDir: filepath.Join(dir, "cni-conf"), Crictl: crictl}
	c, err := Start(ctx, cfg)
	var socket string
	if c != nil {
		socket = c.Socket()
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("%s left after Stop (stat: %v)", dir, err)
			}
			if pids := c.shims(); len(pids) > 0 {
				t.Errorf("shims %v of %s left after Stop", pids, socket)
			}
			if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), dir) {
				t.Errorf("mounts under %s left after Stop", dir)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{pause, probe} {
		if err := c.Import(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	out, err := c.Crictl(ctx, "images", "-q")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(out)); n != 2 {
		t.Fatalf("crictl images: %d images, want the two imported:\n%s", n, out)
	}
	p, err := c.RunHostNetworkPod(ctx, "host")
	if err != nil {
		t.Fatalf("%v\n%s", err, c.LogTail())
	}
	srv, err := c.StartContainer(ctx, p, "server", ProbeImage, "/probe", "serve", "127.0.0.1:8080")
	if err != nil {
		t.Fatalf("%v\n%s", err, c.LogTail())
	}
	var got string
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, err = c.Exec(ctx, srv, "/probe", "get", "http://127.0.0.1:8080/")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || got != "source 127.0.0.1\n" {
		t.Fatalf("probe get in the container = %q, %v; want \"source 127.0.0.1\\n\"", got, err)
	}
	if err := c.RemovePod(ctx, p); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Crictl(ctx, "pods", "-q"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("crictl pods after RemovePod = %q, %v; want none", out, err)
	}
}
