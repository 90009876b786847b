package wireguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl"
)

// UserspaceCommand is the isthmus subcommand that runs RunUserspace;
// SpawnUserspace starts `EXE wireguard-userspace --name NAME --mtu MTU`.
const UserspaceCommand = "wireguard-userspace"

// DefaultMTU is WireGuard's default device MTU: 1500 less the outer IPv6, UDP
// and WireGuard headers.
const DefaultMTU = device.DefaultMTU

// socketDir is where userspace devices serve their UAPI socket (ipc's
// socketDirectory). It is a path, so one directory serves every network
// namespace of the mount namespace: device names must be unique across them.
const socketDir = "/var/run/wireguard"

// spawnTimeout bounds how long SpawnUserspace waits for the device to answer.
const spawnTimeout = 10 * time.Second

func socketPath(name string) string { return filepath.Join(socketDir, name+".sock") }

// RunUserspace runs the wireguard-go device name (a TUN of that name, MTU mtu,
// 0 for DefaultMTU, brought up) and serves its UAPI socket
// /var/run/wireguard/NAME.sock until ctx is done. It then closes the socket
// and the device, which removes the link. It returns an error when the device
// cannot start or stops on its own (its socket removed, its link deleted).
// The device lives in the network namespace of the calling process.
func RunUserspace(ctx context.Context, name string, mtu int, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if mtu == 0 {
		mtu = DefaultMTU
	}
	tdev, err := createTUN(name, mtu)
	if err != nil {
		return err
	}
	dev := device.NewDevice(tdev, conn.NewDefaultBind(), deviceLogger(log))
	defer dev.Close() // closes tdev too
	uapiFile, err := ipc.UAPIOpen(name)
	if err != nil {
		return fmt.Errorf("open uapi socket %s: %w", socketPath(name), err)
	}
	uapi, err := ipc.UAPIListen(name, uapiFile)
	uapiFile.Close() // the listener holds its own descriptor
	if err != nil {
		os.Remove(socketPath(name))
		return fmt.Errorf("listen on uapi socket %s: %w", socketPath(name), err)
	}
	defer func() {
		uapi.Close() // removes the socket file
		if err := os.Remove(socketPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Warn("remove uapi socket", "err", err)
		}
	}()
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("look up link %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set link %s up: %w", name, err)
	}
	served := make(chan error, 1)
	go func() {
		for {
			c, err := uapi.Accept()
			if err != nil {
				served <- err
				return
			}
			go dev.IpcHandle(c)
		}
	}()
	log.Info("userspace wireguard device running", "device", name, "mtu", mtu, "ifindex", link.Attrs().Index, "socket", socketPath(name))
	select {
	case <-ctx.Done():
		log.Info("userspace wireguard device stopping", "device", name)
		return nil
	case err := <-served:
		// UAPIListen also ends Accept when the socket file is removed:
		// wireguard-go takes that as the order to stop, and so does this.
		return fmt.Errorf("serve uapi socket %s: %w", socketPath(name), err)
	case <-dev.Wait():
		return fmt.Errorf("run userspace wireguard device %s: the device closed (its link deleted?)", name)
	}
}

// createTUN creates the TUN name for wireguard-go, without IFF_VNET_HDR.
//
// tun.CreateTUN would set IFF_VNET_HDR, and with it wireguard-go coalesces the
// UDP datagrams of one flow it decrypts into one UDP GSO packet (udpGRO) before
// writing them to the TUN. The isthmus program on this device's ingress pops
// the GENEVE header of one datagram: a coalesced packet would come out
// corrupted. Without the vnet header every packet is written as it arrived.
//
// One cost: wireguard-go learns whether the link is up by writing an empty
// packet to the TUN every second, which a TUN without the vnet header counts
// in the link's rx_dropped. That counter grows by one a second and says
// nothing about traffic.
func createTUN(name string, mtu int) (tun.Device, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tun %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tun %s: %w", name, err)
	}
	// Nonblocking before os.NewFile, so reads go through the poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tun %s: set nonblocking: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "/dev/net/tun")
	tdev, err := tun.CreateTUNFromFile(f, mtu)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("create tun %s: %w", name, err)
	}
	return tdev, nil
}

