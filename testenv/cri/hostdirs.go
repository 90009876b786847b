package cri

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/isthmus-dev/isthmus/testenv/filelock"
)

// hostDirsRegistry records, across every test process on the machine, which
// kubelets use the host directories of kubeletFixedDirs as mount points and
// which of those directories the tests created. A directory that is a mount
// point in another mount namespace can still be removed on the host, and the
// kernel then detaches the mounts over it in every namespace: a kubelet of
// one test that removed "its" /var/log/containers while a kubelet of a
// parallel test ran would send the second kubelet's log links to the host's
// directory. So the directories are removed only when the last user stops.
const hostDirsRegistry = "/run/isthmus-testenv/kubelet-host-dirs"

// hostDirsLease is one kubelet's use of the shared mount points.
type hostDirsLease struct {
	registry string
	user     string // its file under users/
}

// acquireHostDirs makes every directory of dirs that is missing on the host,
// recording the ones it made in registry, and registers one more user of them.
func acquireHostDirs(ctx context.Context, registry string, dirs []string) (*hostDirsLease, error) {
	users := filepath.Join(registry, "users")
	if err := os.MkdirAll(users, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", users, err)
	}
	unlock, err := filelock.Lock(ctx, filepath.Join(registry, ".lock"), nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	f, err := os.CreateTemp(users, strconv.Itoa(os.Getpid())+"-*")
	if err != nil {
		return nil, fmt.Errorf("register kubelet host dirs user: %w", err)
	}
	f.Close()
	lease := &hostDirsLease{registry: registry, user: f.Name()}
	for _, d := range dirs {
		made, err := mkdirAllRecorded(d)
		if len(made) > 0 {
			if rerr := appendCreated(registry, made); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		if err != nil {
			lease.releaseLocked()
			return nil, err
		}
	}
	return lease, nil
}

// release drops this user; when no live user remains it removes the
// directories the tests made, innermost first.
func (l *hostDirsLease) release() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	unlock, err := filelock.Lock(ctx, filepath.Join(l.registry, ".lock"), nil)
	if err != nil {
		return err
	}
	defer unlock()
	return l.releaseLocked()
}

func (l *hostDirsLease) releaseLocked() error {
	if err := os.Remove(l.user); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unregister kubelet host dirs user: %w", err)
	}
	live, err := liveHostDirsUsers(l.registry)
	if err != nil || live > 0 {
		return err
	}
	createdFile := filepath.Join(l.registry, "created")
	created, err := readCreated(createdFile)
	if err != nil {
		return err
	}
	if err := removeDirs(created); err != nil {
		return err
	}
	if err := os.Remove(createdFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", createdFile, err)
	}
	return nil
}

// liveHostDirsUsers counts the registered users whose process still runs,
// removing the files of processes that died without releasing.
func liveHostDirsUsers(registry string) (int, error) {
	users := filepath.Join(registry, "users")
	entries, err := os.ReadDir(users)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", users, err)
	}
	live := 0
	for _, e := range entries {
		pidText, _, _ := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(pidText)
		if err == nil && (pid == os.Getpid() || syscall.Kill(pid, 0) == nil) {
			live++
			continue
		}
		os.Remove(filepath.Join(users, e.Name()))
	}
	return live, nil
}

// appendCreated adds directories, outermost first, to the registry's list.
func appendCreated(registry string, dirs []string) error {
	f, err := os.OpenFile(filepath.Join(registry, "created"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("record created host dirs: %w", err)
	}
	defer f.Close()
	for _, d := range dirs {
		if _, err := fmt.Fprintln(f, d); err != nil {
			return fmt.Errorf("record created host dirs: %w", err)
		}
	}
	return nil
}

// readCreated reads the registry's list of directories the tests made.
func readCreated(path string) ([]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read created host dirs: %w", err)
	}
	defer f.Close()
	var dirs []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if d := strings.TrimSpace(s.Text()); d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs, s.Err()
}
