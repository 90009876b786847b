// Package cniinstall puts the isthmus CNI plugin on a node and takes it away:
// the binary, and the reference portmap plugin chained after it for
// hostPort, into the runtime's plugin directory (a temporary name, then a
// rename, so a runtime never executes a half-written file), and a conflist
// without embedded ranges into its configuration directory, named to sort
// first. It also finds conflists that call host-local with ranges of their
// own: a runtime that cached one hands out addresses the agent never verified.
package cniinstall

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Defaults of the runtime's directories and of the names isthmus puts there.
const (
	DefaultBinDir  = "/opt/cni/bin"
	DefaultConfDir = "/etc/cni/net.d"
	PluginName     = "isthmus-cni"
	// ConflistName sorts before every other conflist a node usually has
	// (10-calico, 10-containerd-net, 05-cilium, 10-azure), so the runtime
	// picks it: runtimes use the first file in lexical order.
	ConflistName = "00-isthmus.conflist"
	NetworkName  = "isthmus"
	// PortmapName is the reference portmap plugin
	// (github.com/containernetworking/plugins, plugins/meta/portmap),
	// chained after isthmus-cni: it serves a pod's hostPort with DNAT rules
	// in the node's nat table, as it does for flannel and Calico.
	PortmapName = "portmap"
)

// InstallPlugin copies src to binDir/isthmus-cni through a temporary file in
// the same directory and a rename.
func InstallPlugin(src, binDir string) error { return installBinary(src, binDir, PluginName) }

// InstallPortmap copies src, the reference portmap plugin, to
// binDir/portmap the same way. A portmap already there (the node's own,
// from a package of the reference plugins) is replaced: the conflist's
// cniVersions need a portmap of CNI 1.1 (plugins v1.5 or later), and the
// one isthmus ships is the one it is tested with. The first install records
// what it found (portmapRecord, a hard link to the node's own portmap), so
// that Uninstall leaves the directory as it was.
func InstallPortmap(src, binDir string) error {
	if err := recordPortmap(binDir); err != nil {
		return err
	}
	return installBinary(src, binDir, PortmapName)
}

// portmapRecord, in the CNI bin directory, says what the first
// InstallPortmap found there: portmapAdded (no portmap) or portmapReplaced
// (the node's own, kept as portmapSaved).
const (
	portmapRecord   = ".isthmus-portmap"
	portmapSaved    = ".portmap.isthmus-saved"
	portmapAdded    = "added"
	portmapReplaced = "replaced"
)

// recordPortmap writes portmapRecord unless an earlier install did, keeping
// a portmap already in binDir as portmapSaved (a hard link: the node's
// portmap stays in place until the new one is renamed over it).
func recordPortmap(binDir string) error {
	record := filepath.Join(binDir, portmapRecord)
	if _, err := os.Stat(record); err == nil {
		return nil
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", binDir, err)
	}
	what := portmapAdded
	if _, err := os.Lstat(filepath.Join(binDir, PortmapName)); err == nil {
		saved := filepath.Join(binDir, portmapSaved)
		if err := os.Remove(saved); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("keep the node's portmap: %w", err)
		}
		if err := os.Link(filepath.Join(binDir, PortmapName), saved); err != nil {
			return fmt.Errorf("keep the node's portmap: %w", err)
		}
		what = portmapReplaced
	}
	if err := os.WriteFile(record, []byte(what+"\n"), 0o644); err != nil {
		return fmt.Errorf("record the node's portmap: %w", err)
	}
	return nil
}

// restorePortmap undoes what portmapRecord says the first install did: it
// puts the node's own portmap back, or removes the one isthmus added. Without
// a record (a portmap isthmus never installed) it leaves portmap alone.
func restorePortmap(binDir string) error {
	record := filepath.Join(binDir, portmapRecord)
	b, err := os.ReadFile(record)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", record, err)
	}
	pm := filepath.Join(binDir, PortmapName)
	switch strings.TrimSpace(string(b)) {
	case portmapReplaced:
		if err := os.Rename(filepath.Join(binDir, portmapSaved), pm); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("put the node's portmap back: %w", err)
		}
	case portmapAdded:
		if err := os.Remove(pm); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", pm, err)
		}
	default:
		return fmt.Errorf("%s: unknown record %q", record, b)
	}
	if err := os.Remove(record); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", record, err)
	}
	return nil
}

// installBinary copies src to binDir/name through a temporary file in the
// same directory and a rename.
func installBinary(src, binDir, name string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open plugin %s: %w", src, err)
	}
	defer in.Close()
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", binDir, err)
	}
	tmp, err := os.CreateTemp(binDir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary plugin: %w", err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; cleans up a failure
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("copy plugin: %w", err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod plugin: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync plugin: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close plugin: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(binDir, name)); err != nil {
		return fmt.Errorf("install plugin %s: %w", name, err)
	}
	return nil
}

