package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// SNATOptions say what RunSNAT measures.
type SNATOptions struct {
	// Scenario is the lab to build; its Src pod must be one that return-path
	// SNAT translates (an unmanaged pod outside every declared block).
	Scenario string
	// Binary is the isthmus executable the agents run.
	Binary string
	// Src sends, Dst (a pod of another site) receives.
	Src, Dst string
	// Duration of each measurement (connection rate and throughput each).
	Duration time.Duration
	// Rounds: each round measures every configuration once, in turn.
	Rounds int
	// Workers are the parallel connection loops of the connection-rate test.
	Workers int
	// NatEntries sizes the isthmus agents' nat tables (--snat-table-size);
	// 0 means DefaultSNATNatEntries.
	NatEntries uint32
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// DefaultSNATNatEntries is the nat table the SNAT benchmark gives isthmus:
// 131,072 flows, the order of the conntrack table MASQUERADE has on these
// machines (nf_conntrack_max 262,144 flows). Its per-source share
// (datapath.DefaultNatSourceFlows: 65,536 flows) holds a 10 s closing
// timeout of a client at 6,500 connections a second, more than two cores
// open, so the benchmark compares the cost of translating, not the share:
// the default table's share (16,384 flows) is reached by the short test's
// second round.
const DefaultSNATNatEntries = 262144

// shareDropCounter is the drop reason of a new flow whose source holds its
// whole share of a nat table (DROP_NAT_SOURCE_LIMIT).
const shareDropCounter = "nat_source_limit"

// SNATConfig is one way of translating the source on its way into the tunnel.
type SNATConfig string

// The configurations RunSNAT compares, in measuring order.
const (
	// SNATIsthmus is isthmus with its BPF return-path SNAT.
	SNATIsthmus SNATConfig = "isthmus BPF SNAT"
	// SNATMasquerade is kernel VXLAN with iptables MASQUERADE of the pod on the
	// sending node (testenv's vxlan datapath), what a user would set up instead.
	SNATMasquerade SNATConfig = "vxlan + MASQUERADE"
)

// SNATConfigs lists the configurations in measuring order.
var SNATConfigs = []SNATConfig{SNATIsthmus, SNATMasquerade}

func (c SNATConfig) datapath() testenv.Datapath {
	if c == SNATMasquerade {
		return testenv.DatapathVXLAN
	}
	return testenv.DatapathIsthmus
}

func (c SNATConfig) labName() string {
	if c == SNATMasquerade {
		return "bsnatvx"
	}
	return "bsnatis"
}

// SNATSample is one round's measurement of one configuration.
type SNATSample struct {
	ConnsPerSec float64 `json:"connsPerSec"`
	// ConnFailures counts connections that failed during the rate test.
	ConnFailures int64 `json:"connFailures"`
	// ShareDrops counts new flows the datapath dropped during the round
	// because the source held its whole share (DROP_NAT_SOURCE_LIMIT).
	ShareDrops uint64 `json:"shareDrops,omitempty"`
	// FirstFailure is the error of the first failed connection, if any.
	FirstFailure string  `json:"firstFailure,omitempty"`
	Gbps         float64 `json:"gbps"`
	Retransmits  int     `json:"retransmits"`
}

// SNATResult holds every sample of one configuration.
type SNATResult struct {
	Config  SNATConfig   `json:"config"`
	Samples []SNATSample `json:"samples"`
}

// MedianConns is the median connection rate per second.
func (r SNATResult) MedianConns() float64 {
	var v []float64
	for _, s := range r.Samples {
		v = append(v, s.ConnsPerSec)
	}
	return median(v)
}

// MedianGbps is the median throughput in Gbit/s.
func (r SNATResult) MedianGbps() float64 {
	var v []float64
	for _, s := range r.Samples {
		v = append(v, s.Gbps)
	}
	return median(v)
}

// SNATReport is the outcome of RunSNAT.
type SNATReport struct {
	Scenario string        `json:"scenario"`
	Src      string        `json:"src"`
	Dst      string        `json:"dst"`
	SrcAddr  netip.Addr    `json:"srcAddr"`
	SeenAs   netip.Addr    `json:"seenAs"`
	Duration time.Duration `json:"duration"`
	Rounds   int           `json:"rounds"`
	Workers  int           `json:"workers"`
	// NatEntries is the isthmus agents' --snat-table-size.
	NatEntries uint32       `json:"natEntries"`
	Kernel     string       `json:"kernel"`
	Results    []SNATResult `json:"results"`
}

// Result returns the result of c, or false.
func (r *SNATReport) Result(c SNATConfig) (SNATResult, bool) {
	for _, res := range r.Results {
		if res.Config == c {
			return res, true
		}
	}
	return SNATResult{}, false
}

// Ratios returns isthmus over MASQUERADE for connection rate and throughput:
// the median of the ratios round by round (both measured in the same round,
// one after the other, so a swing of the machine's load between rounds moves
// both sides of a ratio), 0 where no round has both.
func (r *SNATReport) Ratios() (conns, gbps float64) {
	return median(r.roundRatios(func(s SNATSample) float64 { return s.ConnsPerSec })),
		median(r.roundRatios(func(s SNATSample) float64 { return s.Gbps }))
}

// roundRatios returns isthmus over MASQUERADE of metric, per round in which
// both have a positive value.
func (r *SNATReport) roundRatios(metric func(SNATSample) float64) []float64 {
	a, ok1 := r.Result(SNATIsthmus)
	b, ok2 := r.Result(SNATMasquerade)
	if !ok1 || !ok2 {
		return nil
	}
	var v []float64
	for i := 0; i < len(a.Samples) && i < len(b.Samples); i++ {
		if n, d := metric(a.Samples[i]), metric(b.Samples[i]); n > 0 && d > 0 {
			v = append(v, n/d)
		}
	}
	return v
}

// String renders the report as a table with the ratios to MASQUERADE.
func (r *SNATReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "TCP %s (%s, seen as %s) -> %s, scenario %s, %d rounds of %s per test, %d connection workers, isthmus nat table %d entries, kernel %s\n\n",
		r.Src, r.SrcAddr, r.SeenAs, r.Dst, r.Scenario, r.Rounds, r.Duration, r.Workers, r.NatEntries, r.Kernel)
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SOURCE NAT\tMEDIAN conn/s\tSAMPLES\tFAILED\tMEDIAN Gbit/s\tSAMPLES\tRETRANSMITS")
	for _, res := range r.Results {
		var cs, fs, gs, rs []string
		for _, s := range res.Samples {
			cs = append(cs, strconv.FormatFloat(s.ConnsPerSec, 'f', 0, 64))
			fs = append(fs, strconv.FormatInt(s.ConnFailures, 10))
			gs = append(gs, strconv.FormatFloat(s.Gbps, 'f', 2, 64))
			rs = append(rs, strconv.Itoa(s.Retransmits))
		}
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t%.2f\t%s\t%s\n", res.Config, res.MedianConns(), strings.Join(cs, " "),
			strings.Join(fs, " "), res.MedianGbps(), strings.Join(gs, " "), strings.Join(rs, " "))
	}
	w.Flush()
	conns, gbps := r.Ratios()
	fmt.Fprintf(&b, "\nisthmus BPF SNAT vs MASQUERADE (median of the rounds' ratios): %.2fx connection rate, %.2fx throughput\n", conns, gbps)
	return b.String()
}

