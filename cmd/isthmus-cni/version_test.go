package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/isthmus-dev/isthmus/loader/buildinfo"
)

// TestVersionNamesBuild: a plugin built with the release and commit set as
// the Makefile sets them answers VERSION with both beside the CNI versions,
// which the CNI library's own decoder still reads, and names them in its
// about line.
func TestVersionNamesBuild(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "isthmus-cni")
	const pkg = "github.com/isthmus-dev/isthmus/loader/buildinfo"
	ldflags := "-X " + pkg + ".Release=v9.8.7-test -X " + pkg + ".Commit=0123456789abcdef0123456789abcdef01234567-dirty"
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, "./").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	info, err := (&version.PluginDecoder{}).Decode(out)
	if err != nil || !strings.Contains(strings.Join(info.SupportedVersions(), ","), "1.1.0") {
		t.Fatalf("the CNI library reads VERSION's %s as %v (%v), want 1.1.0 among the supported versions", out, info, err)
	}
	var got struct {
		Isthmus buildinfo.Info `json:"isthmus"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got.Isthmus.Release != "v9.8.7-test" || got.Isthmus.Commit != "0123456789abcdef0123456789abcdef01234567-dirty" || !strings.HasPrefix(got.Isthmus.GoVersion, "go") {
		t.Errorf("VERSION names the build %+v, want release v9.8.7-test and the commit:\n%s", got.Isthmus, out)
	}

	// No CNI_COMMAND: the about line on stderr.
	about, _ := exec.Command(bin).CombinedOutput()
	if !strings.Contains(string(about), "isthmus CNI plugin v9.8.7-test commit 0123456789abcdef0123456789abcdef01234567-dirty go") {
		t.Errorf("about line %q does not name the release and commit", about)
	}
}
