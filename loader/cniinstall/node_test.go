package cniinstall

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// ForeignConfigs names every file a runtime would read as a network
// configuration, except isthmus' own, and nothing else.
func TestForeignConfigs(t *testing.T) {
	conf := t.TempDir()
	for _, f := range []string{ConflistName, "10-flannel.conflist", "87-podman.conflist", "99-loopback.conf", "calico-kubeconfig",
		".isthmus.tmp-123", "broken.json", "README"} {
		os.WriteFile(filepath.Join(conf, f), []byte("{}"), 0o644)
	}
	os.Mkdir(filepath.Join(conf, "multus.d"), 0o755)
	got, err := ForeignConfigs(conf)
	if want := []string{"10-flannel.conflist", "87-podman.conflist", "99-loopback.conf", "broken.json"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("ForeignConfigs = %v, %v; want %v", got, err, want)
	}
	// The reference loopback plugin alone is no pod network, as a .conf or as a
	// .conflist; beside another plugin it is.
	os.WriteFile(filepath.Join(conf, "99-loopback.conf"), []byte(`{"cniVersion": "0.3.1", "name": "lo", "type": "loopback"}`), 0o644)
	os.WriteFile(filepath.Join(conf, "98-lo.conflist"), []byte(`{"cniVersion": "1.0.0", "name": "lo", "plugins": [{"type": "loopback"}]}`), 0o644)
	os.WriteFile(filepath.Join(conf, "20-bridge.conflist"), []byte(`{"cniVersion": "1.0.0", "name": "b", "plugins": [{"type": "loopback"}, {"type": "bridge"}]}`), 0o644)
	got, err = ForeignConfigs(conf)
	if want := []string{"10-flannel.conflist", "20-bridge.conflist", "87-podman.conflist", "broken.json"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("ForeignConfigs = %v, %v; want %v", got, err, want)
	}
	if got, err := ForeignConfigs(filepath.Join(conf, "missing")); err != nil || got != nil {
		t.Fatalf("ForeignConfigs of a missing directory = %v, %v; want none", got, err)
	}
}

// The installer's walk through a node's life: undecided, managed (installs),
// another CNI appears (its conflist goes, the plugin stays while pods hold
// reservations, then goes), the other CNI goes (installs again), the Site
// stops managing (everything goes), --cni-take-over.
func TestInstallerWalk(t *testing.T) {
	bin, conf, src := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), PluginName)
	os.WriteFile(src, []byte("plugin"), 0o755)
	busy := false
	in := &Installer{BinDir: bin, ConfDir: conf, Plugin: src, Socket: "/s", DataDir: "/d", InUse: func() (bool, error) { return busy, nil }}
	has := func(dir, f string) bool { _, err := os.Stat(filepath.Join(dir, f)); return err == nil }
	step := func(w Want, phase string, plugin, conflist bool) {
		t.Helper()
		st, err := in.Reconcile(w)
		if err != nil || st.Phase != phase || has(bin, PluginName) != plugin || has(conf, ConflistName) != conflist {
			t.Fatalf("Reconcile(%v) = %+v, %v; plugin %v conflist %v; want %s, plugin %v conflist %v",
				w, st, err, has(bin, PluginName), has(conf, ConflistName), phase, plugin, conflist)
		}
	}
	step(Undecided, PhasePending, false, false)
	step(Manage, PhaseInstalled, true, true)
	os.Remove(filepath.Join(conf, ConflistName))
	step(Manage, PhaseInstalled, true, true) // written again
	os.WriteFile(filepath.Join(conf, "10-calico.conflist"), []byte("{}"), 0o644)
	busy = true
	step(Manage, PhaseForeign, true, false)
	step(Undecided, PhaseForeign, true, false)
	busy = false
	step(Manage, PhaseForeign, false, false)
	os.Remove(filepath.Join(conf, "10-calico.conflist"))
	step(Manage, PhaseInstalled, true, true)
	step(Leave, PhaseNotManaged, false, false)
	// --cni-take-over: over another CNI where the Site manages, never where
	// it does not.
	in.TakeOver = true
	os.WriteFile(filepath.Join(conf, "10-calico.conflist"), []byte("{}"), 0o644)
	step(Leave, PhaseNotManaged, false, false)
	step(Manage, PhaseInstalled, true, true)
	if st, _ := in.Reconcile(Manage); !slices.Equal(st.Foreign, []string{"10-calico.conflist"}) {
		t.Fatalf("state %+v does not list calico's conflist", st)
	}
}

