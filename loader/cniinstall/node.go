package cniinstall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// Want is what the agent's verification of the node says about its CNI.
type Want int

const (
	// Undecided: the node is not verified yet, or its podCIDRs do not
	// verify. What is on the node stays as it is.
	Undecided Want = iota
	// Manage: the node's podCIDRs verified on a Site that manages the CNI
	// (manageCniPlugin true, the default).
	Manage
	// Leave: the node's Site has manageCniPlugin: false; another CNI owns
	// its pods.
	Leave
)

// The phases of State, as the agent logs them and isthmus_cni_state labels
// them.
const (
	PhasePending    = "pending"        // Undecided so far: nothing installed by this agent
	PhaseInstalled  = "installed"      // the plugin and the conflist are in place
	PhaseForeign    = "foreign_config" // held back by another plugin's configuration
	PhaseNotManaged = "not_managed"    // the node's Site has manageCniPlugin: false
)

// State is where the installer left the node.
type State struct {
	Phase string
	// Foreign lists the configurations of other plugins in the
	// configuration directory (ForeignConfigs), whatever the phase.
	Foreign []string
	// PluginKept is set when isthmus is not the node's CNI but the plugin
	// stays installed because reservations remain: the runtime's DEL of
	// those pods runs it.
	PluginKept bool
}

// Equal reports whether two states are the same.
func (s State) Equal(o State) bool {
	return s.Phase == o.Phase && s.PluginKept == o.PluginKept && slices.Equal(s.Foreign, o.Foreign)
}

// Installer keeps the plugin, portmap and the conflist on a node where, and
// only where, isthmus is the node's CNI: the node's Site manages the CNI and
// its podCIDRs verified, and the configuration directory holds no other
// plugin's configuration unless TakeOver says to write over it. Elsewhere it
// writes nothing, and removes the conflist and the plugin it finds of its
// own (the plugin only once no reservation needs it for DEL; portmap never,
// see Uninstall). Its methods are safe for concurrent use.
type Installer struct {
	// BinDir and ConfDir are the runtime's directories; an empty one is left
	// alone.
	BinDir, ConfDir string
	// Plugin is the isthmus-cni binary to copy into BinDir.
	Plugin string
	// Portmap is the reference portmap binary to copy into BinDir beside
	// it, before the conflist that chains it is written; empty: BinDir
	// has one already (the conflist chains it all the same).
	Portmap string
	// Socket and DataDir go into the conflist.
	Socket, DataDir string
	// TakeOver writes the conflist even when ConfDir holds another plugin's
	// configuration (the operator's --cni-take-over).
	TakeOver bool
	// InUse reports whether pods still hold reservations; nil means never.
	InUse func() (bool, error)
	// Log receives a line at every change of State; nil discards.
	Log *slog.Logger

	mu        sync.Mutex
	installed bool // the plugins were copied by this Installer (once per agent: an upgrade brings its own)
	last      State
}

// Reconcile brings the node to what w asks and returns the state reached;
// the error says what could not be done (the state then says what is in
// place).
func (in *Installer) Reconcile(w Want) (State, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	log := in.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	foreign, err := ForeignConfigs(in.ConfDir)
	if err != nil {
		return in.last, err
	}
	st := State{Phase: in.last.Phase, Foreign: foreign}
	if st.Phase == "" {
		st.Phase = PhasePending
	}
	var errs []error
	switch {
	case w == Manage && (len(foreign) == 0 || in.TakeOver):
		// The plugins before the conflist that names them: a runtime
		// reading the new conflist finds both.
		if in.BinDir != "" && (!in.installed || in.missing()) {
			if err := InstallPlugin(in.Plugin, in.BinDir); err != nil {
				errs = append(errs, err)
				break
			}
			if in.Portmap != "" {
				if err := InstallPortmap(in.Portmap, in.BinDir); err != nil {
					errs = append(errs, err)
					break
				}
			}
			in.installed = true
		}
		if in.ConfDir != "" {
			if err := in.ensureConflist(); err != nil {
				errs = append(errs, err)
				break
			}
		}
		st.Phase = PhaseInstalled
	case w == Manage || w == Leave:
		st.Phase = PhaseForeign
		if w == Leave {
			st.Phase = PhaseNotManaged
		}
		kept, err := in.remove(log)
		if err != nil {
			errs = append(errs, err)
		}
		st.PluginKept = kept
	}
	if !st.Equal(in.last) {
		in.logState(log, st)
	}
	in.last = st
	return st, errors.Join(errs...)
}

