// Command selection prints the conformance focus and skip expressions of a
// focus set (short or full) as shell assignments, FOCUS='...' and
// SKIP='...', for e2e.test or sonobuoy on a real cluster
// (docs/conformance.md):
//
//	eval "$(go run ./testenv/conformance/cmd/selection full)"
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/isthmus-dev/isthmus/testenv/conformance"
)

func main() {
	name := "full"
	if len(os.Args) > 1 {
		name = os.Args[1]
	}
	f, err := conformance.ParseFocus(name)
	if err == nil {
		var sel conformance.Selection
		if sel, err = conformance.Select(f); err == nil {
			fmt.Printf("FOCUS=%s\nSKIP=%s\n", quote(sel.Focus), quote(sel.Skip))
			return
		}
	}
	fmt.Fprintln(os.Stderr, "selection:", err)
	os.Exit(1)
}

// quote quotes s for a POSIX shell.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
