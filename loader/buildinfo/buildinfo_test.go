package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestGetFallsBack(t *testing.T) {
	vcs := func(rev, modified string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Path: "github.com/isthmus-dev/isthmus", Version: "(devel)"},
				Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}, true
		}
	}
	installed := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Path: "github.com/isthmus-dev/isthmus", Version: "v0.3.0"}}, true
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	const rev = "1a2b3c4d5e6f708192a3b4c5d6e7f80912a3b4c5"
	for _, tt := range []struct {
		name            string
		release, commit string
		read            func() (*debug.BuildInfo, bool)
		want            Info
	}{
		{"ldflags win over vcs", "v0.3.0", "abc", vcs(rev, "false"), Info{"v0.3.0", "abc", "go1.26.1"}},
		{"vcs of a clean tree", "", "", vcs(rev, "false"), Info{Unknown, rev, "go1.26.1"}},
		{"vcs of a dirty tree", "", "", vcs(rev, "true"), Info{Unknown, rev + "-dirty", "go1.26.1"}},
		{"release only from ldflags", "v0.3.0", "", vcs(rev, "false"), Info{"v0.3.0", rev, "go1.26.1"}},
		{"go install @version", "", "", installed, Info{"v0.3.0", Unknown, "go1.26.1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := get(tt.release, tt.commit, tt.read); got != tt.want {
				t.Errorf("get = %+v, want %+v", got, tt.want)
			}
		})
	}
	if got := get("", "", none); got.Release != Unknown || got.Commit != Unknown || got.GoVersion == "" {
		t.Errorf("get without build info = %+v, want unknown release and commit and this Go", got)
	}
}
