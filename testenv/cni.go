package testenv

// The lab as a container runtime: with the isthmus datapath every managed pod
// is created through the real CNI plugin, driven by the reference client
// cnitool, against the IPAM the node's agent serves (docs/cni.md). The agents
// run as the DaemonSet runs them, with --ipam-socket and the install flags
// pointing into the lab's state directory; a pod is a network namespace that
// `cnitool add` wires. Pods of another CNI (unmanaged: true) and every pod of
// the baseline datapaths are still made by hand (buildPod), with the names and
// wiring the plugin uses, so a baseline lab looks the same.

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/maps"
)

// CNIToolName is the reference CNI client the lab runs; it is looked for
// beside the isthmus binary (make build puts it in bin/), then on PATH.
const CNIToolName = "cnitool"

// cniState is the directory of a node's CNI files inside a lab's state
// directory: ipam.sock, ipam/ (reservations), bin/ (the installed plugins) and
// net.d/ (the conflist).
func cniState(lab, node string) string { return filepath.Join(StateDir(lab), "cni", node) }

// IPAMSocket returns the socket a node's agent serves IPAM on.
func (l *Lab) IPAMSocket(node string) string {
	return filepath.Join(cniState(l.Name, node), "ipam.sock")
}

// IPAMDir returns a node's reservation directory.
func (l *Lab) IPAMDir(node string) string { return filepath.Join(cniState(l.Name, node), "ipam") }

func cniBinDir(lab, node string) string  { return filepath.Join(cniState(lab, node), "bin") }
func cniConfDir(lab, node string) string { return filepath.Join(cniState(lab, node), "net.d") }

// CNIBinDir and CNIConfDir return where a node's agent installs the plugin
// and writes the conflist (its --cni-bin-dir and --cni-conf-dir): a
// container runtime on the node reads them from there.
func (l *Lab) CNIBinDir(node string) string  { return cniBinDir(l.Name, node) }
func (l *Lab) CNIConfDir(node string) string { return cniConfDir(l.Name, node) }

// cniAgentArgs are the CNI flags of a node's agent, as the DaemonSet gives
// them (docs/cni.md), every path inside the lab. Every agent gets them: on a
// site of another CNI the podCIDRs never verify and no conflist is written.
func (l *Lab) cniAgentArgs(node string) []string {
	return []string{"--ipam-socket", l.IPAMSocket(node), "--ipam-dir", l.IPAMDir(node),
		"--cni-bin-dir", cniBinDir(l.Name, node), "--cni-conf-dir", cniConfDir(l.Name, node)}
}

// usesPlugin reports whether the pod is created through the CNI plugin: a
// managed pod, in a lab whose agents serve IPAM, unless another CNI's wiring
// (PodWiringProxyARP) makes every pod.
func (l *Lab) usesPlugin(p Pod) bool {
	return l.Datapath == DatapathIsthmus && !p.Unmanaged && l.Scenario.PodWiring != PodWiringProxyARP
}

