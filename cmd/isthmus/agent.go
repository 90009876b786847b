package main

import "github.com/spf13/cobra"

// Placeholder until the agent subcommand lands; replace this file.
func newAgentCmd() *cobra.Command { return &cobra.Command{Use: "agent"} }
