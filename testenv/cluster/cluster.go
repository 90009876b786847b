// Package cluster brings up a whole Kubernetes cluster in the lab: a
// Kubernetes-mode lab of a scenario with no lab agents, its kube-apiserver,
// kube-controller-manager (--allocate-node-cidrs=false, as docs/install.md
// tells users) and kube-scheduler, a private containerd and a kubelet on
// every node, optionally kube-proxy on every node, and isthmus installed from
// deploy/ through the lab's overlay with the real kubectl (`kubectl apply
// -k`), as a user installs it. Each node's CNI is its site's: the nodes of a
// site whose Site does not manage the CNI run the reference bridge plugin
// (cri.BridgeCNI), and the agents then get the operator's --pod-interfaces
// for it. Optionally the cluster has what a real one has besides: a cluster
// DNS (testenv/clusterdns) and a NetworkPolicy engine (kube-router's policy
// controller). Up returns once every Node and every agent pod is Ready; Down
// removes everything, also after a failed Up.
//
// The API server runs on the host's loopback, the kubelets in the nodes'
// network namespaces, which the host cannot reach: the API server's traffic
// to the cluster (exec, logs, port-forward, the proxy subresources) goes
// through an HTTP CONNECT proxy of this package that dials from inside the
// node namespaces (kube.Options.ClusterEgress).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/clusterdns"
	"github.com/isthmus-dev/isthmus/testenv/cri"
	isthmusimage "github.com/isthmus-dev/isthmus/testenv/image"
	"github.com/isthmus-dev/isthmus/testenv/kube"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// Namespace is deploy/'s namespace, where the agents and the controller run.
const Namespace = "isthmus-system"

// AgentSelector and ControllerSelector pick deploy/'s agent and controller
// pods.
const (
	AgentSelector      = "app.kubernetes.io/name=isthmus-agent"
	ControllerSelector = "app.kubernetes.io/name=isthmus-controller"
)

// Options say what Up builds.
type Options struct {
	// Scenario is the lab's topology; its nodes are the cluster's Nodes.
	Scenario *testenv.Scenario
	// Name is the lab's name; "" is the scenario's.
	Name string
	// Binary is the isthmus binary the lab's own tools run (its uninstall
	// in Down); "" is the one beside the executable (testenv.Options).
	Binary string
	// Work holds the runtimes, kubelets, images and overlay; "" makes a
	// temporary directory, removed by Down. Keep it short: unix sockets
	// under it must fit in 108 bytes.
	Work string
	// Image is the isthmus image deploy/ is installed with (its name as a
	// pod spec gives it, e.g. "isthmus:lab1"); "" builds one (make image's
	// builder, version "lab") into Work.
	Image string
	// Archives are OCI image archives imported into every node's
	// containerd besides the test images of testenv/cri and the image Up
	// builds: the archive of Image when the caller built it, the images a
	// test suite asks for.
	Archives []string
	// SandboxImage is every pod's sandbox image (cri.Config.SandboxImage),
	// which one of Archives must hold; "" is testenv/cri's pause image.
	SandboxImage string
	// KubeProxy, when set, runs kube-proxy in that mode on every node (the
	// lab's, testenv.Lab.StartKubeProxy); "" runs none.
	KubeProxy testenv.ProxyMode
	// ClusterDNS, when set, gives the cluster a cluster DNS as kubeadm
	// does (testenv/clusterdns): the CoreDNS image built and imported on
	// every node, the kubernetes Service served to pods
	// (testenv.Lab.ServeAPIToPods), kubelets with clusterDNS
	// kube.ClusterDNSIP and clusterDomain kube.ClusterDomain, and, once
	// isthmus is installed, CoreDNS deployed and Ready. It needs KubeProxy.
	ClusterDNS bool
	// PolicyEngine, when set, runs kube-router's network policy controller
	// on every node once isthmus is installed (testenv.Lab.StartKubeRouter),
	// as a cluster runs a policy engine beside isthmus: the NetworkPolicy
	// cases need one.
	PolicyEngine bool
	// Controllers are kube-controller-manager's --controllers; nil is
	// kube.ClusterControllers.
	Controllers []string
	// NoInstall stops before the install: the nodes run, without a CNI,
	// NotReady.
	NoInstall bool
	// Log receives a line for each step; nil discards them.
	Log func(format string, args ...any)
}

