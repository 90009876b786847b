package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
)

// OverlayMark is the skb->mark bit the datapath sets on every pod packet it hands to
// the stack (OVERLAY_MARK in bpf/lib/stack.h).
const OverlayMark = 0x1000

// KubeProxyMasqMark is kube-proxy's default masquerade bit
// (--iptables-masquerade-bit=14, also its nftables mode's): packets kube-proxy wants
// masqueraded (hairpin, NodePort) are never exempt.
const KubeProxyMasqMark = 0x4000

// ExemptChain is the nat chain the agent owns; POSTROUTING jumps to it first.
const ExemptChain = "ISTHMUS-POSTROUTING"

// Exemption says which of the node's own traffic, beside the pods', keeps its
// addresses in nat POSTROUTING (EnsureMasqueradeExemption).
type Exemption struct {
	// FabricHost, when valid, is the node's tunnel address where its policy
	// rules send traffic from it to the underlay device (it lies in the node's
	// FabricEgress sources: on a bridge CNI it is the bridge's gateway address,
	// the first of the podCIDR). The host's packets from it to remote sites
	// leave by Underlay for the site's gateways, tunnelled by the datapath as
	// they leave (plan.NodePlan.FabricEgress), and no other CNI's MASQUERADE
	// may rewrite them on the way: the answers come back to it.
	FabricHost netip.Addr
	// Underlay is the underlay device's name; used with FabricHost.
	Underlay string
}

// exemptRules are ExemptChain's rules: overlay traffic leaves nat POSTROUTING before
// another CNI's MASQUERADE or SNAT rule sees it. Marked packets are pod traffic the
// datapath handed to the stack; unmarked ones into isthmus0 are pod traffic the stack
// routed into the overlay after kube-proxy's DNAT (a pod to a ClusterIP); and the
// host's own overlay traffic over the site fabric (Exemption.FabricHost).
// kube-proxy's own masquerade mark wins over all.
func exemptRules(ex Exemption) [][]string {
	mask := fmt.Sprintf("%#x/%#x", OverlayMark, OverlayMark|KubeProxyMasqMark)
	notMasq := fmt.Sprintf("%#x/%#x", KubeProxyMasqMark, KubeProxyMasqMark)
	rules := [][]string{
		{"-m", "mark", "--mark", mask, "-m", "comment", "--comment", "isthmus: pod traffic keeps its addresses", "-j", "ACCEPT"},
		{"-o", OverlayDev, "-m", "mark", "!", "--mark", notMasq, "-m", "comment", "--comment", "isthmus: overlay traffic keeps its addresses", "-j", "ACCEPT"},
	}
	if ex.FabricHost.Is4() && ex.Underlay != "" {
		rules = append(rules, []string{"-s", ex.FabricHost.String() + "/32", "-o", ex.Underlay, "-m", "mark", "!", "--mark", notMasq,
			"-m", "comment", "--comment", fabricHostComment, "-j", "ACCEPT"})
	}
	return rules
}

// fabricHostComment names the rule for Exemption.FabricHost, in iptables and nft.
const fabricHostComment = "isthmus: overlay traffic of the host over the site fabric keeps its address"

// EnsureMasqueradeExemption installs, in the iptables nat table of this network
// namespace, ExemptChain with exemptRules and a jump to it at the top of
// POSTROUTING, so no MASQUERADE or SNAT rule of another CNI rewrites overlay traffic
// (DESIGN.md invariants). It is idempotent, and moves the jump back to the top when
// a rule was inserted before it. It needs the iptables command (legacy or nft
// backend: the one the node's other rules use). Where the nft command is present it
// also installs ExemptTable, whose nat chain runs before srcnat and binds overlay
// flows to their own addresses, so rules another CNI writes with nft in a table of
// its own do not rewrite them either (docs/architecture.md). The agent calls it on
// every sync.
func EnsureMasqueradeExemption(ex Exemption) error {
	if err := ensureNFTExemption(ex); err != nil {
		return err
	}
	if err := exemptChain(ex).ensure(); err != nil {
		return err
	}
	if c := exemptChain6(); c.available() {
		return c.ensure()
	}
	return nil
}

// RemoveMasqueradeExemption removes what EnsureMasqueradeExemption installed; what is
// already gone (or no iptables or nft at all) counts as removed.
func RemoveMasqueradeExemption() error {
	return errors.Join(removeNFTExemption(), exemptChain(Exemption{}).remove(), exemptChain6().remove())
}

