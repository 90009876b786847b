package wireguard

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Mode says which WireGuard implementation Ensure may create.
type Mode string

const (
	// ModeAuto creates a kernel device, or a userspace one where the kernel
	// has no wireguard module.
	ModeAuto Mode = "auto"
	// ModeKernel creates only a kernel device.
	ModeKernel Mode = "kernel"
	// ModeUserspace creates only a userspace (wireguard-go) device.
	ModeUserspace Mode = "userspace"
)

// ParseMode parses "auto", "kernel" or "userspace".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeKernel, ModeUserspace:
		return m, nil
	}
	return "", fmt.Errorf("parse wireguard mode %q: want auto, kernel or userspace", s)
}

// Kind is the implementation of a running device.
type Kind string

const (
	// KindKernel is the kernel's wireguard link.
	KindKernel Kind = "kernel"
	// KindUserspace is a wireguard-go process (isthmus wireguard-userspace)
	// behind a TUN.
	KindUserspace Kind = "userspace"
)

// DefaultPort is WireGuard's customary listen port.
const DefaultPort = 51820

// DefaultLogDir holds the userspace device processes' logs,
// wireguard-NAME.log.
const DefaultLogDir = "/var/log/isthmus"

// ErrKernelUnsupported is wrapped by Ensure's error when it may only create a
// kernel device and the kernel cannot: no wireguard module.
var ErrKernelUnsupported = errors.New("the kernel has no wireguard support (module not built or not loadable)")

// ErrUserspaceNotRunning is wrapped by Ensure's error, with Config.NoSpawn,
// when the kernel has no wireguard module and no userspace device answers yet.
var ErrUserspaceNotRunning = errors.New("no userspace WireGuard device answers yet")

// Config is the device Ensure brings about.
type Config struct {
	// Name is the link's name, at most 15 bytes. A userspace device's UAPI
	// socket is /var/run/wireguard/NAME.sock, shared by every network
	// namespace: the name must be unique across them.
	Name string
	// Mode says what Ensure may create when no device Name exists; "" is
	// ModeAuto. An existing device is adopted whatever its kind.
	Mode Mode
	// Port is the UDP listen port; 0 is DefaultPort.
	Port int
	// MTU of the link; 0 is DefaultMTU.
	MTU int
	// PrivateKey is the device's key (LoadOrCreateKey); required.
	PrivateKey wgtypes.Key
	// Exe is the isthmus binary SpawnUserspace runs; "" is os.Executable().
	Exe string
	// LogFile receives a userspace device's output; "" is
	// DefaultLogDir/wireguard-NAME.log.
	LogFile string
	// NoSpawn: another process runs the userspace device (the DaemonSet's
	// wireguard container, `isthmus wireguard-userspace --unless-kernel`), so
	// where one is needed and none answers yet Ensure returns
	// ErrUserspaceNotRunning instead of starting one: a device the caller
	// started would die with the caller's container.
	NoSpawn bool
	// Log receives what Ensure does; nil discards it.
	Log *slog.Logger
}

// Device is a WireGuard device Ensure created or adopted, and the handles that
// reach it. Its methods work in the network namespace Ensure ran in, from any
// thread. Call SyncPeers from one goroutine at a time (each reads the device,
// then writes the difference); Status may run beside it.
type Device struct {
	name      string
	kind      Kind
	ifindex   int
	publicKey wgtypes.Key
	adopted   bool

	wg *wgctrl.Client
	nl *netlink.Handle
}

// Name returns the link's name.
func (d *Device) Name() string { return d.name }

// Kind returns the implementation: KindKernel or KindUserspace.
func (d *Device) Kind() Kind { return d.kind }

// Ifindex returns the link's interface index.
func (d *Device) Ifindex() int { return d.ifindex }

// PublicKey returns the public key of the device's private key.
func (d *Device) PublicKey() wgtypes.Key { return d.publicKey }

// Adopted reports whether Ensure found the device running rather than
// creating it.
func (d *Device) Adopted() bool { return d.adopted }

// Close releases the handles; the device itself stays.
func (d *Device) Close() error {
	d.nl.Close()
	return d.wg.Close()
}

