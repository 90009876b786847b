// Package kubebin builds the kube-apiserver, etcd and kube-proxy that
// testenv/kube and the lab run, the crictl of the container runtime tests
// (testenv/cri), the kubelet of the Pod tests, the kube-controller-manager and
// kube-scheduler of the DaemonSet tests (testenv/e2e), the kubectl of
// deploy/'s tests, the kube-router whose policy controller the lab runs
// and the CoreDNS of the lab's cluster DNS, once, into a
// cache shared by every later run, reporting its progress. It depends on the standard library alone, so that `go run` of
// testenv/kube/cmd/prebuild starts at once on a machine with an empty build
// cache, before anything else has compiled client-go.
package kubebin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/isthmus-dev/isthmus/testenv/filelock"
)

// CacheEnv names the environment variable that overrides DefaultCacheRoot.
const CacheEnv = "ISTHMUS_KUBE_CACHE"

// DefaultCacheRoot holds one directory of binaries per build key. It survives
// between runs (and between CI runs on the same machine), so only the first
// run pays for the build.
const DefaultCacheRoot = "/var/cache/isthmus"

// Binaries returns the paths of a kube-apiserver and an etcd built from the
// tools module (testenv/kube/tools: k8s.io/kubernetes with its staging modules
// pinned by replace directives, and go.etcd.io/etcd/server/v3). They are built
// once into a cache directory keyed by the module versions, a hash of the tools
// module's go.mod and go.sum, and the Go version, under $ISTHMUS_KUBE_CACHE or
// DefaultCacheRoot. A lock file serialises builds across processes, so two test
// binaries never build at once; the second finds the first one's result.
//
// The first build on a clean machine downloads the modules and compiles
// kube-apiserver: about 5 minutes on 2 idle cores (4m43s measured with an
// empty build cache), more when other builds compete. Later calls return at
// once.
// A failed build returns an error with the tail of the compiler's output.
// Progress goes to standard error (see Build).
func Binaries(ctx context.Context) (apiserver, etcd string, err error) {
	return Build(ctx, os.Stderr)
}

// ProgressInterval is how often a running build step reports.
const ProgressInterval = 10 * time.Second

// Build is Binaries reporting to progress: a line for each step (waiting for
// another builder, listing a binary's packages, which downloads its modules,
// compiling it) and, while a step runs, a line every ProgressInterval with the
// time so far and the modules downloaded or packages compiled. It prints one
// line when the binaries are already cached. `make test` runs it through
// testenv/kube/cmd/prebuild before `go test`, which would hide this output.
func Build(ctx context.Context, progress io.Writer) (apiserver, etcd string, err error) {
	dir, err := kubeSet.build(ctx, progress)
	if err != nil {
		return "", "", err
	}
	return filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "etcd"), nil
}

// kubeSet is the kube-apiserver, etcd and kube-proxy of the tools module.
var kubeSet = binarySet{
	module:   "tools",
	names:    "kube-apiserver, etcd and kube-proxy",
	estimate: "about 6 minutes on 2 idle cores",
	key: func(gomod []byte, gover string) string {
		return fmt.Sprintf("kube-%s-etcd-%s-%s", moduleVersion(gomod, "k8s.io/kubernetes"),
			moduleVersion(gomod, "go.etcd.io/etcd/server/v3"), gover)
	},
	steps: []setStep{
		{out: "etcd", pkg: "go.etcd.io/etcd/server/v3", ldflags: func(string) string { return "-s -w" }},
		{out: "kube-apiserver", pkg: "k8s.io/kubernetes/cmd/kube-apiserver", ldflags: apiserverLDFlags},
		// The lab's Services (testenv/kubeproxy.go): the same k8s.io/kubernetes
		// release as kube-apiserver, so most of its packages are compiled already.
		{out: "kube-proxy", pkg: "k8s.io/kubernetes/cmd/kube-proxy", ldflags: apiserverLDFlags},
	},
}