// Node is a cluster node: a lab node with its containerd and kubelet.
type Node struct {
	testenv.NodeRef
	Containerd *cri.Containerd
	Kubelet    *cri.Kubelet
	// Bridge is the node's CNI when its site does not manage the CNI (the
	// reference bridge plugin); nil on a node where isthmus-cni runs.
	Bridge *cri.BridgeCNI
}

// Cluster is a running cluster. Its fields are for reading.
type Cluster struct {
	Lab    *testenv.Lab
	Server *kube.Server
	Client kubernetes.Interface
	// Nodes are the scenario's nodes, in its order.
	Nodes []*Node
	// Work is the directory of Options.Work.
	Work string
	// Image is the isthmus image installed.
	Image string

	opts         Options
	ownWork      bool
	kubectl      string
	egress       *egressProxy
	kcm, sched   *kube.Process
	installStart time.Time
}

// Up builds the cluster (see the package comment) and, unless
// opts.NoInstall, installs isthmus and waits until every Node is Ready, the
// controller has labelled every Node with its Site, every agent pod and the
// controller's Deployment are Ready. On error it removes everything it built.
// It needs root. The first run on a machine builds kube-apiserver, etcd,
// kubelet, crictl, kubectl, kube-controller-manager and kube-scheduler
// (kubebin, cached) and the isthmus image's Debian layer.
func Up(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Scenario == nil {
		return nil, errors.New("cluster up: no scenario")
	}
	if opts.ClusterDNS && opts.KubeProxy == "" {
		return nil, errors.New("cluster up: a cluster DNS needs kube-proxy (Options.KubeProxy)")
	}
	c = &Cluster{opts: opts, Work: opts.Work, Image: opts.Image}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Down())
			c = nil
		}
	}()
	start := time.Now()
	kubelet, err := kubebin.Kubelet(ctx)
	if err != nil {
		return c, err
	}
	kcmBin, schedBin, err := kubebin.ControlPlane(ctx)
	if err != nil {
		return c, err
	}
	if c.kubectl, err = kubebin.Kubectl(ctx); err != nil {
		return c, err
	}
	crictl, err := kubebin.Crictl(ctx)
	if err != nil {
		return c, err
	}
	if c.Work == "" {
		if c.Work, err = os.MkdirTemp("", "iscl-"); err != nil {
			return c, fmt.Errorf("cluster up: %w", err)
		}
		c.ownWork = true
	}
	pause, probe, err := cri.BuildImages(ctx, c.Work)
	if err != nil {
		return c, err
	}
	archives := append([]string{pause, probe}, opts.Archives...)
	if err := distinctArchives(archives); err != nil {
		return c, err
	}
	if c.Image == "" {
		c.logf("cluster: building the isthmus image (make image's builder)")
		a, err := isthmusimage.Build(ctx, isthmusimage.Options{Version: "lab", Out: filepath.Join(c.Work, "isthmus-lab.oci.tar"), Log: opts.Log})
		if err != nil {
			return c, err
		}
		c.Image = "isthmus:lab"
		archives = append(archives, a.Path)
	}
	if opts.ClusterDNS {
		c.logf("cluster: building the CoreDNS image")
		a, err := clusterdns.BuildImage(ctx, c.Work)
		if err != nil {
			return c, err
		}
		archives = append(archives, a.Path)
	}
	var routerBin string
	if opts.PolicyEngine {
		if routerBin, err = kubebin.KubeRouter(ctx); err != nil {
			return c, err
		}
	}

	// The API server, with its cluster traffic through the proxy into the
	// node namespaces; the lab on it, with no agents of its own.
	if c.egress, err = listenEgress(filepath.Join(c.Work, "egress.sock")); err != nil {
		return c, err
	}
	c.logf("cluster: kube-apiserver")
	if c.Server, err = kube.Start(ctx, kube.Options{ClusterEgress: c.egress.path}); err != nil {
		return c, err
	}
	var labLog *logWriter
	if opts.Log != nil {
		labLog = &logWriter{opts.Log}
	}
	topts := testenv.Options{Name: opts.Name, Binary: opts.Binary, Source: testenv.SourceKube, NoAgents: true, Kube: c.Server}
	if labLog != nil {
		topts.Log = labLog
	}
	if c.Lab, err = testenv.Up(ctx, opts.Scenario, topts); err != nil {
		return c, err
	}
	c.egress.serve(c.Lab)
	if c.Client, err = kubernetes.NewForConfig(c.Server.RESTConfig()); err != nil {
		return c, fmt.Errorf("cluster up: %w", err)
	}
	controllers := opts.Controllers
	if controllers == nil {
		controllers = kube.ClusterControllers
	}
	c.kcm, c.sched, err = c.Server.StartControlPlaneWith(kcmBin, schedBin, controllers)
	if err != nil {
		return c, err
	}
	if opts.ClusterDNS {
		if err := c.Lab.ServeAPIToPods(ctx); err != nil {
			return c, err
		}
	}
	labReady := time.Now()

	var clusterDNS []netip.Addr
	var clusterDomain string
	if opts.ClusterDNS {
		clusterDNS, clusterDomain = []netip.Addr{kube.ClusterDNSIP}, kube.ClusterDomain
	}
	for _, n := range opts.Scenario.Nodes() {
		node := &Node{NodeRef: n}
		c.Nodes = append(c.Nodes, node)
		dir := filepath.Join(c.Work, n.Name)
		cfg := cri.Config{Dir: filepath.Join(dir, "ctd"), NetNS: testenv.NSPath(c.Lab.NodeNS(n.Name)),
			CNIBinDir: c.Lab.CNIBinDir(n.Name), CNIConfDir: c.Lab.CNIConfDir(n.Name), Crictl: crictl,
			SandboxImage: opts.SandboxImage}
		if !n.Site.ManagesCNI() {
			// A node of another CNI, as it is before isthmus comes.
			mtu := opts.Scenario.Underlay.MTU
			if mtu == 0 {
				mtu = 1500
			}
			node.Bridge = &cri.BridgeCNI{Subnet: n.PodCIDRs[0], MTU: mtu - testenv.GeneveOverhead, IPMasq: true,
				DataDir: filepath.Join(dir, "host-local")}
			cfg.Bridge = node.Bridge
		}
		// The reference loopback plugin beside isthmus-cni.
		if err := cri.BuildLoopback(ctx, cfg.CNIBinDir); err != nil {
			return c, err
		}
		node.Containerd, err = cri.Start(ctx, cfg)
		if err != nil {
			return c, fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, a := range archives {
			if err := node.Containerd.Import(ctx, a); err != nil {
				return c, fmt.Errorf("node %s: %w", n.Name, err)
			}
		}
		node.Kubelet, err = cri.StartKubelet(ctx, cri.KubeletConfig{Dir: filepath.Join(dir, "kubelet"), NetNS: cfg.NetNS,
			NodeName: n.Name, NodeIP: n.Address, Kubeconfig: c.Lab.Kubeconfig(), Runtime: node.Containerd, Binary: kubelet,
			ClientCAFile: c.Server.CAFile(), ClusterDNS: clusterDNS, ClusterDomain: clusterDomain})
		if err != nil {
			return c, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if opts.KubeProxy != "" {
		if err := c.Lab.StartKubeProxy(ctx, opts.KubeProxy); err != nil {
			return c, err
		}
	}
	c.logf("cluster: lab on the API server with kube-controller-manager and kube-scheduler after %s; %d containerds and kubelets after %s",
		labReady.Sub(start).Round(time.Millisecond), len(c.Nodes), time.Since(labReady).Round(time.Millisecond))
	if opts.NoInstall {
		return c, nil
	}
	if err := c.Install(ctx); err != nil {
		return c, err
	}
	if opts.PolicyEngine {
		c.logf("cluster: kube-router's network policy controller on every node")
		if err := c.Lab.StartKubeRouter(ctx, routerBin); err != nil {
			return c, err
		}
	}
	if opts.ClusterDNS {
		c.logf("cluster: CoreDNS")
		if err := clusterdns.DeployClusterDNS(ctx, c.Server.RESTConfig(), clusterdns.Config{}, 3*time.Minute); err != nil {
			return c, fmt.Errorf("%w\n%s", err, PodsState(ctx, c.Client, clusterdns.Namespace, "k8s-app=kube-dns"))
		}
	}
	return c, nil
}

// otherCNI reports whether a node of the cluster runs another CNI than
// isthmus.
func (c *Cluster) otherCNI() bool {
	for _, n := range c.Nodes {
		if n.Bridge != nil {
			return true
		}
	}
	return false
}

// OverlayDir is where Install writes the lab's overlay of deploy/.
func (c *Cluster) OverlayDir() string { return filepath.Join(c.Work, "overlay") }

// Kubeconfig returns the admin kubeconfig; it works on the host and in every
// node's namespace.
func (c *Cluster) Kubeconfig() string { return c.Lab.Kubeconfig() }

// Install installs isthmus as docs/install.md says: deploy/ through the
// lab's overlay (testenv.Lab.DeployOverlay, with c.Image) or, when a node
// runs another CNI, through an operator's overlay on it that adds
// testenv.OtherCNIPodInterfaces (testenv.Lab.DeployOperatorOverlay); `kubectl
// apply -k`; then it waits as Up says.
func (c *Cluster) Install(ctx context.Context) error {
	c.installStart = time.Now()
	var err error
	if c.otherCNI() {
		err = c.Lab.DeployOperatorOverlay(c.OverlayDir(), c.Image, testenv.OtherCNIPodInterfaces)
	} else {
		err = c.Lab.DeployOverlay(c.OverlayDir(), c.Image)
	}
	if err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-k", c.OverlayDir()); err != nil {
		return err
	}
	return c.WaitInstalled(ctx)
}

// WaitInstalled waits until the controller has labelled every Node with its
// Site, every node runs one Ready agent pod of an up-to-date DaemonSet, the
// controller's Deployment is ready, and every runtime reports its network
// ready and every Node is Ready.
func (c *Cluster) WaitInstalled(ctx context.Context) error {
	for _, n := range c.Nodes {
		var label string
		err := Poll(ctx, 2*time.Minute, func() (bool, error) {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err == nil {
				label = node.Labels["isthmus.dev/site"]
			}
			return label == n.Site.Name, nil
		}, func() string {
			return fmt.Sprintf("node %s has label isthmus.dev/site=%q, want %q from the controller", n.Name, label, n.Site.Name)
		})
		if err != nil {
			return fmt.Errorf("%w\n%s\n%s", err, PodsState(ctx, c.Client, Namespace, ControllerSelector), c.Diagnose(c.Nodes[0].Name))
		}
	}
	var ds *appsv1.DaemonSet
	err := Poll(ctx, 3*time.Minute, func() (bool, error) {
		var err error
		ds, err = c.Client.AppsV1().DaemonSets(Namespace).Get(ctx, "isthmus-agent", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st := ds.Status
		return st.DesiredNumberScheduled == int32(len(c.Nodes)) && st.NumberReady == st.DesiredNumberScheduled &&
			st.UpdatedNumberScheduled == st.DesiredNumberScheduled, nil
	}, func() string { return fmt.Sprintf("DaemonSet isthmus-agent status %+v", ds.Status) })
	if err != nil {
		return fmt.Errorf("%w\n%s\n%s", err, PodsState(ctx, c.Client, Namespace, AgentSelector), c.Diagnose(c.Nodes[0].Name))
	}
	agents, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector})
	if err != nil {
		return fmt.Errorf("list agent pods: %w", err)
	}
	onNode := map[string]int{}
	for _, p := range agents.Items {
		if PodReady(&p) {
			onNode[p.Spec.NodeName]++
		}
	}
	for _, n := range c.Nodes {
		if onNode[n.Name] != 1 {
			return fmt.Errorf("node %s has %d Ready agent pods, want 1 (%v)", n.Name, onNode[n.Name], onNode)
		}
	}
	var dep *appsv1.Deployment
	err = Poll(ctx, 2*time.Minute, func() (bool, error) {
		var err error
		dep, err = c.Client.AppsV1().Deployments(Namespace).Get(ctx, "isthmus-controller", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return dep.Status.ReadyReplicas == *dep.Spec.Replicas, nil
	}, func() string { return fmt.Sprintf("Deployment isthmus-controller status %+v", dep.Status) })
	if err != nil {
		return fmt.Errorf("%w\n%s", err, PodsState(ctx, c.Client, Namespace, ControllerSelector))
	}
	// With the conflist in place each runtime reports its network ready and
	// each kubelet its Node Ready.
	for _, n := range c.Nodes {
		if err := n.Containerd.WaitNetworkReady(ctx, 30*time.Second); err != nil {
			return err
		}
		if err := WaitNodeReady(ctx, c.Client, n.Name, time.Minute); err != nil {
			return fmt.Errorf("%w\n%s", err, c.Diagnose(n.Name))
		}
	}
	c.logf("cluster: installed from deploy/: Nodes labelled by the controller, %d agent pods Ready, controller Deployment ready, Nodes Ready, after %s",
		len(c.Nodes), time.Since(c.installStart).Round(time.Millisecond))
	return nil
}

// Node returns the named node, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Kubectl runs the real kubectl (kubebin, the API server's release) with
// the cluster's kubeconfig and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	c.logf("kubectl %s:\n%s", strings.Join(args, " "), out)
	return string(out), nil
}