// RunSNAT builds the scenario twice, once with isthmus (BPF return-path SNAT
// translates Src) and once with kernel VXLAN and iptables MASQUERADE of Src on
// its node, checks in each that Dst sees Src as its node's tunnel address, and
// then, round after round, measures in each a connection rate (ConnRate) and a
// single iperf3 stream from Src to Dst. The labs are removed afterwards, also
// on error. It needs root and iperf3.
func RunSNAT(ctx context.Context, opts SNATOptions) (rep *SNATReport, err error) {
	if opts.Duration < 2*time.Second {
		return nil, fmt.Errorf("bench snat: duration %s: want at least 2s (iperf3 omits the first second)", opts.Duration)
	}
	if opts.Rounds < 1 {
		return nil, fmt.Errorf("bench snat: rounds %d: want at least 1", opts.Rounds)
	}
	if opts.Workers < 1 {
		return nil, fmt.Errorf("bench snat: workers %d: want at least 1", opts.Workers)
	}
	if opts.NatEntries == 0 {
		opts.NatEntries = DefaultSNATNatEntries
	}
	if err := programs.Require("iperf3"); err != nil {
		return nil, fmt.Errorf("bench snat: %w", err)
	}
	logf := func(format string, args ...any) {
		if opts.Log != nil {
			fmt.Fprintf(opts.Log, format+"\n", args...)
		}
	}
	sc, err := testenv.LoadScenario(opts.Scenario)
	if err != nil {
		return nil, err
	}
	e, ok := sc.Expect(opts.Src, opts.Dst)
	src, _ := sc.Pod(opts.Src)
	if !ok || !src.Address.IsValid() || e.Saw == src.Address {
		return nil, fmt.Errorf("bench snat: in scenario %s, %s -> %s is not a translated pair (want an unmanaged pod outside the declared blocks sending to another site)", opts.Scenario, opts.Src, opts.Dst)
	}
	rep = &SNATReport{Scenario: opts.Scenario, Src: opts.Src, Dst: opts.Dst, SrcAddr: src.Address, SeenAs: e.Saw,
		Duration: opts.Duration, Rounds: opts.Rounds, Workers: opts.Workers, NatEntries: opts.NatEntries, Kernel: kernelRelease()}
	labs := make([]*testenv.Lab, len(SNATConfigs))
	defer func() {
		for _, l := range labs {
			if l != nil {
				if derr := l.Down(); derr != nil {
					err = errors.Join(err, fmt.Errorf("remove lab %s: %w", l.Name, derr))
				}
			}
		}
	}()
	for i, c := range SNATConfigs {
		sc, err := testenv.LoadScenario(opts.Scenario)
		if err != nil {
			return nil, err
		}
		name := c.labName()
		_ = testenv.Down(name, testenv.DownOptions{Binary: opts.Binary})
		logf("bench snat: building lab %s for %s", name, c)
		lo := testenv.Options{Name: name, Binary: opts.Binary, Datapath: c.datapath()}
		if c == SNATIsthmus {
			lo.AgentArgs = []string{"--snat-table-size", strconv.FormatUint(uint64(opts.NatEntries), 10)}
		}
		l, err := testenv.Up(ctx, sc, lo)
		if err != nil {
			return nil, fmt.Errorf("bench snat: build lab for %s: %w", c, err)
		}
		labs[i] = l
		// The translation must be in the path, or this measures something else.
		m, err := l.CheckPairs(ctx, [][2]string{{opts.Src, opts.Dst}}, testenv.CheckOptions{})
		if err != nil {
			return nil, fmt.Errorf("bench snat: %s: %s -> %s: %w\n%s", c, opts.Src, opts.Dst, err, m)
		}
		rep.Results = append(rep.Results, SNATResult{Config: c})
	}
	for round := 1; round <= opts.Rounds; round++ {
		for i, l := range labs {
			before, err := l.DatapathCount(shareDropCounter)
			if err != nil {
				return nil, fmt.Errorf("bench snat: round %d, %s: %w", round, SNATConfigs[i], err)
			}
			s, err := measureSNAT(ctx, l, opts, e.Saw)
			if err != nil {
				return nil, fmt.Errorf("bench snat: round %d, %s: %w", round, SNATConfigs[i], err)
			}
			after, err := l.DatapathCount(shareDropCounter)
			if err != nil {
				return nil, fmt.Errorf("bench snat: round %d, %s: %w", round, SNATConfigs[i], err)
			}
			// Else the per-source bound (docs/architecture.md, "The NAT
			// tables"), not the translation, would be measured.
			if s.ShareDrops = after - before; s.ShareDrops > 0 {
				return nil, fmt.Errorf("bench snat: round %d, %s: the source's share of a nat table of %d entries dropped %d new flows (%s): measure with a larger table",
					round, SNATConfigs[i], opts.NatEntries, s.ShareDrops, shareDropCounter)
			}
			logf("bench snat: round %d/%d %-20s %7.0f conn/s (%d failed%s) %6.2f Gbit/s (%d retransmits)",
				round, opts.Rounds, SNATConfigs[i], s.ConnsPerSec, s.ConnFailures, firstFailure(s.FirstFailure), s.Gbps, s.Retransmits)
			rep.Results[i].Samples = append(rep.Results[i].Samples, s)
		}
	}
	return rep, nil
}

