package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// ProxyMode is a kube-proxy mode the lab runs. IPVS is not offered: this
// kernel has no ip_vs module.
type ProxyMode string

const (
	// ProxyIPTables is kube-proxy's iptables mode (iptables, iptables-save,
	// iptables-restore and conntrack on PATH).
	ProxyIPTables ProxyMode = "iptables"
	// ProxyNFTables is kube-proxy's nftables mode (nft on PATH).
	ProxyNFTables ProxyMode = "nftables"
)

// kubeProxy is one kube-proxy the lab started, in a node's namespace.
type kubeProxy struct {
	node string
	proc *kube.Process
}

// KubeProxyLog returns the log file of a node's kube-proxy.
func (l *Lab) KubeProxyLog(node string) string {
	return filepath.Join(l.StateDir(), node+".kube-proxy.log")
}

// StartKubeProxy runs a real kube-proxy (built by kube.KubeProxy, the release
// of the lab's kube-apiserver) in every node's namespace against the lab's
// API server, in mode, as a kubelet-managed DaemonSet pod with host
// networking would: --hostname-override names the node (its Node object gives
// kube-proxy the node's addresses). The conntrack sysctls it would tune are
// global or refused inside a namespace, so the flags keep them as they are.
// It stops kube-proxies already running first (cleaning up their rules with
// --cleanup), so a lab can switch modes. The lab must be in SourceKube.
func (l *Lab) StartKubeProxy(ctx context.Context, mode ProxyMode) error {
	if l.kube == nil {
		return errors.New("start kube-proxy: the lab is not in Kubernetes mode (SourceKube)")
	}
	bin, err := kube.KubeProxy(ctx)
	if err != nil {
		return fmt.Errorf("start kube-proxy: %w", err)
	}
	if err := l.StopKubeProxy(ctx); err != nil {
		return err
	}
	for _, n := range l.Scenario.Nodes() {
		p, err := l.spawnKubeProxy(bin, n.Name, mode)
		if err != nil {
			return err
		}
		l.mu.Lock()
		l.kube.proxies = append(l.kube.proxies, p)
		l.kube.proxyBin = bin
		l.mu.Unlock()
	}
	return nil
}

// kubeProxyArgs is kube-proxy's command line on node in mode.
func (l *Lab) kubeProxyArgs(node string, mode ProxyMode) []string {
	return []string{
		"--kubeconfig=" + l.kube.kubeconfig,
		"--hostname-override=" + node,
		"--proxy-mode=" + string(mode),
		// 0 keeps nf_conntrack_max (global, read-only in a namespace) and
		// the TCP timeouts as the node has them.
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		// Each node's kube-proxy serves on the node's own loopback.
		"--healthz-bind-address=127.0.0.1:10256",
		"--metrics-bind-address=127.0.0.1:10249",
		"--v=2",
	}
}

// spawnKubeProxy starts kube-proxy in node's namespace (nsenter execs it, so the
// child is kube-proxy itself), output to its log, killed if this process dies.
func (l *Lab) spawnKubeProxy(bin, node string, mode ProxyMode) (*kubeProxy, error) {
	args := append([]string{"--net=" + NSPath(l.NodeNS(node)), "--", bin}, l.kubeProxyArgs(node, mode)...)
	p, err := kube.Spawn("kube-proxy", l.KubeProxyLog(node), "nsenter", args...)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	return &kubeProxy{node: node, proc: p}, nil
}

// StopKubeProxy stops every kube-proxy the lab started and removes the rules
// they wrote (kube-proxy --cleanup, which clears all of its modes). It is
// idempotent.
func (l *Lab) StopKubeProxy(ctx context.Context) error {
	if l.kube == nil {
		return nil
	}
	l.mu.Lock()
	proxies, bin := l.kube.proxies, l.kube.proxyBin
	l.kube.proxies = nil
	l.mu.Unlock()
	var errs []error
	for _, p := range proxies {
		if err := p.proc.Stop(); err != nil {
			errs = append(errs, err)
		}
		// --cleanup also tries IPVS, which this kernel lacks, and may exit 1 for
		// that alone: what counts is that no kube-proxy rule is left.
		_, cerr := Exec(ctx, l.NodeNS(p.node), bin, "--cleanup", "--v=0")
		if left := l.kubeProxyLeftovers(ctx, p.node); left != "" {
			errs = append(errs, fmt.Errorf("kube-proxy --cleanup on %s (%v) left %s", p.node, cerr, left))
		}
	}
	return errors.Join(errs...)
}

