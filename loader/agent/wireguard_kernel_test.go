package agent

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/wireguard"
	"github.com/isthmus-dev/isthmus/testenv/syncbuf"
)

// encryptedSites is testdata/two-sites.yaml with the peering encrypted, both
// nodes given tunnel addresses and b1 a WireGuard public key.
const encryptedSites = `apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: a}
spec:
  nodeCidrs: [172.16.1.0/24]
  podCidrAssignments:
    - cidrBlocks: [10.10.0.0/16]
      nodeBlockSizes: {ipv4: 24}
---
apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: b}
spec:
  nodeCidrs: [172.16.2.0/24]
  podCidrAssignments:
    - cidrBlocks: [10.20.0.0/16]
      nodeBlockSizes: {ipv4: 24}
---
apiVersion: isthmus.dev/v1alpha1
kind: SitePeering
metadata: {name: a-b}
spec:
  sites: [a, b]
  meshNodes: true
  encryption: WireGuard
---
apiVersion: v1
kind: Node
metadata:
  name: a1
  annotations: {isthmus.dev/tunnel-ipv4: 100.64.0.1}
spec: {podCIDRs: [10.10.1.0/24]}
status: {addresses: [{type: InternalIP, address: 172.16.1.10}]}
---
apiVersion: v1
kind: Node
metadata:
  name: b1
  annotations: {isthmus.dev/tunnel-ipv4: 100.64.0.2, isthmus.dev/wireguard-public-key: %s}
spec: {podCIDRs: [10.20.1.0/24]}
status: {addresses: [{type: InternalIP, address: 172.16.2.11}]}
`

// TestAgentKernelWireGuardNoSpawn: an agent that leaves the userspace WireGuard
// device to another process (--wireguard-spawn=false: the DaemonSet's
// wireguard container) starts before that device exists, with the datapath in
// place and no device to send into (config.wg_ifindex 0: encrypted traffic is
// dropped, never sent in the clear), and starts none itself. When the device's
// link appears, the agent adopts it at once, not at its next resync (an hour
// here): wireguard_ingress attached to it, wg_ifindex pointing at it, and the
// encrypted peer configured in it.
func TestAgentKernelWireGuardNoSpawn(t *testing.T) {
	e := setup(t)
	peerKey, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	objects := fmt.Sprintf(encryptedSites, peerKey.PublicKey())
	if err := os.WriteFile(filepath.Join(e.objects, "objects.yaml"), []byte(objects), 0o644); err != nil {
		t.Fatal(err)
	}
	// Userspace devices' sockets are shared by every namespace: a name of this
	// process's own.
	dev := fmt.Sprintf("wgat%d", os.Getpid())
	t.Cleanup(func() {
		if err := wireguard.Remove(dev); err != nil {
			t.Errorf("cleanup: remove %s: %v", dev, err)
		}
	})
	logFile := filepath.Join(t.TempDir(), dev+".log")
	e.cfg.Resync = time.Hour
	var logs syncbuf.Buffer
	e.cfg.Log = slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, &logs), nil))
	e.cfg.WireGuard = WireGuardConfig{Mode: wireguard.ModeUserspace, Device: dev, StateDir: t.TempDir(), NoSpawn: true, LogFile: logFile}

	a, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start without the device: %v", err)
	}
	t.Cleanup(a.Close) // after the cleanup that stops Run
	st := readMaps(t, e.pinDir)
	if st.Config.WireGuardIfindex != 0 || st.Config.TunnelIP.String() != "100.64.0.1" {
		t.Errorf("config before the device: wg_ifindex %d tunnel_ip %s, want 0 and 100.64.0.1", st.Config.WireGuardIfindex, st.Config.TunnelIP)
	}
	if _, err := netlink.LinkByName(dev); err == nil {
		t.Errorf("the agent made link %s, told not to", dev)
	}
	stop := e.run(t, a)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wireguard.SpawnUserspace(exe, dev, 0, logFile); err != nil {
		t.Fatalf("start the device beside the agent: %v", err)
	}
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, "the agent adopts the device: wireguard_ingress attached, wg_ifindex set", func() bool {
		_, perr := os.Stat(datapath.LinkPin(e.pinDir, dev, datapath.HookWireGuard))
		return perr == nil && readMaps(t, e.pinDir).Config.WireGuardIfindex == uint32(l.Attrs().Index)
	})
	if _, _, ifindex := linkInfo(t, e.pinDir, dev, datapath.HookWireGuard); ifindex != uint32(l.Attrs().Index) {
		t.Errorf("wireguard_ingress attached to #%d, want %s #%d", ifindex, dev, l.Attrs().Index)
	}
	wg, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer wg.Close()
	eventually(t, 3*time.Second, "b1 configured as the device's peer", func() bool {
		d, err := wg.Device(dev)
		if err != nil || len(d.Peers) != 1 {
			return false
		}
		p := d.Peers[0]
		return p.PublicKey == peerKey.PublicKey() && p.Endpoint != nil &&
			p.Endpoint.String() == fmt.Sprintf("172.16.2.11:%d", wireguard.DefaultPort) &&
			slices.EqualFunc(p.AllowedIPs, []net.IPNet{{IP: net.IPv4(100, 64, 0, 2).To4(), Mask: net.CIDRMask(32, 32)}},
				func(a, b net.IPNet) bool { return a.String() == b.String() })
	})
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	if n := strings.Count(logs.String(), "WireGuard device not up yet"); n != 1 {
		t.Errorf("the wait for the device logged %d times, want once", n)
	}
	if !strings.Contains(logs.String(), "wireguard device adopted") {
		t.Error("the adoption was not logged")
	}
}
