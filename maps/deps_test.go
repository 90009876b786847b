package maps

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoLoaderImports: package maps is the kernel's maps as Go types and
// access, below the loader. Translating a plan into map state belongs to the
// loader (loader/mapstate); if maps imported loader/plan or any other loader
// package, a change of the plan would rebuild, and could break, what reads
// the pinned maps (isthmus inspect, the datapath tests).
func TestNoLoaderImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 2 {
		t.Fatalf("go list -deps listed %v: too few to be this package's dependencies", deps)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/isthmus-dev/isthmus/loader/") {
			t.Errorf("package maps depends on %s", d)
		}
	}
}