// measureSNAT runs one connection-rate test and one iperf3 stream in lab l.
func measureSNAT(ctx context.Context, l *testenv.Lab, opts SNATOptions, seenAs netip.Addr) (SNATSample, error) {
	cr, err := testenv.ConnRate(ctx, l.PodNS(opts.Src), l.PodNS(opts.Dst), l.PodAddr(opts.Dst), opts.Workers, opts.Duration)
	if err != nil {
		return SNATSample{}, err
	}
	if cr.Saw != seenAs {
		return SNATSample{}, fmt.Errorf("connection rate: server saw %s, want the translated %s", cr.Saw, seenAs)
	}
	// More than 1% failed connections is a broken path, not a slow one.
	if cr.Failed*100 > cr.Conns {
		return SNATSample{}, fmt.Errorf("connection rate: %d of %d connections failed (first: %s)", cr.Failed, cr.Conns+cr.Failed, cr.FirstErr)
	}
	tp, err := measure(ctx, l, Options{Src: opts.Src, Dst: opts.Dst, Duration: opts.Duration}, Config{})
	if err != nil {
		return SNATSample{}, err
	}
	return SNATSample{ConnsPerSec: cr.PerSecond(), ConnFailures: cr.Failed, FirstFailure: cr.FirstErr, Gbps: tp.Gbps, Retransmits: tp.Retransmits}, nil
}

// firstFailure formats a round's first failed connection for the progress log.
func firstFailure(err string) string {
	if err == "" {
		return ""
	}
	return ", first: " + err
}
