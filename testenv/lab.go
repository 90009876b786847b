package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// Default locations of a lab's state and pins.
const (
	// StateRoot holds one directory per lab: objects/, <node>.log, .pid, .ready.
	StateRoot = "/run/isthmus-lab"
	// PinRoot holds one directory per lab with one pin directory per node.
	PinRoot = "/sys/fs/bpf/isthmus-lab"
	// NSPrefix starts the name of every namespace the lab creates.
	NSPrefix = "isl-"
	// UnderlayDev is each node's underlay interface and each pod's interface.
	UnderlayDev = "eth0"
	// PodIfacePattern matches the host side of every managed pod's veth
	// (pod-<hash>, Lab.HostVeth); see UnmanagedIfacePattern for the others.
	PodIfacePattern = "pod-*"
	// PodGateway is the pods' next hop, answered by the host side of the veth
	// through a permanent neighbour entry, as Calico and Cilium do.
	PodGateway = "169.254.1.1"
	// PodGateway6 is the pods' IPv6 next hop (a pod with an address6), as the
	// CNI plugin wires it: link-local, a permanent neighbour for the host
	// side's MAC.
	PodGateway6 = "fe80::1"
	// GeneveOverhead is outer IPv4, UDP and GENEVE plus the inner Ethernet header.
	GeneveOverhead = 50
	// GeneveOverhead6 is GeneveOverhead over the IPv6 underlay: the outer
	// IPv6 header is 20 bytes longer.
	GeneveOverhead6 = 70
	// VXLANOverhead6 is what kernel VXLAN over the IPv6 underlay adds (the
	// vxlan datapath there): outer IPv6, UDP and VXLAN plus the inner
	// Ethernet header, 40+8+8+14. Over IPv4 it is GeneveOverhead's 50.
	VXLANOverhead6 = 70
	// WireGuardOverhead is what WireGuard over IPv4 adds around GENEVE: IPv4,
	// UDP, its header and its tag.
	WireGuardOverhead = 60
	// WireGuardOverhead6 is WireGuardOverhead over the IPv6 underlay.
	WireGuardOverhead6 = 80
)

// Datapath selects what carries pod traffic between nodes.
type Datapath string

const (
	// DatapathIsthmus starts one isthmus agent per node (the default).
	DatapathIsthmus Datapath = "isthmus"
	// DatapathPlain routes pod CIDRs natively: routes on nodes and router, and
	// pod-to-pod traffic exempt from the leftover MASQUERADE. A baseline.
	DatapathPlain Datapath = "plain"
	// DatapathVXLAN joins the nodes with kernel VXLAN devices as flannel does,
	// pod-to-pod traffic exempt from MASQUERADE as in DatapathPlain. A baseline.
	DatapathVXLAN Datapath = "vxlan"
	// DatapathWireGuard joins the sites with plain WireGuard routing (a device
	// per node, a peer per node of another site, routes to their podCIDRs into
	// it), the sites' own nodes by plain routes. The baseline of encrypted
	// isthmus.
	DatapathWireGuard Datapath = "wireguard"
	// DatapathNone builds the topology only.
	DatapathNone Datapath = "none"
)

// Options tune Up.
type Options struct {
	// Name is the lab name (default the scenario name); it prefixes every
	// namespace (isl-<name>-) and names the state and pin directories.
	Name string
	// Binary is the isthmus executable for the agents and uninstall; default
	// the running executable.
	Binary string
	// Datapath defaults to DatapathIsthmus.
	Datapath Datapath
	// ReadyTimeout bounds the wait for every agent's ready file, and then the
	// wait for every agent to find every health-checked peer up; default 60s.
	ReadyTimeout time.Duration
	// AgentArgs are appended to every agent's command line.
	AgentArgs []string
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Source is where the agents read their objects: SourceFiles (default) or
	// SourceKube (see kubemode.go).
	Source Source
	// Kube is the API server for SourceKube; nil makes the lab start its own
	// and stop it in Down.
	Kube *kube.Server
	// CRDDir holds the CRDs SourceKube installs; default DefaultCRDDir().
	CRDDir string
	// CheckNodes makes Up ping every node's address from every other node,
	// before the agents start and again once they are ready, and fail when a
	// pair that had a reply before has none with the agents, or when a pair
	// gets a reply one way only: isthmus must never break node-to-node traffic
	// and keeps paths symmetric (docs/gateways.md). Which pairs reach each
	// other at all is the scenario's (a firewall may pass only gateways).
	CheckNodes bool
	// NoAgents builds everything but starts no agent and adds no managed pod:
	// the test installs the agents itself, as the DaemonSet of deploy/ on
	// kubelets (daemonset.go). SourceKube only.
	NoAgents bool
}

// Lab is a built lab. Its methods are safe to call from several goroutines.
type Lab struct {
	Name     string
	Scenario *Scenario
	Binary   string
	Datapath Datapath
	log      io.Writer

	mu     sync.Mutex
	agents map[string]*agent // started by this process, by node
	kube   *kubeLab          // SourceKube only
}

// StateDir returns the lab's state directory.
func (l *Lab) StateDir() string { return StateDir(l.Name) }

// ObjectsDir returns the directory the agents watch.
func (l *Lab) ObjectsDir() string { return filepath.Join(l.StateDir(), "objects") }

// PinDir returns the pin directory of a node's agent.
func (l *Lab) PinDir(node string) string { return filepath.Join(PinRoot, l.Name, node) }

// StateDir returns the state directory of the named lab.
func StateDir(lab string) string { return filepath.Join(StateRoot, lab) }

// NSName returns the namespace of a lab's node, pod or router ("rt").
func NSName(lab, member string) string { return NSPrefix + lab + "-" + member }

// RouterNS returns the router's namespace.
func (l *Lab) RouterNS() string { return NSName(l.Name, "rt") }

// NodeNS returns the namespace of the named node.
func (l *Lab) NodeNS(node string) string { return NSName(l.Name, node) }

// PodNS returns the namespace of the named pod.
func (l *Lab) PodNS(pod string) string { return NSName(l.Name, pod) }

// RouterPort returns the router-side interface of a node's underlay veth, the
// place to capture that node's underlay traffic (in RouterNS). Its MAC is the
// gateway MAC the node's frames to other hosts carry.
func RouterPort(node string) string { return "n-" + node }