// KubectlPath returns the kubectl binary Kubectl runs.
func (c *Cluster) KubectlPath() string { return c.kubectl }

// Diagnose returns, for a failure message, the tails of a node's kubelet and
// containerd logs, of kube-controller-manager's and kube-scheduler's, and of
// the isthmus pods' container logs.
func (c *Cluster) Diagnose(node string) string {
	var b strings.Builder
	if n := c.Node(node); n != nil {
		if n.Kubelet != nil {
			fmt.Fprintf(&b, "kubelet %s log:\n%s\n", node, n.Kubelet.LogTail())
		}
		if n.Containerd != nil {
			fmt.Fprintf(&b, "containerd %s log:\n%s\n", node, n.Containerd.LogTail())
		}
	}
	if c.Server != nil {
		fmt.Fprintf(&b, "kube-controller-manager log:\n%s\nkube-scheduler log:\n%s\n",
			c.Server.LogTail("kube-controller-manager.log", 20), c.Server.LogTail("kube-scheduler.log", 20))
	}
	b.WriteString(c.IsthmusPodLogs())
	return b.String()
}

// IsthmusPodLogs returns the tail of every log the kubelets keep of the
// containers of isthmus-system and isthmus-uninstall pods.
func (c *Cluster) IsthmusPodLogs() string {
	var b strings.Builder
	for _, ns := range []string{Namespace, "isthmus-uninstall"} {
		logs, _ := filepath.Glob(filepath.Join(c.Work, "*", "kubelet", "pod-logs", ns+"_*", "*", "*.log"))
		for _, f := range logs {
			fmt.Fprintf(&b, "container log %s:\n%s\n", strings.TrimPrefix(f, c.Work), tailFile(f, 30))
		}
	}
	return b.String()
}

