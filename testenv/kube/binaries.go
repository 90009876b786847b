package kube

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
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
func Binaries(ctx context.Context) (apiserver, etcd string, err error) {
	paths, err := buildTools(ctx, toolAPIServer, toolEtcd)
	if err != nil {
		return "", "", err
	}
	return paths[0], paths[1], nil
}

// KubeProxy returns the path of a kube-proxy built from the same
// k8s.io/kubernetes release as Binaries' kube-apiserver, cached beside it the
// same way (about 3 minutes more on first use, less once kube-apiserver's
// packages are in the Go build cache).
func KubeProxy(ctx context.Context) (string, error) {
	paths, err := buildTools(ctx, toolKubeProxy)
	if err != nil {
		return "", err
	}
	return paths[0], nil
}

// tool is one binary of the tools module: its file name in the cache and its
// package.
type tool struct{ name, pkg string }

var (
	toolEtcd      = tool{"etcd", "go.etcd.io/etcd/server/v3"}
	toolAPIServer = tool{"kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"}
	toolKubeProxy = tool{"kube-proxy", "k8s.io/kubernetes/cmd/kube-proxy"}
)

// buildTools returns the cached paths of tools, in order, building the
// missing ones under the cache directory's lock.
func buildTools(ctx context.Context, tools ...tool) ([]string, error) {
	dir, err := toolsDir()
	if err != nil {
		return nil, err
	}
	key, err := buildKey(ctx, dir)
	if err != nil {
		return nil, err
	}
	root := os.Getenv(CacheEnv)
	if root == "" {
		root = DefaultCacheRoot
	}
	cache := filepath.Join(root, key)
	paths := make([]string, len(tools))
	missing := false
	for i, t := range tools {
		paths[i] = filepath.Join(cache, t.name)
		missing = missing || !exists(paths[i])
	}
	if !missing {
		return paths, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, fmt.Errorf("create kube binary cache: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(cache, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	for i, t := range tools {
		if exists(paths[i]) {
			continue // built by the process that held the lock before us
		}
		if err := goBuild(ctx, dir, paths[i], t.pkg, versionLDFlags(dir)); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// toolsDir finds the tools module beside this source file.
func toolsDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("find tools module: no caller information")
	}
	dir := filepath.Join(filepath.Dir(file), "tools")
	if !exists(filepath.Join(dir, "go.mod")) {
		return "", fmt.Errorf("find tools module: %s has no go.mod (Binaries needs the source tree)", dir)
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
func toolsEnv() []string {
	return append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
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

// buildKey names the cache directory: kube-<kubernetes>-etcd-<etcd>-<go>-<hash>.
func buildKey(ctx context.Context, tools string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(tools, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("read tools go.mod: %w", err)
	}
	gosum, err := os.ReadFile(filepath.Join(tools, "go.sum"))
	if err != nil {
		return "", fmt.Errorf("read tools go.sum: %w", err)
	}
	cmd := exec.CommandContext(ctx, goCmd(), "env", "GOVERSION")
	cmd.Dir, cmd.Env = tools, toolsEnv()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("read go version: %w", err)
	}
	gover := strings.TrimSpace(string(out))
	h := sha256.New()
	h.Write(gomod)
	h.Write(gosum)
	h.Write([]byte(gover + runtime.GOOS + runtime.GOARCH))
	return fmt.Sprintf("kube-%s-etcd-%s-%s-%s", moduleVersion(gomod, "k8s.io/kubernetes"),
		moduleVersion(gomod, "go.etcd.io/etcd/server/v3"), gover, hex.EncodeToString(h.Sum(nil))[:10]), nil
}

// versionLDFlags strips symbols and stamps the Kubernetes version into the
// Kubernetes binaries, as the release build does, so discovery (and
// kube-proxy's log) reports it. etcd has no such variable; -X of a missing
// one is ignored.
func versionLDFlags(tools string) string {
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

// goBuild builds pkg in the tools module into out, through a temporary name so
// that a half-written binary is never found.
func goBuild(ctx context.Context, tools, out, pkg, ldflags string) error {
	tmp := out + ".tmp"
	start := time.Now()
	cmd := exec.CommandContext(ctx, goCmd(), "build", "-o", tmp, "-ldflags", ldflags, pkg)
	cmd.Dir, cmd.Env = tools, toolsEnv()
	output, err := cmd.CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build %s in %s (go build %s): %w\n%s", filepath.Base(out), tools, pkg, err, tailLines(string(output), 40))
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("install %s: %w", out, err)
	}
	fmt.Fprintf(os.Stderr, "testenv/kube: built %s in %s\n", out, time.Since(start).Round(time.Second))
	return nil
}

// lockFile takes an exclusive flock on path, waiting until ctx ends.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open build lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for build lock %s: %w", path, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