// Pod returns the named pod.
func (l *Lab) Pod(name string) (PodRef, bool) { return l.Scenario.pod(name) }

// Node returns the named node.
func (l *Lab) Node(name string) (NodeRef, bool) { return l.Scenario.node(name) }

// PodAddr returns the address of the named pod, or the zero Addr.
func (l *Lab) PodAddr(name string) netip.Addr {
	p, _ := l.Pod(name)
	return p.Address
}

// Exec runs argv in the namespace nsName (see NodeNS, PodNS, RouterNS).
func (l *Lab) Exec(ctx context.Context, nsName string, argv ...string) (string, error) {
	return Exec(ctx, nsName, argv...)
}

func (l *Lab) logf(format string, args ...any) {
	if l.log != nil {
		fmt.Fprintf(l.log, format+"\n", args...)
	}
}

// Up builds the scenario: namespaces, underlay, nodes, pods, the CNI leftover
// rules, objects, and (for DatapathIsthmus) one agent per node, then waits for
// every agent's ready file. On error everything built so far is removed. It needs
// root.
func Up(ctx context.Context, sc *Scenario, opts Options) (*Lab, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("build lab: needs root (network namespaces, veths, bpffs)")
	}
	l := &Lab{Name: opts.Name, Scenario: sc, Binary: opts.Binary, Datapath: opts.Datapath, log: opts.Log, agents: map[string]*agent{}}
	if l.Name == "" {
		l.Name = sc.Name
	}
	if err := ValidateLabName(l.Name); err != nil {
		return nil, fmt.Errorf("build lab: %w", err)
	}
	if l.Datapath == "" {
		l.Datapath = DatapathIsthmus
	}
	if sc.Underlay6() && l.Datapath == DatapathWireGuard {
		return nil, fmt.Errorf("build lab %q: the %s datapath runs over an IPv4 underlay only, and scenario %q's underlay is IPv6 (datapaths there: %s, %s, %s, %s)",
			l.Name, l.Datapath, sc.Name, DatapathIsthmus, DatapathPlain, DatapathVXLAN, DatapathNone)
	}
	if l.Binary == "" {
		exe, err := AgentBinary()
		if err != nil {
			return nil, fmt.Errorf("build lab %q: %w", l.Name, err)
		}
		l.Binary = exe
	}
	if existing, _ := listNS(NSPrefix + l.Name + "-"); len(existing) > 0 {
		return nil, fmt.Errorf("build lab %q: namespaces %v exist; run `isthmus-lab lab down` first", l.Name, existing)
	}
	if err := l.build(ctx, opts); err != nil {
		if kerr := l.stopKube(); kerr != nil {
			err = errors.Join(err, kerr)
		}
		if derr := Down(l.Name, DownOptions{Binary: l.Binary, Log: opts.Log}); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, fmt.Errorf("build lab %q: %w", l.Name, err)
	}
	return l, nil
}

