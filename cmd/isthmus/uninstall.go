package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/datapath"
)

// newUninstallCmd is `isthmus uninstall`: remove the pinned links (detaching the
// programs), the pinned maps, the pin directory and isthmus0 with its routes.
func newUninstallCmd() *cobra.Command {
	var pinDir string
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove everything the agent installed in this network namespace",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := datapath.Uninstall(pinDir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed the datapath pinned in %s and %s\n", pinDir, datapath.OverlayDev)
			return nil
		},
	}
	cmd.Flags().StringVar(&pinDir, "pin-dir", datapath.DefaultPinDir, "bpffs directory the agent pinned into")
	return cmd
}
