package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/isthmus-dev/isthmus/loader/wireguard"
)

// DownOptions tune Down.
type DownOptions struct {
	// Binary runs `isthmus uninstall` per node; default the binary recorded by
	// Up in the state directory. Without a working binary the pins are removed
	// directly.
	Binary string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Down removes the lab of that name: it stops the agents, runs `cnitool del`
// for every pod the CNI plugin made (found from the reservations), uninstalls each
// node's datapath, removes the pins, deletes every namespace named isl-<lab>-*
// and the state directory. It needs nothing but the name, so it also cleans up
// after a failed or interrupted Up, and it is idempotent.
func Down(lab string, opts DownOptions) error {
	if err := ValidateLabName(lab); err != nil {
		return fmt.Errorf("take lab down: %w", err)
	}
	return down(lab, opts, nil)
}

// Down removes the lab; see the package function Down.
func (l *Lab) Down() error {
	// kube-proxy and kube-router first: their cleanups need the node
	// namespaces.
	perr := errors.Join(l.StopKubeProxy(context.Background()), l.StopKubeRouter(context.Background()))
	l.mu.Lock()
	agents := l.agents
	l.mu.Unlock()
	err := down(l.Name, DownOptions{Binary: l.Binary, Log: l.log}, agents)
	return errors.Join(perr, err, l.stopKube())
}

func down(lab string, opts DownOptions, agents map[string]*agent) error {
	logf := func(format string, args ...any) {
		if opts.Log != nil {
			fmt.Fprintf(opts.Log, format+"\n", args...)
		}
	}
	var errs []error
	state := StateDir(lab)

	// A lab served in Kubernetes mode by another process (lab up --kubernetes)
	// holds its API server, controller and kube-proxies there: that process
	// takes them down, then the rest below finds little left.
	if err := stopServing(state); err != nil {
		errs = append(errs, err)
	}
	pids, _ := filepath.Glob(filepath.Join(state, "*.pid"))
	for _, pf := range pids {
		node := strings.TrimSuffix(filepath.Base(pf), ".pid")
		logf("lab %s: stop agent %s", lab, node)
		if err := stopAgent(lab, node, agents[node]); err != nil {
			errs = append(errs, err)
		}
	}

	bin := opts.Binary
	if bin == "" {
		if data, err := os.ReadFile(filepath.Join(state, "binary")); err == nil {
			bin = strings.TrimSpace(string(data))
		}
	}
	// The runtime's part: DEL of every pod the plugin made, with the agents
	// already gone, as DEL must work then.
	if err := cniDown(lab, bin, logf); err != nil {
		errs = append(errs, err)
	}
	pinLab := filepath.Join(PinRoot, lab)
	nodes, _ := os.ReadDir(pinLab)
	for _, e := range nodes {
		pin := filepath.Join(pinLab, e.Name())
		ns := NSName(lab, e.Name())
		if _, err := os.Stat(NSPath(ns)); err == nil && bin != "" {
			if _, err := os.Stat(bin); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				argv := []string{bin, "uninstall", "--pin-dir", pin, "--wireguard-device", WireGuardDevice(lab, e.Name())}
				if _, err := os.Stat(cniState(lab, e.Name())); err == nil {
					argv = append(argv, "--cni-bin-dir", cniBinDir(lab, e.Name()), "--cni-conf-dir", cniConfDir(lab, e.Name()))
				}
				out, err := Command(ctx, ns, argv...).CombinedOutput()
				cancel()
				if err != nil {
					// Not fatal: removing the pins and the namespace below takes
					// down whatever uninstall left.
					logf("lab %s: uninstall on %s: %v: %s", lab, e.Name(), err, strings.TrimSpace(string(out)))
				}
			}
		}
	}
	// A lab whose agents ran from the DaemonSet has its pin directory bind
	// mounted on itself (prepareDaemonSet); uninstall above worked through it.
	unmountShared(pinLab, logf)
	if err := os.RemoveAll(pinLab); err != nil {
		errs = append(errs, fmt.Errorf("remove pins: %w", err))
	}
	// Remove the parent too once no lab uses it; failure means another lab does.
	os.Remove(PinRoot)

	names, err := listNS(NSPrefix + lab + "-")
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		// The userspace WireGuard process of a node (isthmus' device, or
		// DatapathWireGuard's) would outlive its namespace, its TUN moved
		// to the host's: stop it first.
		node := strings.TrimPrefix(name, NSPrefix+lab+"-")
		if err := wireguard.Remove(WireGuardDevice(lab, node)); err != nil {
			errs = append(errs, err)
		}
		logf("lab %s: delete netns %s", lab, name)
		if err := deleteNS(name); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(state); err != nil {
		errs = append(errs, fmt.Errorf("remove state dir: %w", err))
	}
	os.Remove(StateRoot) // only succeeds once no lab is left
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("take lab %s down: %w", lab, err)
	}
	return nil
}
