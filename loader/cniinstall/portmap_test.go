package cniinstall

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPortmapRestoredOnUninstall: Uninstall leaves the CNI bin directory's
// portmap as the first install found it: the node's own back in place, or
// none when there was none; an upgrade's install does not take the shipped
// portmap for the node's; a portmap isthmus never installed stays.
func TestPortmapRestoredOnUninstall(t *testing.T) {
	shipped := filepath.Join(t.TempDir(), "portmap")
	if err := os.WriteFile(shipped, []byte("shipped"), 0o755); err != nil {
		t.Fatal(err)
	}
	read := func(dir string) string {
		b, err := os.ReadFile(filepath.Join(dir, PortmapName))
		if os.IsNotExist(err) {
			return "none"
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	entries := func(dir string) int {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	for _, tc := range []struct {
		name, before string // "none": no portmap before
	}{{"none before", "none"}, {"the node's own before", "node's own"}} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			if tc.before != "none" {
				if err := os.WriteFile(filepath.Join(bin, PortmapName), []byte(tc.before), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			// Install, then install again (an upgrade, an agent restart).
			for range 2 {
				if err := InstallPlugin(shipped, bin); err != nil {
					t.Fatal(err)
				}
				if err := InstallPortmap(shipped, bin); err != nil {
					t.Fatal(err)
				}
				if got := read(bin); got != "shipped" {
					t.Fatalf("portmap after install: %q, want the shipped one", got)
				}
			}
			if err := Uninstall(bin, ""); err != nil {
				t.Fatal(err)
			}
			if got := read(bin); got != tc.before {
				t.Errorf("portmap after uninstall: %q, want %q", got, tc.before)
			}
			want := 0
			if tc.before != "none" {
				want = 1
			}
			if n := entries(bin); n != want {
				t.Errorf("bin dir after uninstall holds %d entries, want %d (no record, no saved copy, no plugin)", n, want)
			}
		})
	}
	t.Run("never installed", func(t *testing.T) {
		bin := t.TempDir()
		if err := os.WriteFile(filepath.Join(bin, PortmapName), []byte("node's own"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := Uninstall(bin, ""); err != nil {
			t.Fatal(err)
		}
		if got := read(bin); got != "node's own" {
			t.Errorf("portmap after uninstall without install: %q, want the node's own", got)
		}
	})
}
