package datapath

import (
	"fmt"
	"os/exec"
	"strings"
)

// ExemptTable is the nftables table (family ip) the agent owns. Its nat chain
// runs before every srcnat chain and gives overlay traffic a NAT binding to its
// own addresses, which ends the nat hook for the flow: no later MASQUERADE or SNAT,
// whether written with iptables or with nft in another table, rewrites it.
const ExemptTable = "isthmus"

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
func nftExemptions(ex Exemption) []nftExemption {
	rules := []nftExemption{
		{fmt.Sprintf("meta mark & 0x%08x == 0x%08x", OverlayMark|KubeProxyMasqMark, OverlayMark), "isthmus: pod traffic keeps its addresses"},
		{fmt.Sprintf("oifname %q meta mark & 0x%08x == 0x00000000", OverlayDev, KubeProxyMasqMark), "isthmus: overlay traffic keeps its addresses"},
	}
	if ex.FabricHost.Is4() && ex.Underlay != "" {
		rules = append(rules, nftExemption{fmt.Sprintf("ip saddr %s oifname %q meta mark & 0x%08x == 0x00000000", ex.FabricHost, ex.Underlay, KubeProxyMasqMark), fabricHostComment})
	}
	return rules
}

// nftBind is the verdict of every rule: a source NAT to the packet's own source.
// nft lists it so in a table of family ip (older releases wrote "snat ip to").
const nftBind = "snat to ip saddr"

// nftExemptScript replaces ExemptTable in one transaction (nft -f applies a file
// atomically): the add makes the delete succeed when the table is missing, and no
// packet sees the hook without the chain.
func nftExemptScript(ex Exemption) string {
	var b strings.Builder
	fmt.Fprintf(&b, "add table ip %s\ndelete table ip %s\ntable ip %s {\n\tchain postrouting {\n", ExemptTable, ExemptTable, ExemptTable)
	fmt.Fprintf(&b, "\t\ttype nat hook postrouting priority %s; policy accept;\n", exemptPriority)
	for _, r := range nftExemptions(ex) {
		fmt.Fprintf(&b, "\t\t%s counter %s comment %q\n", r.match, nftBind, r.comment)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// nftExemptCurrent reports whether a listing of ExemptTable (nft list table) has
// its chain at exemptPriority with exactly nftExemptions, each binding to the
// source address.
func nftExemptCurrent(listing string, ex Exemption) bool {
	if !strings.Contains(listing, "type nat hook postrouting priority "+exemptPriority+";") {
		return false
	}
	rules := 0
	for _, line := range strings.Split(listing, "\n") {
		if strings.Contains(line, " comment ") {
			rules++
		}
	}
	if rules != len(nftExemptions(ex)) {
		return false
	}
	for _, r := range nftExemptions(ex) {
		found := false
		for _, line := range strings.Split(listing, "\n") {
			bind := strings.Contains(line, nftBind) || strings.Contains(line, "snat ip to ip saddr")
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

// ensureNFTExemption installs ExemptTable unless it is current. Without the nft
// command it does nothing: the iptables chain still covers rules written through
// iptables, and a node whose CNI writes nftables has nft (docs/architecture.md).
func ensureNFTExemption(ex Exemption) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	if out, err := nft("", "list", "table", "ip", ExemptTable); err == nil && nftExemptCurrent(out, ex) {
		return nil
	}
	if _, err := nft(nftExemptScript(ex), "-f", "-"); err != nil {
		return fmt.Errorf("install nftables table ip %s: %w", ExemptTable, err)
	}
	return nil
}

// removeNFTExemption deletes ExemptTable; a missing table or no nft counts as
// removed.
func removeNFTExemption() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	if _, err := nft("", "list", "table", "ip", ExemptTable); err != nil {
		return nil
	}
	if _, err := nft("", "delete", "table", "ip", ExemptTable); err != nil {
		return fmt.Errorf("delete nftables table ip %s: %w", ExemptTable, err)
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
