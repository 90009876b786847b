package wireguard

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// testWriter sends what a logger writes to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

func mustKey(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := LoadOrCreateKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// ensureIn runs Ensure in ns.
func ensureIn(t *testing.T, ns *testNS, cfg Config) (*Device, error) {
	t.Helper()
	var d *Device
	err := ns.do(func() (err error) {
		d, err = Ensure(cfg)
		return err
	})
	if err == nil {
		t.Cleanup(func() { d.Close() })
	}
	return d, err
}

// udpArrives sends datagrams from src in ns from to dst in ns to until one
// arrives from src (at most 10 s).
func udpArrives(t *testing.T, from *testNS, src string, to *testNS, dst string) {
	t.Helper()
	dstAddr := net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dst))
	srcAddr := &net.UDPAddr{IP: net.ParseIP(src).To4()}
	var rc, sc *net.UDPConn
	if err := to.do(func() (err error) { rc, err = net.ListenUDP("udp4", dstAddr); return err }); err != nil {
		t.Fatalf("listen on %s in %s: %v", dst, to.name, err)
	}
	defer rc.Close()
	if err := from.do(func() (err error) { sc, err = net.DialUDP("udp4", srcAddr, dstAddr); return err }); err != nil {
		t.Fatalf("dial %s from %s in %s: %v", dst, src, from.name, err)
	}
	defer sc.Close()
	buf := make([]byte, 64)
	var lastErr error
	for i, deadline := 0, time.Now().Add(10*time.Second); time.Now().Before(deadline); i++ {
		msg := fmt.Sprintf("isthmus-wg-%d", i)
		if _, err := sc.Write([]byte(msg)); err != nil {
			lastErr = err // no session yet: retry
		}
		rc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, got, err := rc.ReadFromUDP(buf)
		if err != nil {
			continue
		}
		if got.IP.String() != src || !strings.HasPrefix(string(buf[:n]), "isthmus-wg-") {
			t.Fatalf("%s received %q from %s, want a datagram from %s", dst, buf[:n], got, src)
		}
		t.Logf("%s -> %s: datagram %d arrived", src, dst, i)
		return
	}
	t.Fatalf("no datagram from %s reached %s through the tunnel in 10 s (last send error: %v)", src, dst, lastErr)
}

// addAddrAndRoute gives the wg device its /32 address and a route to the
// other side's address through it.
func addAddrAndRoute(t *testing.T, ns *testNS, dev string, local, remote string) {
	t.Helper()
	l, err := ns.nl.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.nl.AddrAdd(l, &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP(local))}); err != nil {
		t.Fatalf("add %s to %s: %v", local, dev, err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: netlink.NewIPNet(net.ParseIP(remote)), Scope: netlink.SCOPE_LINK, Src: net.ParseIP(local)}
	if err := ns.nl.RouteAdd(r); err != nil {
		t.Fatalf("route %s via %s: %v", remote, dev, err)
	}
}

