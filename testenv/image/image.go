// Package image builds the isthmus image without a registry: the image the
// repository's Dockerfile describes (Debian trixie with bpftool, iproute2,
// iptables and nftables, plus the static isthmus, isthmus-cni and portmap
// binaries, ENTRYPOINT isthmus), written as an OCI image archive that
// `ctr images import` loads.
//
// The Debian root filesystem comes from mmdebstrap (Debian's package mirrors,
// not a registry) and is cached under /var/cache/isthmus, keyed by the suite,
// the package list and the mirrors, since it costs a download of about 40 MB
// and four minutes. The binaries are built from this source tree on every
// Build; the archive is written in Go.
//
// The Dockerfile stays the recipe for users with a registry; TestDockerfileMatches
// keeps the two lists of packages and binaries the same.
package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// Suite is the Debian release of the image (the Dockerfile's debian:trixie-slim).
const Suite = "trixie"

// Packages are the Debian packages the image installs over the suite's
// minimal base: the Dockerfile's `apt-get install` line, in its order.
var Packages = []string{"bpftool", "iproute2", "iptables", "nftables"}

// Binary is one program of this repository in the image.
type Binary struct {
	// Path is where it lies in the image.
	Path string
	// Main is its main package, relative to the module root, or a
	// package of a module go.mod requires (a tool of the module).
	Main string
}

// Binaries are the image's programs: the Dockerfile's COPY lines.
var Binaries = []Binary{
	{Path: "/usr/local/bin/isthmus", Main: "./cmd/isthmus"},
	{Path: "/usr/local/bin/isthmus-cni", Main: "./cmd/isthmus-cni"},
	{Path: "/usr/local/bin/portmap", Main: "github.com/containernetworking/plugins/plugins/meta/portmap"},
}

// Entrypoint is the image's entrypoint (the Dockerfile's ENTRYPOINT).
var Entrypoint = []string{"isthmus"}

// Labels are the image's labels (the Dockerfile's LABEL) for version.
func Labels(version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "isthmus",
		"org.opencontainers.image.description": "eBPF GENEVE datapath joining the pod networks of several Kubernetes sites: agent, controller and tools",
		"org.opencontainers.image.source":      "https://github.com/isthmus-dev/isthmus",
		"org.opencontainers.image.version":     version,
	}
}

// DefaultPath is the PATH of the images' environment, Debian's.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// tagRe is what the OCI distribution spec allows as a tag.
var tagRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// DefaultMirrors are the apt sources of the root filesystem: those of
// debian:trixie-slim, so security updates are in.
var DefaultMirrors = []string{
	"deb http://deb.debian.org/debian trixie main",
	"deb http://deb.debian.org/debian trixie-updates main",
	"deb http://deb.debian.org/debian-security trixie-security main",
}

// DefaultCacheDir holds the cached root filesystems (shared with the
// Kubernetes binaries of testenv/kube/kubebin).
const DefaultCacheDir = "/var/cache/isthmus"

// CacheDir is where the Debian layers are cached when no option says:
// $ISTHMUS_KUBE_CACHE (kubebin.CacheEnv, the kube binaries' cache root, so
// one variable moves every cache of a first `make test`), else
// DefaultCacheDir.
func CacheDir() string {
	if d := os.Getenv(kubebin.CacheEnv); d != "" {
		return d
	}
	return DefaultCacheDir
}

// Options say what Build builds. The zero value builds isthmus:dev into
// bin/isthmus-image.oci.tar of the module.
type Options struct {
	// Version is the image's tag and its org.opencontainers.image.version
	// label; "" is "dev".
	Version string
	// Name is the image's repository name; "" is "isthmus".
	Name string
	// Commit is the commit the binaries report (loader/buildinfo); "" is
	// `git rev-parse HEAD` of the module, with "-dirty" for a changed tree,
	// as the Makefile computes it.
	Commit string
	// LDFlags are extra go build -ldflags, after "-s -w" and the -X of
	// loader/buildinfo's Release (Version) and Commit.
	LDFlags string
	// Out is the archive's path; "" is bin/isthmus-image.oci.tar, or
	// bin/isthmus-image-<version>.oci.tar for a version other than dev, in
	// the module root.
	Out string
	// CacheDir holds the cached Debian layer; "" is CacheDir().
	CacheDir string
	// Mirrors are apt sources lines; nil is DefaultMirrors.
	Mirrors []string
	// Log, when set, receives a line for each step that takes a while.
	Log func(format string, args ...any)
}

// Archive is a built OCI image archive.
type Archive struct {
	// Path is the archive (an OCI image layout in a tar).
	Path string
	// Ref is the name containerd gives the image on import, e.g.
	// "docker.io/library/isthmus:dev" for isthmus:dev: containerd and the
	// kubelet normalise a short name so, and a pod spec's image "isthmus:dev"
	// finds it.
	Ref string
}