// criSet is crictl, from the critools module: a cache of its own, so that
// neither set's module change rebuilds the other.
var criSet = binarySet{
	module:   "critools",
	names:    "crictl",
	estimate: "about 2 minutes on 2 idle cores",
	key: func(gomod []byte, gover string) string {
		return fmt.Sprintf("crictl-%s-%s", moduleVersion(gomod, "sigs.k8s.io/cri-tools"), gover)
	},
	steps: []setStep{{out: "crictl", pkg: "sigs.k8s.io/cri-tools/cmd/crictl", ldflags: func(string) string { return "-s -w" }}},
}

// kubeletSet is kubelet, from the kubelettools module: the same
// k8s.io/kubernetes release as kubeSet's kube-apiserver, in a cache of its own,
// so that adding it did not change the tools module's go.sum (and with it the
// kube-apiserver cache key).
var kubeletSet = binarySet{
	module:   "kubelettools",
	names:    "kubelet",
	estimate: "about 4 minutes on 2 idle cores",
	key: func(gomod []byte, gover string) string {
		return fmt.Sprintf("kubelet-%s-%s", moduleVersion(gomod, "k8s.io/kubernetes"), gover)
	},
	steps: []setStep{{out: "kubelet", pkg: "k8s.io/kubernetes/cmd/kubelet", ldflags: apiserverLDFlags}},
}

// kubectlSet is kubectl, from the kubectltools module: the same
// k8s.io/kubernetes release as kubeSet's kube-apiserver, in a cache of its
// own for the same reason as kubeletSet.
var kubectlSet = binarySet{
	module:   "kubectltools",
	names:    "kubectl",
	estimate: "about 3 minutes on 2 idle cores",
	key: func(gomod []byte, gover string) string {
		return fmt.Sprintf("kubectl-%s-%s", moduleVersion(gomod, "k8s.io/kubernetes"), gover)
	},
	steps: []setStep{{out: "kubectl", pkg: "k8s.io/kubernetes/cmd/kubectl", ldflags: apiserverLDFlags}},
}

// controlPlaneSet is kube-controller-manager and kube-scheduler, from the
// controlplanetools module: the same k8s.io/kubernetes release as kubeSet's
// kube-apiserver, in a cache of its own (as kubeletSet is), so that adding
// them changed no other set's key. A DaemonSet or a Deployment needs both:
// the first makes the pods, the second binds them to nodes.
var controlPlaneSet = binarySet{
	module:   "controlplanetools",
	names:    "kube-controller-manager and kube-scheduler",
	estimate: "about 6 minutes on 2 idle cores",
	key: func(gomod []byte, gover string) string {
		return fmt.Sprintf("controlplane-%s-%s", moduleVersion(gomod, "k8s.io/kubernetes"), gover)
	},
	steps: []setStep{
		{out: "kube-controller-manager", pkg: "k8s.io/kubernetes/cmd/kube-controller-manager", ldflags: apiserverLDFlags},
		{out: "kube-scheduler", pkg: "k8s.io/kubernetes/cmd/kube-scheduler", ldflags: apiserverLDFlags},
	},
}

// kubeRouterSet is kube-router, from the kuberoutertools module: the network
// policy controller the lab runs beside isthmus (testenv/kuberouter.go), in a
// cache of its own (its client-go is older than the lab's kube binaries').
// Its first build measured 268 s user and 86 s system CPU: 20m29s of wall
// time when it got 28% of a busy machine.
var kubeRouterSet = binarySet{
	module:   "kuberoutertools",
	names:    "kube-router",
	estimate: "about 3 minutes on 2 idle cores",
	key: func(gomod []byte, gover string) string {
		return fmt.Sprintf("kube-router-%s-%s", moduleVersion(gomod, "github.com/cloudnativelabs/kube-router/v2"), gover)
	},
	steps: []setStep{{out: "kube-router", pkg: "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router", ldflags: func(string) string { return "-s -w" }}},
}