// Ensure returns the WireGuard device cfg.Name in the calling thread's network
// namespace, configured with cfg's key, port and MTU and up.
//
// A device that already answers (kernel or userspace) is adopted, never
// recreated: established sessions survive an agent restart. Otherwise Ensure
// creates one: a kernel link for ModeKernel and ModeAuto, falling back for
// ModeAuto to a userspace process (SpawnUserspace) when the kernel has no
// wireguard module; a userspace process for ModeUserspace. The key and the
// port are written only when they differ from the device's. A failure after
// creation leaves the device for the next Ensure to adopt.
func Ensure(cfg Config) (*Device, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Log.With("device", cfg.Name)
	// Open the handles, and spawn, from one thread: the namespace is the
	// thread's.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	nl, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	wg, err := wgctrl.New()
	if err != nil {
		nl.Close()
		return nil, fmt.Errorf("open wgctrl: %w", err)
	}
	d := &Device{name: cfg.Name, wg: wg, nl: nl}
	if err := d.ensure(cfg, log); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

func (cfg Config) withDefaults() (Config, error) {
	if cfg.Name == "" || len(cfg.Name) >= unix.IFNAMSIZ {
		return cfg, fmt.Errorf("ensure wireguard device %q: want a name of 1 to %d bytes", cfg.Name, unix.IFNAMSIZ-1)
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return cfg, err
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return cfg, fmt.Errorf("ensure wireguard device %s: port %d: want 1..65535", cfg.Name, cfg.Port)
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.MTU < 576 || cfg.MTU > 65535 {
		return cfg, fmt.Errorf("ensure wireguard device %s: mtu %d: want 576..65535", cfg.Name, cfg.MTU)
	}
	if cfg.PrivateKey == (wgtypes.Key{}) {
		return cfg, fmt.Errorf("ensure wireguard device %s: no private key", cfg.Name)
	}
	if cfg.LogFile == "" {
		cfg.LogFile = filepath.Join(DefaultLogDir, "wireguard-"+cfg.Name+".log")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

func (d *Device) ensure(cfg Config, log *slog.Logger) error {
	found, err := d.find()
	if err != nil {
		return err
	}
	if found {
		d.adopted = true
		log.Info("wireguard device adopted", "kind", d.kind)
	} else if err := d.create(cfg, log); err != nil {
		return err
	}
	return d.configure(cfg, log)
}

// find looks for a running device d.name and records its kind; it refuses a
// link of that name that is no WireGuard device, and a userspace device of
// that name in another network namespace.
func (d *Device) find() (bool, error) {
	dev, err := d.wg.Device(d.name)
	link, lerr := d.nl.LinkByName(d.name)
	if lerr != nil {
		var missing netlink.LinkNotFoundError
		if !errors.As(lerr, &missing) {
			return false, fmt.Errorf("look up link %s: %w", d.name, lerr)
		}
		link = nil
	}
	switch {
	case err == nil && link != nil:
		// The link must be the device's: a userspace device of this name in
		// another namespace answers here too, beside a link of ours.
		switch {
		case dev.Type == wgtypes.LinuxKernel && link.Type() == "wireguard":
			d.kind = KindKernel
		case dev.Type == wgtypes.Userspace && link.Type() == "tuntap":
			here, err := servedHere(d.name)
			if err != nil {
				return false, fmt.Errorf("adopt wireguard device %s: %w", d.name, err)
			}
			if !here {
				return false, fmt.Errorf("adopt wireguard device %s: the process serving %s runs in another network namespace, beside a tun %s of this one (device names must be unique across namespaces)",
					d.name, socketPath(d.name), d.name)
			}
			d.kind = KindUserspace
		default:
			return false, fmt.Errorf("adopt wireguard device %s: a %v device answers but link %s is a %s: it runs in another network namespace (device names must be unique across namespaces)",
				d.name, dev.Type, d.name, link.Type())
		}
		return true, nil
	case err == nil:
		return false, fmt.Errorf("adopt wireguard device %s: a userspace device answers on %s but no link %s is in this network namespace: it runs in another one (device names must be unique across namespaces)",
			d.name, socketPath(d.name), d.name)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED): // ECONNREFUSED: a dead process's socket
		if link != nil {
			return false, fmt.Errorf("ensure wireguard device %s: link %s (%s) exists and is no wireguard device: delete or rename it, or choose another name",
				d.name, d.name, link.Type())
		}
		return false, nil
	}
	return false, fmt.Errorf("query wireguard device %s: %w", d.name, err)
}

// servedHere reports whether the process serving the UAPI socket of name is
// in the calling thread's network namespace.
func servedHere(name string) (bool, error) {
	pid, err := socketPid(name)
	if err != nil {
		return false, fmt.Errorf("find the process serving %s: %w", socketPath(name), err)
	}
	if pid == 0 {
		// The server is in another PID namespace (the DaemonSet's wireguard
		// container): its pid reads 0 and its namespace cannot be checked.
		// A socket in this mount namespace's directory beside a TUN of the
		// name here is that container's device.
		return true, nil
	}
	var its, ours unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &its); err != nil {
		return false, fmt.Errorf("network namespace of process %d: %w", pid, err)
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &ours); err != nil {
		return false, fmt.Errorf("network namespace of this thread: %w", err)
	}
	return its.Dev == ours.Dev && its.Ino == ours.Ino, nil
}

// probeLink is the link KernelSupported creates and deletes.
const probeLink = "isthmus-wgprobe"

// KernelSupported reports whether the kernel of the calling thread's network
// namespace makes wireguard links: it creates one (probeLink) and deletes it
// again. Without the module it is false; any other failure is an error.
func KernelSupported() (bool, error) {
	err := netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: probeLink}})
	switch {
	case kernelLacksWireguard(err):
		return false, nil
	case err != nil && !errors.Is(err, unix.EEXIST): // EEXIST: a probe an earlier run left
		return false, fmt.Errorf("probe for kernel wireguard support: create link %s: %w", probeLink, err)
	}
	if l, err := netlink.LinkByName(probeLink); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			return true, fmt.Errorf("probe for kernel wireguard support: delete link %s: %w", probeLink, err)
		}
	}
	return true, nil
}

