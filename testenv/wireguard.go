package testenv

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/wireguard"
	"golang.zx2c4.com/wireguard/wgctrl"
)

// NodeStateDir returns the agent's --state-dir of a node: its WireGuard key.
func (l *Lab) NodeStateDir(node string) string {
	return filepath.Join(l.StateDir(), "nodes", node)
}

// WireGuardDevice returns the name of a node's WireGuard device. The names are
// unique across labs and nodes: every network namespace shares the userspace
// devices' socket directory (/var/run/wireguard/NAME.sock).
func WireGuardDevice(lab, node string) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%s", lab, node)
	return fmt.Sprintf("iwg%08x", h.Sum32())
}

// wireGuardArgs are the agent's WireGuard arguments on a node of the lab.
func (l *Lab) wireGuardArgs(node string) []string {
	dev := WireGuardDevice(l.Name, node)
	return []string{
		"--state-dir", l.NodeStateDir(node),
		"--wireguard-device", dev,
		"--wireguard-log", filepath.Join(l.StateDir(), dev+".log"),
	}
}

// publishWireGuardKeys makes every node's key pair in its state directory, as
// its agent would on its first start, and writes the public key into the Node's
// annotation isthmus.dev/wireguard-public-key: in file mode the lab plays the
// operator who publishes it (in Kubernetes mode the agents publish their own).
func (l *Lab) publishWireGuardKeys() error {
	for i := range l.Scenario.Sites {
		for j := range l.Scenario.Sites[i].Nodes {
			n := &l.Scenario.Sites[i].Nodes[j]
			key, err := wireguard.LoadOrCreateKey(l.NodeStateDir(n.Name))
			if err != nil {
				return fmt.Errorf("node %s: %w", n.Name, err)
			}
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[v1alpha1.AnnotationWireGuardPublicKey] = key.PublicKey().String()
		}
	}
	return nil
}

// waitBehindNATHandshakes waits until every node of a site behind a NAT has
// completed a WireGuard handshake with every peer it has an endpoint for. Such a
// node's peers learn its endpoint only from its handshake: until then they can
// reach it at no address, and the device drops their first packets to it. An agent is ready once its datapath is in place; a lab
// is ready once traffic can cross it in both directions. Nodes with no device
// (no encrypted peer) have nothing to wait for.
func (l *Lab) waitBehindNATHandshakes(ctx context.Context, timeout time.Duration) error {
	var nodes []string
	for _, n := range l.Scenario.Nodes() {
		if n.Site.BehindNAT.IsValid() {
			nodes = append(nodes, n.Name)
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	wg, err := wgctrl.New()
	if err != nil {
		return fmt.Errorf("open wgctrl: %w", err)
	}
	defer wg.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var pending []string
		for _, node := range nodes {
			dev, err := wg.Device(WireGuardDevice(l.Name, node))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("node %s: read wireguard device: %w", node, err)
			}
			for _, p := range dev.Peers {
				if p.Endpoint != nil && p.LastHandshakeTime.Unix() <= 0 {
					pending = append(pending, fmt.Sprintf("%s->%s", node, p.Endpoint))
				}
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wireguard handshakes of the nodes behind a NAT still pending: %s: %w", strings.Join(pending, ", "), ctx.Err())
		case <-tick.C:
		}
	}
}

// PublishWireGuardKey writes node's current public key, read from its state
// directory, into its Node's annotation in the lab's objects: what the operator
// does in file mode after `isthmus wireguard-key --rotate`.
func (l *Lab) PublishWireGuardKey(node string) error {
	key, err := wireguard.LoadKey(l.NodeStateDir(node))
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	for i := range l.Scenario.Sites {
		for j := range l.Scenario.Sites[i].Nodes {
			if n := &l.Scenario.Sites[i].Nodes[j]; n.Name == node {
				if n.Annotations == nil {
					n.Annotations = map[string]string{}
				}
				n.Annotations[v1alpha1.AnnotationWireGuardPublicKey] = key.PublicKey().String()
				return l.Scenario.WriteObjects(l.ObjectsDir())
			}
		}
	}
	return fmt.Errorf("publish wireguard key: no node %q", node)
}

// WireGuardStatus describes a node's WireGuard device for a failure report, one
// line per peer: its endpoint, how long before now its last handshake was, and
// the bytes both ways; "" when the node has no device (no encrypted peer).
func (l *Lab) WireGuardStatus(node string) string {
	name := WireGuardDevice(l.Name, node)
	var b strings.Builder
	err := Do(l.NodeNS(node), func() error {
		wg, err := wgctrl.New()
		if err != nil {
			return err
		}
		defer wg.Close()
		dev, err := wg.Device(name)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		now := time.Now()
		fmt.Fprintf(&b, "wireguard %s of %s, %d peers:\n", name, node, len(dev.Peers))
		for _, p := range dev.Peers {
			hs := "never"
			if p.LastHandshakeTime.Unix() > 0 {
				hs = now.Sub(p.LastHandshakeTime).Round(time.Millisecond).String() + " ago"
			}
			fmt.Fprintf(&b, "  peer %s endpoint %v allowed %v handshake %s rx %d tx %d\n",
				p.PublicKey.String()[:8], p.Endpoint, p.AllowedIPs, hs, p.ReceiveBytes, p.TransmitBytes)
		}
		return nil
	})
	if err != nil {
		return fmt.Sprintf("wireguard %s of %s: %v\n", name, node, err)
	}
	return b.String()
}