// ControlPlane returns the paths of a kube-controller-manager and a
// kube-scheduler built from the same k8s.io/kubernetes release as Binaries'
// kube-apiserver (the controlplanetools module), built once into the same
// cache root. Progress goes to standard error.
func ControlPlane(ctx context.Context) (controllerManager, scheduler string, err error) {
	return BuildControlPlane(ctx, os.Stderr)
}

// BuildControlPlane is ControlPlane reporting to progress, as Build does.
func BuildControlPlane(ctx context.Context, progress io.Writer) (controllerManager, scheduler string, err error) {
	dir, err := controlPlaneSet.build(ctx, progress)
	if err != nil {
		return "", "", err
	}
	return filepath.Join(dir, "kube-controller-manager"), filepath.Join(dir, "kube-scheduler"), nil
}

// coreDNSSet is CoreDNS, from the corednstools module: the cluster DNS of the
// lab's whole cluster, run as a pod from an image holding the binary alone
// (testenv/cluster), so it is built static. Its main package
// (corednstools/coredns) compiles in the plugins of the lab's Corefile
// alone, as CoreDNS documents for a build with chosen plugins: half the
// packages of the stock build, which compiles every plugin.
var coreDNSSet = binarySet{
	module:   "corednstools",
	names:    "coredns",
	estimate: "about 2 minutes on 2 idle cores, 5 with an empty build cache",
	key: func(gomod []byte, gover string) string {
		return fmt.Sprintf("coredns-%s-%s", moduleVersion(gomod, "github.com/coredns/coredns"), gover)
	},
	sources: []string{"coredns/main.go"},
	steps:   []setStep{{out: "coredns", pkg: "github.com/isthmus-dev/isthmus/testenv/kube/corednstools/coredns", ldflags: func(string) string { return "-s -w" }}},
}

// CoreDNS returns the path of a static coredns built from
// github.com/coredns/coredns (the corednstools module, with the plugins of
// the lab's Corefile),
// built once into the same cache root as Binaries. Progress goes to standard
// error.
func CoreDNS(ctx context.Context) (string, error) { return BuildCoreDNS(ctx, os.Stderr) }

// BuildCoreDNS is CoreDNS reporting to progress, as Build does.
func BuildCoreDNS(ctx context.Context, progress io.Writer) (string, error) {
	return coreDNSSet.binary(ctx, progress, "coredns")
}

