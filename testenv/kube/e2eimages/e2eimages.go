// Package e2eimages builds the test images that Kubernetes' conformance
// suite (e2e.test, testenv/kube/kubebin.E2ETest) runs its network tests
// with, from their sources in the same k8s.io/kubernetes release, as OCI
// archives that a lab node's containerd imports (testenv/cri): no registry
// is reachable, and nothing is pulled.
//
//   - agnhost: test/images/agnhost, built static (kubebin.Agnhost), over a
//     Debian layer with the tools its Dockerfile installs on Alpine (curl,
//     nc, dig, ip and ss, iperf, bash, socat), which the suite runs inside
//     its pods; entrypoint /agnhost, command pause, as upstream.
//   - pause: build/pause/linux/pause.c compiled statically with gcc, alone
//     in its image, user 65535, as upstream.
//   - glibc-dns-testing: the DNS cases' glibc querier, upstream a Debian
//     with dnsutils (dig; getent of glibc); here agnhost's Debian layer,
//     which has them, alone. (Upstream's also carries a CoreDNS 1.5.0 of the
//     configmap cases, which no case of docs/conformance.md's focus runs.)
//   - nginx: upstream nginx:1.27-alpine; here Debian's nginx package over
//     the suite's base, running `nginx -g "daemon off;"` on port 80 as
//     upstream's does. The Endpoints and EndpointSlice cases run it as a
//     backend that must start.
//
// The names and tags are the suite's own: Build asks the built e2e.test
// (--list-images), so a release bump renames the images with it.
package e2eimages

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/isthmus-dev/isthmus/testenv/image"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// Images this package builds, by the last element of the repository path
// the suite names them with (registry.k8s.io/e2e-test-images/agnhost:2.66.1,
// registry.k8s.io/pause:3.10.2).
const (
	Agnhost         = "agnhost"
	Pause           = "pause"
	GlibcDNSTesting = "glibc-dns-testing"
	Nginx           = "nginx"
)

// NginxPackages are the Debian packages of the nginx image.
var NginxPackages = []string{"nginx"}

// AgnhostPackages are the Debian packages of the agnhost image: those of the
// `apk add` line of test/images/agnhost/Dockerfile (bind-tools curl
// netcat-openbsd iproute2 iperf bash util-linux-misc socat), by their Debian
// names. util-linux (ipcs) is in every Debian root filesystem.
var AgnhostPackages = []string{"bash", "bind9-dnsutils", "curl", "iperf", "iproute2", "netcat-openbsd", "socat"}

// Archive is an image archive and the names the suite knows its image by.
type Archive struct {
	// Image is Agnhost or Pause.
	Image string
	// Path is the archive (an OCI image layout in a tar).
	Path string
	// Names are the references the suite asks for, each an index entry of
	// the archive, so that containerd imports the image under all of them.
	Names []string
}

// refRe is an image reference as --list-images prints it, whole: a registry
// host (and port), a repository path and a tag. Digests do not occur.
var refRe = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// ParseImageList reads the output of `e2e.test --list-images`: an image
// reference a line. It returns them sorted, each once, and fails on a line
// that is no reference (the suite changed its output) or on none at all.
func ParseImageList(out string) ([]string, error) {
	var refs []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if !refRe.MatchString(line) {
			return nil, fmt.Errorf("parse the suite's image list: line %d %q is no image reference (registry/path:tag)", n, line)
		}
		refs = append(refs, line)
	}
	if len(refs) == 0 {
		return nil, errors.New("parse the suite's image list: no image")
	}
	slices.Sort(refs)
	return slices.Compact(refs), nil
}

// Select returns the references among refs whose repository path ends in
// the element image ("agnhost" selects .../e2e-test-images/agnhost:2.66.1
// but not .../agnhost-windows:1).
func Select(refs []string, image string) []string {
	var out []string
	for _, r := range refs {
		repo := r[:strings.LastIndexByte(r, ':')]
		if repo[strings.LastIndexByte(repo, '/')+1:] == image {
			out = append(out, r)
		}
	}
	return out
}

// Tag returns the tag of a reference.
func Tag(ref string) string { return ref[strings.LastIndexByte(ref, ':')+1:] }

// ListImages runs `e2eTest --list-images` and parses what it prints.
func ListImages(ctx context.Context, e2eTest string) ([]string, error) {
	cmd := exec.CommandContext(ctx, e2eTest, "--list-images")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-images: %w\n%s", e2eTest, err, kubebin.TailLines(stderr.String(), 20))
	}
	return ParseImageList(string(out))
}

