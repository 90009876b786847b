// Package examples holds no code: its test runs `isthmus plan` on every
// example directory and checks that the lab scenarios of examples/lab run the
// examples' objects as they are.
package examples

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/isthmus-dev/isthmus/testenv"
)

var (
	binary   string // the isthmus binary, built once by TestMain
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "isthmus-examples-")
	if err != nil {
		buildErr = err
		os.Exit(m.Run())
	}
	binary = filepath.Join(dir, "isthmus")
	if out, err := exec.Command("go", "build", "-o", binary, "github.com/isthmus-dev/isthmus/cmd/isthmus").CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("go build: %w\n%s", err, out)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// isthmus returns the binary TestMain built.
func isthmus(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// exampleDirs returns every directory of examples/ that holds manifests.
func exampleDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() && e.Name() != "lab" {
			dirs = append(dirs, e.Name())
		}
	}
	if len(dirs) < 4 {
		t.Fatalf("examples: %v, want at least the four seed topologies", dirs)
	}
	return dirs
}

// nodeNames returns the names of the Nodes in dir's *.yaml files.
func nodeNames(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			var head struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if head.Kind == "Node" {
				names = append(names, head.Metadata.Name)
			}
		}
	}
	return names
}

// plan runs `isthmus plan` and returns its standard output, failing the test
// unless it exits 0 with nothing on standard error (no warning, nothing set
// aside).
func plan(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, append([]string{"plan"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("isthmus plan %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("isthmus plan %s wrote to stderr:\n%s", strings.Join(args, " "), stderr.String())
	}
	return stdout.Bytes()
}

// TestPlanExamples runs `isthmus plan`, as docs/install.md tells an operator
// to before applying, for every Node of every example: each must be accepted
// as it is, with no warning, and name the node's site.
func TestPlanExamples(t *testing.T) {
	bin := isthmus(t)
	for _, dir := range exampleDirs(t) {
		nodes := nodeNames(t, dir)
		if len(nodes) == 0 {
			t.Errorf("%s: no Node", dir)
		}
		for _, n := range nodes {
			out := plan(t, bin, "--node", n, "--objects", dir)
			if !bytes.HasPrefix(out, []byte("NODE            "+n+"\nSITE ")) {
				t.Errorf("%s: plan of %s does not start with its node and site:\n%s", dir, n, out)
			}
		}
	}
}

// TestLabRunsExamples checks that each lab scenario of examples/lab runs an
// example as it is: the objects the lab writes for its agents give every node
// the same plan (as JSON) as the example directory itself, and every example
// has a lab scenario.
func TestLabRunsExamples(t *testing.T) {
	bin := isthmus(t)
	covered := map[string]bool{}
	files, err := filepath.Glob("lab/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		sc, err := testenv.LoadScenario(f)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Clean(filepath.Join("lab", sc.Manifests))
		covered[dir] = true
		labDir := t.TempDir()
		if err := sc.WriteObjects(labDir); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodeNames(t, dir) {
			want := plan(t, bin, "--node", n, "--objects", dir, "-o", "json")
			got := plan(t, bin, "--node", n, "--objects", labDir, "-o", "json")
			if !bytes.Equal(got, want) {
				t.Errorf("%s: node %s: the lab's objects plan\n%s\nthe example plans\n%s", f, n, got, want)
			}
		}
	}
	for _, dir := range exampleDirs(t) {
		if !covered[dir] {
			t.Errorf("example %s: no lab scenario in examples/lab runs it", dir)
		}
	}
}