// CoreDNSVersion is the github.com/coredns/coredns version CoreDNS builds,
// from the corednstools module's go.mod: the tag of its image.
func CoreDNSVersion() (string, error) {
	mod, err := moduleDir(coreDNSSet.module)
	if err != nil {
		return "", err
	}
	gomod, err := os.ReadFile(filepath.Join(mod, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("read corednstools go.mod: %w", err)
	}
	v := moduleVersion(gomod, "github.com/coredns/coredns")
	if v == "" {
		return "", fmt.Errorf("read corednstools go.mod: no github.com/coredns/coredns requirement")
	}
	return v, nil
}

// e2eSet is Kubernetes' end-to-end suite, e2e.test (go test -c of
// k8s.io/kubernetes/test/e2e), and agnhost, the test image's program most of
// its network tests run, from the e2etools module: the same k8s.io/kubernetes
// release as kubeSet's kube-apiserver, in a cache of its own (as kubeletSet
// is). e2e.test carries the release's version as the other binaries do, so
// the suite's checks of the server's version compare like with like.
// agnhost is static, as its image has no C library (every set is: toolsEnv).
var e2eSet = binarySet{
	module:   "e2etools",
	names:    "e2e.test and agnhost",
	estimate: "about 3 minutes on 2 idle cores after the other kube binaries, 10 alone",
	key: func(gomod []byte, gover string) string {
		return fmt.Sprintf("e2e-%s-%s", moduleVersion(gomod, "k8s.io/kubernetes"), gover)
	},
	steps: []setStep{
		{out: "e2e.test", pkg: "k8s.io/kubernetes/test/e2e", ldflags: apiserverLDFlags, test: true},
		{out: "agnhost", pkg: "k8s.io/kubernetes/test/images/agnhost", ldflags: func(string) string { return "-s -w" }},
	},
}

// E2ETest returns the path of Kubernetes' conformance suite, e2e.test of
// k8s.io/kubernetes/test/e2e, of the same release as Binaries'
// kube-apiserver (the e2etools module), built once into the same cache root
// with agnhost beside it (see Agnhost). Progress goes to standard error.
func E2ETest(ctx context.Context) (string, error) { return BuildE2ETest(ctx, os.Stderr) }

// BuildE2ETest is E2ETest reporting to progress, as Build does.
func BuildE2ETest(ctx context.Context, progress io.Writer) (string, error) {
	return e2eSet.binary(ctx, progress, "e2e.test")
}

// Agnhost returns the path of a static agnhost
// (k8s.io/kubernetes/test/images/agnhost) of the same release as E2ETest,
// which builds both: the program of the suite's agnhost image.
func Agnhost(ctx context.Context, progress io.Writer) (string, error) {
	return e2eSet.binary(ctx, progress, "agnhost")
}

// KubernetesSource returns the directory of the k8s.io/kubernetes module
// source that E2ETest builds from (the e2etools module's version, downloaded
// into the module cache if it is not there yet): the tree the suite's test
// images build from (test/images, build/pause).
func KubernetesSource(ctx context.Context) (string, error) {
	mod, err := moduleDir(e2eSet.module)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, goCmd(), "mod", "download", "-json", "k8s.io/kubernetes")
	cmd.Dir, cmd.Env = mod, toolsEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("download k8s.io/kubernetes in %s: %w\n%s", mod, err, stderr.String())
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("download k8s.io/kubernetes in %s: %w", mod, err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("download k8s.io/kubernetes in %s: no directory (%s)", mod, m.Error)
	}
	return m.Dir, nil
}

// KubeProxy returns the path of a kube-proxy built from the same
// k8s.io/kubernetes release as Binaries' kube-apiserver, in the same cache
// (Build builds all three). Progress goes to standard error.
func KubeProxy(ctx context.Context) (string, error) {
	return kubeSet.binary(ctx, os.Stderr, "kube-proxy")
}

// Crictl returns the path of a crictl built from sigs.k8s.io/cri-tools (the
// critools module), the CRI client the container runtime tests use, built
// once into the same cache root as Binaries (about 2 minutes the first
// time). Progress goes to standard error.
func Crictl(ctx context.Context) (string, error) { return BuildCrictl(ctx, os.Stderr) }

// BuildCrictl is Crictl reporting to progress, as Build does.
func BuildCrictl(ctx context.Context, progress io.Writer) (string, error) {
	return criSet.binary(ctx, progress, "crictl")
}

// Kubelet returns the path of a kubelet built from the same k8s.io/kubernetes
// release as Binaries' kube-apiserver (the kubelettools module), built once
// into the same cache root. Progress goes to standard error.
func Kubelet(ctx context.Context) (string, error) { return BuildKubelet(ctx, os.Stderr) }

// BuildKubelet is Kubelet reporting to progress, as Build does.
func BuildKubelet(ctx context.Context, progress io.Writer) (string, error) {
	return kubeletSet.binary(ctx, progress, "kubelet")
}

// Kubectl returns the path of a kubectl built from the same
// k8s.io/kubernetes release as Binaries' kube-apiserver (the kubectltools
// module), built once into the same cache root: what deploy/'s tests render
// the kustomizations with. Progress goes to standard error.
func Kubectl(ctx context.Context) (string, error) { return BuildKubectl(ctx, os.Stderr) }

// BuildKubectl is Kubectl reporting to progress, as Build does.
func BuildKubectl(ctx context.Context, progress io.Writer) (string, error) {
	return kubectlSet.binary(ctx, progress, "kubectl")
}

// KubeRouter returns the path of a kube-router built from
// github.com/cloudnativelabs/kube-router/v2 (the kuberoutertools module),
// built once into the same cache root as Binaries. The lab runs only its
// network policy controller (testenv.StartKubeRouter). Progress goes to
// standard error.
func KubeRouter(ctx context.Context) (string, error) { return BuildKubeRouter(ctx, os.Stderr) }

