package programs

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestInstallDepsReadsTable runs hack/install-deps.sh --missing (which only
// reads, never installs) on PATHs made for the test, and checks it asks for
// exactly the packages of the table's absent programs.
func TestInstallDepsReadsTable(t *testing.T) {
	tab, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(moduleRoot(t), InstallScript)
	truth, err := exec.LookPath("true")
	if err != nil {
		t.Fatalf("find true (coreutils): %v", err)
	}
	missing := func(t *testing.T, path string) []string {
		t.Helper()
		cmd := exec.Command("bash", script, "--missing")
		cmd.Env, cmd.Dir = []string{"PATH=" + path}, t.TempDir()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s --missing: %v\n%s", script, err, out)
		}
		got := strings.Fields(string(out))
		slices.Sort(got)
		return got
	}

	t.Run("nothing on PATH", func(t *testing.T) {
		var want []string
		for _, p := range tab.All() {
			if p.Package != "" {
				want = append(want, strings.Split(p.Package, ",")...)
			}
		}
		slices.Sort(want)
		want = slices.Compact(want)
		if got := missing(t, t.TempDir()); !slices.Equal(got, want) {
			t.Errorf("packages asked for:\n got %v\nwant %v", got, want)
		}
	})

	t.Run("all but ping", func(t *testing.T) {
		dir := t.TempDir()
		for _, p := range tab.All() {
			if p.Name == "ping" {
				continue
			}
			// sh stands for true too, so every check column passes.
			if err := os.Symlink(truth, filepath.Join(dir, p.Name)); err != nil {
				t.Fatal(err)
			}
		}
		ping, _ := tab.Lookup("ping")
		if got := missing(t, dir); !slices.Equal(got, []string{ping.Package}) {
			t.Errorf("packages asked for: %v, want [%s]", got, ping.Package)
		}
	})
}
