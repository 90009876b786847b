package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// kubeRouter is one kube-router the lab started, in a node's namespace.
type kubeRouter struct {
	node string
	proc *kube.Process
}

// The prefixes of what kube-router's network policy controller writes: its
// filter chains (KUBE-ROUTER-INPUT, -FORWARD and -OUTPUT, one KUBE-POD-FW-
// chain per local pod, one KUBE-NWPLCY- chain per policy and
// KUBE-NWPLCY-DEFAULT) and its ipsets (KUBE-SRC-, KUBE-DST-). None is
// kube-proxy's (its chains are KUBE-SERVICES, KUBE-FORWARD, ...).
var (
	kubeRouterChainPrefixes = []string{"KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"}
	kubeRouterSetPrefixes   = []string{"KUBE-SRC-", "KUBE-DST-"}
)

// KubeRouterLog returns the log file of a node's kube-router.
func (l *Lab) KubeRouterLog(node string) string {
	return filepath.Join(l.StateDir(), node+".kube-router.log")
}

// StartKubeRouter runs kube-router's network policy controller, the binary at
// bin (kubebin.KubeRouter builds it), in every node's namespace against the
// lab's API server, as its DaemonSet runs it beside another CNI: one per
// node, with host networking and the node's kubeconfig,
// --run-firewall=true --run-router=false --run-service-proxy=false and
// --hostname-override naming the node (whose Node object gives it the node's
// InternalIP: the pods it enforces for are those whose status.hostIP is that
// address). It enforces the API's NetworkPolicies in the node's filter table
// (INPUT, FORWARD and OUTPUT jump to its KUBE-ROUTER-* chains) with ipsets,
// running iptables, iptables-save, iptables-restore and ipset. It stops
// kube-routers already running first (StopKubeRouter), and returns once each
// node's top-level chains are in place. The lab must be in SourceKube; Down
// stops them.
func (l *Lab) StartKubeRouter(ctx context.Context, bin string) error {
	if l.kube == nil {
		return errors.New("start kube-router: the lab is not in Kubernetes mode (SourceKube)")
	}
	if err := l.StopKubeRouter(ctx); err != nil {
		return err
	}
	for _, n := range l.Scenario.Nodes() {
		p, err := l.spawnKubeRouter(bin, n.Name)
		if err != nil {
			return err
		}
		l.mu.Lock()
		l.kube.routers = append(l.kube.routers, p)
		l.mu.Unlock()
	}
	l.mu.Lock()
	routers := slices.Clone(l.kube.routers)
	l.mu.Unlock()
	for _, r := range routers {
		if err := l.waitKubeRouterChains(ctx, r, time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// kubeRouterArgs is kube-router's command line on node.
func (l *Lab) kubeRouterArgs(node string) []string {
	return []string{
		"--kubeconfig=" + l.kube.kubeconfig,
		"--hostname-override=" + node,
		// The policy controller alone: isthmus routes, kube-proxy (when the
		// lab runs it) serves Services.
		"--run-firewall=true",
		"--run-router=false",
		"--run-service-proxy=false",
		// Traffic to ClusterIPs is let through to kube-proxy's DNAT; the
		// policies judge it after, on its way to the backend pod.
		"--service-cluster-ip-range=" + kube.ServiceCIDR.String(),
		// Its health endpoint stays on (port 20244 of the node, as its
		// DaemonSet's liveness probe asks for it); no metrics.
		"--metrics-port=0",
		"--v=1",
	}
}

// spawnKubeRouter starts kube-router in node's namespace (nsenter execs it, so
// the child is kube-router itself), output to its log, killed if this
// process dies.
func (l *Lab) spawnKubeRouter(bin, node string) (*kubeRouter, error) {
	args := append([]string{"--net=" + NSPath(l.NodeNS(node)), "--", bin}, l.kubeRouterArgs(node)...)
	p, err := kube.Spawn("kube-router", l.KubeRouterLog(node), "nsenter", args...)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	return &kubeRouter{node: node, proc: p}, nil
}

// waitKubeRouterChains waits until r's node has kube-router's top-level
// chains with the FORWARD jump to KUBE-ROUTER-FORWARD, or r exits.
func (l *Lab) waitKubeRouterChains(ctx context.Context, r *kubeRouter, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		out, _ := Exec(ctx, l.NodeNS(r.node), "iptables-save", "-t", "filter")
		if strings.Contains(out, ":KUBE-ROUTER-FORWARD") && strings.Contains(out, "-j KUBE-ROUTER-FORWARD") {
			return nil
		}
		select {
		case <-r.proc.Done():
			return fmt.Errorf("kube-router on %s exited before writing its chains; log %s", r.node, l.KubeRouterLog(r.node))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-router on %s: no KUBE-ROUTER-FORWARD chain after %s; log %s", r.node, timeout, l.KubeRouterLog(r.node))
		}
	}
}

// KubeRouterRunning returns an error naming each kube-router the lab started
// that has exited since, with its log.
func (l *Lab) KubeRouterRunning() error {
	if l.kube == nil {
		return nil
	}
	l.mu.Lock()
	routers := slices.Clone(l.kube.routers)
	l.mu.Unlock()
	var errs []error
	for _, r := range routers {
		select {
		case <-r.proc.Done():
			errs = append(errs, fmt.Errorf("kube-router on %s exited; log %s", r.node, l.KubeRouterLog(r.node)))
		default:
		}
	}
	return errors.Join(errs...)
}

// WaitKubeRouterPolicy waits until kube-router on node runs the traffic of a
// pod there through the NetworkPolicy name (the pod's KUBE-POD-FW- chain
// jumps to the policy's chain, with a comment naming it), for at most
// timeout: from then on the policy is in force for that node's pods it
// selects.
func (l *Lab) WaitKubeRouterPolicy(ctx context.Context, node, name string, timeout time.Duration) error {
	want := `"run through nw policy ` + name + `"`
	deadline := time.Now().Add(timeout)
	for {
		out, _ := Exec(ctx, l.NodeNS(node), "iptables-save", "-t", "filter")
		if strings.Contains(out, want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-router on %s: no pod chain runs through NetworkPolicy %s after %s; log %s", node, name, timeout, l.KubeRouterLog(node))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// StopKubeRouter stops every kube-router the lab started and removes what
// they wrote: the jumps from INPUT, FORWARD and OUTPUT, kube-router's chains
// and its ipsets (kube-router v2.1.0's --cleanup-config cleans up a policy
// controller built without iptables or ipset handlers, so it removes none of
// them). It is idempotent.
func (l *Lab) StopKubeRouter(ctx context.Context) error {
	if l.kube == nil {
		return nil
	}
	l.mu.Lock()
	routers := l.kube.routers
	l.kube.routers = nil
	l.mu.Unlock()
	var errs []error
	for _, r := range routers {
		if err := r.proc.Stop(); err != nil {
			errs = append(errs, err)
		}
		if err := l.cleanKubeRouter(ctx, r.node); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanKubeRouter removes kube-router's rules, chains and ipsets from node,
// leaving every other rule as it is, and checks that none is left.
func (l *Lab) cleanKubeRouter(ctx context.Context, node string) error {
	ns := l.NodeNS(node)
	saved, err := Exec(ctx, ns, "iptables-save", "-t", "filter")
	if err != nil {
		return fmt.Errorf("clean up kube-router on %s: %w", node, err)
	}
	ours := func(chain string) bool {
		for _, p := range kubeRouterChainPrefixes {
			if strings.HasPrefix(chain, p) {
				return true
			}
		}
		return false
	}
	// iptables-restore --noflush with -D, -F and -X lines: the jumps from
	// other chains go first (a saved rule deletes as it was written), then
	// every chain of ours is flushed, then deleted.
	var jumps, flush, del []string
	sc := bufio.NewScanner(strings.NewReader(saved))
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, ":"); ok {
			if chain := strings.Fields(name)[0]; ours(chain) {
				flush = append(flush, "-F "+chain)
				del = append(del, "-X "+chain)
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" || ours(f[1]) {
			continue
		}
		if j := slices.Index(f, "-j"); j >= 0 && j+1 < len(f) && ours(f[j+1]) {
			jumps = append(jumps, "-D"+strings.TrimPrefix(line, "-A"))
		}
	}
	if len(jumps)+len(flush) > 0 {
		script := "*filter\n" + strings.Join(slices.Concat(jumps, flush, del), "\n") + "\nCOMMIT\n"
		cmd := Command(ctx, ns, "iptables-restore", "--noflush")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("clean up kube-router on %s: iptables-restore: %w: %s\n%s", node, err, strings.TrimSpace(string(out)), script)
		}
	}
	sets, err := Exec(ctx, ns, "ipset", "list", "-n")
	if err != nil {
		return fmt.Errorf("clean up kube-router on %s: %w", node, err)
	}
	for _, set := range strings.Fields(sets) {
		for _, p := range kubeRouterSetPrefixes {
			if strings.HasPrefix(set, p) {
				if _, err := Exec(ctx, ns, "ipset", "destroy", set); err != nil {
					return fmt.Errorf("clean up kube-router on %s: %w", node, err)
				}
			}
		}
	}
	if left := l.kubeRouterLeftovers(ctx, node); left != "" {
		return fmt.Errorf("clean up kube-router on %s: left %s", node, left)
	}
	return nil
}

// kubeRouterLeftovers names what of kube-router remains on node: its chains
// or its ipsets; "" for none.
func (l *Lab) kubeRouterLeftovers(ctx context.Context, node string) string {
	var left []string
	saved, err := Exec(ctx, l.NodeNS(node), "iptables-save", "-t", "filter")
	if err != nil {
		left = append(left, "(iptables-save failed)")
	}
	for _, p := range kubeRouterChainPrefixes {
		if strings.Contains(saved, ":"+p) || strings.Contains(saved, "-j "+p) {
			left = append(left, "iptables chains "+p+"*")
		}
	}
	sets, err := Exec(ctx, l.NodeNS(node), "ipset", "list", "-n")
	if err != nil {
		left = append(left, "(ipset list failed)")
	}
	for _, p := range kubeRouterSetPrefixes {
		if strings.Contains(sets, p) {
			left = append(left, "ipsets "+p+"*")
		}
	}
	return strings.Join(left, ", ")
}
