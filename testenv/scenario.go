// Package testenv is the isthmus network-namespace lab: it builds sites, nodes,
// pods and the underlay router between them out of network namespaces and veth
// pairs, writes the Site, SitePeering and Node objects the agents read, starts
// one agent per node, and checks that every pod reaches every other.
//
// A lab is described by a Scenario (YAML, see docs/lab.md). Up builds it, Check
// probes it, Down removes it; Down works from the names alone, so it also cleans
// up after a crashed or interrupted Up.
package testenv

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

//go:embed scenarios/*.yaml
var builtin embed.FS

// Scenario describes one lab: the underlay, the sites with their nodes and
// pods, and the peerings. Unknown fields are errors, so a scenario written for a
// later lab fails loudly here instead of building something else.
type Scenario struct {
	// Name is the scenario's name; it is also the default lab name.
	Name string `json:"name"`
	// VNI is passed to every agent as --vni; 0 leaves the agent's default.
	VNI uint32 `json:"vni,omitempty"`
	// Decap is passed to every agent as --decap (auto, tc or xdp); empty leaves
	// the agent's default.
	Decap string `json:"decap,omitempty"`
	// Underlay describes the network between the nodes.
	Underlay Underlay `json:"underlay,omitempty"`
	// Defaults apply to every node that does not say otherwise.
	Defaults NodeDefaults `json:"defaults,omitempty"`
	// Sites are the sites, each on its own underlay subnet.
	Sites []Site `json:"sites"`
	// Peerings become SitePeering objects.
	Peerings []Peering `json:"peerings,omitempty"`
	// PodWiring says how every pod's veth is wired to its node: PodWiringNeighbour
	// (the default, "") or PodWiringProxyARP.
	PodWiring PodWiring `json:"podWiring,omitempty"`
	// Objects are further manifests (multi-document YAML), written verbatim into
	// the objects directory.
	Objects string `json:"objects,omitempty"`
	// Manifests names a directory of manifests an operator would apply (such as
	// one of examples/), relative to the scenario file. Its *.yaml and *.yml
	// files give the lab its objects verbatim: each Site becomes the Objects of
	// the scenario site of that name, each Node gives the scenario node of that
	// name its address, external address, podCIDRs, labels and annotations, and
	// every other object is appended to Objects. The scenario then says only
	// what a cluster has and the manifests do not: subnets, pods, firewall.
	Manifests string `json:"manifests,omitempty"`
}

// PodWiring is how a pod reaches its gateway, PodGateway, through its veth.
type PodWiring string

const (
	// PodWiringNeighbour (the default) gives each pod a permanent neighbour entry
	// for PodGateway with the host side's MAC, as Cilium does; managed pods of the
	// isthmus datapath are made by the CNI plugin, which wires them the same way.
	PodWiringNeighbour PodWiring = ""
	// PodWiringProxyARP wires every pod as Calico (and Azure CNI in transparent
	// mode) does: the pod resolves PodGateway by ARP, and the host side of its
	// veth, with no address of its own and Calico's MAC ProxyARPMAC, answers by
	// proxy ARP (proxy_arp on, proxy_delay 0). Every pod is made by hand, also with
	// the isthmus datapath: another CNI owns the pods, isthmus only carries them
	// (its agents attach to the host veths by name, as to any pod interface).
	PodWiringProxyARP PodWiring = "proxyArp"
)

// ProxyARPMAC is the MAC of every host-side pod veth with PodWiringProxyARP:
// Calico gives all of them ee:ee:ee:ee:ee:ee.
const ProxyARPMAC = "ee:ee:ee:ee:ee:ee"

// Underlay is the routed network joining the sites: one router namespace with a
// port per node, holding every site's gateway address and answering ARP for each
// site subnet by proxy, as a cloud VPC fabric does.
type Underlay struct {
	// MTU of every underlay link; default 1500.
	MTU int `json:"mtu,omitempty"`
	// Firewall makes the router a stateful firewall between sites: traffic
	// between two ports of one site passes (the site's own fabric), between
	// sites only node-to-node tunnel traffic (UDP 6081, or 4789 for the VXLAN
	// baseline) and ICMP, and replies to it; everything else is dropped and
	// counted (FirewallDrops).
	Firewall bool `json:"firewall,omitempty"`
	// CrossSite says which nodes the firewall lets talk to other sites:
	// CrossSiteAll (the default, every node) or CrossSiteGateways (only the
	// nodes a GatewayPool of the scenario selects, to each other: the members
	// of a site cannot reach another site's underlay at all, which is why
	// gateways exist). Needs Firewall.
	CrossSite string `json:"crossSite,omitempty"`
	// World adds a namespace behind the router standing for the Internet
	// (WorldPrefix, outside every site), with WorldAddr and WorldNoMasqAddr
	// on its interface (see world.go).
	World bool `json:"world,omitempty"`
}