func exemptChain(ex Exemption) ownedChain {
	return ownedChain{table: "nat", hook: "POSTROUTING", name: ExemptChain, rules: exemptRules(ex)}
}

// exemptChain6 is ExemptChain in ip6tables, for IPv6 pod traffic: the rules of
// exemptRules without the host's fabric address (IPv4).
func exemptChain6() ownedChain {
	return ownedChain{table: "nat", hook: "POSTROUTING", name: ExemptChain, rules: exemptRules(Exemption{}), ipv6: true}
}

// available reports whether c's program is installed and its table exists in the
// kernel: a node without ip6tables, or whose kernel has no IPv6 nat table, has no
// other CNI's IPv6 MASQUERADE rule to keep pod traffic from either.
func (c ownedChain) available() bool {
	if _, err := exec.LookPath(c.command()); err != nil {
		return false
	}
	_, err := c.run("-t", c.table, "-S", c.hook)
	return err == nil
}

// UnderlayFlowMark and OverlayFlowMark mark a flow that entered the node for one
// of the node's own addresses (a NodePort, a hostPort, a host service) on the
// underlay device or on isthmus0: the connection keeps the mark, and every packet
// of the flow, the answers of a pod a DNAT sent it to included, carries it into
// routing. The pods' rules pass over them (KernelRules): PodTable's over a flow
// that entered on the underlay, FabricTable's over both. So such a flow is
// answered, and strict rp_filter checks it, on the device it came in on. Without
// them a peer's host dialling a NodePort whose endpoint is local is dropped by
// strict rp_filter (the pod's traffic to that peer's address goes into isthmus0,
// table 201), and so is a remote pod reaching a gateway-mode member's NodePort
// through the tunnel (its declared pods' traffic to remote sites goes to the
// fabric, table 202).
// They stay clear of the other marks on a node: kube-proxy's 0x4000 and
// 0x8000, portmap's 0x2000 (its hostPort masquerade), OverlayMark, Calico's
// 0xffff0000.
const (
	UnderlayFlowMark = 0x0400
	OverlayFlowMark  = 0x0800
)

// FlowMarkChain is the mangle chain the agent owns; PREROUTING jumps to it first.
const FlowMarkChain = "ISTHMUS-PREROUTING"

// flowMarkRules are FlowMarkChain's rules for the underlay device dev: a new
// connection from dev or isthmus0 to a local address gets that device's mark in
// its conntrack mark, and every packet of a connection with one gets it in
// skb->mark (mangle PREROUTING runs after conntrack and before the nat table's
// DNAT and routing).
func flowMarkRules(dev string) [][]string {
	mark := func(m int) string { return fmt.Sprintf("%#x/%#x", m, m) }
	entered := func(in string, m int) []string {
		return []string{"-i", in, "-m", "addrtype", "--dst-type", "LOCAL", "-m", "conntrack", "--ctstate", "NEW",
			"-m", "comment", "--comment", "isthmus: flows to the node are answered on the device they entered on",
			"-j", "CONNMARK", "--set-xmark", mark(m)}
	}
	both := UnderlayFlowMark | OverlayFlowMark
	return [][]string{
		entered(dev, UnderlayFlowMark),
		entered(OverlayDev, OverlayFlowMark),
		{"-m", "connmark", "!", "--mark", fmt.Sprintf("0x0/%#x", both), "-m", "comment", "--comment", "isthmus: the flow's packets carry its mark",
			"-j", "CONNMARK", "--restore-mark", "--nfmask", fmt.Sprintf("%#x", both), "--ctmask", fmt.Sprintf("%#x", both)},
	}
}

func flowMarkChain(dev string) ownedChain {
	return ownedChain{table: "mangle", hook: "PREROUTING", name: FlowMarkChain, rules: flowMarkRules(dev)}
}

// EnsureFlowMarks installs, in the iptables mangle table of this network
// namespace, FlowMarkChain for the underlay device dev with a jump to it at the
// top of PREROUTING, and sets src_valid_mark on dev and isthmus0, so strict
// rp_filter's reverse lookup for a packet that came on either carries its mark.
// It is idempotent. The agent calls it on every sync, after isthmus0 exists.
func EnsureFlowMarks(dev string) error {
	for _, d := range []string{dev, OverlayDev} {
		if err := WriteSysctl("net/ipv4/conf/"+d+"/src_valid_mark", "1"); err != nil {
			return err
		}
	}
	return flowMarkChain(dev).ensure()
}