// Build builds the image with o (cached Debian layer, fresh binaries) and
// writes its archive. It needs root (mmdebstrap), the first time network
// access to Debian's mirrors. Repeated calls with the same options and the
// same source give the same archive.
func Build(ctx context.Context, o Options) (Archive, error) {
	o = o.withDefaults()
	if !tagRe.MatchString(o.Version) {
		return Archive{}, fmt.Errorf("build image: version %q is not an image tag ([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})", o.Version)
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return Archive{}, err
	}
	if o.Out == "" {
		name := "isthmus-image.oci.tar"
		if o.Version != "dev" {
			name = "isthmus-image-" + o.Version + ".oci.tar"
		}
		o.Out = filepath.Join(root, "bin", name)
	}
	base, err := DebianLayer(ctx, Debian{Packages: Packages, CacheDir: o.CacheDir, Mirrors: o.Mirrors, Log: o.Log})
	if err != nil {
		return Archive{}, err
	}
	tmp, err := os.MkdirTemp("", "isthmus-image-")
	if err != nil {
		return Archive{}, fmt.Errorf("build image: %w", err)
	}
	defer os.RemoveAll(tmp)
	if o.Commit == "" {
		o.Commit = gitCommit(ctx, root)
	}
	ldflags := fmt.Sprintf("-s -w -X %s.Release=%s -X %s.Commit=%s %s", buildinfoPkg, o.Version, buildinfoPkg, o.Commit, o.LDFlags)
	files := map[string]string{}
	for _, b := range Binaries {
		o.Log("build %s", b.Main)
		out := filepath.Join(tmp, filepath.Base(b.Path))
		if err := goBuild(ctx, root, b.Main, out, ldflags); err != nil {
			return Archive{}, err
		}
		files[strings.TrimPrefix(b.Path, "/")] = out
	}
	bins, err := filesLayer(filepath.Join(tmp, "binaries.tar"), files)
	if err != nil {
		return Archive{}, err
	}
	ref := Ref(o.Name, o.Version)
	o.Log("write %s (%s)", o.Out, ref)
	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return Archive{}, fmt.Errorf("build image: %w", err)
	}
	cfg := Config{Entrypoint: Entrypoint, Env: []string{DefaultPath}, Labels: Labels(o.Version)}
	if err := WriteArchive(o.Out, cfg, []Layer{base, bins}, ref); err != nil {
		return Archive{}, err
	}
	return Archive{Path: o.Out, Ref: ref}, nil
}

// Ref is the fully qualified name of image name:version, as containerd
// stores it.
func Ref(name, version string) string {
	if name == "" {
		name = "isthmus"
	}
	if version == "" {
		version = "dev"
	}
	if !strings.Contains(name, "/") {
		name = "library/" + name
	}
	if first, _, _ := strings.Cut(name, "/"); !strings.ContainsAny(first, ".:") && first != "localhost" {
		name = "docker.io/" + name
	}
	return name + ":" + version
}

func (o Options) withDefaults() Options {
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Name == "" {
		o.Name = "isthmus"
	}
	if o.CacheDir == "" {
		o.CacheDir = CacheDir()
	}
	if o.Mirrors == nil {
		o.Mirrors = DefaultMirrors
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	return o
}

// Import imports the archive into the containerd at containerdAddress (its
// socket), in the namespace the kubelet's CRI uses (k8s.io), unpacked for its
// default snapshotter. Importing the same archive again is harmless.
func Import(ctx context.Context, containerdAddress string, a Archive) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", containerdAddress, "--namespace", "k8s.io",
		"images", "import", a.Path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("import %s into %s: %w\n%s", a.Path, containerdAddress, err, out)
	}
	return nil
}

// buildinfoPkg holds the release and commit the binaries report (isthmus
// version, the CNI plugin's VERSION, isthmus_build_info).
const buildinfoPkg = "github.com/isthmus-dev/isthmus/loader/buildinfo"

// gitCommit is HEAD of the checkout at root, "-dirty" when its tree has
// changes, or "unknown" outside a git checkout.
func gitCommit(ctx context.Context, root string) string {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.CommandContext(ctx, "git", "-C", root, "status", "--porcelain").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "-dirty"
	}
	return c
}

// goBuild builds the static binary of main into out, as the Dockerfile does
// (-buildvcs=false there, as here: the commit comes in ldflags).
func goBuild(ctx context.Context, root, main, out, ldflags string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", strings.TrimSpace(ldflags), "-o", out, main)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", main, err, b)
	}
	return nil
}

// moduleRoot is the directory of this repository's go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("find the module root: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