// BuildKubeRouter is KubeRouter reporting to progress, as Build does.
func BuildKubeRouter(ctx context.Context, progress io.Writer) (string, error) {
	return kubeRouterSet.binary(ctx, progress, "kube-router")
}

// binarySet is a group of binaries built from one module beside this
// package into one cache directory.
type binarySet struct {
	module   string // the module's directory, beside kubebin
	names    string // of the binaries, for progress lines
	estimate string // of a first build
	// key names the cache directory from the module's go.mod and the Go
	// version; buildKey appends a hash of go.mod, go.sum and the platform.
	key func(gomod []byte, gover string) string
	// sources are files of the module, beside go.mod and go.sum, whose
	// contents the key hashes: a main package of the module's own.
	sources []string
	steps   []setStep
}

// setStep builds one binary of a set.
type setStep struct {
	out, pkg string
	ldflags  func(moduleDir string) string
	// test builds pkg's test binary (go test -c) instead of its command.
	test bool
}

// binary returns the path of the set's binary name, once build has it.
func (s binarySet) binary(ctx context.Context, progress io.Writer, name string) (string, error) {
	dir, err := s.build(ctx, progress)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

// build returns the set's cache directory once every binary is in it,
// building those that are missing under a lock that serialises builders
// across processes; the second finds the first one's result.
func (s binarySet) build(ctx context.Context, progress io.Writer) (string, error) {
	mod, err := moduleDir(s.module)
	if err != nil {
		return "", err
	}
	key, err := buildKey(ctx, mod, s.key, s.sources)
	if err != nil {
		return "", err
	}
	root := os.Getenv(CacheEnv)
	if root == "" {
		root = DefaultCacheRoot
	}
	dir := filepath.Join(root, key)
	say := func(format string, args ...any) { fmt.Fprintf(progress, "testenv/kube: "+format+"\n", args...) }
	missing := func() bool {
		for _, st := range s.steps {
			if !exists(filepath.Join(dir, st.out)) {
				return true
			}
		}
		return false
	}
	if !missing() {
		say("%s found in %s", s.names, dir)
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create binary cache: %w", err)
	}
	start := time.Now()
	var cpu time.Duration // of the go commands, compilers included
	say("%s: not all in %s yet, building once for this and every later run (%s)", s.names, dir, s.estimate)
	unlock, err := filelock.Lock(ctx, filepath.Join(dir, ".lock"), func() {
		say("waiting for another process that is building into %s", dir)
	})
	if err != nil {
		return "", err
	}
	defer unlock()
	for i, st := range s.steps {
		out := filepath.Join(dir, st.out)
		if exists(out) {
			say("[%d/%d] %s: built meanwhile by the process we waited for", i+1, len(s.steps), st.out)
			continue
		}
		bs := buildStep{tools: mod, name: fmt.Sprintf("[%d/%d] %s", i+1, len(s.steps), st.out), say: say, every: ProgressInterval,
			test: st.test, cpu: &cpu}
		if err := bs.build(ctx, out, st.pkg, st.ldflags(mod)); err != nil {
			return "", err
		}
	}
	// The CPU time compares between machines and loads; the wall time
	// depends on what else runs (docs/development.md).
	say("%s ready in %s after %s (%s CPU, user and system)", s.names, dir, time.Since(start).Round(time.Second), cpu.Round(time.Second))
	return dir, nil
}

// moduleDir finds a module beside this package (tools, critools,
// kubelettools, kubectltools, controlplanetools, kuberoutertools, corednstools) from this
// source file.
func moduleDir(name string) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("find tools module: no caller information")
	}
	dir := filepath.Join(filepath.Dir(file), "..", name)
	if !exists(filepath.Join(dir, "go.mod")) {
		return "", fmt.Errorf("find tools module: %s has no go.mod (the builds need the source tree)", dir)
	}
	return dir, nil
}

