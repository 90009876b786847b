package testenv

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// FirewallDropChain is the router's iptables chain every packet the firewall
// refuses goes through: its one rule's counters are the drops.
const FirewallDropChain = "isl-fw-drop"

// GenevePort and VXLANPort are the tunnel ports the firewall lets through
// between the nodes of different sites: GENEVE for isthmus, VXLAN for the
// kernel VXLAN baseline.
const (
	GenevePort = 6081
	VXLANPort  = vxlanPort
)

// siteGroup returns the device group of the router ports of a site's nodes: its
// index in the scenario plus one (group 0 is every other device's).
func (s *Scenario) siteGroup(site string) uint32 {
	for i := range s.Sites {
		if s.Sites[i].Name == site {
			return uint32(i + 1)
		}
	}
	return 0
}

// TunnelPort returns the UDP port the lab's datapath tunnels with, the one the
// firewall passes between nodes of different sites.
func (l *Lab) TunnelPort() int {
	if l.Datapath == DatapathVXLAN {
		return VXLANPort
	}
	return GenevePort
}

// firewallRules renders the router's filter table for underlay.firewall. The
// router is the fabric of every site and the firewall between them at once,
// so what is "inside a site" is said by ports, not addresses: a packet that
// enters on a port of site S and leaves on a port of S is the site fabric's
// own traffic (node to node, pod to pod through the fabric, whatever the
// addresses, as a VNet routes them) and passes. Between sites only node-to-node
// tunnel traffic and ICMP pass (with CrossSiteGateways: everything between the
// gateways' own addresses, nothing else), and replies to what passed; the rest goes to FirewallDropChain and is dropped
// there. On an IPv6 underlay the rules are the same for ip6tables (host
// addresses /128, ICMPv6 for ICMP): the router forwards no IPv4 there.
func (l *Lab) firewallRules() string {
	host, icmp := 32, "icmp"
	if l.Scenario.Underlay6() {
		host, icmp = 128, "ipv6-icmp"
	}
	var b strings.Builder
	b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n")
	fmt.Fprintf(&b, ":%s - [0:0]\n", FirewallDropChain)
	for _, site := range l.Scenario.Sites {
		g := l.Scenario.siteGroup(site.Name)
		fmt.Fprintf(&b, "-A FORWARD -m devgroup --src-group %d --dst-group %d -m comment --comment \"inside site %s\" -j ACCEPT\n", g, g, site.Name)
	}
	b.WriteString("-A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n")
	if l.Scenario.Underlay.World {
		// As a NAT gateway would: anything may open flows to the Internet.
		fmt.Fprintf(&b, "-A FORWARD -o %s -m comment --comment \"to the world\" -j ACCEPT\n", WorldPort)
	}
	if l.Scenario.Underlay.CrossSite == CrossSiteGateways {
		// Only gateways talk across sites, to each other, and with every
		// protocol: the underlay reaches the gateways, their tunnel and
		// their hosts (a hostNetwork pod on one gateway serves one on the
		// other), as underlayReachesNodes false declares. A source that is
		// not a gateway's own address (a pod's) is still dropped. The
		// addresses are the nodes' own: filtering sees a packet after the
		// DNAT of an external address and before the SNAT to one.
		var gws []NodeRef
		for _, n := range l.Scenario.Nodes() {
			if l.Scenario.IsGateway(n.Name) {
				gws = append(gws, n)
			}
		}
		for _, a := range gws {
			for _, z := range gws {
				if a.Site.Name == z.Site.Name {
					continue
				}
				fmt.Fprintf(&b, "-A FORWARD -s %s/%d -d %s/%d -m comment --comment \"gateway %s to gateway %s\" -j ACCEPT\n", a.Address, host, z.Address, host, a.Name, z.Name)
			}
		}
	} else {
		for _, a := range l.Scenario.Sites {
			for _, z := range l.Scenario.Sites {
				if a.Name == z.Name {
					continue
				}
				fmt.Fprintf(&b, "-A FORWARD -s %s -d %s -p udp --dport %d -m comment --comment \"tunnel %s to %s\" -j ACCEPT\n", a.Subnet, z.Subnet, l.TunnelPort(), a.Name, z.Name)
				fmt.Fprintf(&b, "-A FORWARD -s %s -d %s -p %s -m comment --comment \"icmp %s to %s\" -j ACCEPT\n", a.Subnet, z.Subnet, icmp, a.Name, z.Name)
			}
		}
	}
	fmt.Fprintf(&b, "-A FORWARD -j %s\n", FirewallDropChain)
	fmt.Fprintf(&b, "-A %s -j DROP\n", FirewallDropChain)
	b.WriteString("COMMIT\n")
	return b.String()
}