// Values of Underlay.CrossSite.
const (
	CrossSiteAll      = "all"
	CrossSiteGateways = "gateways"
)

// NodeDefaults are per-node settings applied unless a node overrides them.
type NodeDefaults struct {
	// CNILeftovers installs the iptables rules another CNI typically leaves on a
	// node (MASQUERADE of pod blocks, FORWARD policy DROP, conntrack INVALID
	// drops). Default off.
	CNILeftovers Leftovers `json:"cniLeftovers,omitzero"`
}

// Leftovers are the iptables rules another CNI leaves on a node. In YAML it is
// either a bool (on with the default rules, or off) or an object, which turns
// them on and may replace the MASQUERADE rules:
//
//	cniLeftovers: true
//	cniLeftovers: {masquerade: "-s 10.16.0.0/12 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully"}
type Leftovers struct {
	// On installs the rules.
	On bool `json:"-"`
	// Masquerade, when set, is the one nat POSTROUTING rule installed (iptables
	// arguments after `-A POSTROUTING`, split on blanks) instead of one
	// `-s <block> ! -d 224.0.0.0/4 -j MASQUERADE` per pod block: for example
	// flannel's rule, exactly as a report quotes it.
	Masquerade string `json:"masquerade,omitempty"`
}

// UnmarshalJSON reads a bool or an object with the fields of Leftovers; unknown
// fields are errors.
func (lo *Leftovers) UnmarshalJSON(data []byte) error {
	var on bool
	if err := json.Unmarshal(data, &on); err == nil {
		*lo = Leftovers{On: on}
		return nil
	}
	type plain Leftovers
	var v plain
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("cniLeftovers: want true, false or {masquerade: RULE}: %w", err)
	}
	*lo = Leftovers(v)
	lo.On = true
	return nil
}

// MarshalJSON writes a bool when the rules are the default ones.
func (lo Leftovers) MarshalJSON() ([]byte, error) {
	if !lo.On || lo.Masquerade == "" {
		return json.Marshal(lo.On)
	}
	type plain Leftovers
	return json.Marshal(plain(lo))
}

// Site is one site: an underlay subnet, its nodes, and its Site object given
// either as a spec (the lab wraps it) or as raw manifests.
type Site struct {
	// Name names the Site object.
	Name string `json:"name"`
	// Subnet is the site's underlay subnet; the router takes Gateway in it.
	// IPv4, or IPv6 for a site on the IPv6 underlay (its nodes then have no
	// IPv4 underlay address at all); every site of a scenario is of one
	// family.
	Subnet netip.Prefix `json:"subnet"`
	// Gateway is the router's address in Subnet; default its first address.
	Gateway netip.Addr `json:"gateway,omitzero"`
	// Spec, when set, becomes the spec of a Site object named Name, verbatim.
	Spec json.RawMessage `json:"spec,omitempty"`
	// Objects are raw manifests for this site (for example a user's Site pasted
	// from a report), written verbatim. Pod blocks for the CNI leftover rules are
	// read from every Site in them.
	Objects string `json:"objects,omitempty"`
	// FabricRoutes makes the underlay route every node's podCIDRs to that node,
	// as a cloud route table does. Unmanaged pods are always routed.
	FabricRoutes bool `json:"fabricRoutes,omitempty"`
	// BehindNAT, when set, puts the site behind a many-to-one NAT, as a branch
	// office's or a home router, or a CGNAT: the router masquerades everything
	// the site sends to the other sites to this public address (random ports)
	// and lets in nothing the site did not open. It must lie outside every site
	// subnet.
	BehindNAT netip.Addr `json:"behindNAT,omitzero"`
	// Nodes are the site's nodes.
	Nodes []Node `json:"nodes"`
}

