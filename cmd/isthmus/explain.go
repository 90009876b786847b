package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"

	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

// runExplain prints plan.Explain of addr on node: a summary, every entry that
// contains the address, the corrections and the SNAT verdict.
func runExplain(stdout, stderr io.Writer, node, dir, address, output string) error {
	if output != "table" && output != "json" {
		return fmt.Errorf("parse --output: unknown format %q (want table or json)", output)
	}
	addr, err := netip.ParseAddr(address)
	if err != nil {
		return fmt.Errorf("parse --explain: %w", err)
	}
	if addr = addr.Unmap(); !addr.Is4() {
		return fmt.Errorf("parse --explain: %s is not IPv4 (the datapath is IPv4 only)", addr)
	}
	set, warnings, err := objects.LoadDir(dir)
	printLoadWarnings(stderr, warnings)
	if err != nil {
		return fmt.Errorf("load objects from %s:\n%w", dir, err)
	}
	p, err := plan.Compute(set, node)
	if err != nil {
		return err
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