func (l *Lab) build(ctx context.Context, opts Options) error {
	sc := l.Scenario
	if err := os.MkdirAll(l.StateDir(), 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	// Remember the binary so a later `lab down` can run its uninstall.
	if err := os.WriteFile(filepath.Join(l.StateDir(), "binary"), []byte(l.Binary), 0o644); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	// And the datapath, so a later `lab check` knows what it probes.
	if err := os.WriteFile(filepath.Join(l.StateDir(), datapathFile), []byte(l.Datapath), 0o644); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	l.logf("lab %s: router", l.Name)
	if err := l.buildRouter(); err != nil {
		return err
	}
	for _, n := range sc.Nodes() {
		l.logf("lab %s: node %s (%s, site %s)", l.Name, n.Name, n.Address, n.Site.Name)
		if err := l.buildNode(n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, p := range n.Pods {
			if l.usesPlugin(p) {
				continue // cnitool adds it once the agents serve IPAM
			}
			if err := l.buildPod(n, p); err != nil {
				return fmt.Errorf("pod %s: %w", p.Name, err)
			}
		}
		if err := l.nodeSysctls(n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := l.nodeRules(ctx, n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := l.policyRules(ctx, n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if sc.Underlay.Firewall {
		l.logf("lab %s: firewall between sites", l.Name)
		if err := l.buildFirewall(ctx); err != nil {
			return err
		}
	}
	if err := l.buildExternalNAT(ctx); err != nil {
		return err
	}
	if sc.Underlay.World {
		l.logf("lab %s: world %s", l.Name, WorldPrefix)
		if err := l.buildWorld(); err != nil {
			return err
		}
	}
	switch l.Datapath {
	case DatapathIsthmus, DatapathNone:
	case DatapathPlain:
		if err := l.plainRoutes(); err != nil {
			return err
		}
	case DatapathVXLAN:
		if err := l.vxlanRoutes(); err != nil {
			return err
		}
	case DatapathWireGuard:
		if err := l.wireGuardRoutes(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("datapath %q: want isthmus, plain, vxlan, wireguard or none", l.Datapath)
	}
	if l.Datapath == DatapathIsthmus && opts.Source != SourceKube {
		if err := l.publishWireGuardKeys(); err != nil {
			return err
		}
	}
	if err := sc.WriteObjects(l.ObjectsDir()); err != nil {
		return err
	}
	switch opts.Source {
	case "", SourceFiles:
	case SourceKube:
		if err := l.startKube(ctx, opts); err != nil {
			return err
		}
	default:
		return fmt.Errorf("source %q: want files or kube", opts.Source)
	}
	var before map[[2]string]bool
	if opts.CheckNodes {
		before = l.NodeReach()
		l.logf("lab %s: node to node before the agents:\n%s", l.Name, reachString(before))
		if err := symmetric(l.acrossNAT(before)); err != nil {
			return fmt.Errorf("before the agents: %w", err)
		}
	}
	if l.Datapath != DatapathIsthmus {
		return nil
	}
	if opts.NoAgents {
		if opts.Source != SourceKube {
			return errors.New("NoAgents: only in Kubernetes mode, where a DaemonSet brings the agents")
		}
		return l.prepareDaemonSet()
	}
	if err := l.startAgents(ctx, opts); err != nil {
		return err
	}
	start := time.Now()
	if err := l.addManagedPods(ctx, l.readyTimeout(opts)); err != nil {
		return err
	}
	l.logf("lab %s: managed pods added through the CNI plugin in %s", l.Name, time.Since(start).Round(time.Millisecond))
	if sc.PodWiring == PodWiringProxyARP {
		if err := l.waitHandMadeAttached(ctx, l.readyTimeout(opts)); err != nil {
			return err
		}
	}
	if opts.CheckNodes {
		after := l.NodeReach()
		l.logf("lab %s: node to node with the agents:\n%s", l.Name, reachString(after))
		var lost []string
		for pair, ok := range before {
			if ok && !after[pair] {
				lost = append(lost, pair[0]+" -> "+pair[1])
			}
		}
		if len(lost) > 0 {
			slices.Sort(lost)
			return fmt.Errorf("with the agents: node to node lost: %s", strings.Join(lost, ", "))
		}
		if err := symmetric(l.acrossNAT(after)); err != nil {
			return fmt.Errorf("with the agents: %w", err)
		}
	}
	return nil
}

// waitHandMadeAttached waits until every node's agent has taken in the pods
// another CNI wired (PodWiringProxyARP): no plugin tells the lab when, and a
// flow that starts before pod_ifaces holds the interface meets the stack as a
// stranger's (waitPodAttached).
func (l *Lab) waitHandMadeAttached(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, n := range l.Scenario.Nodes() {
		for _, p := range n.Pods {
			if err := l.waitPodAttached(ctx, n.Name, p.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// NodeReach pings every node's address from every other node (each ordered
// pair, in parallel, up to three tries: a first packet may wait for ARP at
// every hop) and reports which pairs got a reply.
func (l *Lab) NodeReach() map[[2]string]bool {
	nodes := l.Scenario.Nodes()
	out := make(map[[2]string]bool)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, a := range nodes {
		for _, b := range nodes {
			if a.Name == b.Name {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok := false
				for range 3 {
					if Ping(l.NodeNS(a.Name), b.Address, time.Second) == nil {
						ok = true
						break
					}
				}
				mu.Lock()
				out[[2]string{a.Name, b.Name}] = ok
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return out
}

// acrossNAT returns reach without the pairs of nodes of two sites one of which is
// behind a NAT (Site.BehindNAT): such a NAT lets a site's nodes out and nothing
// in, so their underlay reaches one way by design.
func (l *Lab) acrossNAT(reach map[[2]string]bool) map[[2]string]bool {
	behind := map[string]bool{}
	site := map[string]string{}
	for _, n := range l.Scenario.Nodes() {
		site[n.Name] = n.Site.Name
		behind[n.Name] = n.Site.BehindNAT.IsValid()
	}
	out := map[[2]string]bool{}
	for pair, ok := range reach {
		if site[pair[0]] != site[pair[1]] && (behind[pair[0]] || behind[pair[1]]) {
			continue
		}
		out[pair] = ok
	}
	return out
}

// symmetric returns an error naming every pair that reaches one way only:
// paths must be the same both ways, so a stateful firewall or strict
// rp_filter passes both or neither.
func symmetric(reach map[[2]string]bool) error {
	var oneWay []string
	for pair, ok := range reach {
		if ok && !reach[[2]string{pair[1], pair[0]}] {
			oneWay = append(oneWay, pair[0]+" -> "+pair[1])
		}
	}
	if len(oneWay) > 0 {
		slices.Sort(oneWay)
		return fmt.Errorf("node to node one way only: %s", strings.Join(oneWay, ", "))
	}
	return nil
}

func reachString(reach map[[2]string]bool) string {
	var lines []string
	for pair, ok := range reach {
		mark := "ok"
		if !ok {
			mark = "no reply"
		}
		lines = append(lines, fmt.Sprintf("  %s -> %s: %s", pair[0], pair[1], mark))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// buildRouter makes the router: a routed fabric, not a bridge. Each node's underlay
// veth ends on its own router port, which holds the site's gateway address (/32) and
// answers ARP for the rest of the site's subnet by proxy, as a cloud VPC fabric does.
// The gateway address sits on each port rather than once on the loopback so that
// the router's own ARP requests to a node leave from an address of the node's own
// subnet, as a real router's do: from another site's address, a node that routes
// remote node CIDRs into the tunnel would ignore them (strict rp_filter) and fall
// off the underlay once its neighbour entry expired. A Linux bridge would not do: it has no hw_enc_features, so it
// segments every tunnelled GSO frame in software, which no real underlay does and
// which would make every overlay in the lab look four times slower than it is.
func (l *Lab) buildRouter() error {
	ns := l.RouterNS()
	if err := createNS(ns); err != nil {
		return err
	}
	h, _, err := handleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := linkUp(h, "lo"); err != nil {
		return err
	}
	kv := map[string]string{"net/ipv4/ip_forward": "1"}
	if l.Scenario.Underlay6() {
		// Forwarding, and proxy NDP (buildNode6) on every port; all's
		// proxy_ndp also makes the router answer a unicast solicitation for
		// a proxied address instead of forwarding it.
		kv["net/ipv6/conf/all/forwarding"] = "1"
		kv["net/ipv6/conf/all/proxy_ndp"] = "1"
	}
	return writeSysctls(ns, kv)
}

func (l *Lab) buildNode(n NodeRef) error {
	ns := l.NodeNS(n.Name)
	if err := createNS(ns); err != nil {
		return err
	}
	// rp_filter first, so every interface created later inherits strict mode.
	if err := writeSysctls(ns, map[string]string{
		"net/ipv4/conf/all/rp_filter":     "1",
		"net/ipv4/conf/default/rp_filter": "1",
	}); err != nil {
		return err
	}
	port := RouterPort(n.Name)
	rt, h, rport, err := l.linkToRouter(ns, port)
	if err != nil {
		return err
	}
	defer rt.Close()
	defer h.Close()
	if n.Site.Is6() {
		return l.buildNode6(n, rt, h, rport)
	}
	// Proxy ARP answers for the node's gateway and its site neighbours at once (no
	// random proxy_delay), and a host route sends the node's address down its port.
	if err := writeSysctls(l.RouterNS(), map[string]string{
		"net/ipv4/conf/" + port + "/proxy_arp":    "1",
		"net/ipv4/neigh/" + port + "/proxy_delay": "0",
	}); err != nil {
		return err
	}
	// The port's device group names the node's site, for the firewall.
	if err := rt.LinkSetGroup(rport, int(l.Scenario.siteGroup(n.Site.Name))); err != nil {
		return fmt.Errorf("set group of %s: %w", port, err)
	}
	if err := rt.AddrAdd(rport, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.Site.Gateway, 32))}); err != nil {
		return fmt.Errorf("add site gateway %s to %s: %w", n.Site.Gateway, port, err)
	}
	if err := linkUp(rt, port); err != nil {
		return err
	}
	if err := rt.RouteAdd(&netlink.Route{LinkIndex: rport.Attrs().Index, Dst: ipNet(netip.PrefixFrom(n.Address, 32)), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("add router route to %s: %w", n.Address, err)
	}
	if err := linkUp(h, "lo"); err != nil {
		return err
	}
	eth, err := h.LinkByName(UnderlayDev)
	if err != nil {
		return fmt.Errorf("find %s: %w", UnderlayDev, err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.Address, n.Site.Subnet.Bits()))}); err != nil {
		return fmt.Errorf("add underlay address: %w", err)
	}
	if err := linkUp(h, UnderlayDev); err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{Gw: n.Site.Gateway.AsSlice()}); err != nil {
		return fmt.Errorf("add default route via %s: %w", n.Site.Gateway, err)
	}
	// Unmanaged pods are the site fabric's business: it routes them to the node.
	for _, p := range n.Pods {
		if p.Unmanaged || n.Site.FabricRoutes {
			dst := netip.PrefixFrom(p.Address, 32)
			if err := rt.RouteAdd(&netlink.Route{Dst: ipNet(dst), Gw: n.Address.AsSlice()}); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("add fabric route %s via %s: %w", dst, n.Address, err)
			}
		}
	}
	if n.Site.FabricRoutes {
		for _, c := range n.PodCIDRs {
			if !c.Addr().Is4() {
				continue // the underlay routes IPv4 only
			}
			if err := rt.RouteAdd(&netlink.Route{Dst: ipNet(c), Gw: n.Address.AsSlice()}); err != nil {
				return fmt.Errorf("add fabric route %s via %s: %w", c, n.Address, err)
			}
		}
	}
	return nil
}

// buildNode6 wires node n on the IPv6 underlay, as buildNode does on the IPv4
// one: the router port rport holds the site's gateway (/128, so the router's
// own neighbour solicitations to the node come from an address of the node's
// own subnet), routes the node's address (/128) down the port, and answers
// neighbour solicitations for every other node of the site by proxy NDP (an
// entry per address: IPv6 has no proxy for a whole subnet), so the nodes of a
// site share a subnet and talk through the router; the node's eth0 holds its
// address with the subnet's prefix length and a default route via the gateway.
// Duplicate address detection is off on both ends before they come up, and
// the addresses are added IFA_F_NODAD: usable at once. The node has no IPv4
// underlay address at all.
func (l *Lab) buildNode6(n NodeRef, rt, h *netlink.Handle, rport netlink.Link) error {
	port := rport.Attrs().Name
	if err := writeSysctls(l.RouterNS(), map[string]string{
		"net/ipv6/conf/" + port + "/accept_dad":   "0",
		"net/ipv6/conf/" + port + "/proxy_ndp":    "1",
		"net/ipv6/neigh/" + port + "/proxy_delay": "0",
	}); err != nil {
		return err
	}
	if err := rt.LinkSetGroup(rport, int(l.Scenario.siteGroup(n.Site.Name))); err != nil {
		return fmt.Errorf("set group of %s: %w", port, err)
	}
	if err := rt.AddrAdd(rport, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.Site.Gateway, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("add site gateway %s to %s: %w", n.Site.Gateway, port, err)
	}
	if err := linkUp(rt, port); err != nil {
		return err
	}
	if err := rt.RouteAdd(&netlink.Route{LinkIndex: rport.Attrs().Index, Dst: ipNet(netip.PrefixFrom(n.Address, 128))}); err != nil {
		return fmt.Errorf("add router route to %s: %w", n.Address, err)
	}
	for _, other := range n.Site.Nodes {
		if other.Name == n.Name {
			continue
		}
		if err := rt.NeighAdd(&netlink.Neigh{LinkIndex: rport.Attrs().Index, Family: netlink.FAMILY_V6,
			Flags: netlink.NTF_PROXY, IP: other.Address.AsSlice()}); err != nil {
			return fmt.Errorf("proxy NDP for %s on %s: %w", other.Address, port, err)
		}
	}
	if err := linkUp(h, "lo"); err != nil {
		return err
	}
	if err := writeSysctls(l.NodeNS(n.Name), map[string]string{"net/ipv6/conf/" + UnderlayDev + "/accept_dad": "0"}); err != nil {
		return err
	}
	eth, err := h.LinkByName(UnderlayDev)
	if err != nil {
		return fmt.Errorf("find %s: %w", UnderlayDev, err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.Address, n.Site.Subnet.Bits())), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("add underlay address: %w", err)
	}
	if err := linkUp(h, UnderlayDev); err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: n.Site.Gateway.AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
		return fmt.Errorf("add default route via %s: %w", n.Site.Gateway, err)
	}
	return nil
}

// linkToRouter joins the namespace ns to the router with a veth at the underlay
// MTU: port on the router's side, UnderlayDev in ns. It returns netlink handles
// in the router and in ns, which the caller closes, and the router's port.
func (l *Lab) linkToRouter(ns, port string) (rt, h *netlink.Handle, rport netlink.Link, err error) {
	rt, _, err = handleAt(l.RouterNS())
	if err != nil {
		return nil, nil, nil, err
	}
	h, nsh, err := handleAt(ns)
	if err != nil {
		rt.Close()
		return nil, nil, nil, err
	}
	defer nsh.Close()
	mtu := l.Scenario.Underlay.mtu()
	err = rt.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: port, MTU: mtu},
		PeerName:      UnderlayDev,
		PeerMTU:       uint32(mtu),
		PeerNamespace: netlink.NsFd(nsh),
	})
	if err == nil {
		rport, err = rt.LinkByName(port)
	}
	if err != nil {
		rt.Close()
		h.Close()
		return nil, nil, nil, fmt.Errorf("add veth %s to the router: %w", port, err)
	}
	return rt, h, rport, nil
}

func (l *Lab) buildPod(n NodeRef, p Pod) error {
	ns := l.PodNS(p.Name)
	if err := createNS(ns); err != nil {
		return err
	}
	node, _, err := handleAt(l.NodeNS(n.Name))
	if err != nil {
		return err
	}
	defer node.Close()
	h, nsh, err := handleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	defer nsh.Close()
	mtu := l.Scenario.PodMTU(n.Site.Name, p)
	host := l.HostVeth(p.Name)
	if err := node.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: host, MTU: mtu},
		PeerName:      UnderlayDev,
		PeerMTU:       uint32(mtu),
		PeerNamespace: netlink.NsFd(nsh),
	}); err != nil {
		return fmt.Errorf("add pod veth %s: %w", host, err)
	}
	hostLink, err := node.LinkByName(host)
	if err != nil {
		return fmt.Errorf("find %s: %w", host, err)
	}
	proxyARP := l.Scenario.PodWiring == PodWiringProxyARP
	if proxyARP {
		mac, _ := net.ParseMAC(ProxyARPMAC)
		if err := node.LinkSetHardwareAddr(hostLink, mac); err != nil {
			return fmt.Errorf("set MAC of %s: %w", host, err)
		}
		if err := writeSysctls(l.NodeNS(n.Name), map[string]string{
			"net/ipv4/conf/" + host + "/proxy_arp":    "1",
			"net/ipv4/neigh/" + host + "/proxy_delay": "0",
		}); err != nil {
			return err
		}
	}
	if p.Address6.IsValid() {
		// Before the link is up: its link-local address, and PodGateway6
		// below, are usable at once, not after duplicate address detection.
		if err := writeSysctls(l.NodeNS(n.Name), map[string]string{"net/ipv6/conf/" + host + "/accept_dad": "0"}); err != nil {
			return err
		}
	}
	if err := linkUp(node, host); err != nil {
		return err
	}
	if err := node.RouteAdd(&netlink.Route{LinkIndex: hostLink.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: ipNet(netip.PrefixFrom(p.Address, 32))}); err != nil {
		return fmt.Errorf("add host route to %s: %w", p.Address, err)
	}
	if p.Address6.IsValid() {
		if err := hostSide6(node, hostLink, p.Address6); err != nil {
			return err
		}
	}
	if err := linkUp(h, "lo"); err != nil {
		return err
	}
	eth, err := h.LinkByName(UnderlayDev)
	if err != nil {
		return fmt.Errorf("find pod %s: %w", UnderlayDev, err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(p.Address, 32))}); err != nil {
		return fmt.Errorf("add pod address: %w", err)
	}
	if p.Address6.IsValid() {
		if err := writeSysctls(ns, map[string]string{"net/ipv6/conf/" + UnderlayDev + "/accept_dad": "0"}); err != nil {
			return err
		}
		if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(p.Address6, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("add pod address %s: %w", p.Address6, err)
		}
	}
	if err := linkUp(h, UnderlayDev); err != nil {
		return err
	}
	if p.Address6.IsValid() {
		if err := podSide6(h, eth, hostLink, proxyARP); err != nil {
			return err
		}
	}
	gw := netip.MustParseAddr(PodGateway)
	idx := eth.Attrs().Index
	if err := h.RouteAdd(&netlink.Route{LinkIndex: idx, Scope: netlink.SCOPE_LINK, Dst: ipNet(netip.PrefixFrom(gw, 32))}); err != nil {
		return fmt.Errorf("add route to %s: %w", gw, err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("add default route: %w", err)
	}
	if proxyARP {
		return nil // the pod asks for the gateway, the host side answers by proxy
	}
	if err := h.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: gw.AsSlice(), HardwareAddr: hostLink.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("add neighbour %s: %w", gw, err)
	}
	return nil
}

// hostSide6 wires the node's side of a pod's IPv6 address a, as the CNI
// plugin does: a host route a/128 through the host veth. The host veth also
// gets PodGateway6/64 (no DAD), so it answers the pod's neighbour
// solicitations for its gateway where the pod has no permanent neighbour
// entry (PodWiringProxyARP, whose host veths share one MAC as Calico's do);
// with PodWiringNeighbour the pod never asks. IPv6 forwarding is left as the
// node has it: an isthmus agent turns it on itself.
func hostSide6(node *netlink.Handle, hostLink netlink.Link, a netip.Addr) error {
	gw := netip.MustParsePrefix(PodGateway6 + "/64")
	if err := node.AddrAdd(hostLink, &netlink.Addr{IPNet: ipNet(gw), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("add %s to %s: %w", gw, hostLink.Attrs().Name, err)
	}
	if err := node.RouteAdd(&netlink.Route{LinkIndex: hostLink.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: ipNet(netip.PrefixFrom(a, 128))}); err != nil {
		return fmt.Errorf("add host route to %s: %w", a, err)
	}
	return nil
}

// podSide6 gives the pod's eth0 its IPv6 default route through PodGateway6
// and, unless proxyARP (the pod then resolves the gateway, which the host veth
// holds), a permanent neighbour entry for it with the host veth's MAC, as the
// CNI plugin wires it.
func podSide6(h *netlink.Handle, eth, hostLink netlink.Link, proxyARP bool) error {
	gw := netip.MustParseAddr(PodGateway6)
	idx := eth.Attrs().Index
	if !proxyARP {
		if err := h.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
			IP: gw.AsSlice(), HardwareAddr: hostLink.Attrs().HardwareAddr}); err != nil {
			return fmt.Errorf("add neighbour %s: %w", gw, err)
		}
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: gw.AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
		return fmt.Errorf("add IPv6 default route via %s: %w", gw, err)
	}
	return nil
}

