package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/isthmus-dev/isthmus/testenv/bench"
)

func newBenchCmd() *cobra.Command {
	opts := bench.Options{Scenario: "default", Src: "a1-p1", Dst: "b1-p1", Duration: 8 * time.Second, Rounds: 3, WithoutRules: true}
	var output string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure one TCP stream pod to pod: isthmus vs kernel VXLAN vs plain routing, in one run",
		Long: `bench builds the scenario once per datapath (isthmus, kernel VXLAN as flannel
sets it up, plain routing), with and without the CNI leftover iptables rules, then
measures a single iperf3 TCP stream between two pods in every lab, round after round
so drift spreads over all of them alike, and prints medians and ratios. The labs are
removed afterwards. Needs root and iperf3. See docs/benchmarks.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("bench: output %q: want table or json", output)
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find isthmus binary: %w", err)
			}
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
	f.StringVar(&opts.Scenario, "scenario", opts.Scenario, "scenario file or built-in name")
	f.StringVar(&opts.Src, "src", opts.Src, "pod that sends")
	f.StringVar(&opts.Dst, "dst", opts.Dst, "pod that receives")
	f.DurationVar(&opts.Duration, "duration", opts.Duration, "length of each measurement (the first second is omitted)")
	f.IntVar(&opts.Rounds, "rounds", opts.Rounds, "measurements per configuration, interleaved")
	f.BoolVar(&opts.WithoutRules, "without-rules", opts.WithoutRules, "also measure every datapath with the CNI leftover rules removed")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}
