package cri

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostDirsRemovedByLastUser: the mount points kubelets share stay while
// any kubelet uses them, also when the one that made them stops first, and
// go with the last; a directory that was there before stays.
func TestHostDirsRemovedByLastUser(t *testing.T) {
	tmp := t.TempDir()
	registry := filepath.Join(tmp, "registry")
	made := filepath.Join(tmp, "var", "lib", "kubelet", "device-plugins")
	existing := filepath.Join(tmp, "log")
	if err := os.Mkdir(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	dirs := []string{made, existing}
	ctx := context.Background()

	first, err := acquireHostDirs(ctx, registry, dirs)
	if err != nil {
		t.Fatal(err)
	}
	second, err := acquireHostDirs(ctx, registry, dirs)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.release(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s gone while a user remains: %v", d, err)
		}
	}
	if err := second.release(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{made, filepath.Join(tmp, "var")} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left after the last user: %v", d, err)
		}
	}
	if _, err := os.Stat(existing); err != nil {
		t.Errorf("%s was there before and is gone: %v", existing, err)
	}
}

// TestHostDirsIgnoreDeadUsers: a user whose process died without releasing
// does not keep the directories forever; the next last user removes them and
// the dead one's registration.
func TestHostDirsIgnoreDeadUsers(t *testing.T) {
	tmp := t.TempDir()
	registry := filepath.Join(tmp, "registry")
	made := filepath.Join(tmp, "containers")
	ctx := context.Background()

	// pid_max itself is never a process's: pids run below it.
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	dead := strings.TrimSpace(string(b))
	lease, err := acquireHostDirs(ctx, registry, []string{made})
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(registry, "users", dead+"-1")
	if err := os.WriteFile(stale, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := lease.release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(made); !os.IsNotExist(err) {
		t.Errorf("%s left behind by a dead user: %v", made, err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("dead user's registration left: %v", err)
	}
}
