package cniinstall

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

func TestInstallPluginAndConflist(t *testing.T) {
	src := filepath.Join(t.TempDir(), "isthmus-cni")
	os.WriteFile(src, []byte("#!/bin/sh\n"), 0o600)
	bin, conf := t.TempDir(), t.TempDir()
	// An older plugin is replaced whole.
	os.WriteFile(filepath.Join(bin, PluginName), []byte("old"), 0o755)
	if err := InstallPlugin(src, bin); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(bin, PluginName))
	if err != nil || st.Mode().Perm() != 0o755 || st.Size() != 10 {
		t.Fatalf("installed plugin: %v %v", st, err)
	}
	if err := WriteConflist(conf, "/run/isthmus/ipam.sock", "/var/lib/isthmus/ipam"); err != nil {
		t.Fatal(err)
	}
	// No temporary file is left in either directory.
	for _, d := range []string{bin, conf} {
		ents, _ := os.ReadDir(d)
		if len(ents) != 1 {
			t.Errorf("%s holds %v, want only the installed file", d, ents)
		}
	}
	var c struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	b, _ := os.ReadFile(filepath.Join(conf, ConflistName))
	if err := json.Unmarshal(b, &c); err != nil || c.CNIVersion != "1.0.0" || len(c.Plugins) != 2 || c.Plugins[0]["type"] != PluginName {
		t.Fatalf("conflist %s: %v", b, err)
	}
	// A runtime on today's libcni speaks CNI 1.1 with it (STATUS, GC); an
	// older one (containerd 1.6, e2e TestContainerdPods) reads cniVersion.
	if list, err := libcni.ConfListFromBytes(b); err != nil {
		t.Errorf("libcni cannot read conflist %s: %v", b, err)
	} else if list.CNIVersion != "1.1.0" {
		t.Errorf("libcni reads conflist %s as version %q, want 1.1.0", b, list.CNIVersion)
	} else if n := len(list.Plugins); n != 2 || list.Plugins[1].Network.Type != PortmapName ||
		!list.Plugins[1].Network.Capabilities["portMappings"] || list.Plugins[0].Network.Capabilities["portMappings"] {
		// The runtime hands a pod's hostPorts (runtimeConfig.portMappings)
		// to the plugins that declare the capability: portmap, after
		// isthmus-cni, whose result carries the pod's address to it.
		t.Errorf("libcni reads conflist %s with %d plugins; want isthmus-cni, then portmap with the portMappings capability", b, n)
	}
	// portmap's snat on: a pod's own hostPort (hairpin) and 127.0.0.1 need
	// its masquerade.
	if c.Plugins[1]["snat"] != true {
		t.Errorf("conflist %s: portmap without snat", b)
	}
	if _, ok := c.Plugins[0]["ipam"]; ok {
		t.Errorf("conflist embeds an ipam section: %s", b)
	}
	// It sorts before the conflists other CNIs install.
	names := []string{"05-cilium.conflist", "10-calico.conflist", "10-azure.conflist", "01-something.conf", ConflistName}
	sort.Strings(names)
	if names[0] != ConflistName {
		t.Errorf("%s does not sort first: %v", ConflistName, names)
	}
	// portmap beside the plugin, replacing the node's own; a crash's
	// temporary copy is left.
	os.WriteFile(filepath.Join(bin, PortmapName), []byte("the node's portmap"), 0o755)
	os.WriteFile(filepath.Join(bin, "."+PortmapName+".tmp-1"), []byte("half"), 0o600)
	if err := InstallPortmap(src, bin); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(bin, PortmapName)); err != nil || string(b) != "#!/bin/sh\n" {
		t.Fatalf("installed portmap holds %q, %v; want the source's bytes", b, err)
	}
	if err := Uninstall(bin, conf); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(bin, conf); err != nil {
		t.Fatalf("second uninstall: %v", err)
	}
	// Uninstall leaves portmap (other configurations may chain it) but not
	// the temporary copy.
	if ents, _ := os.ReadDir(bin); len(ents) != 1 || ents[0].Name() != PortmapName {
		t.Errorf("after uninstall %s holds %v, want only %s", bin, ents, PortmapName)
	}
	for _, f := range []string{filepath.Join(bin, PluginName), filepath.Join(conf, ConflistName)} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s still there after uninstall", f)
		}
	}
}

func TestFindEmbeddedRanges(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"10-bridge.conflist":             `{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.10.1.0/24"}]]}},{"type":"portmap"}]}`,
		"20-old.conf":                    `{"cniVersion":"0.3.1","name":"o","type":"ptp","ipam":{"type":"host-local","subnet":"10.10.2.0/24"}}`,
		"30-dhcp.conflist":               `{"cniVersion":"1.0.0","name":"d","plugins":[{"type":"macvlan","ipam":{"type":"dhcp"}}]}`,
		"40-hostlocal-noranges.conflist": `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`,
		"50-broken.conflist":             `{`,
		"README":                         `{"type":"x","ipam":{"type":"host-local","subnet":"10.0.0.0/8"}}`,
		ConflistName:                     string(Conflist("/s", "/d")),
	}
	for n, c := range files {
		os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644)
	}
	got, err := FindEmbeddedRanges(dir)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, f := range got {
		s = append(s, f.String())
	}
	want := []string{
		`10-bridge.conflist: plugin "bridge" uses host-local IPAM with embedded ranges`,
		`20-old.conf: plugin "ptp" uses host-local IPAM with embedded ranges`,
	}
	if !slices.Equal(s, want) {
		t.Fatalf("findings:\n%v\nwant\n%v", s, want)
	}
}

// The conflist works with the plugins the agent installs, as a runtime's
// libcni sees them: the real isthmus-cni and portmap (built from this tree
// and the module's pinned plugins) are found in the plugin directory, each
// supports the version libcni picks from cniVersions (1.1.0) and answers
// STATUS, and the capabilities libcni collects are the two the runtime
// fills in (ips, portMappings). No root: VERSION and STATUS touch no
// namespace.
func TestConflistRunsWithShippedPlugins(t *testing.T) {
	bin := t.TempDir()
	for _, b := range []struct{ name, pkg string }{
		{PluginName, "github.com/isthmus-dev/isthmus/cmd/isthmus-cni"},
		{PortmapName, "github.com/containernetworking/plugins/plugins/meta/portmap"},
	} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, b.name), b.pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	list, err := libcni.ConfListFromBytes(Conflist("/nonexistent/ipam.sock", t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfig([]string{bin}, nil)
	caps, err := cni.ValidateNetworkList(context.Background(), list)
	if err != nil {
		t.Fatalf("libcni rejects the conflist with the shipped plugins: %v", err)
	}
	slices.Sort(caps)
	if want := []string{"ips", "portMappings"}; !slices.Equal(caps, want) {
		t.Errorf("capabilities %v, want %v", caps, want)
	}
	// STATUS: isthmus-cni asks the agent (none here: it must fail, naming
	// the socket), so portmap's own STATUS is asked alone.
	if err := cni.GetStatusNetworkList(context.Background(), list); err == nil {
		t.Errorf("STATUS succeeded without an agent")
	}
	pm := &libcni.NetworkConfigList{CNIVersion: list.CNIVersion, Name: list.Name, Plugins: list.Plugins[1:]}
	if err := cni.GetStatusNetworkList(context.Background(), pm); err != nil {
		t.Errorf("portmap's STATUS: %v", err)
	}
}
