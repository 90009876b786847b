// Package testns names what kernel tests leave outside the test process
// (named network namespaces, BPF pin directories) after that process, and
// removes what dead test processes left behind.
//
// A test's cleanup deletes what it created, but a test binary that go test
// kills at its -timeout runs no cleanup. Names carry the process ID
// (PREFIX-PID-RANDOM), so the next run of any test that uses the same prefix
// can tell a leftover (its process is gone) from what a concurrent test
// package is using (its process runs), and removes only the former.
package testns

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces are bound (ip netns).
const NetnsDir = "/run/netns"

// PinRoot is the BPF file system the tests pin under.
const PinRoot = "/sys/fs/bpf"

// Name returns PREFIX-PID-RANDOM for this process.
func Name(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", prefix, os.Getpid(), hex.EncodeToString(b))
}

var swept sync.Map // prefix -> *sync.Once

// SweepOnce removes, the first time this process asks for prefix, the named
// network namespaces and pin directories called prefix-PID-* whose process PID
// no longer runs. It returns what it removed and the errors of what it could
// not.
func SweepOnce(prefix string) (removed []string, err error) {
	once, _ := swept.LoadOrStore(prefix, new(sync.Once))
	once.(*sync.Once).Do(func() { removed, err = Sweep(prefix) })
	return removed, err
}

// Leftovers is SweepOnce for a test: it logs on t what it removed, and what
// it could not (names are unique, so a leftover never blocks the test).
func Leftovers(t testing.TB, prefix string) {
	t.Helper()
	removed, err := SweepOnce(prefix)
	for _, r := range removed {
		t.Logf("removed %s, left by a test process that is gone", r)
	}
	if err != nil {
		t.Logf("leftovers of earlier test runs: %v", err)
	}
}

// Sweep is SweepOnce without the once.
func Sweep(prefix string) (removed []string, err error) {
	var errs []error
	for _, dir := range []string{NetnsDir, PinRoot} {
		ents, rerr := os.ReadDir(dir)
		if rerr != nil {
			if !errors.Is(rerr, os.ErrNotExist) {
				errs = append(errs, rerr)
			}
			continue
		}
		for _, e := range ents {
			pid, ok := pidOf(prefix, e.Name())
			if !ok || running(pid) {
				continue
			}
			path := filepath.Join(dir, e.Name())
			var derr error
			if dir == NetnsDir {
				derr = netns.DeleteNamed(e.Name())
			} else {
				derr = os.RemoveAll(path)
			}
			if derr != nil {
				errs = append(errs, fmt.Errorf("remove leftover %s: %w", path, derr))
				continue
			}
			removed = append(removed, path)
		}
	}
	return removed, errors.Join(errs...)
}

// pidOf parses prefix-PID-RANDOM.
func pidOf(prefix, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return 0, false
	}
	p, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	return pid, err == nil && pid > 0
}

// running reports whether process pid exists (a reused PID counts: then the
// leftover waits for a later sweep).
func running(pid int) bool {
	return unix.Kill(pid, 0) != unix.ESRCH
}
