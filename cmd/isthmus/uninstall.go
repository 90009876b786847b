package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/agent"
	"github.com/isthmus-dev/isthmus/loader/cniinstall"
	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/wireguard"
)

// newUninstallCmd is `isthmus uninstall`: remove the pinned links (detaching the
// programs), the pinned maps, the pin directory, isthmus0 with its routes and the
// WireGuard device.
func newUninstallCmd() *cobra.Command {
	var pinDir, cniBinDir, cniConfDir, wgDevice string
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove everything the agent installed in this network namespace",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := datapath.Uninstall(pinDir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed the datapath pinned in %s and %s\n", pinDir, datapath.OverlayDev)
			if err := wireguard.Remove(wgDevice); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed the WireGuard device %s\n", wgDevice)
			if cniBinDir == "" && cniConfDir == "" {
				return nil
			}
			if err := cniinstall.Uninstall(cniBinDir, cniConfDir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed the CNI plugin from %s and %s from %s\n", cniBinDir, cniinstall.ConflistName, cniConfDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&pinDir, "pin-dir", datapath.DefaultPinDir, "bpffs directory the agent pinned into")
	cmd.Flags().StringVar(&cniBinDir, "cni-bin-dir", "", "also remove isthmus-cni from this CNI plugin directory")
	cmd.Flags().StringVar(&cniConfDir, "cni-conf-dir", "", "also remove "+cniinstall.ConflistName+" from this CNI configuration directory")
	cmd.Flags().StringVar(&wgDevice, "wireguard-device", agent.DefaultWireGuardDevice, "the agent's --wireguard-device: removed, with its userspace process")
	return cmd
}
