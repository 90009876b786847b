package main

import "github.com/spf13/cobra"

// Placeholder until the uninstall subcommand lands; replace this file.
func newUninstallCmd() *cobra.Command { return &cobra.Command{Use: "uninstall"} }
