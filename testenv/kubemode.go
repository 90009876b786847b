package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// Source says where the lab's agents read their objects.
type Source string

const (
	// SourceFiles feeds the agents the objects directory (--objects, the
	// default).
	SourceFiles Source = "files"
	// SourceKube feeds them a real kube-apiserver (--kubeconfig): the lab
	// installs the CRDs of deploy/crds, creates the scenario's objects and one
	// Node per node (spec.podCIDRs, labels, annotations, and status.addresses
	// through UpdateStatus), and forwards 127.0.0.1:<port> in every node's
	// namespace to the API server on the host's loopback. The lab must stay in
	// the process that built it (the forwarders and, unless Options.Kube is
	// given, the API server live there), so `isthmus-lab lab up` does not offer it.
	SourceKube Source = "kube"
)

// kubeLab is the Kubernetes side of a lab in SourceKube.
type kubeLab struct {
	server     *kube.Server
	owned      bool // started by the lab, stopped by Down
	kubeconfig string
	listeners  []net.Listener
	wg         sync.WaitGroup
	proxies    []*kubeProxy // StartKubeProxy's, guarded by Lab.mu
	proxyBin   string
	routers    []*kubeRouter // StartKubeRouter's, guarded by Lab.mu
	controller *kube.Process // StartController's, guarded by Lab.mu
}

// Kube returns the lab's API server, or nil when the agents read files.
func (l *Lab) Kube() *kube.Server {
	if l.kube == nil {
		return nil
	}
	return l.kube.server
}

// Kubeconfig returns the kubeconfig the agents use in SourceKube, or "". The
// same file works on the host: the forwarders listen on the API server's port.
func (l *Lab) Kubeconfig() string {
	if l.kube == nil {
		return ""
	}
	return l.kube.kubeconfig
}

// DefaultCRDDir returns deploy/crds of the source tree this package was built
// from.
func DefaultCRDDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "deploy", "crds")
}

// startKube brings up the Kubernetes side: the API server (unless given), the
// CRDs, the objects, the Nodes, the forwarders and the agents' kubeconfig.
func (l *Lab) startKube(ctx context.Context, opts Options) error {
	k := &kubeLab{server: opts.Kube}
	l.kube = k
	if k.server == nil {
		l.logf("lab %s: kube-apiserver (builds on first use)", l.Name)
		s, err := kube.Start(ctx, kube.Options{})
		if err != nil {
			return err
		}
		k.server, k.owned = s, true
	}
	crds := opts.CRDDir
	if crds == "" {
		crds = DefaultCRDDir()
	}
	if err := k.server.InstallCRDs(ctx, crds); err != nil {
		return err
	}
	if err := l.createKubeObjects(ctx); err != nil {
		return err
	}
	// The agents run in node namespaces, where 127.0.0.1 is the node's own
	// loopback: a forwarder there carries their connections to the host's.
	port := k.server.Port()
	for _, n := range l.Scenario.Nodes() {
		var ln net.Listener
		err := Do(l.NodeNS(n.Name), func() (err error) {
			ln, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			return err
		})
		if err != nil {
			return fmt.Errorf("node %s: forward the API server: %w", n.Name, err)
		}
		k.listeners = append(k.listeners, ln)
		k.wg.Add(1)
		go func() { defer k.wg.Done(); forward(ln, "127.0.0.1:"+strconv.Itoa(port)) }()
	}
	cfg, err := k.server.KubeconfigFor(k.server.URL())
	if err != nil {
		return err
	}
	k.kubeconfig = filepath.Join(l.StateDir(), "kubeconfig")
	if err := os.WriteFile(k.kubeconfig, cfg, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// createKubeObjects creates the scenario's isthmus objects (server-side apply)
// and its Nodes, each with its addresses written through the status
// subresource as a kubelet does.
func (l *Lab) createKubeObjects(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "isthmus-lab-objects-")
	if err != nil {
		return fmt.Errorf("create objects dir: %w", err)
	}
	defer os.RemoveAll(dir)
	files, err := l.Scenario.ObjectFiles()
	if err != nil {
		return err
	}
	var objs []*unstructured.Unstructured
	for _, name := range []string{"sites.yaml", "peerings.yaml", "extra.yaml"} {
		data, ok := files[name]
		if !ok {
			continue
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return fmt.Errorf("write objects: %w", err)
		}
		o, err := kube.ReadManifestFile(p)
		if err != nil {
			return err
		}
		objs = append(objs, o...)
	}
	if err := l.kube.server.Apply(ctx, objs, kube.ApplyOptions{}); err != nil {
		return fmt.Errorf("create scenario objects: %w", err)
	}
	cs, err := kubernetes.NewForConfig(l.kube.server.RESTConfig())
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	for _, n := range l.Scenario.Nodes() {
		if err := createNode(ctx, cs, KubeNode(n)); err != nil {
			return err
		}
	}
	return nil
}

// KubeNode returns the core v1 Node of a scenario node, as nodes.yaml has it.
func KubeNode(n NodeRef) *corev1.Node {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, Annotations: n.Annotations}}
	for i, c := range n.PodCIDRs {
		if i == 0 {
			node.Spec.PodCIDR = c.String()
		}
		node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, c.String())
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.Address.String()}}
	if n.ExternalAddress.IsValid() {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: n.ExternalAddress.String()})
	}
	node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
	return node
}

