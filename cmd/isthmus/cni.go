package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"

	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/loader/ipamd"
	"github.com/isthmus-dev/isthmus/loader/metrics"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// cniFlags configure the agent's CNI side: the IPAM server and the install of
// the plugin and its conflist (docs/cni.md). An empty socket turns it off.
type cniFlags struct {
	socket, dataDir, binDir, confDir, plugin string
	portmap                                  string
	takeOver                                 bool
	leakInterval, leakGrace                  time.Duration
	// metrics, if set, records where the install stands.
	metrics *metrics.CNI
}

func (c *cniFlags) register(f *pflag.FlagSet) {
	f.StringVar(&c.socket, "ipam-socket", "", "serve the CNI plugin's IPAM on this Unix socket (e.g. "+ipam.DefaultSocket+"); empty: isthmus is not the node's CNI")
	f.StringVar(&c.dataDir, "ipam-dir", ipam.DefaultDir, "directory of the node's address reservations")
	f.StringVar(&c.binDir, "cni-bin-dir", cniinstall.DefaultBinDir, "where the runtime finds CNI plugins; on a node whose Site manages the CNI the agent installs isthmus-cni and portmap there (empty: do not install)")
	f.StringVar(&c.confDir, "cni-conf-dir", cniinstall.DefaultConfDir, "where the runtime reads network configurations; on a node whose Site manages the CNI the agent writes "+cniinstall.ConflistName+" there once the podCIDRs verify, unless another plugin's configuration is there (empty: do not write)")
	f.BoolVar(&c.takeOver, "cni-take-over", false, "write "+cniinstall.ConflistName+" even when --cni-conf-dir holds another plugin's configuration: isthmus's sorts first and becomes the node's CNI for new pods")
	f.StringVar(&c.plugin, "cni-plugin", "", "the isthmus-cni binary to install (default: isthmus-cni beside this executable)")
	f.StringVar(&c.portmap, "cni-portmap-plugin", "", "the reference portmap plugin to install beside isthmus-cni; the conflist chains it for hostPort (default: portmap beside this executable)")
	f.DurationVar(&c.leakInterval, "ipam-leak-interval", ipamd.DefaultLeakInterval, "how often the agent looks for reservations of pods the runtime lost without DEL")
	f.DurationVar(&c.leakGrace, "ipam-leak-grace", ipamd.DefaultLeakGrace, "a reservation younger than this is never a leak (its ADD may still be wiring the pod)")
}

// start reports conflists that would bypass the verified IPAM and serves IPAM
// until ctx is done. At every verification it keeps the plugin and the
// conflist where isthmus is the node's CNI, and only there (a Site that
// manages the CNI, podCIDRs verified, no other plugin's configuration unless
// --cni-take-over); see cniinstall.Installer.
func (c *cniFlags) start(ctx context.Context, node, underlayDev string, snapshot func() (*objects.Set, []objects.Warning, error), log *slog.Logger) error {
	if c.socket == "" {
		return nil
	}
	src, portmap := c.plugin, c.portmap
	if c.binDir != "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find own executable: %w", err)
		}
		if src == "" {
			src = filepath.Join(filepath.Dir(exe), cniinstall.PluginName)
		}
		if portmap == "" {
			portmap = filepath.Join(filepath.Dir(exe), cniinstall.PortmapName)
		}
		for _, f := range []string{src, portmap} {
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("find the plugin to install: %w", err)
			}
		}
	}
	if c.confDir != "" {
		found, err := cniinstall.FindEmbeddedRanges(c.confDir)
		if err != nil {
			return err
		}
		for _, f := range found {
			log.Warn("a network configuration hands out addresses the agent never verified; remove it and restart the runtime (docs/cni.md)",
				"dir", c.confDir, "finding", f.String())
		}
	}
	store := ipam.Store{Dir: c.dataDir}
	in := &cniinstall.Installer{
		BinDir: c.binDir, ConfDir: c.confDir, Plugin: src, Portmap: portmap, Socket: c.socket, DataDir: c.dataDir,
		TakeOver: c.takeOver, Log: log,
		InUse: func() (bool, error) { have, err := store.List(); return len(have) > 0, err },
	}
	var lastErr string
	_, done, err := ipamd.Start(ctx, ipamd.Config{
		Node: node, Socket: c.socket, Store: store, Snapshot: snapshot,
		UnderlayMTU: underlayMTU(underlayDev, node, snapshot), Log: log,
		LeakInterval: c.leakInterval, LeakGrace: c.leakGrace,
		OnVerify: func(v ipamd.Verdict) {
			want := cniinstall.Undecided
			switch {
			case v.Ready():
				want = cniinstall.Manage
			case v.Unmanaged:
				want = cniinstall.Leave
			}
			st, err := in.Reconcile(want)
			c.metrics.Set(st.Phase, st.Foreign)
			if msg := fmt.Sprint(err); err != nil && msg != lastErr {
				log.Error("install the CNI plugin and conflist", "err", err)
			}
			lastErr = fmt.Sprint(err)
		},
	})
	if err != nil {
		return err
	}
	go func() {
		if err := <-done; err != nil {
			log.Error("ipam server stopped", "err", err)
		}
	}()
	return nil
}

// underlayMTU is the MTU of the underlay device: the named one, else the one
// holding the node's InternalIP; 1500 when neither can be found yet.
func underlayMTU(dev, node string, snapshot func() (*objects.Set, []objects.Warning, error)) int {
	if dev != "" {
		if l, err := netlink.LinkByName(dev); err == nil {
			return l.Attrs().MTU
		}
	}
	if set, _, err := snapshot(); err == nil {
		if n := set.Node(node); n != nil {
			if ip, ok := objects.InternalIP(n); ok {
				ifs, _ := net.Interfaces()
				for _, i := range ifs {
					addrs, _ := i.Addrs()
					for _, a := range addrs {
						if in, ok := a.(*net.IPNet); ok && in.IP.Equal(ip.AsSlice()) {
							return i.MTU
						}
					}
				}
			}
		}
	}
	return 1500
}
