package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// NetnsDir is where named network namespaces live (as with `ip netns`).
const NetnsDir = "/run/netns"

// NSPath returns the bind-mount path of the named network namespace.
func NSPath(name string) string { return filepath.Join(NetnsDir, name) }

// prepareNetnsDir makes /run/netns a shared mount point of its own, as
// `ip netns add` does the first time it runs. Without this, the first `ip netns
// add` anywhere on the machine bind-mounts the directory over itself and hides
// (and pins forever) every namespace mounted in it before.
func prepareNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", NetnsDir, err)
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount %s: %w", NetnsDir, err)
		}
		err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", NetnsDir, err)
	}
	return nil
}

// createNS creates the named network namespace, leaving the caller's thread in
// its own namespace.
func createNS(name string) error {
	if err := prepareNetnsDir(); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		if serr := netns.Set(orig); serr != nil {
			// The thread is stuck in the wrong namespace: keep it locked so the
			// runtime throws it away when this goroutine ends.
			errc <- errors.Join(err, fmt.Errorf("restore netns: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		if err != nil {
			err = fmt.Errorf("create netns %s: %w", name, err)
		}
		errc <- err
	}()
	return <-errc
}

// deleteNS removes the named network namespace; a missing one is not an error.
func deleteNS(name string) error {
	err := netns.DeleteNamed(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		// A stale file without a mount underneath still has to go.
		if rerr := os.Remove(NSPath(name)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("delete netns %s: %w", name, err)
		}
	}
	return nil
}

// listNS returns the named namespaces whose names start with prefix.
func listNS(prefix string) ([]string, error) {
	ents, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list netns: %w", err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Do runs fn on an OS thread switched into the named network namespace, so every
// socket fn opens belongs to that namespace (a socket stays in the namespace it
// was created in, whatever the thread does later). fn must not start goroutines
// that expect to be in the namespace.
func Do(nsName string, fn func() error) error {
	target, err := netns.GetFromPath(NSPath(nsName))
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsName, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", nsName, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("restore netns: %w", err))
			return // leave the thread locked: it dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// handleAt returns a netlink handle working in the named namespace, and the
// namespace handle (for moving links there); close both.
func handleAt(nsName string) (*netlink.Handle, netns.NsHandle, error) {
	ns, err := netns.GetFromPath(NSPath(nsName))
	if err != nil {
		return nil, 0, fmt.Errorf("open netns %s: %w", nsName, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, 0, fmt.Errorf("netlink handle in %s: %w", nsName, err)
	}
	return h, ns, nil
}

// Command returns a command that runs argv inside the named network namespace
// through nsenter --net (unlike `ip netns exec`, it keeps /sys and so
// /sys/fs/bpf as they are). When nsenter or argv[0] is missing, or not listed
// in testenv/programs' table, the command does not start: Start, Run and
// Output return an error naming the program and its Debian package.
func Command(ctx context.Context, nsName string, argv ...string) *exec.Cmd {
	return CommandAt(ctx, NSPath(nsName), argv...)
}

// CommandAt is Command for the network namespace at path: a pod's, which a
// container runtime keeps outside NetnsDir.
func CommandAt(ctx context.Context, path string, argv ...string) *exec.Cmd {
	args := append([]string{"--net=" + path, "--"}, argv...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	if err := requireArgv(argv); err != nil {
		cmd.Err = err
	}
	return cmd
}

// requireArgv checks nsenter and the program argv runs.
func requireArgv(argv []string) error {
	if len(argv) == 0 {
		return errors.New("run in netns: no program given")
	}
	if err := programs.Require("nsenter"); err != nil {
		return err
	}
	return programs.Require(argv[0])
}

// Exec runs argv inside the named network namespace and returns its combined
// output; a non-zero exit is an error carrying the output.
func Exec(ctx context.Context, nsName string, argv ...string) (string, error) {
	out, err := Command(ctx, nsName, argv...).CombinedOutput()
	if err != nil {
		err = fmt.Errorf("run %q in %s: %w", strings.Join(argv, " "), nsName, err)
		if text := strings.TrimSpace(string(out)); text != "" {
			err = fmt.Errorf("%w: %s", err, text)
		}
		return string(out), err
	}
	return string(out), nil
}

// writeSysctls sets /proc/sys entries (keys like "net/ipv4/ip_forward") inside
// the named namespace; /proc/sys/net follows the writing thread's namespace.
func writeSysctls(nsName string, kv map[string]string) error {
	return Do(nsName, func() error {
		for k, v := range kv {
			if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
				return fmt.Errorf("set sysctl %s in %s: %w", k, nsName, err)
			}
		}
		return nil
	})
}
