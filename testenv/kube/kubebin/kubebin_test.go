package kubebin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// lines collects what a build step says.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) say(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, fmt.Sprintf(format, args...))
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

// writeModule writes a module of one main package into a new directory.
func writeModule(t *testing.T, path, mainGo string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range map[string]string{"go.mod": "module " + path + "\n\ngo 1.26\n", "main.go": mainGo} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestBuildStepReportsProgress builds a small module whose source is new to
// the build cache (so at least its main package compiles) and checks the step
// lines, the periodic lines with their package counts, and the binary.
func TestBuildStepReportsProgress(t *testing.T) {
	dir := writeModule(t, "example.com/tiny",
		fmt.Sprintf("package main\n\nconst built = %d\n\nfunc main() { println(built) }\n", time.Now().UnixNano()))
	var got lines
	out := filepath.Join(t.TempDir(), "tiny")
	b := buildStep{tools: dir, name: "[1/1] tiny", say: got.say, every: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := b.build(ctx, out, "example.com/tiny", "-s -w"); err != nil {
		t.Fatal(err)
	}
	if !exists(out) || exists(out+".tmp") {
		t.Errorf("want %s and no .tmp left", out)
	}
	for _, re := range []string{
		`(?m)^\[1/1\] tiny: listing the packages of example\.com/tiny`,
		`(?m)^\[1/1\] tiny: (\d+) packages, 0 modules downloaded, in \d+s; compiling`,
		`(?m)^\[1/1\] tiny: compiling, \d+s, \d+ of \d+ packages compiled, last \S+`,
		`(?m)^\[1/1\] tiny: built .*/tiny in \d+s \([1-9]\d* packages compiled\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(got.String()) {
			t.Errorf("no line matches %s in:\n%s", re, got.String())
		}
	}
}

// TestBuildStepTestBinary: a test step builds a package's test binary (go
// test -c) with its ldflags and env, reporting the packages its test files
// import: the binary runs the package's test, which sees the -X value and
// was built without cgo, and a package imported only by the test file
// counts among the compiled.
func TestBuildStepTestBinary(t *testing.T) {
	dir := writeModule(t, "example.com/suite", "package suite\n\nvar Version = \"unset\"\n")
	for name, text := range map[string]string{
		"onlytest/onlytest.go": fmt.Sprintf("package onlytest\n\nconst Stamp = %d\n", time.Now().UnixNano()),
		"suite_test.go": `package suite

import (
	"os"
	"testing"

	"example.com/suite/onlytest"
)

var _ = onlytest.Stamp

func TestVersion(t *testing.T) {
	if Version != "v9.8.7" {
		t.Fatalf("Version %q", Version)
	}
	if os.Getenv("SUITE_RUN") != "" && cgoEnabled {
		t.Fatal("built with cgo")
	}
}
`,
		"cgo_on.go":  "//go:build cgo\n\npackage suite\n\nconst cgoEnabled = true\n",
		"cgo_off.go": "//go:build !cgo\n\npackage suite\n\nconst cgoEnabled = false\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var got lines
	out := filepath.Join(t.TempDir(), "suite.test")
	b := buildStep{tools: dir, name: "[1/1] suite.test", say: got.say, every: 10 * time.Millisecond, test: true, env: []string{"CGO_ENABLED=0"}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := b.build(ctx, out, "example.com/suite", "-X example.com/suite.Version=v9.8.7"); err != nil {
		t.Fatal(err)
	}
	// Both new packages compile: the suite and what only its test imports.
	if m := regexp.MustCompile(`(?m)^\[1/1\] suite.test: built .*/suite.test in \d+s \((\d+) packages compiled\)$`).FindStringSubmatch(got.String()); m == nil || m[1] == "0" || m[1] == "1" {
		t.Errorf("want a built line with at least 2 packages compiled in:\n%s", got.String())
	}
	cmd := exec.Command(out, "-test.run", "TestVersion", "-test.v")
	cmd.Env = append(os.Environ(), "SUITE_RUN=1")
	if res, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(res), "--- PASS: TestVersion") {
		t.Fatalf("%s: %v\n%s", out, err, res)
	}
}

// TestBuildStepFailureShowsCompiler: a package that does not compile fails
// with the compiler's message, and leaves no binary.
func TestBuildStepFailureShowsCompiler(t *testing.T) {
	dir := writeModule(t, "example.com/broken", "package main\n\nfunc main() { undefinedThing() }\n")
	var got lines
	out := filepath.Join(t.TempDir(), "broken")
	b := buildStep{tools: dir, name: "[1/1] broken", say: got.say, every: time.Minute}
	err := b.build(context.Background(), out, "example.com/broken", "")
	if err == nil || !strings.Contains(err.Error(), "undefined: undefinedThing") {
		t.Fatalf("build = %v, want the compiler's error", err)
	}
	if exists(out) || exists(out+".tmp") {
		t.Errorf("a failed build left %s or its .tmp", out)
	}
}

// TestBuildSaysWhenCached: with a set's binaries in its cache directory,
// Build and BuildCrictl print one line and build nothing.
func TestBuildSaysWhenCached(t *testing.T) {
	root := t.TempDir()
	t.Setenv(CacheEnv, root)
	for _, c := range []struct {
		set   binarySet
		build func(io.Writer) (string, error)
		want  string // the binary it returns
	}{
		{kubeSet, func(w io.Writer) (string, error) {
			apiserver, etcd, err := Build(context.Background(), w)
			if err == nil && filepath.Dir(etcd) != filepath.Dir(apiserver) {
				err = fmt.Errorf("etcd %s not beside kube-apiserver %s", etcd, apiserver)
			}
			return apiserver, err
		}, "kube-apiserver"},
		{criSet, func(w io.Writer) (string, error) { return BuildCrictl(context.Background(), w) }, "crictl"},
		{coreDNSSet, func(w io.Writer) (string, error) { return BuildCoreDNS(context.Background(), w) }, "coredns"},
	} {
		mod, err := moduleDir(c.set.module)
		if err != nil {
			t.Fatal(err)
		}
		key, err := buildKey(context.Background(), mod, c.set.key, c.set.sources)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(root, key)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, st := range c.set.steps {
			if err := os.WriteFile(filepath.Join(dir, st.out), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		var out strings.Builder
		got, err := c.build(&out)
		if err != nil {
			t.Fatal(err)
		}
		if got != filepath.Join(dir, c.want) {
			t.Errorf("%s: got %s, want the cached one in %s", c.set.names, got, dir)
		}
		if want := "testenv/kube: " + c.set.names + " found in " + dir + "\n"; out.String() != want {
			t.Errorf("printed %q, want %q", out.String(), want)
		}
	}
}

// TestBuildKeyHashesSources: a set's key follows the contents of its
// sources (CoreDNS's main package: a changed plugin list is a new binary),
// and a set without sources keeps the key it had before sources existed,
// the hash of go.mod, go.sum, the Go version and the platform, so that no
// cached kube binary is rebuilt for them.
func TestBuildKeyHashesSources(t *testing.T) {
	mod := t.TempDir()
	for name, data := range map[string]string{
		"go.mod":  "module example.com/m\n\ngo 1.26.0\n\nrequire example.com/dep v1.2.3\n",
		"go.sum":  "example.com/dep v1.2.3 h1:x=\n",
		"main.go": "package main\n\nfunc main() {}\n",
	} {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	name := func(gomod []byte, gover string) string { return "m-" + moduleVersion(gomod, "example.com/dep") }
	ctx := context.Background()
	plain, err := buildKey(ctx, mod, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	gover, err := exec.Command(goCmd(), "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(mod, f))
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	h.Write([]byte(strings.TrimSpace(string(gover)) + runtime.GOOS + runtime.GOARCH))
	if want := "m-v1.2.3-" + hex.EncodeToString(h.Sum(nil))[:10]; plain != want {
		t.Errorf("key without sources %s, want %s (the key before sources: cached builds must stay valid)", plain, want)
	}
	withMain, err := buildKey(ctx, mod, name, []string{"main.go"})
	if err != nil {
		t.Fatal(err)
	}
	if withMain == plain {
		t.Errorf("key with main.go %s equals the key without", withMain)
	}
	if err := os.WriteFile(filepath.Join(mod, "main.go"), []byte("package main\n\nfunc main() { println() }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed, err := buildKey(ctx, mod, name, []string{"main.go"})
	if err != nil {
		t.Fatal(err)
	}
	if changed == withMain {
		t.Errorf("key %s did not change with main.go", changed)
	}
	if again, err := buildKey(ctx, mod, name, nil); err != nil || again != plain {
		t.Errorf("key without sources changed with main.go: %s, %v; want %s", again, err, plain)
	}
	if _, err := buildKey(ctx, mod, name, []string{"absent.go"}); err == nil {
		t.Error("key of a missing source: no error")
	}
}
