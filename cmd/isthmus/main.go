// Command isthmus is the isthmus agent, controller, planner and node tools in
// one binary, the one the image carries. The lab and the benchmarks are
// cmd/isthmus-lab.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "isthmus",
		Short:         "eBPF GENEVE datapath joining the pod networks of several sites",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newPlanCmd(), newAgentCmd(), newControllerCmd(), newUninstallCmd(), newTraceCmd(), newInspectCmd(), newVersionCmd(), newWireguardUserspaceCmd(), newWireguardKeyCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "isthmus:", err)
		os.Exit(1)
	}
}
