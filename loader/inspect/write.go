package inspect

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
)

// Write reads view (one of Views) from m and prints it to w as a table
// (output "table") or as indented JSON (output "json").
func Write(w io.Writer, m *Maps, view, output string) error {
	if output != "table" && output != "json" {
		return fmt.Errorf("parse --output: unknown format %q (want table or json)", output)
	}
	var (
		data  any
		table func(*tabwriter.Writer)
		err   error
	)
	switch view {
	case "routes":
		var rs []Route
		rs, err = m.Routes()
		data, table = nonNil(rs), func(tw *tabwriter.Writer) { routesTable(tw, rs) }
	case "peers":
		var ps []Peer
		ps, err = m.Peers()
		data, table = nonNil(ps), func(tw *tabwriter.Writer) { peersTable(tw, ps) }
	case "nat":
		var fs []NatFlow
		fs, err = m.Nat()
		data, table = nonNil(fs), func(tw *tabwriter.Writer) { natTable(tw, fs) }
	case "counters":
		var cs []Counter
		cs, err = m.Counters()
		data, table = nonNil(cs), func(tw *tabwriter.Writer) { countersTable(tw, cs) }
	case "groups":
		var gs []Group
		gs, err = m.Groups()
		data, table = nonNil(gs), func(tw *tabwriter.Writer) { groupsTable(tw, gs) }
	case "config":
		var c Config
		c, err = m.Config()
		data, table = c, func(tw *tabwriter.Writer) { configTable(tw, c) }
	default:
		return fmt.Errorf("parse view: unknown view %q (want one of %s)", view, strings.Join(Views, ", "))
	}
	if err != nil {
		return fmt.Errorf("inspect %s: %w", view, err)
	}
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(data)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	table(tw)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", view, err)
	}
	return nil
}

// nonNil makes an empty view encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func routesTable(tw *tabwriter.Writer, rs []Route) {
	fmt.Fprintln(tw, "PREFIX\tPEER\tGROUP\tLIVE MEMBERS\tFLAGS")
	for _, r := range rs {
		peer, group, members := "-", "-", "-"
		switch {
		case r.Flags&maps.RouteFlagUnderlay != 0:
			peer = "(underlay)" // an exception: not tunnelled, whatever a shorter route says
		case r.Group != 0:
			group = fmt.Sprint(r.Group)
			members = owners(r.Members)
		default:
			peer = r.Peer.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t0x%x\n", r.Prefix, peer, group, members, r.Flags)
	}
}

func peersTable(tw *tabwriter.Writer, ps []Peer) {
	// A peer is keyed by its underlay address, an encrypted one by its
	// tunnel address (the outer address of GENEVE inside WireGuard).
	fmt.Fprintln(tw, "ADDRESS\tFLAGS\tALLOWED SOURCES")
	for _, p := range ps {
		srcs := make([]string, len(p.AllowedSources))
		for i, s := range p.AllowedSources {
			srcs[i] = s.String()
		}
		fmt.Fprintf(tw, "%s\t0x%x\t%s\n", p.Underlay, p.Flags, orNone(strings.Join(srcs, ",")))
	}
}

func natTable(tw *tabwriter.Writer, fs []NatFlow) {
	fmt.Fprintln(tw, "PROTO\tPOD\t\tTRANSLATED\tDST\tSTATE\tIDLE\tSTATUS")
	for _, f := range fs {
		state := f.State
		if state == "" {
			state = "-"
		}
		status := "live"
		if !f.Live {
			status = "expired"
		}
		if f.Halves != "both" {
			status += " (" + f.Halves + " half only)"
		}
		idle := time.Duration(f.IdleSeconds * float64(time.Second)).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t<->\t%s\t%s\t%s\t%s\t%s\n", f.Proto, f.Pod, f.Translated, f.Dst, state, idle, status)
	}
}

func countersTable(tw *tabwriter.Writer, cs []Counter) {
	fmt.Fprintln(tw, "COUNTER\tHOOK\tPACKETS\tBYTES")
	for _, c := range cs {
		name := c.Name
		if c.Drop {
			name = "drop " + name
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", name, c.Hook, c.Packets, c.Bytes)
	}
}

func groupsTable(tw *tabwriter.Writer, gs []Group) {
	planned := slices.ContainsFunc(gs, func(g Group) bool { return g.Members != nil })
	if !planned {
		fmt.Fprintln(tw, "ID\tLIVE\tSLOT OWNERS")
		for _, g := range gs {
			fmt.Fprintf(tw, "%d\t%d\t%s\n", g.ID, g.Live, owners(g.Owners))
		}
		return
	}
	// With the plan: each member's reach to the group's site.
	fmt.Fprintln(tw, "ID\tSITE\tLIVE\tMEMBERS\tSLOT OWNERS")
	for _, g := range gs {
		ms := make([]string, len(g.Members))
		for i, m := range g.Members {
			state := "reaches"
			if !m.Reaches {
				state = "down"
			}
			ms[i] = fmt.Sprintf("%s %s %s", m.Peer, m.Underlay, state)
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", g.ID, cmp.Or(g.Site, "-"), g.Live, cmp.Or(strings.Join(ms, ", "), "(not planned)"), owners(g.Owners))
	}
}

func configTable(tw *tabwriter.Writer, c Config) {
	addr := func(a netip.Addr) string {
		if !a.IsValid() {
			return "(none)"
		}
		return a.String()
	}
	var pods []string
	for _, i := range c.PodIfindexes {
		pods = append(pods, fmt.Sprint(i))
	}
	fmt.Fprintf(tw, "VNI\t%d\n", c.VNI)
	fmt.Fprintf(tw, "UNDERLAY IP\t%s\n", addr(c.UnderlayIP))
	fmt.Fprintf(tw, "UNDERLAY IFINDEX\t%d\n", c.UnderlayIfindex)
	fmt.Fprintf(tw, "OVERLAY IFINDEX\t%d\n", c.OverlayIfindex)
	fmt.Fprintf(tw, "OVERLAY MAC\t%s\n", c.OverlayMAC)
	fmt.Fprintf(tw, "TUNNEL MTU\t%d\n", c.TunnelMTU)
	fmt.Fprintf(tw, "FLAGS\t%s\n", orNone(strings.Join(c.Flags, ",")))
	fmt.Fprintf(tw, "TUNNEL IP (SNAT)\t%s\n", addr(c.TunnelIP))
	fmt.Fprintf(tw, "SNAT PORTS\t%d-%d\n", c.SNATPortMin, c.SNATPortMax)
	fmt.Fprintf(tw, "POD IFINDEXES\t%s\n", orNone(strings.Join(pods, ",")))
	fmt.Fprintf(tw, "FABRIC PREFIXES\t%s\n", orNone(joinPrefixes(c.FabricPrefixes)))
	fmt.Fprintf(tw, "SNAT EXEMPT\t%s\n", orNone(joinPrefixes(c.SNATExempt)))
	fmt.Fprintf(tw, "MASQ EXEMPT\t%s\n", orNone(joinPrefixes(c.MasqExempt)))
}

// owners summarises slot owners as "10.0.0.4 (33/64), 10.0.0.5 (31/64)".
func owners(os []maps.SlotOwner) string {
	if len(os) == 0 {
		return "(none: no_nexthop)"
	}
	s := make([]string, len(os))
	for i, o := range os {
		s[i] = fmt.Sprintf("%s (%d/%d)", o.Member, o.Slots, maps.NHGSlots)
	}
	return strings.Join(s, ", ")
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
