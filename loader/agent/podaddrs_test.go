package agent

// Kernel test: run it under the shared kernel lock
// (flock /tmp/isthmus-kernel.lock go test ./loader/agent -run PodAddrs).

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/loader/ipamd"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/maps"
	"github.com/isthmus-dev/isthmus/testenv/testns"
)

// TestAgentKernelPodAddrs: a pod made by the CNI plugin, driven by the reference
// client cnitool against the agent's IPAM server, may send only from the address
// the plugin reserved for it. The agent fills pod_addrs from the reservations and
// marks the interface reserved; a ping from a neighbour's address (added to the
// pod's interface, as a compromised pod can) is dropped and counted as
// pod_src_not_reserved, one from its own address is answered, and after DEL the
// entries are gone.
func TestAgentKernelPodAddrs(t *testing.T) {
	checkPodAddrs(t, nil, netip.MustParseAddr("172.16.1.10"))
}

// dualStackSites returns testdata/two-sites.yaml with an IPv6 block for site a
// and an IPv6 podCIDR for a1, as a dual-stack cluster hands them out.
func dualStackSites(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/two-sites.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]string{
		{"- cidrBlocks: [10.10.0.0/16]\n      nodeBlockSizes: {ipv4: 24}", "- cidrBlocks: [10.10.0.0/16, \"fd10::/48\"]\n      nodeBlockSizes: {ipv4: 24, ipv6: 64}"},
		{"spec: {podCIDRs: [10.10.1.0/24]}", "spec: {podCIDRs: [10.10.1.0/24, \"fd10:0:0:1::/64\"]}"},
	} {
		if !bytes.Contains(b, []byte(r[0])) {
			t.Fatalf("testdata/two-sites.yaml has no %q", r[0])
		}
		b = bytes.Replace(b, []byte(r[0]), []byte(r[1]), 1)
	}
	return b
}

// TestAgentKernelPodAddrsDualStack is TestAgentKernelPodAddrs for a pod with an
// IPv4 and an IPv6 address: each family's reservation reaches its map (pod_addrs,
// pod_addrs6), and in each family a neighbour's source is dropped and the pod's
// own is answered by the node.
func TestAgentKernelPodAddrsDualStack(t *testing.T) {
	checkPodAddrs(t, dualStackSites(t), netip.MustParseAddr("172.16.1.10"), netip.MustParseAddr("fd99::10"))
}

