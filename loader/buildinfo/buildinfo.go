// Package buildinfo says which build of isthmus runs: its release and its
// commit, as `isthmus version`, the CNI plugin's VERSION answer and the
// isthmus_build_info metric print them. The build sets both with
//
//	-ldflags "-X github.com/isthmus-dev/isthmus/loader/buildinfo.Release=v0.3.0
//	          -X github.com/isthmus-dev/isthmus/loader/buildinfo.Commit=<git rev-parse HEAD>"
//
// (the Makefile and the Dockerfile do); a build that does not falls back to
// what the Go toolchain recorded (runtime/debug.ReadBuildInfo: the module
// version, and the VCS revision of a build inside a git checkout).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Release and Commit are set at link time (-ldflags -X); empty means not set.
var (
	Release = ""
	Commit  = ""
)

// Unknown is what Info holds for a release or commit no source gave.
const Unknown = "unknown"

// Info is one build's identity.
type Info struct {
	// Release is the version: `git describe` of a tagged build (v0.3.0,
	// v0.3.0-4-g1a2b3c4), "dev" for a build from an untagged tree, the
	// module version of `go install ...@v0.3.0`, or Unknown.
	Release string `json:"release"`
	// Commit is the git commit built, with "-dirty" when the tree had
	// changes, or Unknown.
	Commit string `json:"commit"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"goVersion"`
}

// String is Info on one line: "v0.3.0 commit 1a2b3c4... go1.26.0".
func (i Info) String() string {
	return fmt.Sprintf("%s commit %s %s", i.Release, i.Commit, i.GoVersion)
}

// Get returns this binary's Info: Release and Commit where the build set
// them, else what debug.ReadBuildInfo recorded.
func Get() Info { return get(Release, Commit, debug.ReadBuildInfo) }

// get is Get with the link-time values and the build info reader given.
func get(release, commit string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Release: release, Commit: commit, GoVersion: runtime.Version()}
	bi, ok := read()
	if ok && bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	if info.Release == "" {
		info.Release = Unknown
		// "(devel)" is what a build inside the module records: no version.
		if ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Release = bi.Main.Version
		}
	}
	if info.Commit == "" {
		info.Commit = Unknown
		if ok {
			var rev string
			var dirty bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if rev != "" {
				info.Commit = rev
				if dirty {
					info.Commit += "-dirty"
				}
			}
		}
	}
	return info
}
