package datapath

import (
	"errors"
	"fmt"
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

// exemptRules are ExemptChain's rules: overlay traffic leaves nat POSTROUTING before
// another CNI's MASQUERADE or SNAT rule sees it. Marked packets are pod traffic the
// datapath handed to the stack; unmarked ones into isthmus0 are pod traffic the stack
// routed into the overlay after kube-proxy's DNAT (a pod to a ClusterIP). kube-proxy's
// own masquerade mark wins over both.
func exemptRules() [][]string {
	mask := fmt.Sprintf("%#x/%#x", OverlayMark, OverlayMark|KubeProxyMasqMark)
	notMasq := fmt.Sprintf("%#x/%#x", KubeProxyMasqMark, KubeProxyMasqMark)
	return [][]string{
		{"-m", "mark", "--mark", mask, "-m", "comment", "--comment", "isthmus: pod traffic keeps its addresses", "-j", "ACCEPT"},
		{"-o", OverlayDev, "-m", "mark", "!", "--mark", notMasq, "-m", "comment", "--comment", "isthmus: overlay traffic keeps its addresses", "-j", "ACCEPT"},
	}
}

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
func EnsureMasqueradeExemption() error {
	if err := ensureNFTExemption(); err != nil {
		return err
	}
	if !exemptChainCurrent() {
		if _, err := iptables("-t", "nat", "-L", ExemptChain, "-n"); err != nil {
			if _, err := iptables("-t", "nat", "-N", ExemptChain); err != nil {
				return fmt.Errorf("create nat chain %s: %w", ExemptChain, err)
			}
		}
		if _, err := iptables("-t", "nat", "-F", ExemptChain); err != nil {
			return fmt.Errorf("flush nat chain %s: %w", ExemptChain, err)
		}
		for _, r := range exemptRules() {
			if _, err := iptables(append([]string{"-t", "nat", "-A", ExemptChain}, r...)...); err != nil {
				return fmt.Errorf("add rule to %s: %w", ExemptChain, err)
			}
		}
	}
	out, err := iptables("-t", "nat", "-S", "POSTROUTING")
	if err != nil {
		return fmt.Errorf("list nat POSTROUTING: %w", err)
	}
	// Line 0 is the policy (-P POSTROUTING ACCEPT); the first rule follows.
	if lines := strings.Split(out, "\n"); len(lines) > 1 && lines[1] == "-A POSTROUTING -j "+ExemptChain {
		return nil
	}
	if err := deleteJumps(); err != nil {
		return err
	}
	if _, err := iptables("-t", "nat", "-I", "POSTROUTING", "1", "-j", ExemptChain); err != nil {
		return fmt.Errorf("insert jump to %s: %w", ExemptChain, err)
	}
	return nil
}

// exemptChainCurrent reports whether ExemptChain holds exactly exemptRules, so a
// resync that finds it so changes nothing.
func exemptChainCurrent() bool {
	out, err := iptables("-t", "nat", "-S", ExemptChain)
	if err != nil || len(strings.Split(strings.TrimSpace(out), "\n")) != len(exemptRules())+1 {
		return false
	}
	for _, r := range exemptRules() {
		if _, err := iptables(append([]string{"-t", "nat", "-C", ExemptChain}, r...)...); err != nil {
			return false
		}
	}
	return true
}

// deleteJumps removes every jump from POSTROUTING to ExemptChain.
func deleteJumps() error {
	for {
		if _, err := iptables("-t", "nat", "-C", "POSTROUTING", "-j", ExemptChain); err != nil {
			return nil // none left
		}
		if _, err := iptables("-t", "nat", "-D", "POSTROUTING", "-j", ExemptChain); err != nil {
			return fmt.Errorf("delete jump to %s: %w", ExemptChain, err)
		}
	}
}

// RemoveMasqueradeExemption removes what EnsureMasqueradeExemption installed; what is
// already gone (or no iptables or nft at all) counts as removed.
func RemoveMasqueradeExemption() error {
	nerr := removeNFTExemption()
	if _, err := exec.LookPath("iptables"); err != nil {
		return nerr
	}
	if _, err := iptables("-t", "nat", "-L", ExemptChain, "-n"); err != nil {
		return nerr
	}
	errs := []error{nerr}
	if err := deleteJumps(); err != nil {
		errs = append(errs, err)
	}
	if _, err := iptables("-t", "nat", "-F", ExemptChain); err != nil {
		errs = append(errs, fmt.Errorf("flush nat chain %s: %w", ExemptChain, err))
	}
	if _, err := iptables("-t", "nat", "-X", ExemptChain); err != nil {
		errs = append(errs, fmt.Errorf("delete nat chain %s: %w", ExemptChain, err))
	}
	return errors.Join(errs...)
}

// iptables runs iptables -w with args and returns its output; a failure carries it.
func iptables(args ...string) (string, error) {
	out, err := exec.Command("iptables", append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