// TestUserspaceTunnel joins two namespaces over a veth (192.168.77.1 and .2)
// with userspace WireGuard devices (10.99.0.1 and .2): a is started by Ensure,
// b by SpawnUserspace and adopted by Ensure. b knows a's endpoint; a must
// learn b's.
func TestUserspaceTunnel(t *testing.T) {
	requireRootAndTUN(t)
	a, b := newTestNS(t, "a"), newTestNS(t, "b")
	nameA, nameB := deviceName("a"), deviceName("b")
	stopUserspaceAtCleanup(t, nameA, nameB)
	logs := t.TempDir()
	logA, logB := filepath.Join(logs, nameA+".log"), filepath.Join(logs, nameB+".log")
	dumpLogsOnFailure(t, logA, logB)
	const portA, portB = DefaultPort, DefaultPort + 1

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "wgt-ua"}, PeerName: "wgt-ub", PeerNamespace: netlink.NsFd(int(b.h))}
	if err := a.nl.LinkAdd(veth); err != nil {
		t.Fatalf("create veth: %v", err)
	}
	for _, side := range []struct {
		ns   *testNS
		dev  string
		addr string
	}{{a, "wgt-ua", "192.168.77.1/24"}, {b, "wgt-ub", "192.168.77.2/24"}} {
		l, err := side.ns.nl.LinkByName(side.dev)
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := netlink.ParseAddr(side.addr)
		if err := side.ns.nl.AddrAdd(l, addr); err != nil {
			t.Fatal(err)
		}
		if err := side.ns.nl.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}

	keyA, keyB := mustKey(t), mustKey(t)
	cfgA := Config{Name: nameA, Mode: ModeUserspace, Port: portA, PrivateKey: keyA, LogFile: logA, Log: testLogger(t)}
	devA, err := ensureIn(t, a, cfgA)
	if err != nil {
		t.Fatalf("Ensure %s: %v", nameA, err)
	}
	if devA.Kind() != KindUserspace || devA.Adopted() || devA.PublicKey() != keyA.PublicKey() {
		t.Errorf("Ensure %s: kind %s adopted %v public key %v, want a new userspace device with %v", nameA, devA.Kind(), devA.Adopted(), devA.PublicKey(), keyA.PublicKey())
	}
	pidsA := userspacePids(t, nameA)
	if len(pidsA) != 1 {
		t.Fatalf("wireguard-userspace processes for %s: %v, want one", nameA, pidsA)
	}

	var pidB int
	if err := b.do(func() (err error) { pidB, err = SpawnUserspace(testExe(t), nameB, DefaultMTU, logB); return err }); err != nil {
		t.Fatalf("SpawnUserspace %s: %v", nameB, err)
	}
	if got := userspacePids(t, nameB); !slices.Equal(got, []int{pidB}) {
		t.Fatalf("wireguard-userspace processes for %s: %v, want SpawnUserspace's %d", nameB, got, pidB)
	}
	// ModeKernel: an existing device is adopted whatever the mode.
	cfgB := Config{Name: nameB, Mode: ModeKernel, Port: portB, MTU: 1380, PrivateKey: keyB, LogFile: logB, Log: testLogger(t)}
	devB, err := ensureIn(t, b, cfgB)
	if err != nil {
		t.Fatalf("Ensure %s: %v", nameB, err)
	}
	if devB.Kind() != KindUserspace || !devB.Adopted() {
		t.Errorf("Ensure %s: kind %s adopted %v, want the userspace device adopted", nameB, devB.Kind(), devB.Adopted())
	}
	if l, err := b.nl.LinkByName(nameB); err != nil || l.Attrs().MTU != 1380 || l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("link %s after Ensure: %v (err %v), want MTU 1380 and up", nameB, l.Attrs(), err)
	}
	// a's device answers on its socket from b's namespace too: Ensure there
	// must refuse it, with no link of the name, and beside a tun of the name.
	if _, err := ensureIn(t, b, Config{Name: nameA, PrivateKey: keyA, LogFile: logA}); err == nil || !strings.Contains(err.Error(), "another") {
		t.Errorf("Ensure %s from the other namespace: err = %v, want a refusal: that device runs in another namespace", nameA, err)
	}
	rawTUN(t, b, nameA, unix.IFF_TUN|unix.IFF_NO_PI)
	if _, err := ensureIn(t, b, Config{Name: nameA, PrivateKey: keyA, LogFile: logA}); err == nil || !strings.Contains(err.Error(), "another network namespace") {
		t.Errorf("Ensure %s from the other namespace, beside a tun %s: err = %v, want a refusal: that device runs in another namespace", nameA, nameA, err)
	}
	assertNoVnetHdr(t, a, nameA)
	assertNoVnetHdr(t, b, nameB)

	addAddrAndRoute(t, a, nameA, "10.99.0.1", "10.99.0.2")
	addAddrAndRoute(t, b, nameB, "10.99.0.2", "10.99.0.1")
	peersA := []Peer{{PublicKey: keyB.PublicKey(), AllowedIPs: pfx("10.99.0.2/32")}} // no endpoint: learn it
	peersB := []Peer{{PublicKey: keyA.PublicKey(), Endpoint: udp(fmt.Sprintf("192.168.77.1:%d", portA)), AllowedIPs: pfx("10.99.0.1/32"), Keepalive: time.Second}}
	if n, err := devA.SyncPeers(peersA); err != nil || n != 1 {
		t.Fatalf("SyncPeers %s: %d, %v; want 1 peer changed", nameA, n, err)
	}
	if n, err := devB.SyncPeers(peersB); err != nil || n != 1 {
		t.Fatalf("SyncPeers %s: %d, %v; want 1 peer changed", nameB, n, err)
	}

	udpArrives(t, b, "10.99.0.2", a, "10.99.0.1:40001")
	udpArrives(t, a, "10.99.0.1", b, "10.99.0.2:40002") // a sends to the endpoint it learnt

	learnt := fmt.Sprintf("192.168.77.2:%d", portB)
	assertPeerA := func(when string) {
		t.Helper()
		st, err := devA.Status()
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 1 || st[0].PublicKey != keyB.PublicKey() {
			t.Fatalf("%s: %s peers %+v, want b's alone", when, nameA, st)
		}
		p := st[0]
		if fmtUDP(p.Endpoint) != learnt {
			t.Errorf("%s: %s's endpoint for b is %s, want the one it learnt, %s", when, nameA, fmtUDP(p.Endpoint), learnt)
		}
		if p.LastHandshake.IsZero() || time.Since(p.LastHandshake) > time.Minute || p.ReceiveBytes == 0 || p.TransmitBytes == 0 {
			t.Errorf("%s: %s's peer b: handshake %v, rx %d, tx %d; want a recent handshake and traffic both ways", when, nameA, p.LastHandshake, p.ReceiveBytes, p.TransmitBytes)
		}
		if !slices.Equal(p.AllowedIPs, pfx("10.99.0.2/32")) || p.Keepalive != 0 {
			t.Errorf("%s: %s's peer b: allowed %v keepalive %v, want [10.99.0.2/32] and none", when, nameA, p.AllowedIPs, p.Keepalive)
		}
	}
	assertPeerA("after the exchange")

	if n, err := devA.SyncPeers(peersA); err != nil || n != 0 {
		t.Errorf("SyncPeers %s again: %d, %v; want nothing changed", nameA, n, err)
	}
	if n, err := devB.SyncPeers(peersB); err != nil || n != 0 {
		t.Errorf("SyncPeers %s again: %d, %v; want nothing changed", nameB, n, err)
	}
	// A desired endpoint that differs from the learnt one waits for the
	// session to end: the learnt one is how a NATed peer is reached.
	wrong := slices.Clone(peersA)
	wrong[0].Endpoint = udp("192.168.77.2:9")
	if n, err := devA.SyncPeers(wrong); err != nil || n != 0 {
		t.Errorf("SyncPeers %s with another endpoint during a live session: %d, %v; want nothing changed", nameA, n, err)
	}
	assertPeerA("after the syncs")

	// Ensure again adopts both devices as they are: same link, same process.
	for _, c := range []struct {
		ns   *testNS
		cfg  Config
		dev  *Device
		pids []int
	}{{a, cfgA, devA, pidsA}, {b, cfgB, devB, []int{pidB}}} {
		again, err := ensureIn(t, c.ns, c.cfg)
		if err != nil {
			t.Fatalf("Ensure %s again: %v", c.cfg.Name, err)
		}
		if !again.Adopted() || again.Kind() != KindUserspace || again.Ifindex() != c.dev.Ifindex() || again.Ifindex() == 0 {
			t.Errorf("Ensure %s again: adopted %v kind %s ifindex %d, want the userspace device adopted, ifindex %d",
				c.cfg.Name, again.Adopted(), again.Kind(), again.Ifindex(), c.dev.Ifindex())
		}
		if got := userspacePids(t, c.cfg.Name); !slices.Equal(got, c.pids) {
			t.Errorf("wireguard-userspace processes for %s after Ensure again: %v, want %v alone", c.cfg.Name, got, c.pids)
		}
	}
	assertPeerA("after Ensure again")
	udpArrives(t, a, "10.99.0.1", b, "10.99.0.2:40003")

	if n, err := devA.SyncPeers(nil); err != nil || n != 1 {
		t.Errorf("SyncPeers %s with no peers: %d, %v; want b removed", nameA, n, err)
	}
	if st, err := devA.Status(); err != nil || len(st) != 0 {
		t.Errorf("%s's peers after removing b: %+v, %v; want none", nameA, st, err)
	}
}