// Node is one node: a namespace with the underlay eth0, its pods and an agent.
type Node struct {
	Name string `json:"name"`
	// Address is the node's underlay address (its InternalIP), in the site's
	// subnet: IPv6 on an IPv6 underlay, where the agent runs GENEVE over IPv6.
	Address netip.Addr `json:"address"`
	// PodCIDR is shorthand for a single entry of PodCIDRs.
	PodCIDR netip.Prefix `json:"podCIDR,omitzero"`
	// PodCIDRs become spec.podCIDRs (spec.podCIDR is the first); empty for a
	// node whose pods another CNI addresses.
	PodCIDRs []netip.Prefix `json:"podCIDRs,omitempty"`
	// Labels become the Node's labels.
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations become the Node's annotations, for example
	// isthmus.dev/tunnel-ipv4 for a node without a podCIDR.
	Annotations map[string]string `json:"annotations,omitempty"`
	// ExternalAddress, when set, is the node's public address in front of a
	// 1:1 NAT (a cloud public IP): the router translates it to Address for
	// packets coming in and Address to it for packets leaving the site, and the
	// Node gets it as ExternalIP. It must lie outside every site subnet.
	ExternalAddress netip.Addr `json:"externalAddress,omitzero"`
	// CNILeftovers overrides Defaults.CNILeftovers for this node.
	CNILeftovers *Leftovers `json:"cniLeftovers,omitempty"`
	// Pods are the node's pods.
	Pods []Pod `json:"pods,omitempty"`
}

// Pod is one pod: a namespace with eth0 (address/32, and address6/128 when
// set) wired to the node by a veth whose host side is HostVeth: pod-<hash>, or
// azv-<name> for an unmanaged pod.
type Pod struct {
	Name    string     `json:"name"`
	Address netip.Addr `json:"address"`
	// Address6, when set, is the pod's IPv6 address, as a dual-stack node's
	// CNI gives it: a global unicast address inside one of the node's IPv6
	// podCIDRs. Managed pods only (another CNI's pods are IPv4 only in the
	// lab).
	Address6 netip.Addr `json:"address6,omitzero"`
	// Unmanaged marks a pod addressed by another CNI from a site-wide pool: its
	// address need not be in the node's podCIDRs, the underlay routes it (/32) to
	// the node, and its host veth is named as Azure CNI names them (azv-<name>),
	// outside the pattern of isthmus' own pods.
	Unmanaged bool `json:"unmanaged,omitempty"`
	// MTU of the pod's veth (both ends); default the underlay MTU less the
	// tunnels' overhead (GeneveOverhead, and WireGuard's 60 bytes where the
	// site's tunnels are encrypted: Scenario.PodMTU).
	// The underlay MTU itself stands for a pod of another CNI that knows nothing of
	// the tunnel and relies on the datapath's ICMP and MSS clamping.
	MTU int `json:"mtu,omitempty"`
	// Ingress is a NetworkPolicy of the shape Calico writes in policy-only mode: on
	// the pod's node, FORWARD rules for the pod's host interface (-o <if>) that
	// accept the sources in Allow and drop those in Deny, before any other rule.
	Ingress *Policy `json:"ingress,omitempty"`
	// Egress is the same for what the pod sends (-i <if>), by destination.
	Egress *Policy `json:"egress,omitempty"`
}

// Policy says which peers a pod may reach (Egress: destinations) or be reached
// from (Ingress: sources) through its node's FORWARD chain, for flows conntrack does
// not already hold. Allow is checked first; a peer in neither passes on to the
// node's other rules.
type Policy struct {
	Allow []netip.Prefix `json:"allow,omitempty"`
	Deny  []netip.Prefix `json:"deny,omitempty"`
}

// PodMTU returns the MTU of pod p of site: its own, else the underlay MTU less
// what the site's tunnels add, as the CNI plugin gives its pods
// (plan.TunnelOverheadOf): GeneveOverhead over an IPv4 underlay,
// GeneveOverhead6 over an IPv6 one; where a peering or assignment encrypts the
// site's tunnels, GeneveOverhead (GENEVE between IPv4 tunnel addresses) plus
// WireGuardOverhead, or WireGuardOverhead6 over an IPv6 underlay.
func (s *Scenario) PodMTU(site string, p Pod) int {
	if p.MTU != 0 {
		return p.MTU
	}
	v6 := slices.ContainsFunc(s.Sites, func(x Site) bool { return x.Name == site && x.Is6() })
	overhead := GeneveOverhead
	if v6 {
		overhead = GeneveOverhead6
	}
	if files, err := s.ObjectFiles(); err == nil {
		if set, _ := objects.LoadSettingAside(files); set.SiteEncrypted(site) {
			overhead = GeneveOverhead + WireGuardOverhead
			if v6 {
				overhead = GeneveOverhead + WireGuardOverhead6
			}
		}
	}
	return s.Underlay.mtu() - overhead
}