// kernelLacksWireguard reports whether err, from creating a wireguard link,
// says the kernel has no wireguard module: RTM_NEWLINK of a kind no module
// provides fails with EOPNOTSUPP ("Unknown device type"). Other errors
// (EPERM, EEXIST, ...) are no reason to fall back to userspace.
func kernelLacksWireguard(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP)
}

// create makes the device as cfg.Mode allows.
func (d *Device) create(cfg Config, log *slog.Logger) error {
	if cfg.Mode != ModeUserspace {
		err := d.nl.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: d.name, MTU: cfg.MTU}})
		if err == nil {
			d.kind = KindKernel
			log.Info("kernel wireguard device created")
			// LinkAdd may have loaded the module just now: a wgctrl opened
			// before knew no wireguard netlink family.
			wg, err := wgctrl.New()
			if err != nil {
				return fmt.Errorf("open wgctrl: %w", err)
			}
			d.wg.Close()
			d.wg = wg
			return nil
		}
		if !kernelLacksWireguard(err) {
			return fmt.Errorf("create kernel wireguard link %s: %w", d.name, err)
		}
		if cfg.Mode == ModeKernel {
			return fmt.Errorf("create kernel wireguard link %s: %w: %w (load the wireguard module, or use mode auto or userspace)", d.name, ErrKernelUnsupported, err)
		}
		if !cfg.NoSpawn {
			log.Info("the kernel has no wireguard module: starting a userspace device", "err", err)
		}
	}
	if cfg.NoSpawn {
		return fmt.Errorf("wireguard device %s: %w (the kernel has no wireguard module; its process, `isthmus %s --name %s --unless-kernel`, runs beside the agent and has not started it)",
			d.name, ErrUserspaceNotRunning, UserspaceCommand, d.name)
	}
	exe := cfg.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("find the isthmus binary for %s: %w", UserspaceCommand, err)
		}
	}
	pid, err := SpawnUserspace(exe, d.name, cfg.MTU, cfg.LogFile)
	if err != nil {
		return err
	}
	d.kind = KindUserspace
	log.Info("userspace wireguard device started", "pid", pid, "log", cfg.LogFile)
	return nil
}

// SetPrivateKey replaces the device's private key (a rotation). The device
// expires its sessions: each peer's next packet starts a handshake under the
// new key, which succeeds once the peer knows the new public key.
func (d *Device) SetPrivateKey(k wgtypes.Key) error {
	if err := d.wg.ConfigureDevice(d.name, wgtypes.Config{PrivateKey: &k}); err != nil {
		return fmt.Errorf("set the private key of wireguard device %s: %w", d.name, err)
	}
	d.publicKey = k.PublicKey()
	return nil
}

// configure writes what differs of key and port, sets the MTU and brings the
// link up.
func (d *Device) configure(cfg Config, log *slog.Logger) error {
	dev, err := d.wg.Device(d.name)
	if err != nil {
		return fmt.Errorf("read wireguard device %s: %w", d.name, err)
	}
	var wcfg wgtypes.Config
	if dev.PrivateKey != cfg.PrivateKey {
		wcfg.PrivateKey = &cfg.PrivateKey
	}
	if dev.ListenPort != cfg.Port {
		wcfg.ListenPort = &cfg.Port
	}
	if wcfg.PrivateKey != nil || wcfg.ListenPort != nil {
		if err := d.wg.ConfigureDevice(d.name, wcfg); err != nil {
			return fmt.Errorf("configure wireguard device %s: %w", d.name, err)
		}
		log.Info("wireguard device configured", "new_key", wcfg.PrivateKey != nil, "port", cfg.Port)
	}
	link, err := d.nl.LinkByName(d.name)
	if err != nil {
		return fmt.Errorf("look up link %s: %w", d.name, err)
	}
	if link.Attrs().MTU != cfg.MTU {
		if err := d.nl.LinkSetMTU(link, cfg.MTU); err != nil {
			return fmt.Errorf("set mtu of %s to %d: %w", d.name, cfg.MTU, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := d.nl.LinkSetUp(link); err != nil {
			return fmt.Errorf("set link %s up: %w", d.name, err)
		}
	}
	d.ifindex = link.Attrs().Index
	d.publicKey = cfg.PrivateKey.PublicKey()
	return nil
}
