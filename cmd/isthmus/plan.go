package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

func newPlanCmd() *cobra.Command {
	var node, dir, output, explain, from string
	cmd := &cobra.Command{
		Use:   "plan --node NAME --objects DIR [--explain ADDRESS [--from SOURCE]] [-o table|json]",
		Short: "Print the datapath state a node's agent would install",
		Long: `plan loads the Site, SitePeering, GatewayPool, SiteGatewayPoolAssignment and
Node objects in DIR (every *.yaml and *.yml file), computes the plan of one
node and prints it: its site, its role (a gateway of which pools, or a
member), underlay and tunnel address, the prefixes left to its site (local)
and handed to its site's fabric, its peers, the routes into the overlay (a
route to an unmanaged site, or through gateways, goes to a group of nodes,
listed under ROUTE GROUPS), the sources return-path SNAT translates, the
corrections made to keep tunnel endpoints and local prefixes out of the
overlay, and warnings. Nothing on the machine is changed.

With --explain ADDRESS it prints instead what the node does with one address:
the entry it matches (longest prefix among routes, local and fabric prefixes,
the node's podCIDRs, tunnel and underlay addresses and its peers' underlay
addresses), where a packet to it goes, the corrections that cut a route which
would have covered it, and whether a packet from it entering the tunnel is
translated by SNAT, each with the object and field that made it so.

With --from SOURCE as well (an address on or behind the node: one of its
pods, its host) it prints both directions of the pair: the table the node's
policy rules pick for SOURCE, the route and the device a packet from SOURCE to
ADDRESS leaves by, and the device the answer must arrive on for strict
rp_filter to accept it (the same one), with how the answer gets there.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from != "" && explain == "" {
				return fmt.Errorf("--from needs --explain: the pair is SOURCE and the explained ADDRESS")
			}
			if explain != "" {
				return runExplain(cmd.OutOrStdout(), cmd.ErrOrStderr(), node, dir, explain, from, output)
			}
			return runPlan(cmd.OutOrStdout(), cmd.ErrOrStderr(), node, dir, output)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "name of the Node to plan for")
	cmd.Flags().StringVar(&dir, "objects", "", "directory of YAML files with Site, SitePeering, GatewayPool, SiteGatewayPoolAssignment and Node objects")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&explain, "explain", "", "explain what the node does with this IPv4 address instead of printing the plan")
	cmd.Flags().StringVar(&from, "from", "", "with --explain: a source on or behind the node; print both directions of the pair")
	_ = cmd.MarkFlagRequired("node")
	_ = cmd.MarkFlagRequired("objects")
	return cmd
}

func runPlan(stdout, stderr io.Writer, node, dir, output string) error {
	if output != "table" && output != "json" {
		return fmt.Errorf("parse --output: unknown format %q (want table or json)", output)
	}
	set, warnings, err := objects.LoadDir(dir)
	if err != nil {
		printLoadWarnings(stderr, warnings)
		return fmt.Errorf("load objects from %s:\n%w", dir, err)
	}
	p, err := plan.Compute(set, node)
	if err != nil {
		printLoadWarnings(stderr, warnings)
		return err
	}
	if output == "json" {
		// The JSON is the NodePlan alone, for tools; loader warnings go to
		// stderr so they are still seen.
		printLoadWarnings(stderr, warnings)
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	}
	return writePlanTable(stdout, p, warnings)
}

func printLoadWarnings(w io.Writer, warnings []objects.Warning) {
	for _, warn := range warnings {
		fmt.Fprintln(w, "warning:", warn)
	}
}

// writePlanTable prints p as a summary followed by one table per section.
func writePlanTable(w io.Writer, p *plan.NodePlan, warnings []objects.Warning) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	mtu := "auto (underlay MTU - 50)"
	if p.TunnelMTU != 0 {
		mtu = fmt.Sprint(p.TunnelMTU)
	}
	fmt.Fprintf(tw, "NODE\t%s\n", p.Node)
	fmt.Fprintf(tw, "SITE\t%s\n", p.Site)
	fmt.Fprintf(tw, "ROLE\t%s\n", role(p))
	fmt.Fprintf(tw, "UNDERLAY\t%s\n", p.Underlay)
	fmt.Fprintf(tw, "POD CIDRS\t%s\n", orNone(joinPrefixes(p.PodCIDRs)))
	tunnel := "(none)"
	if p.TunnelAddr.IsValid() {
		tunnel = fmt.Sprintf("%s from %s", p.TunnelAddr, p.TunnelAddrOrigin)
	}
	fmt.Fprintf(tw, "TUNNEL ADDRESS\t%s\n", tunnel)
	fmt.Fprintf(tw, "TUNNEL MTU\t%s\n", mtu)
	fmt.Fprintf(tw, "LOCAL\t%s\n", orNone(joinPrefixes(p.LocalPrefixes)))
	fmt.Fprintf(tw, "FABRIC\t%s\n", orNone(joinPrefixes(p.FabricPrefixes)))
	fmt.Fprintf(tw, "TUNNEL SOURCES\t%s\n", orNone(joinPrefixes(p.TunnelSources)))
	fmt.Fprintf(tw, "FABRIC EGRESS\t%s\n", orNone(joinPrefixes(p.FabricEgress)))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write plan: %w", err)
	}

	section(w, "PEERS", len(p.Peers), func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "NAME\tSITE\tUNDERLAY\tTUNNEL ADDRESS\tALLOWED SOURCES")
		for _, pr := range p.Peers {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", pr.Name, pr.Site, pr.Underlay, orNone(addrText(pr.TunnelAddr)), orNone(joinPrefixes(pr.AllowedSources)))
		}
	})
	groups := 0
	section(w, "ROUTES", len(p.Routes), func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "PREFIX\tPEER\tVIA\tORIGIN")
		for _, r := range p.Routes {
			origin := r.Origin
			if r.Underlay {
				fmt.Fprintf(tw, "%s	(underlay)	-	%s (not tunnelled: an exception to a shorter route)\n", r.Prefix, origin)
				continue
			}
			switch {
			case r.TransitOnly && r.NotForPods:
				origin += " (transit only: forwarded traffic, not the host's or its pods')"
			case r.TransitOnly:
				origin += " (transit only: pods and forwarded traffic, not the host's)"
			}
			if r.ViaFabric {
				origin += " (via fabric: FABRIC EGRESS sources leave by the underlay device)"
			}
			if len(r.Group) > 0 {
				groups++
				fmt.Fprintf(tw, "%s\tgroup of %d\t(see ROUTE GROUPS)\t%s\n", r.Prefix, len(r.Group), origin)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Prefix, r.Peer, r.Via, origin)
		}
	})
	section(w, "ROUTE GROUPS", groups, func(tw *tabwriter.Writer) {
		// One row per route: each flow to the prefix takes one member by
		// consistent hash, among those passing health checks (for a gateway
		// group, those that reach the remote site).
		fmt.Fprintln(tw, "PREFIX\tSITE\tMEMBERS")
		for _, r := range p.Routes {
			if len(r.Group) == 0 {
				continue
			}
			members := make([]string, len(r.Group))
			for i, h := range r.Group {
				members[i] = fmt.Sprintf("%s %s", h.Peer, h.Via)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Prefix, cmp.Or(r.Site, "-"), strings.Join(members, ", "))
		}
	})
	writeSNAT(w, p.SNAT)
	writeMasquerade(w, p.Masquerade)
	section(w, "CORRECTIONS", len(p.Corrections), func(tw *tabwriter.Writer) {
		// Kept last: it is the one column that can be long.
		fmt.Fprintln(tw, "REMOVED\tCUT OUT\tORIGIN\tKEPT")
		for _, c := range p.Corrections {
			cut := "underlay " + addrText(c.Endpoint)
			if c.Local.IsValid() {
				cut = "local " + c.Local.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Removed, cut, c.Origin, orNone(joinPrefixes(c.Kept)))
		}
	})
	var all []string
	for _, warn := range warnings {
		all = append(all, warn.String())
	}
	all = append(all, p.Warnings...)
	section(w, "WARNINGS", len(all), func(tw *tabwriter.Writer) {
		for _, warn := range all {
			fmt.Fprintf(tw, "- %s\n", warn)
		}
	})
	return nil
}

// role says whether the node forwards between sites: "gateway of GatewayPool
// a, b (transit)", or "member" (it never forwards).
func role(p *plan.NodePlan) string {
	if !p.Gateway {
		return "member"
	}
	return fmt.Sprintf("gateway of GatewayPool %s (transit)", strings.Join(p.GatewayPools, ", "))
}

// writeSNAT prints the return-path SNAT policy: which sources entering the
// tunnel on this node are translated, and why the others are not.
func writeSNAT(w io.Writer, s plan.SNATPolicy) {
	writeTranslation(w, "SNAT", s.Addr, s.Reason, "sources translated to %s on this node: everything except", s.Exempt)
}

// writeMasquerade prints the egress masquerade policy: which destinations this
// node's pods reach from its underlay address, and which keep the pod's.
func writeMasquerade(w io.Writer, m plan.MasqueradePolicy) {
	writeTranslation(w, "MASQUERADE", m.Addr, m.Reason, "pods reach every destination from %s: everything except", m.Exempt)
}

// writeTranslation prints one translation policy under title: "off" and the
// reason when addr is invalid, else intro (with addr) and the exempt prefixes.
func writeTranslation(w io.Writer, title string, addr netip.Addr, reason, intro string, exempt []plan.ExemptSource) {
	fmt.Fprintf(w, "\n%s\n", title)
	if !addr.IsValid() {
		fmt.Fprintf(w, "off: %s\n", reason)
		return
	}
	fmt.Fprintf(w, intro+"\n", addr)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PREFIX\tORIGIN")
	for _, e := range exempt {
		fmt.Fprintf(tw, "%s\t%s\n", e.Prefix, e.Origin)
	}
	tw.Flush()
}

// section prints a titled table, or the title and "(none)" when it is empty.
func section(w io.Writer, title string, n int, rows func(*tabwriter.Writer)) {
	fmt.Fprintf(w, "\n%s\n", title)
	if n == 0 {
		fmt.Fprintln(w, "(none)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rows(tw)
	tw.Flush()
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func addrText(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