// TestEnsureKernelOrFallback checks the kernel modes: ModeKernel makes a
// kernel device or fails with ErrKernelUnsupported leaving nothing behind, and
// then ModeAuto falls back to a userspace device.
func TestEnsureKernelOrFallback(t *testing.T) {
	ns, name, logFile := deviceTest(t, "k")
	key := mustKey(t)
	cfg := Config{Name: name, Mode: ModeKernel, PrivateKey: key, LogFile: logFile, Log: testLogger(t)}
	dev, err := ensureIn(t, ns, cfg)
	if err == nil {
		t.Logf("this kernel has wireguard: Ensure made a %s device", dev.Kind())
		if dev.Kind() != KindKernel || dev.Adopted() {
			t.Errorf("Ensure(kernel): kind %s adopted %v, want a new kernel device", dev.Kind(), dev.Adopted())
		}
		cfg.Mode = ModeUserspace
		again, err := ensureIn(t, ns, cfg)
		if err != nil || again.Kind() != KindKernel || !again.Adopted() {
			t.Errorf("Ensure(userspace) over a kernel device: %v, want it adopted", err)
		}
		return
	}
	if !errors.Is(err, ErrKernelUnsupported) || !errors.Is(err, unix.EOPNOTSUPP) {
		t.Fatalf("Ensure(kernel) = %v, want a kernel device or an error wrapping ErrKernelUnsupported and EOPNOTSUPP", err)
	}
	t.Logf("Ensure(kernel): %v", err)
	if _, lerr := ns.nl.LinkByName(name); lerr == nil {
		t.Errorf("a failed Ensure(kernel) left link %s", name)
	}
	if pids := userspacePids(t, name); len(pids) != 0 {
		t.Errorf("Ensure(kernel) started wireguard-userspace %v", pids)
	}
	cfg.Mode = ModeAuto
	dev, err = ensureIn(t, ns, cfg)
	if err != nil {
		t.Fatalf("Ensure(auto) on a kernel without wireguard: %v", err)
	}
	if dev.Kind() != KindUserspace || dev.Adopted() {
		t.Errorf("Ensure(auto): kind %s adopted %v, want a new userspace device", dev.Kind(), dev.Adopted())
	}
	if pids := userspacePids(t, name); len(pids) != 1 {
		t.Errorf("wireguard-userspace processes after Ensure(auto): %v, want one", pids)
	}
	assertNoVnetHdr(t, ns, name)
}