// nodeSysctls turns on forwarding and strict reverse-path filtering on every
// interface of the node, as a hardened node would have them.
func (l *Lab) nodeSysctls(n NodeRef) error {
	kv := map[string]string{
		"net/ipv4/ip_forward":             "1",
		"net/ipv4/conf/all/rp_filter":     "1",
		"net/ipv4/conf/default/rp_filter": "1",
	}
	h, _, err := handleAt(l.NodeNS(n.Name))
	if err != nil {
		return err
	}
	links, err := h.LinkList()
	h.Close()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, link := range links {
		kv["net/ipv4/conf/"+link.Attrs().Name+"/rp_filter"] = "1"
	}
	return writeSysctls(l.NodeNS(n.Name), kv)
}

// nodeRules installs the iptables rules another CNI typically leaves on a node,
// when the scenario asks for them: its exact MASQUERADE rule when Leftovers
// gives one, else one MASQUERADE per pod block. In the baseline datapaths
// pod-to-pod traffic is exempted from MASQUERADE first, as every routed CNI does
// for its own traffic (with plain WireGuard routing it must be: the peer's
// cryptokey routing drops a source masqueraded to the node's address); isthmus
// must not need that exemption.
func (l *Lab) nodeRules(ctx context.Context, n NodeRef) error {
	lo := l.Scenario.Leftovers(&n.Node)
	if !lo.On {
		return l.nodeRules6(ctx, n, false)
	}
	// iptables rules for the IPv4 pod blocks; nodeRules6 has the IPv6 ones.
	blocks := l.Scenario.PodBlocks4()
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
	if l.Datapath == DatapathPlain || l.Datapath == DatapathVXLAN || l.Datapath == DatapathWireGuard {
		for _, s := range blocks {
			for _, d := range blocks {
				fmt.Fprintf(&b, "-A POSTROUTING -s %s -d %s -j RETURN\n", s, d)
			}
		}
	}
	// Another CNI never masquerades its own pods' traffic to each other
	// (Calico's natOutgoing skips destinations in its pools, Azure CNI's
	// nonMasqueradeCIDRs hold the VNet). On a node of an unmanaged site that
	// traffic is the CNI's and the fabric's, never isthmus'
	// (docs/unmanaged-sites.md), so the lab exempts it as the CNI does.
	if sem := n.Site.semantics(); sem.unmanaged {
		blocks4 := slices.DeleteFunc(slices.Clone(sem.blocks), func(p netip.Prefix) bool { return !p.Addr().Is4() })
		for _, s := range blocks4 {
			for _, d := range blocks4 {
				fmt.Fprintf(&b, "-A POSTROUTING -s %s -d %s -j RETURN\n", s, d)
			}
		}
	}
	if lo.Masquerade != "" {
		fmt.Fprintf(&b, "-A POSTROUTING %s\n", lo.Masquerade)
	} else {
		for _, s := range blocks {
			fmt.Fprintf(&b, "-A POSTROUTING -s %s ! -d 224.0.0.0/4 -j MASQUERADE\n", s)
		}
	}
	b.WriteString("COMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n")
	b.WriteString("-A FORWARD -m conntrack --ctstate INVALID -j DROP\n")
	for _, s := range blocks {
		fmt.Fprintf(&b, "-A FORWARD -s %s -j ACCEPT\n", s)
		fmt.Fprintf(&b, "-A FORWARD -d %s -j ACCEPT\n", s)
	}
	b.WriteString("COMMIT\n")
	cmd := Command(ctx, l.NodeNS(n.Name), "iptables-restore", "-w")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install CNI leftover rules: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return l.nodeRules6(ctx, n, true)
}

