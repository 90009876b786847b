package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/buildinfo"
)

// TestVersionFromLdflags: the binary built as the Makefile builds it
// (-ldflags -X for the release and commit) prints both, and its Go version.
func TestVersionFromLdflags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "isthmus")
	const pkg = "github.com/isthmus-dev/isthmus/loader/buildinfo"
	ldflags := "-X " + pkg + ".Release=v9.8.7-test -X " + pkg + ".Commit=0123456789abcdef0123456789abcdef01234567"
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, "./").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("isthmus version: %v\n%s", err, out)
	}
	if want := "isthmus v9.8.7-test commit 0123456789abcdef0123456789abcdef01234567 " + runtime.Version() + "\n"; string(out) != want {
		t.Errorf("isthmus version printed %q, want %q", out, want)
	}
	out, err = exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("isthmus version -o json: %v", err)
	}
	var got buildinfo.Info
	if err := json.Unmarshal(out, &got); err != nil || got != (buildinfo.Info{Release: "v9.8.7-test", Commit: "0123456789abcdef0123456789abcdef01234567", GoVersion: runtime.Version()}) {
		t.Errorf("isthmus version -o json: %s (%v)", out, err)
	}
}

// TestVersionFallback: built without -ldflags, the binary names the module
// version and the commit the Go toolchain stamped into it, as `go version -m`
// (the toolchain's own reader) reports them, and "unknown" where it stamped
// none (-buildvcs=false; a git worktree, whose .git is a file the toolchain
// does not follow; "(devel)" is no version). In a git checkout Go 1.24 and
// later stamp a pseudo-version from the commit as the module's version.
func TestVersionFallback(t *testing.T) {
	for _, vcs := range []string{"-buildvcs=auto", "-buildvcs=false"} {
		bin := filepath.Join(t.TempDir(), "isthmus")
		if out, err := exec.Command("go", "build", vcs, "-o", bin, "./").CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", vcs, err, out)
		}
		meta, err := exec.Command("go", "version", "-m", bin).Output()
		if err != nil {
			t.Fatalf("go version -m: %v", err)
		}
		release, commit, dirty := "unknown", "unknown", ""
		for _, line := range strings.Split(string(meta), "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == "mod" && f[2] != "(devel)" {
				release = f[2]
			}
			if len(f) != 2 || f[0] != "build" {
				continue
			}
			if rev, ok := strings.CutPrefix(f[1], "vcs.revision="); ok {
				commit = rev
			}
			if f[1] == "vcs.modified=true" {
				dirty = "-dirty"
			}
		}
		if commit != "unknown" {
			commit += dirty
		}
		out, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("isthmus version: %v\n%s", err, out)
		}
		if vcs == "-buildvcs=false" && commit != "unknown" {
			t.Errorf("go version -m finds %s in a -buildvcs=false build", commit)
		}
		if want := "isthmus " + release + " commit " + commit + " "; !strings.HasPrefix(string(out), want) {
			t.Errorf("%s: isthmus version printed %q, want it to start with %q (go version -m:\n%s)", vcs, out, want, meta)
		}
	}
}