// Peering becomes a SitePeering object.
type Peering struct {
	Name  string   `json:"name"`
	Sites []string `json:"sites"`
	// MeshNodes is written as spec.meshNodes when set.
	MeshNodes *bool `json:"meshNodes,omitempty"`
	// Encryption is written as spec.encryption when set (None, WireGuard).
	Encryption string `json:"encryption,omitempty"`
}

// Leftovers returns the CNI leftover rules of node n: its own, else the
// scenario's default.
func (s *Scenario) Leftovers(n *Node) Leftovers {
	if n.CNILeftovers != nil {
		return *n.CNILeftovers
	}
	return s.Defaults.CNILeftovers
}

// MTU returns the underlay MTU with its default applied.
func (u Underlay) mtu() int {
	if u.MTU == 0 {
		return 1500
	}
	return u.MTU
}

// PodRef is a pod with the node and site it sits on.
type PodRef struct {
	Pod
	Node string
	Site string
}

// Pods lists every pod of the scenario in scenario order.
func (s *Scenario) Pods() []PodRef {
	var out []PodRef
	for _, site := range s.Sites {
		for _, n := range site.Nodes {
			for _, p := range n.Pods {
				out = append(out, PodRef{Pod: p, Node: n.Name, Site: site.Name})
			}
		}
	}
	return out
}

// NodeRef is a node with the site it belongs to.
type NodeRef struct {
	Node
	Site *Site
}

// Nodes lists every node of the scenario in scenario order.
func (s *Scenario) Nodes() []NodeRef {
	var out []NodeRef
	for i := range s.Sites {
		for _, n := range s.Sites[i].Nodes {
			out = append(out, NodeRef{Node: n, Site: &s.Sites[i]})
		}
	}
	return out
}

// ParseScenario parses and validates a scenario. A Manifests directory is
// read relative to the working directory.
func ParseScenario(data []byte) (*Scenario, error) {
	return parseScenario(data, ".")
}

// parseScenario parses and validates a scenario whose Manifests directory is
// relative to dir.
func parseScenario(data []byte, dir string) (*Scenario, error) {
	var s Scenario
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return nil, fmt.Errorf("parse scenario: %w", err)
	}
	if s.Manifests != "" {
		mdir := s.Manifests
		if !filepath.IsAbs(mdir) {
			mdir = filepath.Join(dir, mdir)
		}
		if err := s.mergeManifests(mdir); err != nil {
			return nil, fmt.Errorf("scenario %q: manifests %s: %w", s.Name, s.Manifests, err)
		}
	}
	for i := range s.Sites {
		site := &s.Sites[i]
		if !site.Gateway.IsValid() && site.Subnet.IsValid() {
			site.Gateway = site.Subnet.Masked().Addr().Next()
		}
		for j := range site.Nodes {
			n := &site.Nodes[j]
			if n.PodCIDR.IsValid() && !slices.Contains(n.PodCIDRs, n.PodCIDR) {
				n.PodCIDRs = append([]netip.Prefix{n.PodCIDR}, n.PodCIDRs...)
			}
			n.PodCIDR = netip.Prefix{}
		}
	}
	if err := s.validate(); err != nil {
		return nil, fmt.Errorf("scenario %q: %w", s.Name, err)
	}
	return &s, nil
}

// LoadScenario reads a scenario from a file path, or, when nameOrPath names no
// file and has no slash, the built-in scenario of that name.
func LoadScenario(nameOrPath string) (*Scenario, error) {
	data, err := os.ReadFile(nameOrPath)
	if err == nil {
		return parseScenario(data, filepath.Dir(nameOrPath))
	}
	if !os.IsNotExist(err) || strings.ContainsRune(nameOrPath, '/') {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	data, err = builtin.ReadFile(path.Join("scenarios", strings.TrimSuffix(nameOrPath, ".yaml")+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("load scenario %q: no such file and no built-in (have %s)", nameOrPath, strings.Join(Builtins(), ", "))
	}
	return ParseScenario(data)
}

// Builtins lists the names of the embedded scenarios.
func Builtins() []string {
	ents, _ := builtin.ReadDir("scenarios")
	var names []string
	for _, e := range ents {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	return names
}

// Name limits keep every interface name within the kernel's 15 characters:
// n-<node> (router side of a node's underlay veth), pod-<pod>; site names are
// kept as short for readable tables.
const (
	maxSiteName = 12
	maxNodeName = 15 - len("n-")
	maxPodName  = 15 - len("pod-")
	// MaxLabName keeps namespace names short and lab prefixes unambiguous
	// (no dash, so isl-<lab>- never prefixes another lab's names).
	MaxLabName = 12
)

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	labNameRE = regexp.MustCompile(`^[a-z0-9]+$`)
	// reserved are namespace suffixes the lab uses itself.
	reserved = []string{"rt", "fw", WorldMember}
)

// ValidateLabName checks that name can prefix a lab's namespaces.
func ValidateLabName(name string) error {
	if !labNameRE.MatchString(name) || len(name) > MaxLabName {
		return fmt.Errorf("lab name %q: want 1-%d characters of [a-z0-9]", name, MaxLabName)
	}
	return nil
}

func checkName(kind, name string, max int) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%s name %q: want lower-case letters, digits and inner dashes", kind, name)
	}
	if len(name) > max {
		return fmt.Errorf("%s name %q: longer than %d characters (interface names are limited to 15)", kind, name, max)
	}
	return nil
}

