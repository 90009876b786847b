package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/loader/ipamd/ipamdtest"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/testenv/syncbuf"
)

// The agent's CNI side installs the plugin at once, reports a conflist that
// calls host-local with ranges, and writes its own conflist only once the
// node's podCIDR verifies.
func TestCNIStartWritesConflistAfterVerification(t *testing.T) {
	objDir, bin, conf, plugin := t.TempDir(), t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "isthmus-cni")
	os.WriteFile(plugin, []byte("plugin"), 0o755)
	write := func(podCIDR string) {
		os.WriteFile(filepath.Join(objDir, "o.yaml"), []byte(ipamdtest.Objects("[10.10.0.0/16]", true, 0, podCIDR)), 0o644)
	}
	write("")
	os.WriteFile(filepath.Join(conf, "10-bridge.conflist"),
		[]byte(`{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"bridge","ipam":{"type":"host-local","subnet":"10.10.1.0/24"}}]}`), 0o644)
	var logs syncbuf.Buffer
	c := cniFlags{socket: filepath.Join(t.TempDir(), "ipam.sock"), dataDir: t.TempDir(), binDir: bin, confDir: conf, plugin: plugin}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snapshot := func() (*objects.Set, []objects.Warning, error) { return objects.LoadDir(objDir) }
	if err := c.start(ctx, "n1", "", snapshot, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(bin, cniinstall.PluginName)); err != nil || string(b) != "plugin" {
		t.Fatalf("plugin not installed: %q %v", b, err)
	}
	if !strings.Contains(logs.String(), "10-bridge.conflist: plugin") {
		t.Errorf("the host-local conflist was not reported; log:\n%s", logs.String())
	}
	conflist := filepath.Join(conf, cniinstall.ConflistName)
	if _, err := os.Stat(conflist); !os.IsNotExist(err) {
		t.Fatalf("conflist written before the node has a podCIDR (%v)", err)
	}
	write("10.10.1.0/24")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(conflist); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no conflist 10s after the podCIDR verified; log:\n%s", logs.String())
		}
	}
}
