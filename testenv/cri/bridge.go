package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
)

// BridgeConflistName is the file BridgeCNI's configuration is written to. It
// sorts after isthmus' 00-isthmus.conflist, as another CNI's file usually
// does (flannel's 10-flannel.conflist).
const BridgeConflistName = "10-bridge.conflist"

// BridgeNetwork is the network name in BridgeCNI's conflist.
const BridgeNetwork = "bridge-net"

// BridgeCNI is a node's CNI when another CNI than isthmus owns its pods: the
// reference plugins of containernetworking/plugins as a flannel-style node
// runs them. bridge puts every pod's host veth (veth<hex>) on the bridge
// cni0, which holds the range's gateway address (the first host) and is the
// pods' default route; host-local hands out addresses from the node's
// podCIDR; portmap serves hostPort; loopback brings up the pod's lo.
type BridgeCNI struct {
	// Subnet is host-local's range: the node's podCIDR.
	Subnet netip.Prefix
	// MTU of the bridge and the pods' interfaces; 0 leaves the plugin's
	// default (that of the bridge, 1500 for a new one).
	MTU int
	// IPMasq sets the bridge plugin's ipMasq: per pod, a nat POSTROUTING
	// rule masquerading what the pod sends outside Subnet (flannel's
	// MASQUERADE, per pod address).
	IPMasq bool
	// DataDir is host-local's dataDir, where it keeps its reservations (a
	// file per address, named by the address, holding the container ID);
	// empty: the plugin's /var/lib/cni/networks, which the lab's nodes
	// would share.
	DataDir string
}

// bridgePlugins are the reference plugins a BridgeCNI node needs, by package.
var bridgePlugins = []string{
	"github.com/containernetworking/plugins/plugins/main/bridge",
	"github.com/containernetworking/plugins/plugins/ipam/host-local",
	"github.com/containernetworking/plugins/plugins/meta/portmap",
	"github.com/containernetworking/plugins/plugins/main/loopback",
}

// BuildBridgePlugins builds bridge, host-local, portmap and loopback
// (containernetworking/plugins, tools of the module: go.mod's tool block pins
// their dependencies) into binDir.
func BuildBridgePlugins(ctx context.Context, binDir string) error {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", binDir, err)
	}
	args := append([]string{"build", "-o", binDir + string(filepath.Separator)}, bridgePlugins...)
	if out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("build the reference CNI plugins: %w\n%s", err, out)
	}
	return nil
}

// Conflist returns b's network configuration, as 10-bridge.conflist holds
// it.
func (b BridgeCNI) Conflist() ([]byte, error) {
	if !b.Subnet.IsValid() || !b.Subnet.Addr().Is4() {
		return nil, fmt.Errorf("bridge conflist: subnet %v: want an IPv4 prefix", b.Subnet)
	}
	ipam := map[string]any{
		"type":   "host-local",
		"ranges": [][]map[string]string{{{"subnet": b.Subnet.Masked().String()}}},
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
	}
	if b.DataDir != "" {
		ipam["dataDir"] = b.DataDir
	}
	bridge := map[string]any{
		"type":        "bridge",
		"bridge":      "cni0",
		"isGateway":   true,
		"ipMasq":      b.IPMasq,
		"hairpinMode": true,
		"ipam":        ipam,
	}
	if b.MTU > 0 {
		bridge["mtu"] = b.MTU
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       BridgeNetwork,
		"plugins": []any{
			bridge,
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
		},
	}
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("bridge conflist: %w", err)
	}
	return append(out, '\n'), nil
}

// InstallBridgeCNI makes b the CNI of a node whose runtime looks in binDir
// and confDir: the plugins built into binDir and the conflist written to
// confDir/BridgeConflistName.
func InstallBridgeCNI(ctx context.Context, binDir, confDir string, b BridgeCNI) error {
	conf, err := b.Conflist()
	if err != nil {
		return err
	}
	if err := BuildBridgePlugins(ctx, binDir); err != nil {
		return err
	}
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", confDir, err)
	}
	if err := os.WriteFile(filepath.Join(confDir, BridgeConflistName), conf, 0o644); err != nil {
		return fmt.Errorf("write bridge conflist: %w", err)
	}
	return nil
}