// Options say where Build finds what it builds from.
type Options struct {
	// CacheDir holds the agnhost image's Debian layer; "" is
	// image.CacheDir() (shared with the kube binaries).
	CacheDir string
	// Log, when set, receives a line for each step that takes a while.
	Log func(format string, args ...any)
}

// Build writes the agnhost, pause, glibc-dns-testing and nginx archives of
// the suite e2eTest (the binary of kubebin.E2ETest) into dir, named as the
// suite names them, and returns them in that order. agnhost is the binary kubebin builds beside
// e2eTest, pause.c comes from the same k8s.io/kubernetes source
// (kubebin.KubernetesSource). It needs root the first time, when mmdebstrap
// makes the Debian layer (a few minutes; cached), and gcc with a static C
// library.
func Build(ctx context.Context, dir, e2eTest string) ([]Archive, error) {
	return BuildWith(ctx, dir, e2eTest, Options{})
}

// BuildWith is Build with options.
func BuildWith(ctx context.Context, dir, e2eTest string, o Options) ([]Archive, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	refs, err := ListImages(ctx, e2eTest)
	if err != nil {
		return nil, err
	}
	agnhostNames, pauseNames := Select(refs, Agnhost), Select(refs, Pause)
	if len(agnhostNames) == 0 || len(pauseNames) == 0 {
		return nil, fmt.Errorf("build the suite's images: %s lists agnhost %q and pause %q, want both", e2eTest, agnhostNames, pauseNames)
	}
	src, err := kubebin.KubernetesSource(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("build the suite's images: %w", err)
	}
	work, err := os.MkdirTemp(dir, "work-")
	if err != nil {
		return nil, fmt.Errorf("build the suite's images: %w", err)
	}
	defer os.RemoveAll(work)

	agnhost, err := buildAgnhost(ctx, dir, work, src, agnhostNames, o)
	if err != nil {
		return nil, err
	}
	pause, err := buildPause(ctx, dir, work, src, pauseNames, o)
	if err != nil {
		return nil, err
	}
	glibc, err := buildDebianImage(ctx, dir, Select(refs, GlibcDNSTesting), GlibcDNSTesting, AgnhostPackages,
		image.Config{Cmd: []string{"bash"}, Env: []string{image.DefaultPath}}, o)
	if err != nil {
		return nil, err
	}
	nginx, err := buildDebianImage(ctx, dir, Select(refs, Nginx), Nginx, NginxPackages,
		image.Config{Cmd: []string{"nginx", "-g", "daemon off;"}, Env: []string{image.DefaultPath}}, o)
	if err != nil {
		return nil, err
	}
	return []Archive{agnhost, pause, glibc, nginx}, nil
}

// buildDebianImage writes an image of a Debian layer with packages alone
// (image.DebianLayer, cached), under names, with cfg.
func buildDebianImage(ctx context.Context, dir string, names []string, name string, packages []string, cfg image.Config, o Options) (Archive, error) {
	if len(names) == 0 {
		return Archive{}, fmt.Errorf("build the suite's images: the suite lists no %s", name)
	}
	base, err := image.DebianLayer(ctx, image.Debian{Packages: packages, CacheDir: o.CacheDir, Log: o.Log})
	if err != nil {
		return Archive{}, fmt.Errorf("%s image: %w", name, err)
	}
	a := Archive{Image: name, Path: filepath.Join(dir, name+".oci.tar"), Names: names}
	o.Log("%s: write %s (%s)", name, a.Path, strings.Join(names, " "))
	if err := image.WriteArchive(a.Path, cfg, []image.Layer{base}, names...); err != nil {
		return Archive{}, err
	}
	return a, nil
}

