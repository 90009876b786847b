package main

import "github.com/spf13/cobra"

// Placeholder until the plan subcommand lands; replace this file.
func newPlanCmd() *cobra.Command { return &cobra.Command{Use: "plan"} }