// Down stops every kubelet (first: its pods' sandboxes stay with the
// runtime), removes every node's pods (CNI DEL), stops every containerd,
// kube-controller-manager and kube-scheduler, takes the lab down (kube-proxy,
// namespaces, pins), stops the API server and the egress proxy, and removes
// Work if Up made it. It reports what it could not undo, and is idempotent.
func (c *Cluster) Down() error {
	var errs []error
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		n := c.Nodes[i]
		if n.Kubelet != nil {
			errs = append(errs, n.Kubelet.Stop())
			n.Kubelet = nil
		}
	}
	// Every node's pods go before any containerd stops: each containerd
	// removes the cgroups made since it started, which on one machine are
	// also those of the pods of the nodes started before it.
	for _, n := range c.Nodes {
		if n.Containerd != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if _, err := n.Containerd.Crictl(ctx, "rmp", "--all", "--force"); err != nil {
				errs = append(errs, fmt.Errorf("node %s: remove pods: %w", n.Name, err))
			}
			cancel()
		}
	}
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		n := c.Nodes[i]
		if n.Containerd != nil {
			errs = append(errs, n.Containerd.Stop())
			n.Containerd = nil
		}
	}
	if c.sched != nil {
		errs = append(errs, c.sched.Stop())
		c.sched = nil
	}
	if c.kcm != nil {
		errs = append(errs, c.kcm.Stop())
		c.kcm = nil
	}
	if c.Lab != nil {
		errs = append(errs, c.Lab.Down())
		c.Lab = nil
	}
	if c.Server != nil {
		errs = append(errs, c.Server.Stop())
		c.Server = nil
	}
	if c.egress != nil {
		errs = append(errs, c.egress.close())
		c.egress = nil
	}
	if c.ownWork && c.Work != "" {
		if err := os.RemoveAll(c.Work); err != nil {
			errs = append(errs, fmt.Errorf("remove cluster work dir: %w", err))
		}
		c.ownWork = false
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster down: %w", err)
	}
	return nil
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Log != nil {
		c.opts.Log(format, args...)
	}
}

