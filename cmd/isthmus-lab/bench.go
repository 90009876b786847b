package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/loader/cpbench"
	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/bench"
)

func newBenchCmd() *cobra.Command {
	opts := bench.Options{Scenario: "default", Src: "a1-p1", Dst: "b1-p1", Duration: 8 * time.Second, Rounds: 3, WithoutRules: true, KubeProxy: testenv.ProxyIPTables}
	snatOpts := bench.SNATOptions{Scenario: "seed000", Src: "aks1-ext", Dst: "flex-p1", Duration: 5 * time.Second, Rounds: 3, Workers: 4}
	var output string
	var snat, controlPlane bool
	withRules := true
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure one TCP stream pod to pod: isthmus vs kernel VXLAN vs plain routing, in one run",
		Long: `bench builds the scenario once per datapath (isthmus, kernel VXLAN as flannel
sets it up, plain routing), with and without the CNI leftover iptables rules (and,
with --kube-proxy, a real kube-proxy with a Service per pod, each lab with rules
running its own kube-apiserver), and with --proxy-arp once more with no rules and
the pods wired as Calico and Azure CNI wire them (proxy ARP on the host veth), then
measures a single iperf3 TCP stream between two pods in every lab, round after round
so drift spreads over all of them alike, and prints medians and ratios, and the
min / median / max of the per-round ratios to VXLAN (the margin: how far one round
fell, not only where the median sits; for isthmus also to plain routing). With
--encryption also isthmus with its peerings encrypted and plain WireGuard routing
between the sites (its baseline, the same WireGuard implementation). The labs are
removed afterwards. Needs root, iperf3 and sockperf. See docs/benchmarks.md.

With --family 6 the stream and the request/response run between the two pods'
IPv6 addresses (address6; default scenario dualstack): isthmus and kernel VXLAN
carry them over the IPv4 underlay, plain routing over IPv6 addresses the lab
gives the underlay. --family both measures both families in the same labs. With
--scenario underlay6 (an IPv6-only underlay) all three cross IPv6 between the
nodes: isthmus in GENEVE, kernel VXLAN over IPv6, plain routing via the nodes'
IPv6 addresses; each carries both pod families there.

With --snat it compares return-path source NAT instead: the seed000 scenario with
isthmus (BPF SNAT translates the undeclared pod aks1-ext to aks-1's tunnel
address) and with kernel VXLAN plus iptables MASQUERADE of that pod on its node,
measuring in each a TCP connection rate (--workers loops opening, using and
closing connections for --duration) and one iperf3 stream, interleaved.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("bench: output %q: want table or json", output)
			}
			// Ctrl-C ends the measurement and still removes the labs.
			ctx, cancel := signalContext()
			defer cancel()
			cmd.SetContext(ctx)
			if (controlPlane || snat) && cmd.Flags().Changed("family") {
				return fmt.Errorf("bench: --family: the stream benchmark's only (--snat and --control-plane measure IPv4)")
			}
			if controlPlane {
				return runControlPlaneBench(cmd, output)
			}
			exe, err := testenv.AgentBinary()
			if err != nil {
				return err
			}
			if snat {
				return runSNATBench(cmd, snatOpts, opts, exe, output)
			}
			if opts.KubeProxy != "" && opts.KubeProxy != testenv.ProxyIPTables && opts.KubeProxy != testenv.ProxyNFTables {
				return fmt.Errorf("bench: --kube-proxy %q: want iptables, nftables or \"\"", opts.KubeProxy)
			}
			if !cmd.Flags().Changed("scenario") {
				opts.Scenario = bench.DefaultScenario(opts.Family)
			}
			opts.SkipRules = !withRules
			opts.Binary = exe
			opts.Log = cmd.ErrOrStderr()
			rep, err := bench.Run(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if output == "json" {
				b, err := rep.JSON()
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), rep.String())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Scenario, "scenario", opts.Scenario, "scenario file or built-in name; dualstack when not given and --family is 6 or both")
	f.StringVar(&opts.Family, "family", bench.Family4, "address family of the measured traffic: 4, 6 (between the pods' address6) or both (in the same labs)")
	f.StringVar(&opts.Src, "src", opts.Src, "pod that sends")
	f.StringVar(&opts.Dst, "dst", opts.Dst, "pod that receives")
	f.DurationVar(&opts.Duration, "duration", opts.Duration, "length of each measurement (the first second is omitted)")
	f.IntVar(&opts.Rounds, "rounds", opts.Rounds, "measurements per configuration, interleaved; medians and the spread of the per-round ratios are reported")
	f.BoolVar(&opts.WithoutRules, "without-rules", opts.WithoutRules, "also measure every datapath with the CNI leftover rules removed")
	f.BoolVar(&opts.ProxyARP, "proxy-arp", opts.ProxyARP, "also measure every datapath with no rules and the pods wired as Calico and Azure CNI wire them (the pod's gateway answered by proxy ARP on the host veth)")
	f.BoolVar(&opts.Encryption, "encryption", opts.Encryption, "also measure isthmus with the scenario's peerings encrypted (GENEVE inside WireGuard) and plain WireGuard routing between the sites over the same WireGuard implementation, its baseline")
	f.BoolVar(&withRules, "with-rules", withRules, "measure every datapath with the CNI leftover rules (and kube-proxy); false leaves that variant out")
	f.StringVar((*string)(&opts.KubeProxy), "kube-proxy", string(opts.KubeProxy), `iptables or nftables: kube-proxy in that mode on every node of the labs with rules (needs the kube binaries, make kube-binaries); "" for none`)
	f.StringVarP(&output, "output", "o", "table", "table or json")
	f.BoolVar(&snat, "snat", false, "compare BPF return-path SNAT with iptables MASQUERADE over kernel VXLAN (scenario seed000, aks1-ext -> flex-p1, 5s)")
	f.BoolVar(&controlPlane, "control-plane", false, "measure the control plane instead, without a lab: plan CPU, one-Node change CPU and writes, map entries and heap for fleets of 500, 5,000 and 20,000 nodes, mesh and hub; then, as root (real BPF maps in network namespaces), event to maps through a running agent at 5,000 nodes")
	f.IntVar(&snatOpts.Workers, "workers", snatOpts.Workers, "with --snat: parallel connection loops of the connection-rate test")
	f.Uint32Var(&snatOpts.NatEntries, "snat-table-size", bench.DefaultSNATNatEntries, "with --snat: the isthmus agents' --snat-table-size; a round in which a source's share of it drops a new flow fails")
	return cmd
}

// controlPlaneReport is what `bench --control-plane` reports: the planning
// path's CPU per fleet, and event to maps measured through running agents.
type controlPlaneReport struct {
	Fleets      []cpbench.Result
	EventToMaps []cpbench.Latency
}

// runControlPlaneBench runs `bench --control-plane`: cpbench.Measure over
// cpbench.DefaultShapes, then cpbench.MeasureEventToMaps over
// cpbench.EventToMapsShapes (root only; without root the CPU figures are
// printed and the command fails saying why).
func runControlPlaneBench(cmd *cobra.Command, output string) error {
	var rep controlPlaneReport
	for _, sh := range cpbench.DefaultShapes {
		fmt.Fprintf(cmd.ErrOrStderr(), "fleet %s %dx%d\n", sh.Topology, sh.Sites, sh.NodesPerSite)
		rs, err := cpbench.Measure(sh)
		if err != nil {
			return err
		}
		rep.Fleets = append(rep.Fleets, rs...)
	}
	var failed error
	for _, sh := range cpbench.EventToMapsShapes {
		fmt.Fprintf(cmd.ErrOrStderr(), "event to maps, fleet %s %dx%d: running the agent\n", sh.Topology, sh.Sites, sh.NodesPerSite)
		ls, err := cpbench.MeasureEventToMaps(cmd.Context(), sh, cpbench.EventToMapsRounds, cmd.ErrOrStderr())
		if err != nil {
			failed = err
			break
		}
		rep.EventToMaps = append(rep.EventToMaps, ls...)
	}
	table := cpbench.Table(rep.Fleets)
	if len(rep.EventToMaps) > 0 {
		table += "\n" + cpbench.EventToMapsTable(rep.EventToMaps)
	}
	if err := printReport(cmd, output, rep, table); err != nil {
		return err
	}
	return failed
}

// printReport prints rep as indented JSON with output json, else table.
func printReport(cmd *cobra.Command, output string, rep any, table string) error {
	if output == "json" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("encode report: %w", err)
		}
		_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
		return err
	}
	_, err := fmt.Fprint(cmd.OutOrStdout(), table)
	return err
}

// runSNATBench runs `bench --snat`: the flags given explicitly override the
// SNAT defaults.
func runSNATBench(cmd *cobra.Command, so bench.SNATOptions, o bench.Options, exe, output string) error {
	f := cmd.Flags()
	if f.Changed("scenario") {
		so.Scenario = o.Scenario
	}
	if f.Changed("src") {
		so.Src = o.Src
	}
	if f.Changed("dst") {
		so.Dst = o.Dst
	}
	if f.Changed("duration") {
		so.Duration = o.Duration
	}
	if f.Changed("rounds") {
		so.Rounds = o.Rounds
	}
	so.Binary = exe
	so.Log = cmd.ErrOrStderr()
	rep, err := bench.RunSNAT(cmd.Context(), so)
	if err != nil {
		return err
	}
	return printReport(cmd, output, rep, rep.String())
}