// nodeRules6 is nodeRules for IPv6. On an isthmus, plain or vxlan lab whose
// scenario has IPv6 pod blocks, a node with the CNI leftovers (leftovers) gets the
// ip6tables leftovers a dual-stack CNI leaves (a MASQUERADE per IPv6 pod block, a
// FORWARD chain that drops what it does not accept; the baselines exempt
// pod-to-pod traffic from the MASQUERADE first, as nodeRules does for IPv4) and the
// strict IPv6 reverse-path filter of a hardened node, firewalld's default (raw
// PREROUTING: rpfilter --invert drops, RPFilter6Rule). A node on the IPv6 underlay
// gets that filter whatever its leftovers: it is the IPv6 twin of the strict
// rp_filter every node has, and there it judges the underlay too.
func (l *Lab) nodeRules6(ctx context.Context, n NodeRef, leftovers bool) error {
	var blocks []netip.Prefix
	for _, p := range l.Scenario.PodBlocks() {
		if p.Addr().Is6() {
			blocks = append(blocks, p)
		}
	}
	routes6 := l.Datapath == DatapathPlain || l.Datapath == DatapathVXLAN // baselines that route IPv6 pods
	leftovers = leftovers && len(blocks) > 0 && (l.Datapath == DatapathIsthmus || l.Datapath == "" || routes6)
	if !leftovers && !n.Site.Is6() {
		return nil
	}
	var b strings.Builder
	if leftovers {
		b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
		if routes6 {
			// As in nodeRules: a routed CNI exempts its own pod-to-pod traffic.
			for _, s := range blocks {
				for _, d := range blocks {
					fmt.Fprintf(&b, "-A POSTROUTING -s %s -d %s -j RETURN\n", s, d)
				}
			}
		}
		for _, s := range blocks {
			fmt.Fprintf(&b, "-A POSTROUTING -s %s ! -d ff00::/8 -j MASQUERADE\n", s)
		}
		b.WriteString("COMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n")
		b.WriteString("-A FORWARD -m conntrack --ctstate INVALID -j DROP\n")
		for _, s := range blocks {
			fmt.Fprintf(&b, "-A FORWARD -s %s -j ACCEPT\n", s)
			fmt.Fprintf(&b, "-A FORWARD -d %s -j ACCEPT\n", s)
		}
		b.WriteString("COMMIT\n")
	}
	b.WriteString("*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
	b.WriteString("-A " + RPFilter6Rule + "\n")
	b.WriteString("COMMIT\n")
	cmd := Command(ctx, l.NodeNS(n.Name), "ip6tables-restore", "-w")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install IPv6 rules (CNI leftovers, rpfilter): %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// policyRules installs the Ingress and Egress policies of the node's pods, as
// Calico in policy-only mode writes them: a chain per pod interface and direction
// that FORWARD jumps to for packets leaving through it (-o, isl-tw-<pod>, by
// source) or arriving from it (-i, isl-fw-<pod>, by destination), accepting what
// conntrack ties to an accepted flow, then Allow, and dropping Deny. The jumps go
// first in FORWARD, so they hold whatever the leftovers accept.
func (l *Lab) policyRules(ctx context.Context, n NodeRef) error {
	var b strings.Builder
	for _, p := range n.Pods {
		writePolicyChain(&b, policyChain(PolicyIngress, p.Name), "-o", l.HostVeth(p.Name), "-s", p.Ingress)
		writePolicyChain(&b, policyChain(PolicyEgress, p.Name), "-i", l.HostVeth(p.Name), "-d", p.Egress)
	}
	if b.Len() == 0 {
		return nil
	}
	cmd := Command(ctx, l.NodeNS(n.Name), "iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader("*filter\n" + b.String() + "COMMIT\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install policy rules: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// writePolicyChain writes, in iptables-restore form, the filter chain of one pod
// policy direction (named by policyChain): FORWARD jumps to it for packets with ifFlag (-o or -i) of the
// pod's interface, and it matches peers with peerFlag (-s or -d). Nothing for a nil
// policy.
func writePolicyChain(b *strings.Builder, chain, ifFlag, ifname, peerFlag string, pol *Policy) {
	if pol == nil {
		return
	}
	fmt.Fprintf(b, ":%s - [0:0]\n-I FORWARD %s %s -j %s\n", chain, ifFlag, ifname, chain)
	// Calico's workload chains accept what conntrack ties to a flow first.
	fmt.Fprintf(b, "-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n", chain)
	for _, a := range pol.Allow {
		fmt.Fprintf(b, "-A %s %s %s -m comment --comment \"policy allow\" -j ACCEPT\n", chain, peerFlag, a)
	}
	for _, d := range pol.Deny {
		fmt.Fprintf(b, "-A %s %s %s -m comment --comment \"policy deny\" -j DROP\n", chain, peerFlag, d)
	}
}

// plainRoutes routes every node's IPv4 pod CIDRs natively: straight to
// same-subnet nodes, and through the router (which learns a route per podCIDR)
// otherwise. IPv6 podCIDRs are routed by plainRoutes6; on an IPv6 underlay
// plainRoutesUnderlay6 routes both families instead.
func (l *Lab) plainRoutes() error {
	if l.Scenario.Underlay6() {
		return l.plainRoutesUnderlay6()
	}
	if err := l.plainRoutes6(); err != nil {
		return err
	}
	rt, _, err := handleAt(l.RouterNS())
	if err != nil {
		return err
	}
	defer rt.Close()
	nodes := l.Scenario.Nodes()
	for _, dst := range nodes {
		for _, c := range podCIDRs4(dst.Node) {
			if dst.Site.FabricRoutes {
				continue // already there
			}
			if err := rt.RouteAdd(&netlink.Route{Dst: ipNet(c), Gw: dst.Address.AsSlice()}); err != nil {
				return fmt.Errorf("add router route %s: %w", c, err)
			}
		}
		for _, src := range nodes {
			if src.Name == dst.Name || src.Site.Name != dst.Site.Name {
				continue
			}
			h, _, err := handleAt(l.NodeNS(src.Name))
			if err != nil {
				return err
			}
			for _, c := range podCIDRs4(dst.Node) {
				if err := h.RouteAdd(&netlink.Route{Dst: ipNet(c), Gw: dst.Address.AsSlice()}); err != nil {
					h.Close()
					return fmt.Errorf("node %s: add route %s via %s: %w", src.Name, c, dst.Address, err)
				}
			}
			h.Close()
		}
	}
	return nil
}

// plainRoutesUnderlay6 routes every node's podCIDRs natively over the IPv6
// underlay (Scenario.Underlay6), whose addresses buildNode6 has given the nodes
// and the router already: the router routes each podCIDR via the node's
// underlay address, and every other node routes it down eth0 via its site
// gateway, so every pod packet between nodes crosses the router as on an IPv4
// underlay. IPv4 podCIDRs get IPv4 routes with an IPv6 next hop (RFC 5549,
// `via inet6`): the underlay has no IPv4 address anywhere. IPv4 and IPv6
// forwarding are on in every node (and in the router already).
func (l *Lab) plainRoutesUnderlay6() error {
	rt, _, err := handleAt(l.RouterNS())
	if err != nil {
		return err
	}
	defer rt.Close()
	nodes := l.Scenario.Nodes()
	for _, dst := range nodes {
		port, err := rt.LinkByName(RouterPort(dst.Name))
		if err != nil {
			return fmt.Errorf("find %s: %w", RouterPort(dst.Name), err)
		}
		for _, c := range dst.PodCIDRs {
			if err := rt.RouteAdd(viaUnderlay6(c, port.Attrs().Index, dst.Address)); err != nil {
				return fmt.Errorf("add router route %s via %s: %w", c, dst.Address, err)
			}
		}
	}
	forward := map[string]string{"net/ipv4/ip_forward": "1", "net/ipv6/conf/all/forwarding": "1"}
	for _, src := range nodes {
		if err := writeSysctls(l.NodeNS(src.Name), forward); err != nil {
			return err
		}
		h, _, err := handleAt(l.NodeNS(src.Name))
		if err != nil {
			return err
		}
		err = func() error {
			defer h.Close()
			eth, err := h.LinkByName(UnderlayDev)
			if err != nil {
				return fmt.Errorf("find %s: %w", UnderlayDev, err)
			}
			for _, dst := range nodes {
				if dst.Name == src.Name {
					continue
				}
				for _, c := range dst.PodCIDRs {
					if err := h.RouteAdd(viaUnderlay6(c, eth.Attrs().Index, src.Site.Gateway)); err != nil {
						return fmt.Errorf("add route %s via %s: %w", c, src.Site.Gateway, err)
					}
				}
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("node %s: %w", src.Name, err)
		}
	}
	return nil
}

// viaUnderlay6 returns the route to dst down the link with index link via the
// IPv6 underlay address gw: a plain gateway for an IPv6 dst, an IPv6 next hop
// of an IPv4 route (RTA_VIA, RFC 5549) for an IPv4 one.
func viaUnderlay6(dst netip.Prefix, link int, gw netip.Addr) *netlink.Route {
	r := &netlink.Route{LinkIndex: link, Dst: ipNet(dst)}
	if dst.Addr().Is6() {
		r.Gw = gw.AsSlice()
	} else {
		r.Via = &netlink.Via{AddrFamily: netlink.FAMILY_V6, Addr: gw.AsSlice()}
	}
	return r
}

// underlay6Prefix holds the plain datapath's IPv6 underlay addresses: each
// IPv4 address of the underlay (a node's, a site gateway's) in its last 32
// bits (underlay6Addr).
var underlay6Prefix = netip.MustParsePrefix("fd00:ffff::/96")

// underlay6Addr returns the IPv6 underlay address of IPv4 underlay address a:
// fd00:ffff::<a>, as fd00:ffff::172.16.1.11 for 172.16.1.11.
func underlay6Addr(a netip.Addr) netip.Addr {
	b := underlay6Prefix.Addr().As16()
	copy(b[12:], a.AsSlice())
	return netip.AddrFrom16(b)
}

// plainRoutes6 routes the IPv6 podCIDRs natively, as plainRoutes the IPv4
// ones, when the scenario has any: every node with an IPv6 podCIDR gets its
// underlay6Addr on eth0 (/128), its router port the site gateway's (/128; the
// same on every port of the site, as the IPv4 one), and IPv6 forwarding is on
// in the node and the router. The router routes the node's address down its
// port and each of its IPv6 podCIDRs via that address; every other such node
// routes them via its site gateway's address, through the router (no proxy
// NDP: every IPv6 pod packet between nodes crosses the router, as the IPv4
// ones do). It returns once both ends of every such link have a link-local
// address past duplicate address detection: until then neither sends a
// neighbour solicitation, and the first pod packets across would be lost.
func (l *Lab) plainRoutes6() error {
	var nodes []NodeRef
	for _, n := range l.Scenario.Nodes() {
		if len(podCIDRs6(n.Node)) > 0 {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	forward := map[string]string{"net/ipv6/conf/all/forwarding": "1"}
	if err := writeSysctls(l.RouterNS(), forward); err != nil {
		return err
	}
	rt, _, err := handleAt(l.RouterNS())
	if err != nil {
		return err
	}
	defer rt.Close()
	for _, n := range nodes {
		addr, gw := underlay6Addr(n.Address), underlay6Addr(n.Site.Gateway)
		port, err := rt.LinkByName(RouterPort(n.Name))
		if err != nil {
			return fmt.Errorf("find %s: %w", RouterPort(n.Name), err)
		}
		if err := rt.AddrAdd(port, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(gw, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("add %s to %s: %w", gw, RouterPort(n.Name), err)
		}
		if err := rt.RouteAdd(&netlink.Route{LinkIndex: port.Attrs().Index, Dst: ipNet(netip.PrefixFrom(addr, 128)), Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("add router route to %s: %w", addr, err)
		}
		if err := waitLinkLocal(rt, port); err != nil {
			return err
		}
		for _, c := range podCIDRs6(n.Node) {
			if err := rt.RouteAdd(&netlink.Route{Dst: ipNet(c), Gw: addr.AsSlice()}); err != nil {
				return fmt.Errorf("add router route %s: %w", c, err)
			}
		}
		if err := writeSysctls(l.NodeNS(n.Name), forward); err != nil {
			return err
		}
		h, _, err := handleAt(l.NodeNS(n.Name))
		if err != nil {
			return err
		}
		err = func() error {
			defer h.Close()
			eth, err := h.LinkByName(UnderlayDev)
			if err != nil {
				return fmt.Errorf("find %s: %w", UnderlayDev, err)
			}
			if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
				return fmt.Errorf("add %s to %s: %w", addr, UnderlayDev, err)
			}
			if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: ipNet(netip.PrefixFrom(gw, 128)), Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("add route to %s: %w", gw, err)
			}
			if err := waitLinkLocal(h, eth); err != nil {
				return err
			}
			for _, dst := range nodes {
				if dst.Name == n.Name {
					continue
				}
				for _, c := range podCIDRs6(dst.Node) {
					if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: ipNet(c), Gw: gw.AsSlice()}); err != nil {
						return fmt.Errorf("add route %s via %s: %w", c, gw, err)
					}
				}
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// waitLinkLocal waits up to 5 s until link has an IPv6 link-local address
// that duplicate address detection no longer holds tentative (about a second
// after the link came up): the source of its neighbour solicitations.
func waitLinkLocal(h *netlink.Handle, link netlink.Link) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		addrs, err := h.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", link.Attrs().Name, err)
		}
		if slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
			return a.IP.IsLinkLocalUnicast() && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0
		}) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no IPv6 link-local address past duplicate address detection after 5s: %v", link.Attrs().Name, addrs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// podCIDRs6 returns the IPv6 podCIDRs of n: those the plain and vxlan
// datapaths route when the scenario has them.
func podCIDRs6(n Node) []netip.Prefix {
	return slices.DeleteFunc(slices.Clone(n.PodCIDRs), func(c netip.Prefix) bool { return !c.Addr().Is6() })
}

// podCIDRs4 returns the IPv4 podCIDRs of n: those the baseline datapaths
// route over the IPv4 underlay.
func podCIDRs4(n Node) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range n.PodCIDRs {
		if c.Addr().Is4() {
			out = append(out, c)
		}
	}
	return out
}

func linkUp(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Attach returns the lab of that name built earlier (by another process) from
// sc, for Check, Exec and Down, with the datapath Up recorded (DatapathIsthmus
// for a lab that recorded none). It fails when the lab's router namespace is
// missing.
func Attach(sc *Scenario, name string) (*Lab, error) {
	if err := ValidateLabName(name); err != nil {
		return nil, fmt.Errorf("attach lab: %w", err)
	}
	l := &Lab{Name: name, Scenario: sc, Datapath: DatapathIsthmus, agents: map[string]*agent{}}
	if _, err := os.Stat(NSPath(l.RouterNS())); err != nil {
		return nil, fmt.Errorf("attach lab %s: not up (%w)", name, err)
	}
	if data, err := os.ReadFile(filepath.Join(l.StateDir(), "binary")); err == nil {
		l.Binary = strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile(filepath.Join(l.StateDir(), datapathFile)); err == nil && len(data) > 0 {
		l.Datapath = Datapath(strings.TrimSpace(string(data)))
	}
	return l, nil
}

// datapathFile, in a lab's state directory, names the lab's Datapath.
const datapathFile = "datapath"

// AgentBinary returns the isthmus binary beside the running executable
// (bin/isthmus beside bin/isthmus-lab, as `make build` puts them), or the
// executable itself when it is isthmus: what a lab's agents run when
// Options.Binary is empty. The path may not exist (no `make build`, or a test
// binary): starting an agent then fails naming it.
func AgentBinary() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find isthmus binary: %w", err)
	}
	if filepath.Base(exe) == "isthmus" {
		return exe, nil
	}
	return filepath.Join(filepath.Dir(exe), "isthmus"), nil
}
