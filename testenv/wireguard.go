package testenv

import (
	"fmt"
	"hash/fnv"
	"path/filepath"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/wireguard"
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