// kubeProxyLeftovers names what kube-proxy rules remain on node: its iptables nat
// chains or its nftables table; "" for none.
func (l *Lab) kubeProxyLeftovers(ctx context.Context, node string) string {
	var left []string
	if out, err := Exec(ctx, l.NodeNS(node), "iptables-save", "-t", "nat"); err != nil || strings.Contains(out, ":KUBE-SERVICES") {
		left = append(left, "iptables chain KUBE-SERVICES")
	}
	if out, err := Exec(ctx, l.NodeNS(node), "nft", "list", "tables"); err != nil || strings.Contains(out, "table ip kube-proxy") {
		left = append(left, "nftables table ip kube-proxy")
	}
	return strings.Join(left, ", ")
}

// Service is a Service the lab created for one pod: its ClusterIP and
// NodePort, both on Port (TCP).
type Service struct {
	Name      string
	ClusterIP netip.Addr
	Port      uint16
	NodePort  uint16
}

// CreateService creates, in the lab's API server, a NodePort Service named
// name with port 80 (TCP) and one EndpointSlice holding the pod as its only
// ready endpoint on targetPort, as the EndpointSlice controller would write it
// (the lab runs no controller-manager). It returns the allocated ClusterIP and
// NodePort.
func (l *Lab) CreateService(ctx context.Context, name, pod string, targetPort uint16) (Service, error) {
	if l.kube == nil {
		return Service{}, errors.New("create service: the lab is not in Kubernetes mode (SourceKube)")
	}
	p, ok := l.Pod(pod)
	if !ok {
		return Service{}, fmt.Errorf("create service %s: no pod %q", name, pod)
	}
	cs, err := kubernetes.NewForConfig(l.kube.server.RESTConfig())
	if err != nil {
		return Service{}, fmt.Errorf("create client: %w", err)
	}
	const ns, port = "default", 80
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Name: "echo", Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(int32(targetPort))}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return Service{}, fmt.Errorf("create service %s: %w", name, err)
	}
	ready, node, addr := true, p.Node, p.Address.String()
	_, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-lab", Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "isthmus-lab"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("echo"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(targetPort))}},
	}, metav1.CreateOptions{})
	if err != nil {
		return Service{}, fmt.Errorf("create endpointslice of %s: %w", name, err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return Service{}, fmt.Errorf("service %s: cluster IP %q: %w", name, svc.Spec.ClusterIP, err)
	}
	return Service{Name: name, ClusterIP: ip, Port: port, NodePort: uint16(svc.Spec.Ports[0].NodePort)}, nil
}

func ptr[T any](v T) *T { return &v }

// WaitKubeProxyRules waits until every node's kube-proxy has written rules for
// every Service's ClusterIP, read back with the mode's own tool
// (iptables-save, nft), for at most timeout.
func (l *Lab) WaitKubeProxyRules(ctx context.Context, mode ProxyMode, svcs []Service, timeout time.Duration) error {
	argv := []string{"iptables-save", "-t", "nat"}
	if mode == ProxyNFTables {
		argv = []string{"nft", "list", "table", "ip", "kube-proxy"}
	}
	deadline := time.Now().Add(timeout)
	for _, n := range l.Scenario.Nodes() {
		for {
			out, _ := Exec(ctx, l.NodeNS(n.Name), argv...)
			missing := ""
			for _, s := range svcs {
				if !strings.Contains(out, s.ClusterIP.String()) {
					missing = s.Name
				}
			}
			if missing == "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kube-proxy (%s) on %s: no rule for %s after %s; log %s", mode, n.Name, missing, timeout, l.KubeProxyLog(n.Name))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}
