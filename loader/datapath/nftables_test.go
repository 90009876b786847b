package datapath

import (
	"slices"
	"strings"
	"testing"
)

// nftListing is `nft list table ip isthmus` as nftables 1.0.6 prints it after
// nftExemptScript, with counters (copied from a kernel run of TestAgentKernel).
const nftListing = `table ip isthmus {
	chain postrouting {
		type nat hook postrouting priority srcnat - 10; policy accept;
		meta mark & 0x00005000 == 0x00001000 counter packets 12 bytes 720 snat to ip saddr comment "isthmus: pod traffic keeps its addresses"
		oifname "isthmus0" meta mark & 0x00004000 == 0x00000000 counter packets 0 bytes 0 snat to ip saddr comment "isthmus: overlay traffic keeps its addresses"
	}
}
`

func TestNFTExemptCurrent(t *testing.T) {
	// Current, so a resync leaves the table (and its counters) alone.
	for _, listing := range []string{nftListing, strings.ReplaceAll(nftListing, "snat to", "snat ip to")} {
		if !nftExemptCurrent(listing) {
			t.Errorf("the listing of the installed table is not current:\n%s", listing)
		}
	}
	for name, listing := range map[string]string{
		"priority srcnat, after a CNI's": strings.Replace(nftListing, "srcnat - 10", "srcnat", 1),
		"accept, not a binding":          strings.Replace(nftListing, `bytes 720 snat to ip saddr`, `bytes 720 accept`, 1),
		"a rule's match changed":         strings.Replace(nftListing, "oifname", "iifname", 1),
		"a rule missing":                 strings.Join(slices.DeleteFunc(strings.Split(nftListing, "\n"), func(l string) bool { return strings.Contains(l, "oifname") }), "\n"),
		"another rule added":             strings.Replace(nftListing, "\t}\n}", "\t\tip saddr 10.0.0.0/8 counter masquerade comment \"x\"\n\t}\n}", 1),
		"empty":                          "",
	} {
		if nftExemptCurrent(listing) {
			t.Errorf("%s: taken as current:\n%s", name, listing)
		}
	}
}

func TestNFTExemptScript(t *testing.T) {
	script := nftExemptScript()
	// One file, one transaction: the table is replaced, never missing.
	if !strings.HasPrefix(script, "add table ip isthmus\ndelete table ip isthmus\ntable ip isthmus {") {
		t.Errorf("script does not replace the table in one transaction:\n%s", script)
	}
	for _, r := range nftExemptions() {
		if !strings.Contains(script, r.match+" counter snat to ip saddr comment \""+r.comment+"\"") {
			t.Errorf("script lacks the rule %q:\n%s", r.match, script)
		}
	}
}
