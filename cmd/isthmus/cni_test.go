package main

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/loader/ipamd/ipamdtest"
	"github.com/isthmus-dev/isthmus/loader/metrics"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/testenv/syncbuf"
)

// Real configurations of other plugins, as their installers write them.
const (
	// flannel's cni-conf.json (kube-flannel.yml), which its DaemonSet writes
	// as /etc/cni/net.d/10-flannel.conflist (k3s ships the same).
	flannelConflist = `{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "flannel",
      "delegate": {
        "hairpinMode": true,
        "isDefaultGateway": true
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}
`
	// containerd's example 10-containerd-net.conflist: bridge with host-local
	// ranges of its own.
	bridgeConflist = `{"cniVersion":"1.0.0","name":"containerd-net","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.88.0.0/16"}]],"routes":[{"dst":"0.0.0.0/0"}]}},{"type":"portmap","capabilities":{"portMappings":true}}]}`
)

// cniNode is one node's CNI directories, objects and agent CNI side.
type cniNode struct {
	t                             *testing.T
	objDir, bin, conf, data, plug string
	portmap                       string
	logs                          syncbuf.Buffer
	reg                           *prometheus.Registry
	c                             cniFlags
}

func newCNINode(t *testing.T, takeOver bool) *cniNode {
	n := &cniNode{t: t, objDir: t.TempDir(), bin: t.TempDir(), conf: t.TempDir(), data: t.TempDir(),
		plug: filepath.Join(t.TempDir(), "isthmus-cni"), portmap: filepath.Join(t.TempDir(), "portmap"), reg: prometheus.NewRegistry()}
	if err := os.WriteFile(n.plug, []byte("plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.portmap, []byte("portmap"), 0o755); err != nil {
		t.Fatal(err)
	}
	n.c = cniFlags{socket: filepath.Join(t.TempDir(), "ipam.sock"), dataDir: n.data, binDir: n.bin, confDir: n.conf,
		plugin: n.plug, portmap: n.portmap, takeOver: takeOver, metrics: metrics.NewCNI(n.reg)}
	return n
}

// objects writes Site "a" (manageCniPlugin manage) and node n1 with podCIDR
// ("" for none).
func (n *cniNode) objects(manage bool, podCIDR string) {
	if err := os.WriteFile(filepath.Join(n.objDir, "o.yaml"), []byte(ipamdtest.Objects("[10.10.0.0/16]", manage, 0, podCIDR)), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func (n *cniNode) file(dir, name, content string) {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// start runs the agent's CNI side until the test ends. Its first
// verification, and so its first install decision, is done when it returns.
func (n *cniNode) start() {
	n.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n.t.Cleanup(func() {
		cancel()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(n.c.socket); os.IsNotExist(err) {
				return
			}
		}
	})
	snapshot := func() (*objects.Set, []objects.Warning, error) { return objects.LoadDir(n.objDir) }
	if err := n.c.start(ctx, "n1", "", snapshot, slog.New(slog.NewTextHandler(&n.logs, nil))); err != nil {
		n.t.Fatal(err)
	}
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func (n *cniNode) conflist() string { return filepath.Join(n.conf, cniinstall.ConflistName) }
func (n *cniNode) plugin() string   { return filepath.Join(n.bin, cniinstall.PluginName) }

// metric reports whether the agent's /metrics has the line.
func (n *cniNode) metric(line string) bool {
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return strings.Contains(rec.Body.String(), "\n"+line+"\n")
}

// unchanged fails the test unless dir/name still holds content.
func (n *cniNode) unchanged(dir, name, content string) {
	n.t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != content {
		n.t.Errorf("%s changed: %q %v", name, b, err)
	}
}

// The agent's CNI side installs nothing before the node's podCIDR verifies,
// then the plugin and the conflist; a conflist that calls host-local with
// ranges is reported.
func TestCNIStartWritesConflistAfterVerification(t *testing.T) {
	n := newCNINode(t, false)
	n.objects(true, "")
	n.start()
	if exists(n.conflist()) || exists(n.plugin()) {
		t.Fatalf("conflist (%v) or plugin (%v) installed before the node has a podCIDR", exists(n.conflist()), exists(n.plugin()))
	}
	if !n.metric(`isthmus_cni_state{state="pending"} 1`) {
		t.Errorf("isthmus_cni_state is not pending before the podCIDR verifies")
	}
	n.objects(true, "10.10.1.0/24")
	for deadline := time.Now().Add(10 * time.Second); !exists(n.conflist()); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no conflist 10s after the podCIDR verified; log:\n%s", n.logs.String())
		}
	}
	if b, err := os.ReadFile(n.plugin()); err != nil || string(b) != "plugin" {
		t.Fatalf("plugin not installed with the conflist: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(n.bin, cniinstall.PortmapName)); err != nil || string(b) != "portmap" {
		t.Fatalf("portmap not installed with the conflist that chains it: %q %v", b, err)
	}
	if !n.metric(`isthmus_cni_state{state="installed"} 1`) {
		t.Errorf("isthmus_cni_state is not installed")
	}
}

// A node of a managed Site whose configuration directory holds another
// plugin's conflist keeps that CNI: no conflist, no plugin, the other file
// untouched, a warning naming it and the metrics saying so. What an older
// agent put there (conflist and plugin) is taken away; the plugin stays while
// pods hold reservations, since the runtime's DEL of those pods runs it.
func TestCNIStartLeavesAnotherCNI(t *testing.T) {
	n := newCNINode(t, false)
	n.objects(true, "10.10.1.0/24")
	n.file(n.conf, "10-flannel.conflist", flannelConflist)
	n.file(n.conf, cniinstall.ConflistName, "{}") // an older agent's
	n.file(n.bin, cniinstall.PluginName, "old plugin")
	// flannel's conflist chains the node's own portmap.
	n.file(n.bin, cniinstall.PortmapName, "the node's portmap")
	if _, err := (ipam.Store{Dir: n.data}).Reserve([]netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")}, nil,
		ipam.Reservation{Attachment: ipam.Attachment{ContainerID: "c1", IfName: "eth0"}}); err != nil {
		t.Fatal(err)
	}
	n.start()
	n.unchanged(n.conf, "10-flannel.conflist", flannelConflist)
	if exists(n.conflist()) {
		t.Errorf("%s is there beside flannel's conflist", cniinstall.ConflistName)
	}
	if !exists(n.plugin()) {
		t.Errorf("the plugin was removed while a pod holds a reservation")
	}
	if l := n.logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "10-flannel.conflist") || !strings.Contains(l, "--cni-take-over") {
		t.Errorf("no warning naming 10-flannel.conflist and --cni-take-over; log:\n%s", l)
	}
	for _, m := range []string{`isthmus_cni_state{state="foreign_config"} 1`, `isthmus_cni_state{state="installed"} 0`, `isthmus_cni_foreign_config{file="10-flannel.conflist"} 1`} {
		if !n.metric(m) {
			t.Errorf("metrics lack %s", m)
		}
	}
	// The pod is deleted: the plugin goes at the next verification.
	if _, err := (ipam.Store{Dir: n.data}).Release(ipam.Attachment{ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); exists(n.plugin()); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin still there 10s after the last reservation went; log:\n%s", n.logs.String())
		}
	}
	n.unchanged(n.conf, "10-flannel.conflist", flannelConflist)
	n.unchanged(n.bin, cniinstall.PortmapName, "the node's portmap")
	if exists(n.conflist()) {
		t.Errorf("%s is there beside flannel's conflist", cniinstall.ConflistName)
	}
}

// --cni-take-over: the operator asks isthmus to be the node's CNI over
// another plugin's configuration, which stays as it is.
func TestCNIStartTakeOver(t *testing.T) {
	n := newCNINode(t, true)
	n.objects(true, "10.10.1.0/24")
	n.file(n.conf, "10-containerd-net.conflist", bridgeConflist)
	n.start()
	if b, err := os.ReadFile(n.conflist()); err != nil || string(b) != string(cniinstall.Conflist(n.c.socket, n.data)) {
		t.Fatalf("conflist with --cni-take-over: %q %v", b, err)
	}
	if b, err := os.ReadFile(n.plugin()); err != nil || string(b) != "plugin" {
		t.Fatalf("plugin with --cni-take-over: %q %v", b, err)
	}
	n.unchanged(n.conf, "10-containerd-net.conflist", bridgeConflist)
	if l := n.logs.String(); !strings.Contains(l, "10-containerd-net.conflist: plugin") || !strings.Contains(l, "uses host-local IPAM with embedded ranges") {
		t.Errorf("the host-local conflist was not reported; log:\n%s", l)
	}
	for _, m := range []string{`isthmus_cni_state{state="installed"} 1`, `isthmus_cni_foreign_config{file="10-containerd-net.conflist"} 1`} {
		if !n.metric(m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

// A node of a Site with manageCniPlugin: false gets nothing, even with
// --cni-take-over and an empty configuration directory, and loses the
// plugin an older agent installed there.
func TestCNIStartUnmanagedSite(t *testing.T) {
	n := newCNINode(t, true)
	n.objects(false, "10.10.1.0/24")
	n.file(n.bin, cniinstall.PluginName, "old plugin")
	n.start()
	if exists(n.conflist()) || exists(n.plugin()) {
		t.Fatalf("conflist (%v) or plugin (%v) on a node of an unmanaged Site; log:\n%s", exists(n.conflist()), exists(n.plugin()), n.logs.String())
	}
	if ents, _ := os.ReadDir(n.conf); len(ents) != 0 {
		t.Errorf("configuration directory holds %v", ents)
	}
	if !n.metric(`isthmus_cni_state{state="not_managed"} 1`) {
		t.Errorf("isthmus_cni_state is not not_managed")
	}
}
