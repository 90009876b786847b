package testenv

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// TestExecNamesMissingProgram: a program the machine lacks fails before
// nsenter runs, with its name, its Debian package and the install script, not
// as nsenter's "exit status 127". No namespace is needed, since nothing starts.
func TestExecNamesMissingProgram(t *testing.T) {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Fatalf("this test needs nsenter (util-linux) to isolate the missing program: %v", err)
	}
	// A PATH with nsenter and nothing else: tcpdump is listed but, here, absent.
	dir := t.TempDir()
	if err := os.Symlink(nsenter, filepath.Join(dir, "nsenter")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	for _, tc := range []struct {
		program string
		is      error
		naming  []string
	}{
		{"tcpdump", programs.ErrMissing, []string{"tcpdump", "Debian package tcpdump", programs.InstallScript}},
		{"isthmus-test-unlisted-tool", programs.ErrUnlisted, []string{"isthmus-test-unlisted-tool", programs.TablePath}},
	} {
		out, err := Exec(context.Background(), "isthmus-no-such-ns", tc.program, "-h")
		if !errors.Is(err, tc.is) {
			t.Errorf("Exec %s = %v (output %q), want %v", tc.program, err, out, tc.is)
			continue
		}
		for _, s := range tc.naming {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("Exec %s: error %q does not name %q", tc.program, err, s)
			}
		}
		if cmd := Command(context.Background(), "isthmus-no-such-ns", tc.program); cmd.Start() == nil {
			cmd.Process.Kill()
			t.Errorf("Command %s started", tc.program)
		}
	}
}