// checkPodAddrs runs the pod_addrs test with objectsYAML (nil: testdata/two-sites.yaml)
// for a pod that gets one address per family of nodeAddrs, the node's addresses
// it pings (an IPv6 one is added to the underlay device).
func checkPodAddrs(t *testing.T, objectsYAML []byte, nodeAddrs ...netip.Addr) {
	e := setup(t)
	if objectsYAML != nil {
		if err := os.WriteFile(filepath.Join(e.objects, "objects.yaml"), objectsYAML, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range nodeAddrs {
		if a.Is6() {
			if err := netlink.AddrAdd(e.under, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(128, 128)},
				Flags: unix.IFA_F_NODAD}); err != nil {
				t.Fatal(err)
			}
		}
	}
	nodeNS := e.nsName
	bin, conf, data := t.TempDir(), t.TempDir(), t.TempDir()
	sock := filepath.Join(t.TempDir(), "ipam.sock")
	for out, pkg := range map[string]string{
		cniinstall.PluginName:  "github.com/isthmus-dev/isthmus/cmd/isthmus-cni",
		cniinstall.PortmapName: "github.com/containernetworking/plugins/plugins/meta/portmap", // the conflist chains it (hostPort)
		"cnitool":              "github.com/containernetworking/cni/cnitool",
	} {
		if b, err := exec.Command("go", "build", "-o", filepath.Join(bin, out), pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	if err := cniinstall.WriteConflist(conf, sock, data); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, done, err := ipamd.Start(ctx, ipamd.Config{
		Node: "a1", Socket: sock, Store: ipam.Store{Dir: data}, UnderlayMTU: 1500,
		Snapshot:       func() (*objects.Set, []objects.Warning, error) { return objects.LoadDir(e.objects) },
		VerifyInterval: time.Hour, LeakInterval: time.Hour,
		LinkExists: func(string) bool { return true },
	})
	if err != nil {
		cancel()
		t.Fatalf("start ipam server: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })
	srv.Verify()

	e.cfg.IPAMDir = data
	a, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer a.Close()

	podNS := testns.Name(netnsPrefix)
	if b, err := exec.Command("ip", "netns", "add", podNS).CombinedOutput(); err != nil {
		t.Fatalf("add pod netns: %v\n%s", err, b)
	}
	t.Cleanup(func() { netns.DeleteNamed(podNS) })
	cnitool := func(verb string) string {
		t.Helper()
		cmd := exec.Command("nsenter", "--net=/run/netns/"+nodeNS, filepath.Join(bin, "cnitool"), verb,
			cniinstall.NetworkName, "/run/netns/"+podNS)
		cmd.Env = append(cmd.Environ(), "CNI_PATH="+bin, "NETCONFPATH="+conf)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("cnitool %s: %v\n%s", verb, err, b)
		}
		return string(b)
	}
	inPod := func(args ...string) error {
		return exec.Command("nsenter", append([]string{"--net=/run/netns/" + podNS}, args...)...).Run()
	}
	var res struct {
		Interfaces []struct {
			Name    string `json:"name"`
			Sandbox string `json:"sandbox"`
		} `json:"interfaces"`
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal([]byte(cnitool("add")), &res); err != nil || len(res.IPs) != len(nodeAddrs) || len(res.Interfaces) == 0 {
		t.Fatalf("ADD result: %v %+v, want %d addresses", err, res, len(nodeAddrs))
	}
	var owns []netip.Addr
	for _, ip := range res.IPs {
		owns = append(owns, netip.MustParsePrefix(ip.Address).Addr())
	}
	host := res.Interfaces[0].Name
	if err := a.scanPods(); err != nil {
		t.Fatal(err)
	}
	if err := a.sync("pods", false); err != nil {
		t.Fatal(err)
	}
	ifindex, ok := a.pods[host]
	if !ok {
		t.Fatalf("agent did not attach to %s (pods %v)", host, a.pods)
	}
	st := readMaps(t, e.pinDir)
	for _, own := range owns {
		if _, ok := st.PodAddrs[maps.PodAddr{Ifindex: uint32(ifindex), Addr: own}]; !ok || len(st.PodAddrs) != len(owns) {
			t.Fatalf("pod_addrs and pod_addrs6 %v, want only (%d, %v)", st.PodAddrs, ifindex, owns)
		}
	}
	if f := st.PodIfaces[uint32(ifindex)].Flags; f&maps.PodIfaceFlagReserved == 0 {
		t.Fatalf("pod_ifaces %d flags %#x, want reserved", ifindex, f)
	}
	if st.PodIfaces[uint32(e.pod.Attrs().Index)].Flags != 0 {
		t.Errorf("pod-a (no reservation) flags %#x, want 0: it keeps the FIB check", st.PodIfaces[uint32(e.pod.Attrs().Index)].Flags)
	}

	code := uint16(0)
	for _, r := range maps.DropReasons() {
		if r.Const == "DROP_POD_SRC_NOT_RESERVED" {
			code = uint16(-r.Code)
		}
	}
	drops := func() uint64 {
		s, err := maps.OpenPinned(e.pinDir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		m, err := maps.ReadMetrics(s.Map(maps.MapMetrics))
		if err != nil {
			t.Fatal(err)
		}
		return m[maps.MetricKey{Code: code, Hook: maps.HookPodIngress}].Packets
	}
	for _, nodeAddr := range nodeAddrs {
		var own netip.Addr
		for _, a := range owns {
			if a.Is4() == nodeAddr.Is4() {
				own = a
			}
		}
		family := "-4"
		if own.Is6() {
			family = "-6"
		}
		neighbour := own.Next()
		if err := inPod("ip", "addr", "add", netip.PrefixFrom(neighbour, neighbour.BitLen()).String(), "dev", "eth0", "nodad"); err != nil {
			t.Fatal(err)
		}
		before := drops()
		if err := inPod("ping", family, "-c", "2", "-i", "0.2", "-W", "1", "-I", neighbour.String(), nodeAddr.String()); err == nil {
			t.Errorf("ping from the neighbour's %v was answered", neighbour)
		}
		if n := drops() - before; n < 2 {
			t.Errorf("from %v: pod_src_not_reserved counted %d packets, want 2 or more", neighbour, n)
		}
		before = drops()
		if err := inPod("ping", family, "-c", "1", "-W", "2", "-I", own.String(), nodeAddr.String()); err != nil {
			t.Errorf("ping from the pod's own %v: %v", own, err)
		}
		if n := drops() - before; n != 0 {
			t.Errorf("own address %v: %d drops", own, n)
		}
	}

	cnitool("del")
	if err := a.scanPods(); err != nil {
		t.Fatal(err)
	}
	if err := a.sync("pods", false); err != nil {
		t.Fatal(err)
	}
	st = readMaps(t, e.pinDir)
	if len(st.PodAddrs) != 0 {
		t.Errorf("pod_addrs after DEL: %v, want none", st.PodAddrs)
	}
	if _, ok := st.PodIfaces[uint32(ifindex)]; ok {
		t.Errorf("pod_ifaces still has %d after DEL", ifindex)
	}
}