func (s *Scenario) validate() error {
	if s.Name == "" {
		return fmt.Errorf("name: missing")
	}
	if s.Underlay.MTU != 0 && (s.Underlay.MTU < 1280 || s.Underlay.MTU > 9000) {
		return fmt.Errorf("underlay.mtu %d: want 1280-9000", s.Underlay.MTU)
	}
	switch s.Decap {
	case "", "auto", "tc", "xdp":
	default:
		return fmt.Errorf("decap %q: want auto, tc or xdp", s.Decap)
	}
	if s.VNI >= 1<<24 {
		return fmt.Errorf("vni %d: does not fit 24 bits", s.VNI)
	}
	switch s.PodWiring {
	case PodWiringNeighbour, PodWiringProxyARP:
	default:
		return fmt.Errorf("podWiring %q: want %s or none", s.PodWiring, PodWiringProxyARP)
	}
	if len(s.Sites) == 0 {
		return fmt.Errorf("sites: none")
	}
	nsNames := map[string]string{}
	for _, r := range reserved {
		nsNames[r] = "reserved by the lab"
	}
	claim := func(name, what string) error {
		if prev, ok := nsNames[name]; ok {
			return fmt.Errorf("%s: name %q already used (%s)", what, name, prev)
		}
		nsNames[name] = what
		return nil
	}
	addrs := map[netip.Addr]string{}
	claimAddr := func(a netip.Addr, what string) error {
		if prev, ok := addrs[a]; ok {
			return fmt.Errorf("%s: address %s already used by %s", what, a, prev)
		}
		addrs[a] = what
		return nil
	}
	siteNames := map[string]bool{}
	for i, site := range s.Sites {
		where := fmt.Sprintf("sites[%d] %q", i, site.Name)
		if err := checkName("site", site.Name, maxSiteName); err != nil {
			return fmt.Errorf("sites[%d]: %w", i, err)
		}
		if siteNames[site.Name] {
			return fmt.Errorf("%s: duplicate site", where)
		}
		siteNames[site.Name] = true
		if !site.Subnet.IsValid() {
			return fmt.Errorf("%s: subnet: want an IPv4 or IPv6 prefix", where)
		}
		if a := site.Subnet.Addr(); a.Is6() && (a.Is4In6() || a.Zone() != "" || !a.IsGlobalUnicast()) {
			return fmt.Errorf("%s: subnet %s: want an IPv4 prefix or an IPv6 global unicast one (not link-local, multicast or IPv4-mapped)", where, site.Subnet)
		}
		if site.Subnet != site.Subnet.Masked() {
			return fmt.Errorf("%s: subnet %s is not canonical (want %s)", where, site.Subnet, site.Subnet.Masked())
		}
		if first := s.Sites[0]; site.Is6() != first.Is6() {
			return fmt.Errorf("%s: subnet %s is %s and site %q's %s is %s: every site's subnet must be of one family "+
				"(a node reaches only peers on its own underlay family, so the pods of the two would not talk)",
				where, site.Subnet, family(site.Is6()), first.Name, first.Subnet, family(first.Is6()))
		}
		if site.Is6() {
			if err := site.validateUnderlay6(); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		for _, other := range s.Sites[:i] {
			if other.Subnet.Overlaps(site.Subnet) {
				return fmt.Errorf("%s: subnet %s overlaps site %q's %s", where, site.Subnet, other.Name, other.Subnet)
			}
		}
		if !site.Subnet.Contains(site.Gateway) {
			return fmt.Errorf("%s: gateway %s not in subnet %s", where, site.Gateway, site.Subnet)
		}
		if err := claimAddr(site.Gateway, where+" gateway"); err != nil {
			return err
		}
		if nat := site.BehindNAT; nat.IsValid() {
			if !nat.Is4() {
				return fmt.Errorf("%s: behindNAT %s: want IPv4", where, nat)
			}
			for _, other := range s.Sites {
				if other.Subnet.Contains(nat) {
					return fmt.Errorf("%s: behindNAT %s inside site %q's subnet %s (want a public address outside every site)", where, nat, other.Name, other.Subnet)
				}
			}
			if err := claimAddr(nat, where+" behindNAT"); err != nil {
				return err
			}
		}
		if len(site.Spec) == 0 && site.Objects == "" {
			return fmt.Errorf("%s: want spec or objects (the Site object)", where)
		}
		if _, err := site.podBlocks(); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		for j, n := range site.Nodes {
			nwhere := fmt.Sprintf("%s nodes[%d] %q", where, j, n.Name)
			if err := checkName("node", n.Name, maxNodeName); err != nil {
				return fmt.Errorf("%s: %w", nwhere, err)
			}
			if err := claim(n.Name, "node of site "+site.Name); err != nil {
				return fmt.Errorf("%s: %w", nwhere, err)
			}
			if !site.Subnet.Contains(n.Address) {
				return fmt.Errorf("%s: address %s not in site subnet %s", nwhere, n.Address, site.Subnet)
			}
			if site.Is6() && n.Address == site.Subnet.Addr() {
				return fmt.Errorf("%s: address %s is the subnet's Subnet-Router anycast address", nwhere, n.Address)
			}
			if !site.Is6() && (n.Address == site.Subnet.Addr() || n.Address == lastAddr(site.Subnet)) {
				return fmt.Errorf("%s: address %s is the subnet's network or broadcast address", nwhere, n.Address)
			}
			if err := claimAddr(n.Address, "node "+n.Name); err != nil {
				return fmt.Errorf("%s: %w", nwhere, err)
			}
			if ext := n.ExternalAddress; ext.IsValid() && site.BehindNAT.IsValid() {
				return fmt.Errorf("%s: externalAddress %s in a site behind a NAT (behindNAT %s)", nwhere, ext, site.BehindNAT)
			}
			if ext := n.ExternalAddress; ext.IsValid() {
				if !ext.Is4() {
					return fmt.Errorf("%s: externalAddress %s: want IPv4", nwhere, ext)
				}
				for _, other := range s.Sites {
					if other.Subnet.Contains(ext) {
						return fmt.Errorf("%s: externalAddress %s inside site %q's subnet %s (want a public address outside every site)", nwhere, ext, other.Name, other.Subnet)
					}
				}
				if err := claimAddr(ext, "external address of node "+n.Name); err != nil {
					return fmt.Errorf("%s: %w", nwhere, err)
				}
			}
			if v, ok := n.Annotations[TunnelAnnotation]; ok {
				if a, err := netip.ParseAddr(v); err != nil || !a.Is4() {
					return fmt.Errorf("%s: annotation %s %q: want an IPv4 address", nwhere, TunnelAnnotation, v)
				}
			}
			for k, p := range n.PodCIDRs {
				if p != p.Masked() {
					return fmt.Errorf("%s: podCIDRs[%d] %s is not canonical (want %s)", nwhere, k, p, p.Masked())
				}
				if a := p.Addr(); a.Is6() && (a.Is4In6() || !a.IsGlobalUnicast()) {
					return fmt.Errorf("%s: podCIDRs[%d] %s: want an IPv6 global unicast prefix (not link-local, multicast or IPv4-mapped)", nwhere, k, p)
				}
			}
			// A dual-stack node has an IPv4 podCIDR beside its IPv6 ones: the
			// underlay, the tunnel addresses and every pod's address are IPv4.
			if len(n.PodCIDRs) > 0 && !slices.ContainsFunc(n.PodCIDRs, func(c netip.Prefix) bool { return c.Addr().Is4() }) {
				return fmt.Errorf("%s: podCIDRs %v: IPv6 only (want an IPv4 podCIDR too: every pod of the lab has an IPv4 address and every node an IPv4 tunnel address, IPv6 rides beside)", nwhere, n.PodCIDRs)
			}
			for k, p := range n.Pods {
				pwhere := fmt.Sprintf("%s pods[%d] %q", nwhere, k, p.Name)
				if err := checkName("pod", p.Name, maxPodName); err != nil {
					return fmt.Errorf("%s: %w", pwhere, err)
				}
				if err := claim(p.Name, "pod on node "+n.Name); err != nil {
					return fmt.Errorf("%s: %w", pwhere, err)
				}
				if !p.Address.Is4() {
					return fmt.Errorf("%s: address: want IPv4", pwhere)
				}
				if p.MTU != 0 && (p.MTU < 576 || p.MTU > 9000) {
					return fmt.Errorf("%s: mtu %d: want 576-9000", pwhere, p.MTU)
				}
				if !p.Unmanaged && !slices.ContainsFunc(n.PodCIDRs, func(c netip.Prefix) bool { return c.Contains(p.Address) }) {
					return fmt.Errorf("%s: address %s not in the node's podCIDRs %v (mark the pod unmanaged if another CNI addresses it)", pwhere, p.Address, n.PodCIDRs)
				}
				if err := claimAddr(p.Address, "pod "+p.Name); err != nil {
					return fmt.Errorf("%s: %w", pwhere, err)
				}
				if err := n.validateAddress6(p); err != nil {
					return fmt.Errorf("%s: %w", pwhere, err)
				}
				if p.Address6.IsValid() {
					if err := claimAddr(p.Address6, "pod "+p.Name); err != nil {
						return fmt.Errorf("%s: %w", pwhere, err)
					}
				}
			}
		}
	}
	if s.Underlay6() && s.Underlay.World {
		return fmt.Errorf("underlay.world: the world and egress masquerade to it are IPv4 only, and the sites' subnets are IPv6")
	}
	peerNames := map[string]bool{}
	for i, p := range s.Peerings {
		where := fmt.Sprintf("peerings[%d] %q", i, p.Name)
		if !nameRE.MatchString(p.Name) {
			return fmt.Errorf("%s: want a lower-case name", where)
		}
		if peerNames[p.Name] {
			return fmt.Errorf("%s: duplicate peering", where)
		}
		peerNames[p.Name] = true
		if len(p.Sites) < 2 {
			return fmt.Errorf("%s: want at least two sites", where)
		}
		for _, sn := range p.Sites {
			if !siteNames[sn] {
				return fmt.Errorf("%s: unknown site %q", where, sn)
			}
		}
	}
	if _, err := splitDocs(s.Objects); err != nil {
		return fmt.Errorf("objects: %w", err)
	}
	return s.validateGateways()
}

// validateAddress6 checks pod p's Address6 on node n: a global unicast IPv6
// address (no zone, not IPv4-mapped) of a managed pod, inside one of the
// node's IPv6 podCIDRs. No Address6 is fine.
func (n *Node) validateAddress6(p Pod) error {
	a := p.Address6
	if !a.IsValid() {
		return nil
	}
	if p.Unmanaged {
		return fmt.Errorf("address6 %s: unmanaged pods are IPv4 only", a)
	}
	if !a.Is6() || a.Is4In6() || a.Zone() != "" || !a.IsGlobalUnicast() {
		return fmt.Errorf("address6 %s: want an IPv6 global unicast address (not link-local, multicast or IPv4-mapped, no zone)", a)
	}
	var v6 []netip.Prefix
	for _, c := range n.PodCIDRs {
		if c.Addr().Is6() {
			v6 = append(v6, c)
		}
	}
	if len(v6) == 0 {
		return fmt.Errorf("address6 %s: the node has no IPv6 podCIDR (podCIDRs %v)", a, n.PodCIDRs)
	}
	if !slices.ContainsFunc(v6, func(c netip.Prefix) bool { return c.Contains(a) }) {
		return fmt.Errorf("address6 %s not in the node's IPv6 podCIDRs %v", a, v6)
	}
	return nil
}

// Is6 reports whether the site's underlay is IPv6: its subnet, gateway and
// node addresses are IPv6 and its nodes have no IPv4 underlay address at all.
func (site *Site) Is6() bool { return site.Subnet.Addr().Is6() }

// Underlay6 reports whether the scenario's underlay is IPv6 (every site's
// subnet is of one family).
func (s *Scenario) Underlay6() bool { return len(s.Sites) > 0 && s.Sites[0].Is6() }

// family names the underlay family for messages.
func family(is6 bool) string {
	if is6 {
		return "IPv6"
	}
	return "IPv4"
}

// validateUnderlay6 refuses, on a site of an IPv6 underlay, what the lab
// builds for an IPv4 underlay only: the NAT in front of a site or a node (the
// router's NAT rules are IPv4), and the site fabric's routes to pods (a site
// of another CNI, its unmanaged pods, fabricRoutes: the fabric routes IPv4
// pods to an IPv4 node address).
func (site *Site) validateUnderlay6() error {
	const why = "the lab builds it for an IPv4 underlay only, and the subnet %s is IPv6"
	if site.BehindNAT.IsValid() {
		return fmt.Errorf("behindNAT %s: "+why, site.BehindNAT, site.Subnet)
	}
	if site.FabricRoutes {
		return fmt.Errorf("fabricRoutes: "+why, site.Subnet)
	}
	if site.semantics().unmanaged {
		return fmt.Errorf("manageCniPlugin: false (a site of another CNI, whose pods the fabric routes): "+why, site.Subnet)
	}
	for _, n := range site.Nodes {
		if n.ExternalAddress.IsValid() {
			return fmt.Errorf("node %q: externalAddress %s (a 1:1 NAT in the router): "+why, n.Name, n.ExternalAddress, site.Subnet)
		}
		for _, p := range n.Pods {
			if p.Unmanaged {
				return fmt.Errorf("node %q: pod %q: unmanaged (routed by the site fabric): "+why, n.Name, p.Name, site.Subnet)
			}
		}
	}
	return nil
}

// lastAddr returns the last address of the IPv4 prefix p (its broadcast
// address).
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// siteFields are the parts of a Site spec the lab itself needs.
type siteFields struct {
	PodCIDRAssignments []struct {
		CIDRBlocks []string `json:"cidrBlocks"`
	} `json:"podCidrAssignments"`
}

// podBlocks returns the site's declared pod blocks: every cidrBlocks entry of
// the embedded spec and of each Site in Objects.
func (site *Site) podBlocks() ([]netip.Prefix, error) {
	var specs []json.RawMessage
	if len(site.Spec) > 0 {
		specs = append(specs, site.Spec)
	}
	docs, err := splitDocs(site.Objects)
	if err != nil {
		return nil, fmt.Errorf("objects: %w", err)
	}
	for _, d := range docs {
		if d.Kind == "Site" {
			specs = append(specs, d.Spec)
		}
	}
	var out []netip.Prefix
	for _, raw := range specs {
		var f siteFields
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, fmt.Errorf("read site spec: %w", err)
		}
		for _, a := range f.PodCIDRAssignments {
			for _, b := range a.CIDRBlocks {
				p, err := netip.ParsePrefix(b)
				if err != nil {
					return nil, fmt.Errorf("podCidrAssignments cidrBlocks: %w", err)
				}
				if !slices.Contains(out, p.Masked()) {
					out = append(out, p.Masked())
				}
			}
		}
	}
	return out, nil
}

