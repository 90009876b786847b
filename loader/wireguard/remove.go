package wireguard

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
)

// removeWait is how long Remove waits for a userspace process to exit after
// SIGTERM before it sends SIGKILL.
const removeWait = 5 * time.Second

// Remove deletes the WireGuard device name: the userspace process serving its
// socket (in any network namespace: the sockets are shared) is stopped, SIGTERM
// then SIGKILL after 5 s, and a stale socket removed; a link of that name in the
// caller's network namespace is deleted (the kernel's device, or the TUN of a
// process that is gone). A device that does not exist is no error. It is for
// `isthmus uninstall`: an agent never removes its device.
func Remove(name string) error {
	var errs []error
	if pid, err := socketPid(name); err == nil {
		if err := stopProcess(pid); err != nil {
			errs = append(errs, fmt.Errorf("stop the userspace WireGuard process %d of %s: %w", pid, name, err))
		}
	}
	if err := os.Remove(socketPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove %s: %w", socketPath(name), err))
	}
	if l, err := netlink.LinkByName(name); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete link %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// stopProcess sends pid SIGTERM, and SIGKILL if it is still there after
// removeWait.
func stopProcess(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	deadline := time.Now().Add(removeWait)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