// CNIToolContainerID is the container ID cnitool gives an attachment: it
// hashes the network namespace path (cnitool/cmd/root.go), so DEL finds what
// ADD made from the path alone.
func CNIToolContainerID(netnsPath string) string {
	s := sha512.Sum512([]byte(netnsPath))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// HostVeth returns the host side of a pod's veth on its node: the plugin's
// name for a managed pod (pod-<hash of the attachment>, see ipam.HostIface;
// hand-made baseline pods get the same), azv-<name> for a pod of another CNI.
func (l *Lab) HostVeth(pod string) string {
	if p, ok := l.Pod(pod); ok && p.Unmanaged {
		return UnmanagedVethPrefix + pod
	}
	return ipam.HostIface(CNIToolContainerID(NSPath(l.PodNS(pod))), UnderlayDev)
}

// cniTool returns the cnitool binary for a lab run with binary.
func cniTool(binary string) (string, error) {
	beside := filepath.Join(filepath.Dir(binary), CNIToolName)
	if _, err := os.Stat(beside); err == nil {
		return beside, nil
	}
	if p, err := exec.LookPath(CNIToolName); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found beside %s nor on PATH: `make build` builds bin/%s from github.com/containernetworking/cni/cnitool", CNIToolName, binary, CNIToolName)
}

// cnitool runs `cnitool VERB isthmus <pod netns>` in the node's namespace (the
// plugin makes the host side of the veth where it runs), with the node's
// plugin directory and conflist, and env added (CAP_ARGS=...).
func cnitool(ctx context.Context, tool, lab, node, verb, podNS string, env ...string) (string, error) {
	cmd := Command(ctx, NSName(lab, node), tool, verb, cniinstall.NetworkName, podNS)
	cmd.Env = append(append(os.Environ(), "CNI_PATH="+cniBinDir(lab, node), "NETCONFPATH="+cniConfDir(lab, node)), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("cnitool %s %s on %s: %w: %s", verb, podNS, node, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// waitCNIReady waits until the node's agent has written its conflist (it does
// once the node's podCIDRs verify) and `cnitool status` succeeds: the CNI 1.1
// STATUS a runtime asks before it creates sandboxes.
func (l *Lab) waitCNIReady(ctx context.Context, tool, node string) error {
	conflist := filepath.Join(cniConfDir(l.Name, node), cniinstall.ConflistName)
	var last error
	for {
		if _, err := os.Stat(conflist); err != nil {
			last = fmt.Errorf("no conflist %s yet", conflist)
		} else if _, err := cnitool(ctx, tool, l.Name, node, "status", NSPath(l.NodeNS(node))); err != nil {
			last = err
		} else {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for CNI STATUS ready on %s: %w (last: %v); agent log %s:\n%s", node, ctx.Err(), last, l.AgentLog(node), tail(l.AgentLog(node), 10))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// addResult is what the lab reads of cnitool's types/100 result.
type addResult struct {
	IPs []struct {
		Address netip.Prefix `json:"address"`
	} `json:"ips"`
}

// cniAdd creates the pod's namespace and wires it with `cnitool add`, asking
// for the pod's scenario address, and its address6, when it has them (the
// `ips` capability, which the agent checks against the verified podCIDRs) and
// taking the one the IPAM gives otherwise (the IPAM gives an address in each
// podCIDR: a pod without an address6 on a dual-stack node gets an IPv6
// address too, which the lab does not record). It returns the pod's IPv4
// address. A pod with its own MTU gets it on both ends afterwards.
func (l *Lab) cniAdd(ctx context.Context, tool, node string, p Pod) (netip.Addr, error) {
	ns := l.PodNS(p.Name)
	if err := createNS(ns); err != nil {
		return netip.Addr{}, err
	}
	// lo up, as a runtime's loopback plugin does for every sandbox (the
	// hand-made pods had it; tools like scapy warn on a down lo).
	h, _, err := handleAt(ns)
	if err != nil {
		return netip.Addr{}, err
	}
	err = linkUp(h, "lo")
	h.Close()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("pod %s: %w", p.Name, err)
	}
	var env, ips []string
	for _, a := range []netip.Addr{p.Address, p.Address6} {
		if a.IsValid() {
			ips = append(ips, fmt.Sprintf("%q", netip.PrefixFrom(a, a.BitLen())))
		}
	}
	if len(ips) > 0 {
		env = append(env, fmt.Sprintf(`CAP_ARGS={"ips":[%s]}`, strings.Join(ips, ",")))
	}
	out, err := cnitool(ctx, tool, l.Name, node, "add", NSPath(ns), env...)
	if err != nil {
		return netip.Addr{}, err
	}
	var res addResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return netip.Addr{}, fmt.Errorf("decode cnitool add result for %s: %w: %s", p.Name, err, out)
	}
	var got, got6 netip.Addr
	for _, ip := range res.IPs {
		if a := ip.Address.Addr(); a.Is4() && !got.IsValid() {
			got = a
		} else if a.Is6() && a == p.Address6 {
			got6 = a
		}
	}
	switch {
	case !got.IsValid():
		return got, fmt.Errorf("cnitool add %s: no IPv4 address in the result: %s", p.Name, out)
	case p.Address.IsValid() && got != p.Address:
		return got, fmt.Errorf("cnitool add %s: asked for %s, got %s", p.Name, p.Address, got)
	case p.Address6.IsValid() && !got6.IsValid():
		return got, fmt.Errorf("cnitool add %s: asked for %s, not in the result: %s", p.Name, p.Address6, out)
	}
	if p.MTU != 0 {
		if err := l.setPodMTU(node, p.Name, p.MTU); err != nil {
			return got, err
		}
	}
	return got, nil
}

// setPodMTU sets the MTU of both ends of a pod's veth: a scenario pod with
// its own MTU stands for a runtime or user that changed what the plugin gave.
func (l *Lab) setPodMTU(node, pod string, mtu int) error {
	for _, end := range [][2]string{{l.NodeNS(node), l.HostVeth(pod)}, {l.PodNS(pod), UnderlayDev}} {
		h, _, err := handleAt(end[0])
		if err != nil {
			return err
		}
		link, err := h.LinkByName(end[1])
		if err == nil {
			err = h.LinkSetMTU(link, mtu)
		}
		h.Close()
		if err != nil {
			return fmt.Errorf("set MTU %d on %s: %w", mtu, end[1], err)
		}
	}
	return nil
}

// waitPodAttached waits until the node's agent has taken the pod in: pinned
// pod_ingress on its host interface and written the interface to pod_ifaces.
// The plugin only wires the pod; the agent attaches to every new interface
// that matches its pod pattern, and only then syncs pod_ifaces, which local
// delivery needs: until it has, the reply to a pod's first packet is handed
// to the stack like a stranger's, and conntrack, which never saw the request,
// calls it INVALID (the CNI leftovers drop that). Traffic must not start
// before.
func (l *Lab) waitPodAttached(ctx context.Context, node, pod string) error {
	pin := datapath.LinkPin(l.PinDir(node), l.HostVeth(pod), datapath.HookPodIngress)
	var last error
	for {
		if last = podTakenIn(l.NodeNS(node), l.PinDir(node), pin, l.HostVeth(pod)); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the agent on %s to take pod %s in: %w (%v)", node, pod, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// podTakenIn returns nil once pin exists and the pinned pod_ifaces map of
// pinDir holds the ifindex of host in the namespace ns.
func podTakenIn(ns, pinDir, pin, host string) error {
	if _, err := os.Stat(pin); err != nil {
		return fmt.Errorf("no pinned link yet: %w", err)
	}
	h, _, err := handleAt(ns)
	if err != nil {
		return err
	}
	link, err := h.LinkByName(host)
	h.Close()
	if err != nil {
		return fmt.Errorf("find %s: %w", host, err)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, string(maps.MapPodIfaces)), nil)
	if err != nil {
		return fmt.Errorf("open pod_ifaces: %w", err)
	}
	defer m.Close()
	var v maps.PodIfaceValue
	if err := m.Lookup(uint32(link.Attrs().Index), &v); err != nil {
		return fmt.Errorf("%s (ifindex %d) not in pod_ifaces yet: %w", host, link.Attrs().Index, err)
	}
	return nil
}

// addManagedPods creates every managed pod through the plugin, node by node
// in parallel, pods of a node in scenario order, and records the addresses
// the IPAM gave in the lab's scenario.
func (l *Lab) addManagedPods(ctx context.Context, timeout time.Duration) error {
	tool, err := cniTool(l.Binary)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var wg sync.WaitGroup
	nodes := l.Scenario.Nodes()
	errs := make([]error, len(nodes))
	addrs := make([]map[string]netip.Addr, len(nodes))
	for i, n := range nodes {
		var pods []Pod
		for _, p := range n.Pods {
			if l.usesPlugin(p) {
				pods = append(pods, p)
			}
		}
		if len(pods) == 0 {
			continue
		}
		wg.Go(func() {
			if err := l.waitCNIReady(ctx, tool, n.Name); err != nil {
				errs[i] = err
				return
			}
			addrs[i] = map[string]netip.Addr{}
			for _, p := range pods {
				a, err := l.cniAdd(ctx, tool, n.Name, p)
				if err != nil {
					errs[i] = fmt.Errorf("pod %s: %w", p.Name, err)
					return
				}
				addrs[i][p.Name] = a
				l.logf("lab %s: pod %s on %s: %s%s (cnitool add)", l.Name, p.Name, n.Name, a, also6(p))
			}
			for _, p := range pods {
				if err := l.waitPodAttached(ctx, n.Name, p.Name); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	// The scenario learns the addresses only now: the goroutines read it.
	for i := range l.Scenario.Sites {
		for j := range l.Scenario.Sites[i].Nodes {
			for k := range l.Scenario.Sites[i].Nodes[j].Pods {
				p := &l.Scenario.Sites[i].Nodes[j].Pods[k]
				for _, m := range addrs {
					if a, ok := m[p.Name]; ok {
						p.Address = a
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// AddPod creates a managed pod on a node of a running lab, as a runtime
// would: a namespace, `cnitool add`, the address the node's IPAM chooses. It
// waits until the agent has attached to the pod's interface, adds the pod to
// the lab's scenario (so Check and Down know it) and returns its address.
func (l *Lab) AddPod(ctx context.Context, node, name string) (netip.Addr, error) {
	if l.Datapath != DatapathIsthmus {
		return netip.Addr{}, fmt.Errorf("add pod %s: the %s datapath has no CNI", name, l.Datapath)
	}
	if _, ok := l.Pod(name); ok {
		return netip.Addr{}, fmt.Errorf("add pod %s: exists", name)
	}
	tool, err := cniTool(l.Binary)
	if err != nil {
		return netip.Addr{}, err
	}
	a, err := l.cniAdd(ctx, tool, node, Pod{Name: name})
	if err != nil {
		return a, fmt.Errorf("add pod %s: %w", name, err)
	}
	l.mu.Lock()
	for i := range l.Scenario.Sites {
		for j := range l.Scenario.Sites[i].Nodes {
			if n := &l.Scenario.Sites[i].Nodes[j]; n.Name == node {
				n.Pods = append(n.Pods, Pod{Name: name, Address: a})
			}
		}
	}
	l.mu.Unlock()
	return a, l.waitPodAttached(ctx, node, name)
}

// CNITool runs `cnitool VERB` (check, del, ...) for a pod of the lab, as the
// lab's runtime runs it, and returns its output.
func (l *Lab) CNITool(ctx context.Context, verb, pod string) (string, error) {
	p, ok := l.Pod(pod)
	if !ok {
		return "", fmt.Errorf("cnitool %s: no pod %q", verb, pod)
	}
	tool, err := cniTool(l.Binary)
	if err != nil {
		return "", err
	}
	return cnitool(ctx, tool, l.Name, p.Node, verb, NSPath(l.PodNS(pod)))
}

// IPAMStatus asks a node's agent for its IPAM state over the socket the
// plugin uses (ready, verified ranges, reservations outside them).
func (l *Lab) IPAMStatus(ctx context.Context, node string) (ipam.Status, error) {
	return ipam.NewClient(l.IPAMSocket(node)).Status(ctx)
}

// Reservations lists a node's reservations from its store on disk.
func (l *Lab) Reservations(node string) ([]ipam.Reservation, error) {
	return ipam.Store{Dir: l.IPAMDir(node)}.List()
}

// cniDown runs `cnitool del` for every attachment reserved on the lab's
// nodes, found from the reservations on disk, so it needs no scenario and no
// agent (DEL works with the agent down, docs/cni.md). A node whose namespace
// is already gone took its veths with it; its reservations go with the state
// directory.
func cniDown(lab, binary string, logf func(string, ...any)) error {
	nodes, _ := os.ReadDir(filepath.Join(StateDir(lab), "cni"))
	var errs []error
	for _, e := range nodes {
		node := e.Name()
		if _, err := os.Stat(NSPath(NSName(lab, node))); err != nil {
			continue
		}
		have, err := ipam.Store{Dir: filepath.Join(cniState(lab, node), "ipam")}.List()
		if err != nil || len(have) == 0 {
			continue
		}
		tool, err := cniTool(binary)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		done := map[ipam.Attachment]bool{}
		for _, r := range have {
			if done[r.Attachment] || r.NetNS == "" {
				continue
			}
			done[r.Attachment] = true
			logf("lab %s: cnitool del %s on %s", lab, r.NetNS, node)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err := cnitool(ctx, tool, lab, node, "del", r.NetNS)
			cancel()
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// BuildBinaries builds what a lab with agents runs into dir, side by side as
// `make build` puts them in bin/: isthmus, the plugins the agents install
// (isthmus-cni and the reference portmap its conflist chains), cnitool, and isthmus-lab (LabBinary), the lab's own command.
// It returns the isthmus binary's path. It must run inside the module (go
// test does).
func BuildBinaries(ctx context.Context, dir string) (string, error) {
	for _, b := range [][2]string{
		{"isthmus", "github.com/isthmus-dev/isthmus/cmd/isthmus"},
		{LabCommand, "github.com/isthmus-dev/isthmus/cmd/isthmus-lab"},
		{cniinstall.PluginName, "github.com/isthmus-dev/isthmus/cmd/isthmus-cni"},
		{cniinstall.PortmapName, "github.com/containernetworking/plugins/plugins/meta/portmap"},
		{CNIToolName, "github.com/containernetworking/cni/cnitool"},
	} {
		out, err := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, b[0]), b[1]).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("build %s: %w\n%s", b[0], err, out)
		}
	}
	return filepath.Join(dir, "isthmus"), nil
}

// LabCommand is the name of the lab's command (cmd/isthmus-lab), which
// BuildBinaries and `make build` put beside isthmus.
const LabCommand = "isthmus-lab"

// LabBinary returns the isthmus-lab binary BuildBinaries built beside binary.
func LabBinary(binary string) string { return filepath.Join(filepath.Dir(binary), LabCommand) }

// also6 returns " and <address6>" for a pod with an address6, "" otherwise.
func also6(p Pod) string {
	if p.Address6.IsValid() {
		return " and " + p.Address6.String()
	}
	return ""
}