// buildAgnhost writes the agnhost image: the Debian layer, then a layer
// with what test/images/agnhost/Dockerfile adds (the binary and its
// agnhost-2 link, porter's certificate and key, /uploads, the user and
// group of the SupplementalGroups tests).
func buildAgnhost(ctx context.Context, dir, work, src string, names []string, o Options) (Archive, error) {
	o.Log("agnhost: the binary (kubebin, cached with e2e.test)")
	bin, err := kubebin.Agnhost(ctx, logWriter{o.Log})
	if err != nil {
		return Archive{}, err
	}
	base, err := image.DebianLayer(ctx, image.Debian{Packages: AgnhostPackages, CacheDir: o.CacheDir, Log: o.Log})
	if err != nil {
		return Archive{}, fmt.Errorf("agnhost image: %w", err)
	}
	passwd, group, err := baseAccounts(base)
	if err != nil {
		return Archive{}, fmt.Errorf("agnhost image: %w", err)
	}
	passwd, group = strings.TrimRight(passwd, "\n")+"\n", strings.TrimRight(group, "\n")+"\n"
	passwd += "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
	group += "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
	agnhostSrc := filepath.Join(src, "test", "images", "agnhost")
	version, err := os.ReadFile(filepath.Join(agnhostSrc, "VERSION"))
	if err != nil {
		return Archive{}, fmt.Errorf("agnhost image: %w", err)
	}
	top, err := image.WriteLayer(filepath.Join(work, "agnhost.layer"), []image.Entry{
		{Name: "agnhost", Src: bin},
		{Name: "agnhost-2", Link: "agnhost"},
		{Name: "etc/group", Data: []byte(group), Mode: 0o644},
		{Name: "etc/passwd", Data: []byte(passwd), Mode: 0o644},
		{Name: "home/"},
		{Name: "home/user-defined-in-image/"},
		{Name: "localhost.crt", Src: filepath.Join(agnhostSrc, "porter", "localhost.crt"), Mode: 0o644},
		{Name: "localhost.key", Src: filepath.Join(agnhostSrc, "porter", "localhost.key"), Mode: 0o644},
		{Name: "uploads/"},
	})
	if err != nil {
		return Archive{}, fmt.Errorf("agnhost image: %w", err)
	}
	a := Archive{Image: Agnhost, Path: filepath.Join(dir, "agnhost.oci.tar"), Names: names}
	cfg := image.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: []string{image.DefaultPath},
		Labels: map[string]string{"org.opencontainers.image.version": strings.TrimSpace(string(version))}}
	o.Log("agnhost: write %s (%s)", a.Path, strings.Join(names, " "))
	if err := image.WriteArchive(a.Path, cfg, []image.Layer{base, top}, names...); err != nil {
		return Archive{}, err
	}
	return a, nil
}

// buildPause compiles pause.c as build/pause/Makefile does (static, -Os,
// warnings are errors, the version it prints with -v from the suite's tag)
// and writes an image of it alone, as build/pause/Dockerfile does.
func buildPause(ctx context.Context, dir, work, src string, names []string, o Options) (Archive, error) {
	if err := programs.Require("gcc"); err != nil {
		return Archive{}, fmt.Errorf("pause image: %w", err)
	}
	bin := filepath.Join(work, "pause")
	o.Log("pause: gcc -static build/pause/linux/pause.c")
	cmd := exec.CommandContext(ctx, "gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=v"+Tag(names[0]),
		"-o", bin, filepath.Join(src, "build", "pause", "linux", "pause.c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return Archive{}, fmt.Errorf("pause image: gcc: %w\n%s", err, out)
	}
	l, err := image.WriteLayer(filepath.Join(work, "pause.layer"), []image.Entry{{Name: "pause", Src: bin}})
	if err != nil {
		return Archive{}, fmt.Errorf("pause image: %w", err)
	}
	// Not pause.oci.tar: testenv/cri writes its own pause image under that
	// name, often into the same directory.
	a := Archive{Image: Pause, Path: filepath.Join(dir, "suite-pause.oci.tar"), Names: names}
	cfg := image.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"}
	if err := image.WriteArchive(a.Path, cfg, []image.Layer{l}, names...); err != nil {
		return Archive{}, err
	}
	return a, nil
}

// baseAccounts returns /etc/passwd and /etc/group of a root filesystem
// layer, to which an upper layer appends.
func baseAccounts(l image.Layer) (passwd, group string, err error) {
	f, err := os.Open(l.Path())
	if err != nil {
		return "", "", fmt.Errorf("read the base layer: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", "", fmt.Errorf("read the base layer: %w", err)
		}
		var dst *string
		switch strings.TrimPrefix(h.Name, "./") {
		case "etc/passwd":
			dst = &passwd
		case "etc/group":
			dst = &group
		default:
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return "", "", fmt.Errorf("read the base layer: %s: %w", h.Name, err)
		}
		*dst = string(b)
	}
	if passwd == "" || group == "" {
		return "", "", fmt.Errorf("the base layer %s has no etc/passwd or etc/group", l.Path())
	}
	return passwd, group, nil
}

// logWriter hands a build's progress lines to a Log function.
type logWriter struct {
	log func(format string, args ...any)
}

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.log("%s", line)
	}
	return len(p), nil
}