// buildFirewall installs firewallRules in the router, with ip6tables on an
// IPv6 underlay.
func (l *Lab) buildFirewall(ctx context.Context) error {
	restore := "iptables-restore"
	if l.Scenario.Underlay6() {
		restore = "ip6tables-restore"
	}
	cmd := Command(ctx, l.RouterNS(), restore, "-w")
	cmd.Stdin = strings.NewReader(l.firewallRules())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install firewall: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// FirewallDrops returns how many packets the firewall has dropped so far.
func (l *Lab) FirewallDrops(ctx context.Context) (uint64, error) {
	if l.Scenario.Underlay6() {
		return l.firewallDrops6(ctx)
	}
	out, err := l.Exec(ctx, l.RouterNS(), "iptables-save", "-c", "-t", "filter")
	if err != nil {
		return 0, fmt.Errorf("read firewall counters: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		// [packets:bytes] -A isl-fw-drop -j DROP
		line := sc.Text()
		if !strings.HasSuffix(line, "-A "+FirewallDropChain+" -j DROP") || !strings.HasPrefix(line, "[") {
			continue
		}
		pkts, _, ok := strings.Cut(strings.TrimPrefix(line, "["), ":")
		if !ok {
			break
		}
		n, err := strconv.ParseUint(pkts, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read firewall counters: %q: %w", line, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("read firewall counters: no rule in chain %s (firewall off?)", FirewallDropChain)
}

// firewallDrops6 is FirewallDrops on an IPv6 underlay: the packet count of
// the one rule of FirewallDropChain in ip6tables, as
//
//	Chain isl-fw-drop (1 references)
//	    pkts      bytes target     prot opt in     out     source               destination
//	       3      240 DROP       0    --  *      *       ::/0                 ::/0
func (l *Lab) firewallDrops6(ctx context.Context) (uint64, error) {
	out, err := l.Exec(ctx, l.RouterNS(), "ip6tables", "-w", "-L", FirewallDropChain, "-v", "-x", "-n")
	if err != nil {
		return 0, fmt.Errorf("read firewall counters (firewall off?): %w", err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "DROP" {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read firewall counters: %q: %w", line, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("read firewall counters: no DROP rule in chain %s: %s", FirewallDropChain, out)
}

// buildExternalNAT maps every node's externalAddress 1:1 to its address in the
// router, as a cloud's public IP in front of a NAT: packets to the external
// address are DNATed to the node, and the node's packets leaving its site
// (out of a port of another site's group) are SNATed to the external address.
// Inside its site the node keeps its own address. A site behindNAT is masqueraded
// to that address as it leaves (random ports), and its router ports take nothing
// from other sites that does not belong to a flow the site opened.
func (l *Lab) buildExternalNAT(ctx context.Context) error {
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
	have := false
	var filter strings.Builder
	for _, site := range l.Scenario.Sites {
		if !site.BehindNAT.IsValid() {
			continue
		}
		have = true
		g := l.Scenario.siteGroup(site.Name)
		fmt.Fprintf(&b, "-A POSTROUTING -s %s -m devgroup ! --dst-group %d -m comment --comment \"site %s behind a NAT\" -j SNAT --to-source %s --random-fully\n",
			site.Subnet, g, site.Name, site.BehindNAT)
		fmt.Fprintf(&filter, "-I FORWARD -m devgroup --dst-group %d ! --src-group %d -m conntrack --ctstate NEW,INVALID -m comment --comment \"site %s behind a NAT: nothing in it did not open\" -j DROP\n",
			g, g, site.Name)
	}
	for _, n := range l.Scenario.Nodes() {
		if !n.ExternalAddress.IsValid() {
			continue
		}
		have = true
		g := l.Scenario.siteGroup(n.Site.Name)
		fmt.Fprintf(&b, "-A PREROUTING -d %s/32 -m comment --comment \"external address of %s\" -j DNAT --to-destination %s\n", n.ExternalAddress, n.Name, n.Address)
		fmt.Fprintf(&b, "-A POSTROUTING -s %s/32 -m devgroup ! --dst-group %d -m comment --comment \"external address of %s\" -j SNAT --to-source %s\n", n.Address, g, n.Name, n.ExternalAddress)
	}
	if !have {
		return nil
	}
	b.WriteString("COMMIT\n")
	if filter.Len() > 0 {
		b.WriteString("*filter\n" + filter.String() + "COMMIT\n")
	}
	cmd := Command(ctx, l.RouterNS(), "iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install external address NAT: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
