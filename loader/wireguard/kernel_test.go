package wireguard

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/testenv/testns"
)

// The tests below run WireGuard devices in network namespaces named
// wgt-PID-X; the devices are named wgtPIDX: unique per run, since the UAPI
// sockets of every namespace share /var/run/wireguard.

// requireRootAndTUN fails the test when it cannot run: these tests are part
// of the suite, not optional.
func requireRootAndTUN(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test creates network namespaces and TUN devices and needs root: run go test as root")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Fatalf("this test needs /dev/net/tun for userspace WireGuard: %v", err)
	}
}

// deviceName is this run's device name for suffix.
func deviceName(suffix string) string { return fmt.Sprintf("wgt%d%s", os.Getpid(), suffix) }

// deviceTest sets up a test of one device: root and TUN, a namespace of its
// own, the device's name for suffix and its log file; the cleanup stops a
// userspace process serving the name and prints the log if the test failed.
func deviceTest(t *testing.T, suffix string) (ns *testNS, name, logFile string) {
	t.Helper()
	requireRootAndTUN(t)
	ns = newTestNS(t, suffix)
	name = deviceName(suffix)
	stopUserspaceAtCleanup(t, name)
	logFile = filepath.Join(t.TempDir(), name+".log")
	dumpLogsOnFailure(t, logFile)
	return ns, name, logFile
}

// testNS is a named network namespace of one test.
type testNS struct {
	name string
	h    netns.NsHandle
	nl   *netlink.Handle
}

// newTestNS creates the namespace wgt-PID-suffix with lo up; the test's
// cleanup deletes it.
func newTestNS(t *testing.T, suffix string) *testNS {
	t.Helper()
	testns.Leftovers(t, "wgt")
	name := fmt.Sprintf("wgt-%d-%s", os.Getpid(), suffix) // testns' form
	ns := &testNS{name: name}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		ns.h, err = netns.NewNamed(name)
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, serr) // the thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	t.Cleanup(func() {
		ns.h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	var err error
	if ns.nl, err = netlink.NewHandleAt(ns.h); err != nil {
		t.Fatalf("netlink in %s: %v", name, err)
	}
	t.Cleanup(ns.nl.Close)
	lo, err := ns.nl.LinkByName("lo")
	if err == nil {
		err = ns.nl.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("set lo up in %s: %v", name, err)
	}
	return ns
}

// do runs fn on a thread switched into ns: what fn creates (sockets, links,
// processes) belongs to ns.
func (ns *testNS) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns.h); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", ns.name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err) // the thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// userspacePids returns the pids of the wireguard-userspace processes serving
// the device name.
func userspacePids(t *testing.T, name string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < 2 || args[1] != UserspaceCommand {
			continue
		}
		if i := slices.Index(args, "--name"); i > 0 && i+1 < len(args) && args[i+1] == name {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopUserspaceAtCleanup makes the test's cleanup stop the userspace devices
// named names (SIGTERM, by pid) and check each shut down cleanly: process
// gone, socket removed. Register it after the namespaces, so it runs before
// they are deleted.
func stopUserspaceAtCleanup(t *testing.T, names ...string) {
	t.Cleanup(func() {
		for _, name := range names {
			for _, pid := range userspacePids(t, name) {
				unix.Kill(pid, unix.SIGTERM)
				if !waitGone(pid, 5*time.Second) {
					t.Errorf("wireguard-userspace %s (pid %d) ignored SIGTERM for 5 s: killed", name, pid)
					unix.Kill(pid, unix.SIGKILL)
					waitGone(pid, 5*time.Second)
				}
			}
			if _, err := os.Stat(socketPath(name)); err == nil {
				t.Errorf("%s is left after its device stopped", socketPath(name))
				os.Remove(socketPath(name))
			}
		}
	})
}

// waitGone waits until pid no longer exists (SpawnUserspace's goroutine
// reaps it).
func waitGone(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			return true
		}
	}
	return false
}

// dumpLogsOnFailure logs the files when the test failed: the userspace
// devices' own account.
func dumpLogsOnFailure(t *testing.T, files ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			t.Logf("%s (%v):\n%s", f, err, b)
		}
	})
}

// tunFlags returns the TUN link name's mode and flags as the kernel reports
// them (IFLA_TUN_*): the flags a TUNSETIFF gave it.
func tunFlags(t *testing.T, ns *testNS, name string) (netlink.TuntapMode, netlink.TuntapFlag) {
	t.Helper()
	l, err := ns.nl.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	tt, ok := l.(*netlink.Tuntap)
	if !ok {
		t.Fatalf("link %s is a %s, want a tun", name, l.Type())
	}
	return tt.Mode, tt.Flags
}

