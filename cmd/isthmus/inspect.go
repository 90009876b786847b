package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/agent"
	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/inspect"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
)

func newInspectCmd() *cobra.Command {
	var pinDir, output, objectsDir, node, wgDevice string
	cmd := &cobra.Command{
		Use:   "inspect routes|peers|nat|counters|groups|config|wireguard [--pin-dir DIR] [--objects DIR --node NAME] [-o table|json]",
		Short: "Print what the datapath's pinned maps hold on this node",
		Long: `inspect reads the maps the agent pinned under --pin-dir and prints one view:

  routes    overlay prefixes, the peer or next-hop group each goes to (with the
            group's live members and the slots each owns), flags
  peers     underlay address of each peer, flags, the inner sources it may send
  nat       return-path SNAT flows, both directions paired: pod <-> translated
            source, destination, TCP state, idle time and live or expired by
            the datapath's own timeouts
  counters  non-zero counters by verdict or drop reason and hook, packets and
            bytes summed over CPUs
  groups    next-hop groups with a live member and their slot owners; with
            --objects and --node (the node's plan), every group's remote site
            and each planned member marked "reaches" (it owns slots: it
            answers and reaches that site) or "down", and the groups no
            member reaches
  config    the config entry, pod interfaces, fabric prefixes, SNAT exempt
  wireguard the WireGuard device (--wireguard-device) and its peers, as
            "wg show" reports them: allowed IPs, endpoint, latest handshake,
            bytes received and sent, keepalive

It only reads, and works whether or not the agent runs. It needs root (or
CAP_BPF) and the bpffs the maps are pinned on; maps are not per network
namespace, so pointing --pin-dir at a node's pin directory is enough (in the
lab: --pin-dir /sys/fs/bpf/isthmus-lab/<lab>/<node>).
See docs/inspect.md.`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: append(slices.Clone(inspect.Views), "wireguard"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "wireguard" {
				wg, err := inspect.ReadWireGuard(wgDevice)
				if err != nil {
					return err
				}
				return inspect.WriteWireGuard(cmd.OutOrStdout(), wg, output)
			}
			if !slices.Contains(inspect.Views, args[0]) {
				return fmt.Errorf("parse view: unknown view %q (want one of %s)", args[0], strings.Join(inspect.Views, ", "))
			}
			if output != "table" && output != "json" {
				return fmt.Errorf("parse --output: unknown format %q (want table or json)", output)
			}
			if (objectsDir == "") != (node == "") {
				return fmt.Errorf("parse --objects %q / --node %q: give both or neither", objectsDir, node)
			}
			m, err := inspect.Open(pinDir)
			if err != nil {
				return err
			}
			defer m.Close()
			if objectsDir != "" {
				set, _, err := objects.LoadDir(objectsDir)
				if err != nil {
					return fmt.Errorf("load objects from %s:\n%w", objectsDir, err)
				}
				if m.Plan, err = plan.Compute(set, node); err != nil {
					return err
				}
			}
			return inspect.Write(cmd.OutOrStdout(), m, args[0], output)
		},
	}
	cmd.Flags().StringVar(&pinDir, "pin-dir", datapath.DefaultPinDir, "bpffs directory the agent pinned the maps into")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&objectsDir, "objects", "", "directory of the objects (as for isthmus plan), to name each group's site and planned members")
	cmd.Flags().StringVar(&node, "node", "", "this node's name, with --objects")
	cmd.Flags().StringVar(&wgDevice, "wireguard-device", agent.DefaultWireGuardDevice, "the agent's --wireguard-device, for the wireguard view")
	return cmd
}
