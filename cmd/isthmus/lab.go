package main

import "github.com/spf13/cobra"

// Placeholder until the lab subcommand lands; replace this file.
func newLabCmd() *cobra.Command { return &cobra.Command{Use: "lab"} }