// PodBlocks returns every pod block of the scenario, in both families: the
// sites' declared blocks, and the nodes' podCIDRs and pods' addresses not
// inside one of them.
func (s *Scenario) PodBlocks() []netip.Prefix {
	var out []netip.Prefix
	add := func(p netip.Prefix) {
		for _, have := range out {
			if have.Bits() <= p.Bits() && have.Contains(p.Addr()) {
				return
			}
		}
		out = append(out, p)
	}
	for i := range s.Sites {
		blocks, _ := s.Sites[i].podBlocks() // validated
		for _, b := range blocks {
			add(b)
		}
	}
	for _, n := range s.Nodes() {
		for _, c := range n.PodCIDRs {
			add(c)
		}
		for _, p := range n.Pods {
			add(netip.PrefixFrom(p.Address, 32))
			if p.Address6.IsValid() {
				add(netip.PrefixFrom(p.Address6, 128))
			}
		}
	}
	return out
}

// PodBlocks4 returns the IPv4 ones of PodBlocks: what the lab's iptables rules
// (the CNI leftovers) cover.
func (s *Scenario) PodBlocks4() []netip.Prefix {
	return slices.DeleteFunc(s.PodBlocks(), func(p netip.Prefix) bool { return !p.Addr().Is4() })
}

// manifest is the head of one YAML document.
type manifest struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
	Raw  []byte          `json:"-"`
}

// splitDocs splits multi-document YAML and reads each document's kind.
func splitDocs(s string) ([]manifest, error) {
	var out []manifest
	for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(s, -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var m manifest
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if m.Kind == "" {
			return nil, fmt.Errorf("document %d: no kind", i)
		}
		m.Raw = []byte(doc)
		out = append(out, m)
	}
	return out, nil
}
