package datapath

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// ExemptTable is the nftables table the agent owns, once in family ip and once
// in family ip6 (nftFamilies). Its nat chain runs before every srcnat chain and
// gives overlay traffic a NAT binding to its own addresses, which ends the nat hook
// for the flow: no later MASQUERADE or SNAT, whether written with iptables or with
// nft in another table, rewrites it.
const ExemptTable = "isthmus"

// nftFamilies are the families of ExemptTable: IPv4 and IPv6 pod traffic.
var nftFamilies = []string{"ip", "ip6"}

// exemptPriority is ExemptTable's chain priority: before srcnat (100), where
// iptables' nat POSTROUTING and the nat chains of CNIs run.
const exemptPriority = "srcnat - 10"

// nftExemption is one rule of ExemptTable's chain: the match, then the comment
// that names it.
type nftExemption struct{ match, comment string }

// nftExemptions mirror exemptRules. "snat to ip saddr" binds the flow to its own
// source: the kernel's nat hook calls nat chains in priority order only until one
// sets a binding, so this is what stops the later ones (an accept would not:
// nftables runs every base chain of a hook).
// In family ip6 there is no FabricHost rule (the tunnel address is IPv4).
func nftExemptions(family string, ex Exemption) []nftExemption {
	rules := []nftExemption{
		{fmt.Sprintf("meta mark & 0x%08x == 0x%08x", OverlayMark|KubeProxyMasqMark, OverlayMark), "isthmus: pod traffic keeps its addresses"},
		{fmt.Sprintf("oifname %q meta mark & 0x%08x == 0x00000000", OverlayDev, KubeProxyMasqMark), "isthmus: overlay traffic keeps its addresses"},
	}
	if family == "ip" && ex.FabricHost.Is4() && ex.Underlay != "" {
		rules = append(rules, nftExemption{fmt.Sprintf("ip saddr %s oifname %q meta mark & 0x%08x == 0x00000000", ex.FabricHost, ex.Underlay, KubeProxyMasqMark), fabricHostComment})
	}
	return rules
}

// nftBind is the verdict of every rule in a table of family (ip or ip6): a source
// NAT to the packet's own source, as nft lists it ("snat to ip saddr"; older
// releases wrote "snat ip to ip saddr").
func nftBind(family string) string { return "snat to " + family + " saddr" }

// nftExemptScript replaces ExemptTable of family in one transaction (nft -f applies
// a file atomically): the add makes the delete succeed when the table is missing,
// and no packet sees the hook without the chain.
func nftExemptScript(family string, ex Exemption) string {
	var b strings.Builder
	fmt.Fprintf(&b, "add table %[1]s %[2]s\ndelete table %[1]s %[2]s\ntable %[1]s %[2]s {\n\tchain postrouting {\n", family, ExemptTable)
	fmt.Fprintf(&b, "\t\ttype nat hook postrouting priority %s; policy accept;\n", exemptPriority)
	for _, r := range nftExemptions(family, ex) {
		fmt.Fprintf(&b, "\t\t%s counter %s comment %q\n", r.match, nftBind(family), r.comment)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// nftExemptCurrent reports whether a listing of ExemptTable (nft list table) has
// its chain at exemptPriority with exactly nftExemptions, each binding to the
// source address.
func nftExemptCurrent(listing, family string, ex Exemption) bool {
	if !strings.Contains(listing, "type nat hook postrouting priority "+exemptPriority+";") {
		return false
	}
	rules := 0
	for _, line := range strings.Split(listing, "\n") {
		if strings.Contains(line, " comment ") {
			rules++
		}
	}
	if rules != len(nftExemptions(family, ex)) {
		return false
	}
	for _, r := range nftExemptions(family, ex) {
		found := false
		for _, line := range strings.Split(listing, "\n") {
			bind := strings.Contains(line, nftBind(family)) || strings.Contains(line, "snat "+family+" to "+family+" saddr")
			if strings.Contains(line, r.match) && bind && strings.Contains(line, fmt.Sprintf("comment %q", r.comment)) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ensureNFTExemption installs ExemptTable in each family unless it is current.
// Without the nft command it does nothing: the iptables chain still covers rules
// written through iptables, and a node whose CNI writes nftables has nft
// (docs/architecture.md). A kernel without IPv6 gets no ip6 table (nor has any
// IPv6 masquerade to keep away).
func ensureNFTExemption(ex Exemption) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	for _, family := range nftFamilies {
		if family == "ip6" && !ipv6Kernel() {
			continue
		}
		if out, err := nft("", "list", "table", family, ExemptTable); err == nil && nftExemptCurrent(out, family, ex) {
			continue
		}
		if _, err := nft(nftExemptScript(family, ex), "-f", "-"); err != nil {
			return fmt.Errorf("install nftables table %s %s: %w", family, ExemptTable, err)
		}
	}
	return nil
}

// ipv6Kernel reports whether the kernel has IPv6 (not booted with ipv6.disable=1).
func ipv6Kernel() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}

// removeNFTExemption deletes ExemptTable in each family; a missing table or no nft
// counts as removed.
func removeNFTExemption() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	for _, family := range nftFamilies {
		if _, err := nft("", "list", "table", family, ExemptTable); err != nil {
			continue
		}
		if _, err := nft("", "delete", "table", family, ExemptTable); err != nil {
			return fmt.Errorf("delete nftables table %s %s: %w", family, ExemptTable, err)
		}
	}
	return nil
}

// nft runs nft with args (and stdin, when not empty) and returns its output; a
// failure carries it.
func nft(stdin string, args ...string) (string, error) {
	cmd := exec.Command("nft", args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