// logWriter turns the lab's progress lines into Options.Log calls.
type logWriter struct{ logf func(string, ...any) }

func (w *logWriter) Write(p []byte) (int, error) {
	w.logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// PodReady reports whether the Pod's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitNodeReady waits until the Node's Ready condition is True.
func WaitNodeReady(ctx context.Context, cs kubernetes.Interface, name string, timeout time.Duration) error {
	var last string
	return Poll(ctx, timeout, func() (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = fmt.Sprintf("%s: %s", c.Reason, c.Message)
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		last = "no Ready condition"
		return false, nil
	}, func() string { return fmt.Sprintf("node %s not Ready: %s", name, last) })
}

// distinctArchives fails when two of the archives to import are one file: one
// image overwrote another's archive, and a node would lack the first.
func distinctArchives(paths []string) error {
	seen := map[string]bool{}
	for _, p := range paths {
		p = filepath.Clean(p)
		if seen[p] {
			return fmt.Errorf("cluster up: two images were written to %s: one overwrote the other", p)
		}
		seen[p] = true
	}
	return nil
}

// Poll calls done every 200 ms until it reports true or an error, or the
// timeout passes (an error with describe's text).
func Poll(ctx context.Context, timeout time.Duration, done func() (bool, error), describe func() string) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("after %s: %s", timeout, describe())
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// PodsState describes the pods of a namespace a selector picks, for a
// failure message: phase, conditions, and each container's state and last
// exit.
func PodsState(ctx context.Context, cs kubernetes.Interface, namespace, selector string) string {
	list, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d pods %s:\n", len(list.Items), selector)
	for _, p := range list.Items {
		fmt.Fprintf(&b, "  %s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			fmt.Fprintf(&b, " %s=%s(%s)", c.Type, c.Status, c.Message)
		}
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, " [%s ready=%v restarts=%d", c.Name, c.Ready, c.RestartCount)
			if w := c.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
			}
			if x := c.LastTerminationState.Terminated; x != nil {
				fmt.Fprintf(&b, " last exit %d %s: %s", x.ExitCode, x.Reason, x.Message)
			}
			b.WriteString("]")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// tailFile returns the last n lines of a file, or the error reading it.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return kubebin.TailLines(string(data), n)
}
