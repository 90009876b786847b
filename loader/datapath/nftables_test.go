package datapath

import (
	"net/netip"
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
		if !nftExemptCurrent(listing, "ip", Exemption{}) {
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
		if nftExemptCurrent(listing, "ip", Exemption{}) {
			t.Errorf("%s: taken as current:\n%s", name, listing)
		}
	}
}

func TestNFTExemptScript(t *testing.T) {
	for _, family := range nftFamilies {
		script := nftExemptScript(family, Exemption{})
		// One file, one transaction: the table is replaced, never missing.
		head := "add table " + family + " isthmus\ndelete table " + family + " isthmus\ntable " + family + " isthmus {"
		if !strings.HasPrefix(script, head) {
			t.Errorf("%s: script does not replace the table in one transaction:\n%s", family, script)
		}
		for _, r := range nftExemptions(family, Exemption{}) {
			if !strings.Contains(script, r.match+" counter snat to "+family+" saddr comment \""+r.comment+"\"") {
				t.Errorf("%s: script lacks the rule %q:\n%s", family, r.match, script)
			}
		}
	}
	// The ip6 table as nftables lists it is current for family ip6, not for ip.
	listing6 := strings.ReplaceAll(strings.ReplaceAll(nftListing, "table ip ", "table ip6 "), "snat to ip saddr", "snat to ip6 saddr")
	if !nftExemptCurrent(listing6, "ip6", Exemption{}) || nftExemptCurrent(listing6, "ip", Exemption{}) {
		t.Errorf("the ip6 listing is not current for ip6 only:\n%s", listing6)
	}
}

// TestNFTExemptCurrentFabricHost: with a FabricHost the table holds a third rule
// for the host's traffic from it out of the underlay device (as nftables prints
// it); a listing without that rule, or with another address or device, is not
// current, and one with it is not current for a node without a FabricHost.
func TestNFTExemptCurrentFabricHost(t *testing.T) {
	ex := Exemption{FabricHost: netip.MustParseAddr("10.16.2.1"), Underlay: "eth0"}
	withHost := strings.Replace(nftListing, "\t}\n}", "\t\tip saddr 10.16.2.1 oifname \"eth0\" meta mark & 0x00004000 == 0x00000000 counter packets 3 bytes 180 snat to ip saddr comment \""+fabricHostComment+"\"\n\t}\n}", 1)
	if !nftExemptCurrent(withHost, "ip", ex) {
		t.Errorf("the listing of the installed table is not current for %+v:\n%s", ex, withHost)
	}
	for name, c := range map[string]struct {
		listing string
		ex      Exemption
	}{
		"the rule missing":       {nftListing, ex},
		"another address":        {withHost, Exemption{FabricHost: netip.MustParseAddr("10.16.3.1"), Underlay: "eth0"}},
		"another device":         {withHost, Exemption{FabricHost: ex.FabricHost, Underlay: "ens5"}},
		"no FabricHost any more": {withHost, Exemption{Underlay: "eth0"}},
	} {
		if nftExemptCurrent(c.listing, "ip", c.ex) {
			t.Errorf("%s: taken as current for %+v:\n%s", name, c.ex, c.listing)
		}
	}
	if rules := nftExemptions("ip", Exemption{FabricHost: netip.MustParseAddr("fd00::1"), Underlay: "eth0"}); len(rules) != 2 {
		t.Errorf("an IPv6 FabricHost gave rules %v in an ip-family table", rules)
	}
	if rules := nftExemptions("ip6", ex); len(rules) != 2 {
		t.Errorf("the IPv4 FabricHost gave rules %v in an ip6-family table", rules)
	}
}

// TestExemptRulesFabricHost: the iptables chain gets the same third rule, with
// the address as a /32 (as iptables -S prints it, so the chain reads as
// current), the underlay device, and kube-proxy's masquerade mark still winning.
func TestExemptRulesFabricHost(t *testing.T) {
	if n := len(exemptRules(Exemption{Underlay: "eth0"})); n != 2 {
		t.Fatalf("%d rules without a FabricHost, want 2", n)
	}
	rules := exemptRules(Exemption{FabricHost: netip.MustParseAddr("10.16.2.1"), Underlay: "eth0"})
	if len(rules) != 3 {
		t.Fatalf("%d rules, want 3", len(rules))
	}
	got := strings.Join(rules[2], " ")
	want := `-s 10.16.2.1/32 -o eth0 -m mark ! --mark 0x4000/0x4000 -m comment --comment ` + fabricHostComment + ` -j ACCEPT`
	if got != want {
		t.Errorf("rule %q, want %q", got, want)
	}
}
