package agent

// Kernel test: run it under the shared kernel lock
// (flock /tmp/isthmus-kernel.lock go test ./loader/agent -run PodAddrs).

import (
	"context"
	"encoding/json"
	"net/netip"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netns"

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
	e := setup(t)
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
	if err := json.Unmarshal([]byte(cnitool("add")), &res); err != nil || len(res.IPs) != 1 || len(res.Interfaces) == 0 {
		t.Fatalf("ADD result: %v %+v", err, res)
	}
	own := netip.MustParsePrefix(res.IPs[0].Address).Addr()
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
	if _, ok := st.PodAddrs[maps.PodAddr{Ifindex: uint32(ifindex), Addr: own}]; !ok || len(st.PodAddrs) != 1 {
		t.Fatalf("pod_addrs %v, want only (%d, %v)", st.PodAddrs, ifindex, own)
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
	nodeAddr := "172.16.1.10"
	neighbour := own.Next()
	if err := inPod("ip", "addr", "add", neighbour.String()+"/32", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	before := drops()
	if err := inPod("ping", "-c", "2", "-i", "0.2", "-W", "1", "-I", neighbour.String(), nodeAddr); err == nil {
		t.Errorf("ping from the neighbour's %v was answered", neighbour)
	}
	if n := drops() - before; n < 2 {
		t.Errorf("pod_src_not_reserved counted %d packets, want 2 or more", n)
	}
	before = drops()
	if err := inPod("ping", "-c", "1", "-W", "2", "-I", own.String(), nodeAddr); err != nil {
		t.Errorf("ping from the pod's own %v: %v", own, err)
	}
	if n := drops() - before; n != 0 {
		t.Errorf("own address: %d drops", n)
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
