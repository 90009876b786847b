package image_test

// Kernel test: needs root (mmdebstrap, a network namespace, containerd with
// runc); run it under the shared kernel lock
// (flock -o /tmp/isthmus-kernel.lock go test ./testenv/image -run TestImageRuns).
// The first run downloads Debian trixie (about 40 MB, a few minutes) into
// /var/cache/isthmus; later runs take about a minute.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv/cri"
	"github.com/isthmus-dev/isthmus/testenv/image"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// TestImageRunsInContainerd: the archive Build writes imports into a private
// containerd with ctr, under the name a pod spec's "isthmus:<version>"
// resolves to, and containers from it run the image's entrypoint (isthmus),
// the CNI plugin, bpftool, iproute2, iptables and nft, with a shell; dpkg in
// the image lists the Dockerfile's packages; the apt lists are gone.
func TestImageRunsInContainerd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("image test: needs root (mmdebstrap, network namespaces, containerd, runc); run as root under flock -o /tmp/isthmus-kernel.lock")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const version = "imagetest"
	a, err := image.Build(ctx, image.Options{Version: version, Out: filepath.Join(t.TempDir(), "isthmus.oci.tar"), Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if want := "docker.io/library/isthmus:" + version; a.Ref != want {
		t.Errorf("Build: Ref %q, want %q", a.Ref, want)
	}

	crictl, err := kubebin.Crictl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("isimg%d", os.Getpid()%100000)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	dir, err := os.MkdirTemp("", "isimg-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cri.Start(ctx, cri.Config{Dir: dir, NetNS: "/run/netns/" + ns, CNIBinDir: filepath.Join(dir, "cni-bin"), CNIConfDir: filepath.Join(dir, "cni-conf"), Crictl: crictl})
	if c != nil {
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := image.Import(ctx, c.Socket(), a); err != nil {
		t.Fatal(err)
	}
	// Twice: a node's second import (a restarted lab) must not fail.
	if err := image.Import(ctx, c.Socket(), a); err != nil {
		t.Fatalf("second import: %v", err)
	}
	// The CRI plugin resolves a pod spec's short name as the kubelet asks for it.
	if out, err := c.Crictl(ctx, "inspecti", "isthmus:"+version); err != nil {
		t.Fatalf("crictl inspecti isthmus:%s: %v\n%s", version, err, out)
	}

	n := 0
	run := func(env []string, argv ...string) (string, error) {
		n++
		args := []string{"--address", c.Socket(), "--namespace", "k8s.io", "run", "--rm", "--runc-root", filepath.Join(dir, "runc")}
		for _, e := range env {
			args = append(args, "--env", e)
		}
		args = append(args, a.Ref, fmt.Sprintf("isimg-%d", n))
		args = append(args, argv...)
		out, err := exec.CommandContext(ctx, "ctr", args...).CombinedOutput()
		return string(out), err
	}
	for _, c := range []struct {
		name string
		env  []string
		argv []string // none: the image's entrypoint
		want []string // substrings of the output
	}{
		{name: "entrypoint", want: []string{"eBPF GENEVE datapath", "Usage:"}},
		{name: "isthmus --help", argv: []string{"isthmus", "--help"}, want: []string{"agent", "controller", "uninstall"}},
		{name: "isthmus-cni VERSION", env: []string{"CNI_COMMAND=VERSION"}, argv: []string{"isthmus-cni"}, want: []string{`"supportedVersions"`}},
		// The conflist's cniVersions go up to 1.1.0: portmap must speak it.
		{name: "portmap VERSION", env: []string{"CNI_COMMAND=VERSION"}, argv: []string{"portmap"}, want: []string{`"supportedVersions"`, `"1.1.0"`}},
		{name: "bpftool version", argv: []string{"bpftool", "version"}, want: []string{"bpftool v7."}},
		{name: "shell and tools", argv: []string{"sh", "-c", "test -x /usr/local/bin/isthmus && test -x /usr/local/bin/isthmus-cni && ip -V && iptables --version && nft --version"},
			want: []string{"iproute2", "(nf_tables)", "nftables v"}},
		{name: "dpkg", argv: []string{"dpkg-query", "-W", "-f", "${Package} ${Status}\n", "bpftool", "iproute2", "iptables", "nftables"},
			want: []string{"bpftool install ok installed", "iproute2 install ok installed", "iptables install ok installed", "nftables install ok installed"}},
		{name: "no apt lists", argv: []string{"sh", "-c", "find /var/lib/apt/lists -type f ! -name lock | wc -l"}, want: []string{"0\n"}},
	} {
		out, err := run(c.env, c.argv...)
		if err != nil {
			t.Errorf("%s: ctr run: %v\n%s", c.name, err, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", c.name, w, out)
			}
		}
	}
	// A package the image does not install is not there, and asking for it
	// fails: the checks above are not vacuous.
	if out, err := run(nil, "dpkg-query", "-W", "curl"); err == nil {
		t.Errorf("dpkg-query finds curl in the image, which installs no curl:\n%s", out)
	}
}