// deviceLogger sends wireguard-go's logs to log: its verbose lines (handshakes,
// keepalives) at debug level, its errors at error level.
func deviceLogger(log *slog.Logger) *device.Logger {
	return &device.Logger{
		Verbosef: func(format string, args ...any) {
			if log.Enabled(context.Background(), slog.LevelDebug) {
				log.Debug(fmt.Sprintf(format, args...))
			}
		},
		Errorf: func(format string, args ...any) {
			log.Error(fmt.Sprintf(format, args...))
		},
	}
}

// SpawnUserspace starts `exe wireguard-userspace --name NAME --mtu MTU` as a
// process of its own, and returns its pid once the device answers on its UAPI
// socket and its link is in the caller's network namespace (at most 10 s;
// then the process is killed and the error carries the end of logFile).
//
// The process outlives the caller: it runs in a new session, stdin /dev/null,
// stdout and stderr appended to logFile (created 0600, its directory 0700
// when missing), so that an agent restart keeps the device and its sessions.
// While the caller runs, a goroutine reaps the process when it exits.
//
// The process inherits the network namespace of the calling thread: a caller
// switched into another namespace must hold its goroutine locked to that
// thread (runtime.LockOSThread), and SpawnUserspace forks from it.
func SpawnUserspace(exe string, name string, mtu int, logFile string) (pid int, err error) {
	// Fork, and open the handles that wait for the device, from one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	nl, err := netlink.NewHandle()
	if err != nil {
		return 0, fmt.Errorf("open netlink: %w", err)
	}
	defer nl.Close()
	wg, err := wgctrl.New()
	if err != nil {
		return 0, fmt.Errorf("open wgctrl: %w", err)
	}
	defer wg.Close()
	if err := os.MkdirAll(filepath.Dir(logFile), 0o700); err != nil {
		return 0, fmt.Errorf("create log directory: %w", err)
	}
	out, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("open log file: %w", err)
	}
	defer out.Close() // the process has its own copy
	var logStart int64
	if fi, err := out.Stat(); err == nil {
		logStart = fi.Size()
	}
	// Absolute, since the process runs in / (a long-lived process pins no
	// directory).
	path, err := exec.LookPath(exe)
	if err == nil {
		path, err = filepath.Abs(path)
	}
	if err != nil {
		return 0, fmt.Errorf("find %s: %w", exe, err)
	}
	cmd := exec.Command(path, UserspaceCommand, "--name", name, "--mtu", strconv.Itoa(mtu))
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = out, out // *os.File: no copying goroutine to outlive
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s %s: %w", exe, UserspaceCommand, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(spawnTimeout)
	for {
		// The socket must be this process's: another device of the name
		// (here, or in another namespace) answers too until this one exits.
		if owner, err := socketPid(name); err == nil && owner == cmd.Process.Pid {
			if _, err := wg.Device(name); err == nil {
				if _, err := nl.LinkByName(name); err == nil {
					return cmd.Process.Pid, nil
				}
			}
		}
		select {
		case err := <-exited:
			return 0, fmt.Errorf("start userspace wireguard device %s: %s exited before its socket answered (%v); %s", name, exe, err, logTail(logFile, logStart))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			select {
			case <-exited:
			case <-time.After(2 * time.Second):
			}
			return 0, fmt.Errorf("start userspace wireguard device %s: no answer on %s within %v, process %d killed; %s",
				name, socketPath(name), spawnTimeout, cmd.Process.Pid, logTail(logFile, logStart))
		}
	}
}

// socketPid returns the pid of the process serving the UAPI socket of the
// device name (SO_PEERCRED: the process that listened).
func socketPid(name string) (int, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socketPath(name), Net: "unix"})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return int(cred.Pid), nil
}

// logTail returns the end of what was written to path from offset on, for
// an error message.
func logTail(path string, offset int64) string {
	const max = 2048
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("log %s: %v", path, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > max {
		offset = fi.Size() - max
	}
	b, err := io.ReadAll(io.NewSectionReader(f, offset, max))
	if err != nil {
		return fmt.Sprintf("log %s: %v", path, err)
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return fmt.Sprintf("log %s: empty", path)
	}
	return fmt.Sprintf("log %s ends:\n%s", path, text)
}