// Conflist is the network configuration: the plugin, the agent's socket and
// the reservation directory, and no ranges: the agent alone knows them.
// cniVersion 1.0.0 with cniVersions up to 1.1.0 (CNI 1.1): a runtime on libcni
// 1.2 or later picks 1.1.0 (and STATUS and GC with it), while containerd 1.6,
// whose libcni 1.1 ignores cniVersions and rejects a 1.1.0 result, uses 1.0.0
// (docs/cni.md).
//
// The reference portmap plugin follows isthmus-cni: with the portMappings
// capability the runtime hands it the pod's hostPorts, and it DNATs them to
// the pod's address from isthmus-cni's result. snat is on (portmap's
// default, written out): it masquerades the two kinds of connection that
// cannot work otherwise, a pod to its own hostPort (hairpin) and the node's
// 127.0.0.1 to a hostPort, with its mark bit 13 (0x2000). Neither goes into
// the overlay, and the agent's masquerade exemption (datapath.OverlayMark
// 0x1000, or out isthmus0) matches neither, so the two do not meet: the
// exemption keeps overlay traffic's addresses, portmap's MASQUERADE rewrites
// only these local hairpins.
func Conflist(socket, dataDir string) []byte {
	c := map[string]any{
		"cniVersion":  "1.0.0",
		"cniVersions": []string{"1.0.0", "1.1.0"},
		"name":        NetworkName,
		"plugins": []map[string]any{{
			"type": PluginName, "socket": socket, "dataDir": dataDir,
			// A runtime may ask for a pod's addresses (CNI conventions'
			// `ips`); the agent still checks them against the verified ranges.
			"capabilities": map[string]bool{"ips": true},
		}, {
			"type": PortmapName, "capabilities": map[string]bool{"portMappings": true}, "snat": true,
		}},
	}
	b, _ := json.MarshalIndent(c, "", "  ")
	return append(b, '\n')
}

// WriteConflist writes Conflist to confDir/ConflistName through a temporary
// file and a rename.
func WriteConflist(confDir, socket, dataDir string) error {
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", confDir, err)
	}
	tmp, err := os.CreateTemp(confDir, ".isthmus.tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary conflist: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(Conflist(socket, dataDir))
	if err2 := tmp.Close(); err == nil {
		err = err2
	}
	if err != nil {
		return fmt.Errorf("write conflist: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("chmod conflist: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(confDir, ConflistName)); err != nil {
		return fmt.Errorf("install conflist: %w", err)
	}
	return nil
}

// Finding is a network configuration that calls host-local with ranges of its
// own.
type Finding struct {
	File   string // base name in the configuration directory
	Plugin string // the plugin type whose ipam is host-local
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: plugin %q uses host-local IPAM with embedded ranges", f.File, f.Plugin)
}

// FindEmbeddedRanges lists the configurations in confDir (.conf, .conflist,
// .json, as runtimes read them) whose plugins use host-local IPAM with
// "ranges" or "subnet". Files that do not parse are skipped: the runtime
// skips them too.
func FindEmbeddedRanges(confDir string) ([]Finding, error) {
	ents, err := os.ReadDir(confDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", confDir, err)
	}
	var out []Finding
	for _, e := range ents {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || !slices.Contains([]string{".conf", ".conflist", ".json"}, ext) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(confDir, e.Name()))
		if err != nil {
			continue
		}
		var conf struct {
			pluginConf
			Plugins []pluginConf `json:"plugins"`
		}
		if json.Unmarshal(b, &conf) != nil {
			continue
		}
		for _, p := range append(conf.Plugins, conf.pluginConf) {
			if p.IPAM.Type == "host-local" && (len(p.IPAM.Ranges) > 0 || p.IPAM.Subnet != "") {
				out = append(out, Finding{File: e.Name(), Plugin: p.Type})
			}
		}
	}
	return out, nil
}

type pluginConf struct {
	Type string `json:"type"`
	IPAM struct {
		Type   string            `json:"type"`
		Subnet string            `json:"subnet"`
		Ranges []json.RawMessage `json:"ranges"`
	} `json:"ipam"`
}

// Uninstall removes the plugin from binDir and the conflist from confDir
// (an empty directory name skips it), with any temporary file a crash left;
// what is already gone counts as removed. portmap goes back to what the first
// InstallPortmap found: the node's own portmap (other network configurations
// may chain it), or none.
func Uninstall(binDir, confDir string) error {
	var errs []error
	if binDir != "" {
		if err := restorePortmap(binDir); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range []struct {
		dir, file string // file "": only the leftovers
		tmp       string
	}{
		{binDir, PluginName, "." + PluginName + ".tmp-*"},
		{binDir, "", "." + PortmapName + ".tmp-*"},
		{confDir, ConflistName, ".isthmus.tmp-*"},
	} {
		if d.dir == "" {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(d.dir, d.tmp))
		if d.file != "" {
			files = append(files, filepath.Join(d.dir, d.file))
		}
		for _, f := range files {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove %s: %w", f, err))
			}
		}
	}
	return errors.Join(errs...)
}