// createNode creates a Node and then writes its status (create ignores it).
func createNode(ctx context.Context, cs kubernetes.Interface, node *corev1.Node) error {
	status := node.Status
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", node.Name, err)
	}
	created.Status.Addresses = status.Addresses
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of node %s: %w", node.Name, err)
	}
	return nil
}

// stopKube closes the forwarders and stops the API server if the lab started
// it. It is idempotent.
func (l *Lab) stopKube() error {
	k := l.kube
	if k == nil {
		return nil
	}
	cerr := l.stopController()
	l.kube = nil
	for _, ln := range k.listeners {
		ln.Close()
	}
	k.wg.Wait()
	if k.owned {
		return errors.Join(cerr, k.server.Stop())
	}
	return cerr
}

// forward accepts on ln until it is closed and copies each connection to and
// from a new connection to target (dialled in this process' namespace).
func forward(ln net.Listener, target string) {
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	closed := false
	open := map[net.Conn]struct{}{}
	defer func() {
		mu.Lock()
		closed = true
		for c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				return
			}
			defer up.Close()
			mu.Lock()
			if closed {
				mu.Unlock()
				return
			}
			open[c], open[up] = struct{}{}, struct{}{}
			mu.Unlock()
			done := make(chan struct{}, 2)
			go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
			go func() { io.Copy(c, up); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
			<-done
			<-done
			mu.Lock()
			delete(open, c)
			delete(open, up)
			mu.Unlock()
		}()
	}
}

// servingFile is the state file that names the process serving a lab in
// Kubernetes mode (`isthmus-lab lab up --kubernetes`): its pid, then its command
// line, so Down from another process stops that one and not a process that
// reused the pid.
const servingFile = "serving"

// RecordServing records this process as the one serving the lab, so that
// `isthmus-lab lab down` from another shell stops it (and with it the API server,
// the controller and kube-proxy it holds) before removing the rest.
func (l *Lab) RecordServing() error {
	cmdline, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		return fmt.Errorf("record serving process: %w", err)
	}
	data := append([]byte(strconv.Itoa(os.Getpid())+"\n"), cmdline...)
	if err := os.WriteFile(filepath.Join(l.StateDir(), servingFile), data, 0o644); err != nil {
		return fmt.Errorf("record serving process: %w", err)
	}
	return nil
}

// stopServing ends the process RecordServing named for the lab (SIGTERM: it
// takes the lab down itself) and waits up to a minute for it to exit. Nothing
// recorded, this process, or a pid that now runs another command line: nothing
// to do.
func stopServing(state string) error {
	data, err := os.ReadFile(filepath.Join(state, servingFile))
	if err != nil {
		return nil
	}
	pidText, cmdline, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid == os.Getpid() {
		return nil
	}
	// A process that exited has no command line, even while its parent has
	// not reaped it yet.
	running := func() bool {
		now, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && string(now) == cmdline
	}
	if !running() {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil // gone already
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if !running() {
			return nil
		}
	}
	return fmt.Errorf("the process serving the lab (pid %d) still runs a minute after SIGTERM", pid)
}