// missing reports whether a plugin the Installer copies is not in BinDir.
func (in *Installer) missing() bool {
	names := []string{PluginName}
	if in.Portmap != "" {
		names = append(names, PortmapName)
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(in.BinDir, n)); err != nil {
			return true
		}
	}
	return false
}

// ensureConflist writes the conflist unless it is there with its content:
// a conflist of an older release (before portmap was chained, say) is
// rewritten on the agent's first verification after an upgrade.
func (in *Installer) ensureConflist() error {
	b, err := os.ReadFile(filepath.Join(in.ConfDir, ConflistName))
	if err == nil && bytes.Equal(b, Conflist(in.Socket, in.DataDir)) {
		return nil
	}
	return WriteConflist(in.ConfDir, in.Socket, in.DataDir)
}

// remove takes away the conflist and, unless pods still hold reservations,
// the plugin (not portmap: see Uninstall); it reports whether the plugin was
// kept for them.
func (in *Installer) remove(log *slog.Logger) (kept bool, err error) {
	if in.ConfDir != "" {
		f := filepath.Join(in.ConfDir, ConflistName)
		if err := os.Remove(f); err == nil {
			log.Warn("removed the isthmus CNI conflist: isthmus is not this node's CNI; pods created from now on get their network from the node's other configuration", "file", f)
		} else if !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("remove %s: %w", f, err)
		}
	}
	if in.BinDir == "" {
		return false, nil
	}
	f := filepath.Join(in.BinDir, PluginName)
	if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
		in.installed = false
		return false, nil
	}
	if in.InUse != nil {
		busy, err := in.InUse()
		if err != nil {
			return true, fmt.Errorf("read reservations: %w", err)
		}
		if busy {
			return true, nil
		}
	}
	if err := Uninstall(in.BinDir, ""); err != nil {
		return true, err
	}
	in.installed = false
	log.Info("removed the isthmus CNI plugin: isthmus is not this node's CNI", "file", f)
	return false, nil
}

func (in *Installer) logState(log *slog.Logger, st State) {
	conflist := filepath.Join(in.ConfDir, ConflistName)
	switch {
	case st.Phase == PhaseInstalled && len(st.Foreign) > 0:
		log.Warn("isthmus is this node's CNI over another plugin's configuration (--cni-take-over): its conflist sorts first",
			"file", conflist, "other", st.Foreign)
	case st.Phase == PhaseInstalled:
		log.Info("isthmus is this node's CNI: plugin and conflist installed", "plugin", filepath.Join(in.BinDir, PluginName), "file", conflist)
	case st.Phase == PhaseForeign:
		log.Warn("isthmus is not this node's CNI: another plugin's configuration is in the CNI configuration directory; "+
			"no conflist written (pass --cni-take-over to replace it, docs/cni.md)", "dir", in.ConfDir, "other", st.Foreign, "pluginKeptForDEL", st.PluginKept)
	case st.Phase == PhaseNotManaged:
		log.Info("isthmus is not this node's CNI: its Site has manageCniPlugin: false", "pluginKeptForDEL", st.PluginKept)
	}
}

// ForeignConfigs lists, sorted, the network configurations in confDir that
// isthmus did not write: every .conf, .conflist and .json file (the files a
// runtime reads) other than ConflistName, parsable or not, except one whose
// only plugin is the reference loopback plugin (the 99-loopback.conf older
// install guides leave on every node: it is no pod network, and
// 00-isthmus.conflist sorts before it). A missing or empty confDir has none.
func ForeignConfigs(confDir string) ([]string, error) {
	if confDir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(confDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", confDir, err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() || e.Name() == ConflistName || !slices.Contains([]string{".conf", ".conflist", ".json"}, filepath.Ext(e.Name())) {
			continue
		}
		if loopbackOnly(filepath.Join(confDir, e.Name())) {
			continue
		}
		out = append(out, e.Name())
	}
	return out, nil
}

// loopbackOnly reports whether the network configuration in file (a .conf
// with one plugin, or a .conflist) names only plugins of type "loopback".
// Anything unreadable or unparsable is not.
func loopbackOnly(file string) bool {
	b, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	var conf struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if json.Unmarshal(b, &conf) != nil {
		return false
	}
	if len(conf.Plugins) == 0 {
		return conf.Type == "loopback"
	}
	for _, p := range conf.Plugins {
		if p.Type != "loopback" {
			return false
		}
	}
	return conf.Type == ""
}
