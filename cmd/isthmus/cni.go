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
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// cniFlags configure the agent's CNI side: the IPAM server and the install of
// the plugin and its conflist (docs/cni.md). An empty socket turns it off.
type cniFlags struct {
	socket, dataDir, binDir, confDir, plugin string
	leakInterval, leakGrace                  time.Duration
}

func (c *cniFlags) register(f *pflag.FlagSet) {
	f.StringVar(&c.socket, "ipam-socket", "", "serve the CNI plugin's IPAM on this Unix socket (e.g. "+ipam.DefaultSocket+"); empty: isthmus is not the node's CNI")
	f.StringVar(&c.dataDir, "ipam-dir", ipam.DefaultDir, "directory of the node's address reservations")
	f.StringVar(&c.binDir, "cni-bin-dir", cniinstall.DefaultBinDir, "where the runtime finds CNI plugins; the agent installs isthmus-cni there (empty: do not install)")
	f.StringVar(&c.confDir, "cni-conf-dir", cniinstall.DefaultConfDir, "where the runtime reads network configurations; the agent writes "+cniinstall.ConflistName+" there once the podCIDRs verify (empty: do not write)")
	f.StringVar(&c.plugin, "cni-plugin", "", "the isthmus-cni binary to install (default: isthmus-cni beside this executable)")
	f.DurationVar(&c.leakInterval, "ipam-leak-interval", ipamd.DefaultLeakInterval, "how often the agent looks for reservations of pods the runtime lost without DEL")
	f.DurationVar(&c.leakGrace, "ipam-leak-grace", ipamd.DefaultLeakGrace, "a reservation younger than this is never a leak (its ADD may still be wiring the pod)")
}

// start installs the plugin, reports conflists that would bypass the verified
// IPAM, and serves IPAM until ctx is done. The conflist is written only once
// the node's podCIDRs verify.
func (c *cniFlags) start(ctx context.Context, node, underlayDev string, snapshot func() (*objects.Set, []objects.Warning, error), log *slog.Logger) error {
	if c.socket == "" {
		return nil
	}
	if c.binDir != "" {
		src := c.plugin
		if src == "" {
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find own executable: %w", err)
			}
			src = filepath.Join(filepath.Dir(exe), cniinstall.PluginName)
		}
		if err := cniinstall.InstallPlugin(src, c.binDir); err != nil {
			return err
		}
		log.Info("installed the CNI plugin", "dir", c.binDir)
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
	_, done, err := ipamd.Start(ctx, ipamd.Config{
		Node: node, Socket: c.socket, Store: ipam.Store{Dir: c.dataDir}, Snapshot: snapshot,
		UnderlayMTU: underlayMTU(underlayDev, node, snapshot), Log: log,
		LeakInterval: c.leakInterval, LeakGrace: c.leakGrace,
		OnReady: func(ipamd.Verdict) {
			if c.confDir == "" {
				return
			}
			if err := cniinstall.WriteConflist(c.confDir, c.socket, c.dataDir); err != nil {
				log.Error("write the CNI conflist", "err", err)
				return
			}
			log.Info("wrote the CNI conflist", "file", filepath.Join(c.confDir, cniinstall.ConflistName))
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
