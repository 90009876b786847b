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

	"github.com/isthmus-dev/isthmus/loader/agent"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

func newPlanCmd() *cobra.Command {
	var node, dir, output, explain, from, tunnelCIDR string
	var strict bool
	cmd := &cobra.Command{
		Use:   "plan --node NAME --objects DIR [--explain ADDRESS [--from SOURCE]] [-o table|json] [--strict]",
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

Objects the agent would set aside are set aside here too, by the same code:
a Node in no Site (a control-plane node, say), a Node whose podCIDR
overlaps another's, any object that breaks a rule. They are listed under SET
ASIDE (in JSON, "setAside") with every reason, and the node is planned
without them, as its agent would plan it; the exit status is 0. With
--strict it is 1 when anything was set aside. A node that is itself set
aside gets no plan: the error says why.

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
		// A plan printed and then refused by --strict must not be
		// followed by the usage: nothing was wrong with the command line.
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from != "" && explain == "" {
				return fmt.Errorf("--from needs --explain: the pair is SOURCE and the explained ADDRESS")
			}
			in := planInput{node: node, dir: dir, strict: strict}
			if tunnelCIDR != "" {
				p, err := netip.ParsePrefix(tunnelCIDR)
				if err != nil || !p.Addr().Is4() {
					return fmt.Errorf("parse --tunnel-cidr %q: want an IPv4 prefix, the controller's --tunnel-cidr (such as 100.64.0.0/16)", tunnelCIDR)
				}
				in.rules.TunnelCIDR = p.Masked()
			}
			if explain != "" {
				return runExplain(cmd.OutOrStdout(), cmd.ErrOrStderr(), in, explain, from, output)
			}
			return runPlan(cmd.OutOrStdout(), cmd.ErrOrStderr(), in, output)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "name of the Node to plan for")
	cmd.Flags().StringVar(&dir, "objects", "", "directory of YAML files with Site, SitePeering, GatewayPool, SiteGatewayPoolAssignment and Node objects")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&explain, "explain", "", "explain what the node does with this IPv4 address instead of printing the plan")
	cmd.Flags().StringVar(&from, "from", "", "with --explain: a source on or behind the node; print both directions of the pair")
	cmd.Flags().BoolVar(&strict, "strict", false, "exit with status 1 when any object was set aside (the plan is printed all the same)")
	cmd.Flags().StringVar(&tunnelCIDR, "tunnel-cidr", "", "the controller's --tunnel-cidr, as the agent is given it: a Node whose isthmus.dev/tunnel-ipv4 annotation is outside it is set aside (empty: not checked)")
	_ = cmd.MarkFlagRequired("node")
	_ = cmd.MarkFlagRequired("objects")
	return cmd
}

// planInput is what plan and plan --explain read: the objects in dir, set
// aside by rules as the agent sets them aside, planned for node.
type planInput struct {
	node, dir string
	rules     objects.Rules
	strict    bool
}

// load reads the objects and computes the plan the way the agent does in
// file mode (source.Files): invalid objects are set aside with their
// reasons (objects.Rules.LoadDirSettingAside), the node is checked with
// agent.Plannable, and the rest is planned. Warnings of the objects go to
// stderr when the plan fails, with the objects set aside, so the reason
// shows.
func (in planInput) load(stderr io.Writer) (*plan.NodePlan, []objects.Warning, []plan.SetAside, error) {
	set, warnings, err := in.rules.LoadDirSettingAside(in.dir)
	if err != nil {
		return nil, warnings, nil, fmt.Errorf("load objects from %s: %w", in.dir, err)
	}
	aside := plan.SetAsideOf(set.Rejected)
	fail := func(err error) (*plan.NodePlan, []objects.Warning, []plan.SetAside, error) {
		printLoadWarnings(stderr, warnings)
		printSetAside(stderr, aside)
		return nil, warnings, aside, err
	}
	if err := agent.Plannable(set, warnings, in.node); err != nil {
		return fail(fmt.Errorf("plan node %q: %w", in.node, err))
	}
	p, err := plan.Compute(set, in.node)
	if err != nil {
		return fail(err)
	}
	return p, warnings, aside, nil
}

// strictErr is the error --strict returns when anything was set aside.
func (in planInput) strictErr(aside []plan.SetAside) error {
	if !in.strict || len(aside) == 0 {
		return nil
	}
	return fmt.Errorf("--strict: %d objects set aside (see SET ASIDE, or setAside in JSON)", len(aside))
}

// planJSON is plan -o json: the NodePlan's fields and the objects set aside.
type planJSON struct {
	*plan.NodePlan
	SetAside []plan.SetAside `json:"setAside"`
}

func runPlan(stdout, stderr io.Writer, in planInput, output string) error {
	if output != "table" && output != "json" {
		return fmt.Errorf("parse --output: unknown format %q (want table or json)", output)
	}
	p, warnings, aside, err := in.load(stderr)
	if err != nil {
		return err
	}
	if output == "json" {
		// The JSON is the NodePlan and the objects set aside, for tools;
		// loader warnings go to stderr so they are still seen.
		printLoadWarnings(stderr, warnings)
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(planJSON{NodePlan: p, SetAside: aside}); err != nil {
			return fmt.Errorf("write plan: %w", err)
		}
		return in.strictErr(aside)
	}
	if err := writePlanTable(stdout, p, warnings, aside); err != nil {
		return err
	}
	return in.strictErr(aside)
}

func printLoadWarnings(w io.Writer, warnings []objects.Warning) {
	for _, warn := range warnings {
		fmt.Fprintln(w, "warning:", warn)
	}
}

// printSetAside prints one line per object set aside, with its reasons.
func printSetAside(w io.Writer, aside []plan.SetAside) {
	for _, a := range aside {
		fmt.Fprintf(w, "set aside: %s: %s\n", setAsideObject(a), strings.Join(a.Reasons, "; "))
	}
}

// setAsideObject names an object set aside and the file it came from.
func setAsideObject(a plan.SetAside) string {
	if a.File == "" {
		return a.Object
	}
	return a.File + ": " + a.Object
}

// writePlanTable prints p as a summary followed by one table per section.
func writePlanTable(w io.Writer, p *plan.NodePlan, warnings []objects.Warning, aside []plan.SetAside) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	mtu := fmt.Sprintf("auto (underlay MTU - %d)", p.TunnelOverhead)
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
	section(w, "SET ASIDE", len(aside), func(tw *tabwriter.Writer) {
		// What the agent plans without, as it does: one row per reason.
		fmt.Fprintln(tw, "OBJECT\tFILE\tREASON")
		for _, a := range aside {
			for i, r := range a.Reasons {
				obj, file := a.Object, cmp.Or(a.File, "-")
				if i > 0 {
					obj, file = "", ""
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", obj, file, r)
			}
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
