// Command isthmus-lab is the network-namespace lab and the benchmarks: the
// development tools that build sites, nodes and pods out of namespaces and
// run the isthmus binary beside it as their agents. It is not part of the
// image: cmd/isthmus, the agent, links none of it (TestImageLinksNoLab).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "isthmus-lab",
		Short:         "The isthmus network-namespace lab and benchmarks (runs the isthmus binary beside it)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newLabCmd(), newBenchCmd(), newClusterCmd(), newConformanceCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "isthmus-lab:", err)
		os.Exit(1)
	}
}