// RemoveFlowMarks removes FlowMarkChain and its jump; what is already gone counts
// as removed. src_valid_mark is left as it is.
func RemoveFlowMarks() error {
	return flowMarkChain("").remove()
}

// ownedChain is an iptables chain the agent owns in table, jumped to from the top
// of the built-in chain hook, holding exactly rules; with ipv6, an ip6tables one.
type ownedChain struct {
	table, hook, name string
	rules             [][]string
	ipv6              bool
}

// command is the program that holds c: iptables, or ip6tables.
func (c ownedChain) command() string {
	if c.ipv6 {
		return "ip6tables"
	}
	return "iptables"
}

// run runs c's program with args (iptables -w ...).
func (c ownedChain) run(args ...string) (string, error) {
	return xtables(c.command(), args...)
}

// ensure creates the chain with its rules and the jump at the top of the hook; it
// rewrites a chain that differs and moves the jump back to the top when a rule was
// inserted before it.
func (c ownedChain) ensure() error {
	if !c.current() {
		if _, err := c.run("-t", c.table, "-L", c.name, "-n"); err != nil {
			if _, err := c.run("-t", c.table, "-N", c.name); err != nil {
				return fmt.Errorf("create %s chain %s: %w", c.table, c.name, err)
			}
		}
		if _, err := c.run("-t", c.table, "-F", c.name); err != nil {
			return fmt.Errorf("flush %s chain %s: %w", c.table, c.name, err)
		}
		for _, r := range c.rules {
			if _, err := c.run(append([]string{"-t", c.table, "-A", c.name}, r...)...); err != nil {
				return fmt.Errorf("add rule to %s: %w", c.name, err)
			}
		}
	}
	out, err := c.run("-t", c.table, "-S", c.hook)
	if err != nil {
		return fmt.Errorf("list %s %s: %w", c.table, c.hook, err)
	}
	// Line 0 is the policy (-P HOOK ACCEPT); the first rule follows.
	if lines := strings.Split(out, "\n"); len(lines) > 1 && lines[1] == "-A "+c.hook+" -j "+c.name {
		return nil
	}
	if err := c.deleteJumps(); err != nil {
		return err
	}
	if _, err := c.run("-t", c.table, "-I", c.hook, "1", "-j", c.name); err != nil {
		return fmt.Errorf("insert jump to %s: %w", c.name, err)
	}
	return nil
}

// current reports whether the chain holds exactly c.rules, so a resync that finds
// it so changes nothing.
func (c ownedChain) current() bool {
	out, err := c.run("-t", c.table, "-S", c.name)
	if err != nil || len(strings.Split(strings.TrimSpace(out), "\n")) != len(c.rules)+1 {
		return false
	}
	for _, r := range c.rules {
		if _, err := c.run(append([]string{"-t", c.table, "-C", c.name}, r...)...); err != nil {
			return false
		}
	}
	return true
}

// deleteJumps removes every jump from the hook to the chain.
func (c ownedChain) deleteJumps() error {
	for {
		if _, err := c.run("-t", c.table, "-C", c.hook, "-j", c.name); err != nil {
			return nil // none left
		}
		if _, err := c.run("-t", c.table, "-D", c.hook, "-j", c.name); err != nil {
			return fmt.Errorf("delete jump to %s: %w", c.name, err)
		}
	}
}

// remove deletes the jumps and the chain; what is already gone (or no iptables at
// all) counts as removed.
func (c ownedChain) remove() error {
	if _, err := exec.LookPath(c.command()); err != nil {
		return nil
	}
	if _, err := c.run("-t", c.table, "-L", c.name, "-n"); err != nil {
		return nil
	}
	var errs []error
	if err := c.deleteJumps(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.run("-t", c.table, "-F", c.name); err != nil {
		errs = append(errs, fmt.Errorf("flush %s chain %s: %w", c.table, c.name, err))
	}
	if _, err := c.run("-t", c.table, "-X", c.name); err != nil {
		errs = append(errs, fmt.Errorf("delete %s chain %s: %w", c.table, c.name, err))
	}
	return errors.Join(errs...)
}

// xtables runs cmd (iptables or ip6tables) -w with args and returns its output; a
// failure carries it.
func xtables(cmd string, args ...string) (string, error) {
	out, err := exec.Command(cmd, append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", cmd, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
