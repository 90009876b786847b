package main

import (
	"os/exec"
	"strings"
	"testing"
)

// imageMains are the main packages whose binaries the image carries
// (Dockerfile: /usr/local/bin/isthmus and isthmus-cni).
var imageMains = []string{
	"github.com/isthmus-dev/isthmus/cmd/isthmus",
	"github.com/isthmus-dev/isthmus/cmd/isthmus-cni",
}

// notInImage are the packages, and the trees under them, that are the lab,
// the benchmarks or the helpers that build kube binaries: cmd/isthmus-lab's,
// never the image's.
var notInImage = []string{
	"github.com/isthmus-dev/isthmus/testenv",
	"github.com/isthmus-dev/isthmus/loader/cpbench",
	"github.com/isthmus-dev/isthmus/loader/fleet",
	"github.com/isthmus-dev/isthmus/cmd/isthmus-lab",
}

// TestImageLinksNoLab: `go list -deps` of the image's main packages (what
// the go tool links into them) names no lab, bench or build helper.
func TestImageLinksNoLab(t *testing.T) {
	out, err := exec.Command("go", append([]string{"list", "-deps"}, imageMains...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps named %d packages, too few to be the binaries' dependencies:\n%s", len(deps), out)
	}
	for _, mainPkg := range imageMains {
		if !strings.Contains("\n"+string(out), "\n"+mainPkg+"\n") {
			t.Errorf("go list -deps does not list %s itself:\n%s", mainPkg, out)
		}
	}
	for _, dep := range deps {
		for _, bad := range notInImage {
			if dep == bad || strings.HasPrefix(dep, bad+"/") {
				t.Errorf("the image's binaries link %s", dep)
			}
		}
	}
}
