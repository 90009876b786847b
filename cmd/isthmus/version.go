package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/buildinfo"
)

// newVersionCmd is `isthmus version [-o json]`: the release, commit and Go
// version of this binary (buildinfo.Get), as isthmus_build_info labels them.
func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version [-o text|json]",
		Short: "Print the release, the git commit and the Go version of this build",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bi := buildinfo.Get()
			switch output {
			case "text":
				fmt.Fprintf(cmd.OutOrStdout(), "isthmus %s\n", bi)
				return nil
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(bi)
			}
			return fmt.Errorf("parse --output: unknown format %q (want text or json)", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}