// goCmd returns the go command: the one on PATH, else the one of this
// binary's GOROOT.
func goCmd() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// toolsEnv is the environment of every go command run in the tools module: no
// workspace, and the module's own go.sum is the authority.
//
// Every binary is static (CGO_ENABLED=0), as Kubernetes' own release builds
// are: the binaries that run in images with no C library (agnhost, CoreDNS)
// must be, and building the rest the same way lets them share compiled
// packages. With cgo the net package differs, and with it every package
// above it, so mixed settings compiled most of k8s.io twice.
func toolsEnv() []string {
	return append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly", "CGO_ENABLED=0")
}

// moduleVersion returns the version the tools module's go.mod requires of a
// module path, or "".
func moduleVersion(gomod []byte, path string) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(f) >= 2 && f[0] == path && strings.HasPrefix(f[1], "v") {
			return f[1]
		}
	}
	return ""
}

// buildKey names a set's cache directory: its key, then a hash of the
// module's go.mod and go.sum, the Go version, the platform and the module's
// files sources.
func buildKey(ctx context.Context, mod string, key func(gomod []byte, gover string) string, sources []string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(mod, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("read tools go.mod: %w", err)
	}
	gosum, err := os.ReadFile(filepath.Join(mod, "go.sum"))
	if err != nil {
		return "", fmt.Errorf("read tools go.sum: %w", err)
	}
	cmd := exec.CommandContext(ctx, goCmd(), "env", "GOVERSION")
	cmd.Dir, cmd.Env = mod, toolsEnv()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("read go version: %w", err)
	}
	gover := strings.TrimSpace(string(out))
	h := sha256.New()
	h.Write(gomod)
	h.Write(gosum)
	h.Write([]byte(gover + runtime.GOOS + runtime.GOARCH))
	for _, name := range sources {
		src, err := os.ReadFile(filepath.Join(mod, name))
		if err != nil {
			return "", fmt.Errorf("read the build's source: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", name, len(src))
		h.Write(src)
	}
	return key(gomod, gover) + "-" + hex.EncodeToString(h.Sum(nil))[:10], nil
}

// apiserverLDFlags stamps the Kubernetes version into kube-apiserver, as the
// release build does, so discovery reports it (and into kube-proxy and
// kubelet, which report it in the Node's status).
func apiserverLDFlags(tools string) string {
	gomod, _ := os.ReadFile(filepath.Join(tools, "go.mod"))
	v := moduleVersion(gomod, "k8s.io/kubernetes")
	flags := "-s -w"
	var major, minor string
	if parts := strings.Split(strings.TrimPrefix(v, "v"), "."); len(parts) >= 2 {
		major, minor = parts[0], parts[1]
	}
	const pkg = "k8s.io/component-base/version"
	if v != "" {
		flags += fmt.Sprintf(" -X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s", pkg, v, pkg, major, pkg, minor)
	}
	return flags
}

// buildStep builds one binary of the tools module, reporting as it goes.
type buildStep struct {
	tools string
	name  string // "[2/2] kube-apiserver"
	say   func(format string, args ...any)
	every time.Duration // between progress lines
	test  bool          // build pkg's test binary (go test -c)
	env   []string      // added to the go command's environment
	// cpu, when set, gathers the user and system time of every go command
	// run, with the compilers and linkers it ran.
	cpu *time.Duration
}

