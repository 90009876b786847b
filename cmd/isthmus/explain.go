package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"

	"github.com/isthmus-dev/isthmus/loader/plan"
)

// runExplain prints plan.Explain of addr on node: a summary, every entry that
// contains the address, the corrections and the SNAT verdict.
func runExplain(stdout, stderr io.Writer, in planInput, address, from, output string) error {
	if output != "table" && output != "json" {
		return fmt.Errorf("parse --output: unknown format %q (want table or json)", output)
	}
	addr, err := netip.ParseAddr(address)
	if err != nil {
		return fmt.Errorf("parse --explain: %w", err)
	}
	addr = addr.Unmap()
	p, warnings, aside, err := in.load(stderr)
	if err != nil {
		return err
	}
	// The explanation is of the plan without the objects set aside: say
	// which, where the warnings go.
	printLoadWarnings(stderr, warnings)
	printSetAside(stderr, aside)
	if err := explain(stdout, p, addr, from, output); err != nil {
		return err
	}
	return in.strictErr(aside)
}

// explain prints plan.Explain of addr in p, or with from plan.ExplainPair.
func explain(stdout io.Writer, p *plan.NodePlan, addr netip.Addr, from, output string) error {
	if from != "" {
		src, err := netip.ParseAddr(from)
		if err != nil {
			return fmt.Errorf("parse --from: %w", err)
		}
		src = src.Unmap()
		if src.Is4() != addr.Is4() {
			return fmt.Errorf("parse --from: %s and %s are of different families", src, addr)
		}
		pe := plan.ExplainPair(p, src, addr)
		if output == "json" {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(pe)
		}
		return writePair(stdout, pe)
	}
	e := plan.Explain(p, addr)
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(e)
	}
	return writeExplain(stdout, e)
}

func writeExplain(w io.Writer, e plan.Explanation) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "ADDRESS\t%s\n", e.Addr)
	fmt.Fprintf(tw, "NODE\t%s\n", e.Node)
	if e.Match != nil {
		fmt.Fprintf(tw, "MATCH\t%s %s\n", e.Match.Kind, e.Match.Prefix)
		fmt.Fprintf(tw, "ORIGIN\t%s\n", orNone(e.Match.Origin))
	} else {
		fmt.Fprintf(tw, "MATCH\t(none)\n")
	}
	fmt.Fprintf(tw, "GOES\t%s\n", e.Verdict)
	snat := e.SNAT.Reason
	if e.SNAT.Translated {
		snat = "yes, " + snat
	} else {
		snat = "no, " + snat
	}
	fmt.Fprintf(tw, "SNAT AS SOURCE\t%s\n", snat)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write explanation: %w", err)
	}
	section(w, "MATCHING ENTRIES (longest first)", len(e.Matches), func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "PREFIX\tKIND\tTO\tORIGIN")
		for _, m := range e.Matches {
			to := m.Peer
			if m.Via.IsValid() {
				to += " " + m.Via.String()
			}
			if len(m.Group) > 0 {
				to = fmt.Sprintf("group of %d", len(m.Group))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Prefix, m.Kind, orNone(to), orNone(m.Origin))
		}
	})
	section(w, "CORRECTIONS", len(e.Corrections), func(tw *tabwriter.Writer) {
		for _, c := range e.Corrections {
			fmt.Fprintf(tw, "- %s\n", c.Why)
		}
	})
	return nil
}

func writePair(w io.Writer, e plan.PairExplanation) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "NODE\t%s\n", e.Node)
	for _, d := range []struct {
		name string
		dir  plan.Direction
		verb string
	}{{"REQUEST", e.Request, "leaves by"}, {"REPLY", e.Reply, "must arrive on"}} {
		route := "no route"
		if r := d.dir.Route; r != nil {
			route = "route " + r.Prefix.String()
			if r.Peer != "" {
				route += " to " + r.Peer
			} else if len(r.Group) > 0 {
				route += fmt.Sprintf(" to a group of %d", len(r.Group))
			}
		}
		fmt.Fprintf(tw, "%s\t%s -> %s: table %s, %s, %s %s\n", d.name, d.dir.From, d.dir.To, d.dir.Table, route, d.verb, d.dir.Device)
	}
	fmt.Fprintf(tw, "HOW\t%s\n", e.Says)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write explanation: %w", err)
	}
	return nil
}