// An agent of this release on a node where an older one installed isthmus:
// the conflist the older agent wrote (isthmus-cni alone, no portmap: its
// bytes as that release wrote them) is rewritten with portmap chained, and
// portmap is in the plugin directory before the conflist names it. A
// portmap the node had is replaced by the one shipped. Leaving the node
// later takes the conflist and isthmus-cni, and leaves portmap.
func TestInstallerUpgradeChainsPortmap(t *testing.T) {
	bin, conf, dir := t.TempDir(), t.TempDir(), t.TempDir()
	plugin, portmap := filepath.Join(dir, PluginName), filepath.Join(dir, PortmapName)
	os.WriteFile(plugin, []byte("plugin v2"), 0o755)
	os.WriteFile(portmap, []byte("portmap shipped"), 0o755)
	const older = `{
  "cniVersion": "1.0.0",
  "cniVersions": [
    "1.0.0",
    "1.1.0"
  ],
  "name": "isthmus",
  "plugins": [
    {
      "capabilities": {
        "ips": true
      },
      "dataDir": "/d",
      "socket": "/s",
      "type": "isthmus-cni"
    }
  ]
}
`
	os.WriteFile(filepath.Join(conf, ConflistName), []byte(older), 0o644)
	os.WriteFile(filepath.Join(bin, PluginName), []byte("plugin v1"), 0o755)
	os.WriteFile(filepath.Join(bin, PortmapName), []byte("the node's portmap"), 0o755)
	// The conflist never names portmap before the binary is there: while
	// portmap cannot be installed, the older conflist stays.
	in := &Installer{BinDir: bin, ConfDir: conf, Plugin: plugin, Portmap: filepath.Join(dir, "missing"), Socket: "/s", DataDir: "/d"}
	if st, err := in.Reconcile(Manage); err == nil || st.Phase == PhaseInstalled {
		t.Fatalf("Reconcile(Manage) without a portmap to install = %+v, %v; want an error", st, err)
	}
	if b, _ := os.ReadFile(filepath.Join(conf, ConflistName)); string(b) != older {
		t.Fatalf("conflist rewritten to %s before portmap was installed", b)
	}
	in.Portmap = portmap
	st, err := in.Reconcile(Manage)
	if err != nil || st.Phase != PhaseInstalled {
		t.Fatalf("Reconcile(Manage) = %+v, %v", st, err)
	}
	for f, want := range map[string]string{
		filepath.Join(bin, PluginName):    "plugin v2",
		filepath.Join(bin, PortmapName):   "portmap shipped",
		filepath.Join(conf, ConflistName): string(Conflist("/s", "/d")),
	} {
		if b, err := os.ReadFile(f); err != nil || string(b) != want {
			t.Errorf("%s holds %q, %v; want %q", f, b, err, want)
		}
	}
	var list struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	b, _ := os.ReadFile(filepath.Join(conf, ConflistName))
	if err := json.Unmarshal(b, &list); err != nil || len(list.Plugins) != 2 || list.Plugins[1].Type != PortmapName {
		t.Errorf("rewritten conflist %s does not chain portmap (%v)", b, err)
	}
	// portmap removed by hand comes back at the next verification.
	os.Remove(filepath.Join(bin, PortmapName))
	if _, err := in.Reconcile(Manage); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bin, PortmapName)); err != nil {
		t.Errorf("portmap not installed again: %v", err)
	}
	if st, err := in.Reconcile(Leave); err != nil || st.Phase != PhaseNotManaged {
		t.Fatalf("Reconcile(Leave) = %+v, %v", st, err)
	}
	if ents, _ := os.ReadDir(bin); len(ents) != 1 || ents[0].Name() != PortmapName {
		t.Errorf("after leaving, %s holds %v; want only %s", bin, ents, PortmapName)
	}
}
