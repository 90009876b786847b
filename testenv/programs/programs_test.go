package programs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEmbeddedTableParses keeps the shipped table readable by both Parse and
// hack/install-deps.sh (which splits on tabs): four fields a row, no duplicate.
func TestEmbeddedTableParses(t *testing.T) {
	tab, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if len(tab.All()) < 10 {
		t.Fatalf("embedded table has %d rows; want every program the project runs", len(tab.All()))
	}
	for _, name := range []string{"ping", "ip", "tshark", "iperf3", "nsenter"} {
		if _, ok := tab.Lookup(name); !ok {
			t.Errorf("embedded table does not list %s", name)
		}
	}
}

func TestParseRejectsMalformedRows(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"three fields", "ping\tiputils-ping\t-\n", "4 (program"},
		{"empty field", "ping\t\t-\tx\n", "field 2 is empty"},
		{"spaces not tabs", "ping iputils-ping - x\n", "1 tab-separated fields"},
		{"duplicate", "ip\tiproute2\t-\tx\nip\tiproute2\t-\ty\n", "listed twice"},
		{"path", "/usr/bin/ip\tiproute2\t-\tx\n", "base name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.text)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse(%q) = %v, want an error containing %q", tc.text, err, tc.want)
			}
		})
	}
}

func TestParseDashMeansNone(t *testing.T) {
	tab, err := Parse("# comment\n\ngo\t-\t-\tthe build\npython3\tpython3-scapy\tpython3 -c 'import scapy'\tscapy tests\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []Program{
		{Name: "go", UsedBy: "the build"},
		{Name: "python3", Package: "python3-scapy", Check: "python3 -c 'import scapy'", UsedBy: "scapy tests"},
	}
	got := tab.All()
	if len(got) != len(want) {
		t.Fatalf("rows %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestRequire runs Require against a table of its own: programs that exist
// (sh, and one written into a temporary PATH), one that is listed but absent,
// one whose check fails, and one that is not listed.
func TestRequire(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "isthmus-test-fake-tool")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	tab, err := Parse(strings.Join([]string{
		"sh\tdash\t-\tx",
		"isthmus-test-fake-tool\tfake-pkg\ttrue\tx",
		"isthmus-test-absent-tool\tabsent-pkg\t-\tx",
		"isthmus-test-fake-tool-broken\tbroken-pkg\tfalse\tx",
		"isthmus-test-not-apt\t-\t-\tthe README says how",
	}, "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fake, filepath.Join(dir, "isthmus-test-fake-tool-broken")); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{"sh", "isthmus-test-fake-tool", fake} {
		if err := tab.Require(ok); err != nil {
			t.Errorf("Require(%s) = %v, want nil", ok, err)
		}
	}
	for _, tc := range []struct {
		name   string
		is     error
		naming []string
	}{
		{"isthmus-test-absent-tool", ErrMissing, []string{"isthmus-test-absent-tool", "Debian package absent-pkg", InstallScript}},
		{"isthmus-test-fake-tool-broken", ErrMissing, []string{"isthmus-test-fake-tool-broken", "`false` fails", "broken-pkg", InstallScript}},
		{"isthmus-test-not-apt", ErrMissing, []string{"isthmus-test-not-apt", "not from apt: the README says how"}},
		{"isthmus-test-unlisted", ErrUnlisted, []string{"isthmus-test-unlisted", TablePath}},
		{"/usr/bin/isthmus-test-unlisted", ErrUnlisted, []string{"/usr/bin/isthmus-test-unlisted", TablePath}},
		{filepath.Join(dir, "built-binary-that-is-gone"), ErrMissing, []string{"built-binary-that-is-gone"}},
	} {
		err := tab.Require(tc.name)
		if !errors.Is(err, tc.is) {
			t.Errorf("Require(%s) = %v, want %v", tc.name, err, tc.is)
			continue
		}
		for _, s := range tc.naming {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("Require(%s) = %q, does not name %q", tc.name, err, s)
			}
		}
	}
}

// TestRequireRemembersOnlySuccess: a program installed after a failed Require
// is found by the next call.
func TestRequireRemembersOnlySuccess(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	tab, err := Parse("isthmus-test-late-tool\tlate-pkg\t-\tx\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := tab.Require("isthmus-test-late-tool"); !errors.Is(err, ErrMissing) {
		t.Fatalf("before install: Require = %v, want ErrMissing", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "isthmus-test-late-tool"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := tab.Require("isthmus-test-late-tool"); err != nil {
		t.Fatalf("after install: Require = %v, want nil", err)
	}
}