// assertNoVnetHdr checks the userspace device name is a TUN without
// IFF_VNET_HDR (see createTUN for why).
func assertNoVnetHdr(t *testing.T, ns *testNS, name string) {
	t.Helper()
	mode, flags := tunFlags(t, ns, name)
	if mode != netlink.TUNTAP_MODE_TUN || flags&netlink.TUNTAP_NO_PI == 0 || flags&netlink.TUNTAP_VNET_HDR != 0 {
		t.Errorf("%s: tun_flags %#x, want IFF_TUN|IFF_NO_PI (0x1001) without IFF_VNET_HDR (0x4000): with it wireguard-go coalesces datagrams the datapath must see one by one",
			name, uint16(mode)|uint16(flags)) // TUNTAP_MODE_TUN is IFF_TUN
	}
}

// rawTUN creates the TUN name in ns with the TUNSETIFF flags given, as a
// process other than wireguard-go would; the test's cleanup closes it, which
// removes it.
func rawTUN(t *testing.T, ns *testNS, name string, flags uint16) {
	t.Helper()
	var fd int
	err := ns.do(func() error {
		var err error
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		ifr.SetUint16(flags)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	})
	if err != nil {
		t.Fatalf("create tun %s in %s: %v", name, ns.name, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
}

// TestVnetHdrCheckSeesTheFlag proves assertNoVnetHdr can fail: a TUN made
// with IFF_VNET_HDR, as tun.CreateTUN makes it, shows the flag.
func TestVnetHdrCheckSeesTheFlag(t *testing.T) {
	requireRootAndTUN(t)
	ns := newTestNS(t, "v")
	name := deviceName("v")
	rawTUN(t, ns, name, unix.IFF_TUN|unix.IFF_NO_PI|unix.IFF_VNET_HDR)
	if _, flags := tunFlags(t, ns, name); flags&netlink.TUNTAP_VNET_HDR == 0 {
		t.Errorf("a tun created with IFF_VNET_HDR reports flags %#x without it: the check cannot see the flag", uint16(flags))
	}
}

// testExe is this test binary, which TestMain turns into wireguard-userspace.
func testExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestSpawnUserspace starts a device from a thread in a namespace: the
// process and its link must be there, not in the test's own namespace; a
// second one for the same name must fail; SIGTERM must remove link and socket.
func TestSpawnUserspace(t *testing.T) {
	requireRootAndTUN(t)
	ns := newTestNS(t, "s")
	name := deviceName("s")
	stopUserspaceAtCleanup(t, name)
	logFile := filepath.Join(t.TempDir(), "logs", name+".log") // a directory to create
	dumpLogsOnFailure(t, logFile)
	var pid int
	if err := ns.do(func() (err error) { pid, err = SpawnUserspace(testExe(t), name, 1400, logFile); return err }); err != nil {
		t.Fatalf("SpawnUserspace: %v", err)
	}
	if got := userspacePids(t, name); !slices.Equal(got, []int{pid}) {
		t.Fatalf("wireguard-userspace processes for %s: %v, want SpawnUserspace's %d", name, got, pid)
	}
	l, err := ns.nl.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s in %s: %v", name, ns.name, err)
	}
	if l.Attrs().MTU != 1400 || l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("link %s: MTU %d flags %v, want MTU 1400 and up", name, l.Attrs().MTU, l.Attrs().Flags)
	}
	if _, err := netlink.LinkByName(name); err == nil {
		t.Errorf("link %s is in the test's own namespace: the process did not inherit the calling thread's", name)
	}
	if self, err := os.Readlink("/proc/self/ns/net"); err != nil {
		t.Fatal(err)
	} else if its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil || its == self {
		t.Errorf("process %d is in network namespace %s (%v), the test's own", pid, its, err)
	}
	assertNoVnetHdr(t, ns, name)

	err = ns.do(func() error { _, err := SpawnUserspace(testExe(t), name, 1400, logFile); return err })
	if err == nil {
		t.Errorf("a second SpawnUserspace for %s succeeded", name)
	} else {
		t.Logf("second SpawnUserspace: %v", err)
	}
	if got := userspacePids(t, name); !slices.Equal(got, []int{pid}) {
		t.Errorf("wireguard-userspace processes for %s after a second spawn: %v, want %d alone", name, got, pid)
	}

	if err := unix.Kill(pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !waitGone(pid, 5*time.Second) {
		t.Fatalf("process %d still there 5 s after SIGTERM", pid)
	}
	if _, err := ns.nl.LinkByName(name); err == nil {
		t.Errorf("link %s outlived its process", name)
	}
	if _, err := os.Stat(socketPath(name)); err == nil {
		t.Errorf("%s outlived its process", socketPath(name))
	}
	if b, _ := os.ReadFile(logFile); !strings.Contains(string(b), "userspace wireguard device stopping") {
		t.Errorf("%s does not say the device stopped:\n%s", logFile, b)
	}
}