// TestEnsureRefusesForeignLink checks Ensure never takes over a link of its
// name that is no WireGuard device.
func TestEnsureRefusesForeignLink(t *testing.T) {
	requireRootAndTUN(t)
	ns := newTestNS(t, "f")
	name := deviceName("f")
	stopUserspaceAtCleanup(t, name)
	if err := ns.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatal(err)
	}
	_, err := ensureIn(t, ns, Config{Name: name, PrivateKey: mustKey(t), LogFile: filepath.Join(t.TempDir(), "log")})
	if err == nil || !strings.Contains(err.Error(), "is no wireguard device") {
		t.Errorf("Ensure over a veth: err = %v, want a refusal naming it", err)
	}
	if pids := userspacePids(t, name); len(pids) != 0 {
		t.Errorf("Ensure over a veth started wireguard-userspace %v", pids)
	}
}

// TestEnsureReplacesStaleSocket checks the socket a killed process left
// behind does not stop Ensure: it starts a new device.
func TestEnsureReplacesStaleSocket(t *testing.T) {
	ns, name, logFile := deviceTest(t, "x")
	if err := os.MkdirAll(socketDir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketPath(name), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close() // the socket file stays, refusing connections
	dev, err := ensureIn(t, ns, Config{Name: name, PrivateKey: mustKey(t), LogFile: logFile, Log: testLogger(t)})
	if err != nil {
		t.Fatalf("Ensure over a stale socket: %v", err)
	}
	if dev.Kind() != KindUserspace || dev.Adopted() {
		t.Errorf("Ensure over a stale socket: kind %s adopted %v, want a new userspace device", dev.Kind(), dev.Adopted())
	}
	if pids := userspacePids(t, name); len(pids) != 1 {
		t.Errorf("wireguard-userspace processes: %v, want one", pids)
	}
}

// TestEnsureNoSpawn checks the DaemonSet's division of labour: KernelSupported
// leaves no probe link; where the kernel has no wireguard, Ensure with NoSpawn
// starts nothing and says it waits (ErrUserspaceNotRunning), then adopts the
// userspace device another process started (the wireguard container); where
// the kernel has it, Ensure makes a kernel device as without NoSpawn.
func TestEnsureNoSpawn(t *testing.T) {
	ns, name, logFile := deviceTest(t, "n")
	var kernel bool
	if err := ns.do(func() (err error) { kernel, err = KernelSupported(); return err }); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.nl.LinkByName(probeLink); err == nil {
		t.Errorf("KernelSupported left link %s", probeLink)
	}
	cfg := Config{Name: name, Mode: ModeAuto, PrivateKey: mustKey(t), LogFile: logFile, NoSpawn: true, Log: testLogger(t)}
	dev, err := ensureIn(t, ns, cfg)
	if kernel {
		t.Log("this kernel has wireguard")
		if err != nil || dev.Kind() != KindKernel {
			t.Errorf("Ensure(auto, NoSpawn) with kernel wireguard: %v, want a kernel device", err)
		}
		return
	}
	if !errors.Is(err, ErrUserspaceNotRunning) {
		t.Fatalf("Ensure(auto, NoSpawn) without kernel wireguard and no device = %v, want ErrUserspaceNotRunning", err)
	}
	if pids := userspacePids(t, name); len(pids) != 0 {
		t.Errorf("Ensure with NoSpawn started wireguard-userspace %v", pids)
	}
	if _, err := ns.nl.LinkByName(name); err == nil {
		t.Errorf("a waiting Ensure left link %s", name)
	}
	if err := ns.do(func() error { _, err := SpawnUserspace(testExe(t), name, 0, logFile); return err }); err != nil {
		t.Fatal(err)
	}
	dev, err = ensureIn(t, ns, cfg)
	if err != nil || dev.Kind() != KindUserspace || !dev.Adopted() {
		t.Fatalf("Ensure(auto, NoSpawn) beside a running userspace device: %v, want it adopted", err)
	}
	if pids := userspacePids(t, name); len(pids) != 1 {
		t.Errorf("wireguard-userspace processes: %v, want the one started beside", pids)
	}
}