// build lists pkg's packages (which downloads the modules they need), then
// builds pkg into out through a temporary name, so that a half-written binary
// is never found. A test binary's packages are pkg, the imports of its test
// files and their dependencies: go build -v compiles all of them but pkg's
// test variant (go test -c names no package it compiles, so this is what
// reports progress), then go test -c compiles that variant and links.
func (b buildStep) build(ctx context.Context, out, pkg, ldflags string) error {
	start := time.Now()
	b.say("%s: listing the packages of %s (downloads their modules on first use)", b.name, pkg)
	roots := []string{pkg}
	if b.test {
		imports, _, err := b.goRun(ctx, "listing test imports", func() string { return "" }, func(string) {},
			"list", "-f", `{{join .TestImports "\n"}}{{"\n"}}{{join .XTestImports "\n"}}`, pkg)
		if err != nil {
			return fmt.Errorf("list the test imports of %s in %s: %w", pkg, b.tools, err)
		}
		for _, p := range strings.Fields(string(imports)) {
			if p != pkg {
				roots = append(roots, p)
			}
		}
	}
	var downloaded int
	listed, _, err := b.goRun(ctx, "listing", func() string { return fmt.Sprintf("%d modules downloaded", downloaded) },
		func(line string) {
			if strings.HasPrefix(line, "go: downloading ") {
				downloaded++
			}
		}, append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, roots...)...)
	if err != nil {
		return fmt.Errorf("list the packages of %s in %s: %w", pkg, b.tools, err)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(listed)) {
		deps[p] = true
	}
	b.say("%s: %d packages, %d modules downloaded, in %s; compiling what the build cache lacks", b.name, len(deps), downloaded, time.Since(start).Round(time.Second))

	tmp := out + ".tmp"
	var compiled int
	var last string
	compiling := func() string {
		return fmt.Sprintf("%d of %d packages compiled, last %s", compiled, len(deps), last)
	}
	count := func(line string) {
		if deps[line] { // go build -v names each package as it compiles it
			compiled++
			last = line
		}
	}
	args := []string{"build", "-v", "-o", tmp, "-ldflags", ldflags, pkg}
	if b.test {
		// go build of several packages, none of them a command, writes
		// nothing: it fills the build cache that go test -c then uses.
		if _, stderr, err := b.goRun(ctx, "compiling", compiling, count, append([]string{"build", "-v"}, roots...)...); err != nil {
			return fmt.Errorf("build %s in %s (go build %s): %w\n%s", filepath.Base(out), b.tools, pkg, err, TailLines(stderr, 40))
		}
		// -vet=off: go test would vet the package, and for that every
		// dependency (several minutes for the e2e suite's 2,800 packages).
		args = []string{"test", "-c", "-vet=off", "-o", tmp, "-ldflags", ldflags, pkg}
	}
	_, stderr, err := b.goRun(ctx, "compiling", compiling, count, args...)
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build %s in %s (go %s %s): %w\n%s", filepath.Base(out), b.tools, args[0], pkg, err, TailLines(stderr, 40))
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("install %s: %w", out, err)
	}
	b.say("%s: built %s in %s (%d packages compiled)", b.name, out, time.Since(start).Round(time.Second), compiled)
	return nil
}

// goRun runs the go command in the tools module, handing each line it writes
// to standard error to line, and reporting "<name>: <what>, <elapsed>,
// <status()>" every b.every until it ends. It returns standard output
// and standard error.
func (b buildStep) goRun(ctx context.Context, what string, status func() string, line func(string), args ...string) (stdout []byte, stderr string, err error) {
	cmd := exec.CommandContext(ctx, goCmd(), args...)
	cmd.Dir, cmd.Env = b.tools, append(toolsEnv(), b.env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", fmt.Errorf("go %s: %w", args[0], err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("go %s: %w", args[0], err)
	}
	var mu sync.Mutex // line and status share the counters
	var errText strings.Builder
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			mu.Lock()
			errText.WriteString(sc.Text() + "\n")
			line(sc.Text())
			mu.Unlock()
		}
	}()
	tick := time.NewTicker(b.every)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case <-scanned:
			waiting = false
		case <-tick.C:
			mu.Lock()
			b.say("%s: %s, %s, %s", b.name, what, time.Since(start).Round(time.Second), status())
			mu.Unlock()
		}
	}
	err = cmd.Wait()
	if b.cpu != nil && cmd.ProcessState != nil {
		// wait4's usage of a process counts the children it waited for.
		*b.cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	return out.Bytes(), errText.String(), err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TailLines returns the last n lines of s.
func TailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
