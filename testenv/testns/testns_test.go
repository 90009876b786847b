package testns

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestPidOf(t *testing.T) {
	for _, c := range []struct {
		name string
		pid  int
		ok   bool
	}{
		{"isthmus-at-123-beef", 123, true},
		{"isthmus-at-beef", 0, false},
		{"isthmus-at-123", 0, false},
		{"isthmus-att-123-beef", 0, false},
		{"other-123-beef", 0, false},
	} {
		pid, ok := pidOf("isthmus-at", c.name)
		if pid != c.pid || ok != c.ok {
			t.Errorf("pidOf(%q) = %d, %v; want %d, %v", c.name, pid, ok, c.pid, c.ok)
		}
	}
	if pid, ok := pidOf("p", Name("p")); !ok || pid != os.Getpid() {
		t.Errorf("pidOf(Name) = %d, %v; want this process", pid, ok)
	}
}

// deadPid returns a process ID no process has: the highest free one below
// the kernel's pid_max.
func deadPid(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	for pid := max - 1; pid > 1; pid-- {
		if !running(pid) {
			return pid
		}
	}
	t.Fatal("every process ID is taken")
	return 0
}

// TestSweep: a namespace and a pin directory of a process that has exited
// go; those of this (running) process stay.
func TestSweep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test creates named network namespaces and needs root")
	}
	dead := deadPid(t)
	prefix := "isthmus-sweeptest"
	gone := prefix + "-" + strconv.Itoa(dead) + "-0001"
	kept := Name(prefix)
	for _, n := range []string{gone, kept} {
		if out, err := exec.Command("ip", "netns", "add", n).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v\n%s", n, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", n).Run() })
		if err := os.Mkdir(filepath.Join(PinRoot, n), 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(filepath.Join(PinRoot, n)) })
	}
	removed, err := Sweep(prefix)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{filepath.Join(NetnsDir, gone), filepath.Join(PinRoot, gone)}
	slices.Sort(want)
	if strings.Join(removed, " ") != strings.Join(want, " ") {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, dir := range []string{NetnsDir, PinRoot} {
		if _, err := os.Stat(filepath.Join(dir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s/%s is still there (%v)", dir, gone, err)
		}
		if _, err := os.Stat(filepath.Join(dir, kept)); err != nil {
			t.Errorf("%s/%s of this process was removed: %v", dir, kept, err)
		}
	}
}
