// Package bench measures isthmus side by side with what a user would run instead:
// kernel VXLAN (as flannel sets it up) and plain routing, on the same lab topology
// and in one run, and reports ratios. Absolute numbers on shared machines drift; the
// ratios between datapaths measured in the same run, interleaved round by round, are
// what the project tracks.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// Options say what to measure.
type Options struct {
	// Scenario is the lab to build, once per datapath and rules variant.
	Scenario string
	// Binary is the isthmus executable the agents run.
	Binary string
	// Src and Dst are the pods the TCP stream runs between.
	Src, Dst string
	// Duration of each measurement, of which the first second is not counted.
	Duration time.Duration
	// Rounds: each round measures every configuration once, in turn, so drift on
	// the machine spreads over all of them alike.
	Rounds int
	// WithoutRules adds a variant of each datapath with the scenario's CNI
	// leftover iptables rules removed, which shows how much of the difference is
	// the datapath itself and how much is netfilter that isthmus bypasses.
	WithoutRules bool
	// ProxyARP adds a variant of each datapath with no rules and every pod wired
	// as Calico and Azure CNI wire them (testenv.PodWiringProxyARP: a /32 behind a
	// host veth that answers the pod's gateway by proxy ARP), made by hand for
	// isthmus too, so all three datapaths carry the same pods.
	ProxyARP bool
	// SkipRules leaves out the variant with the scenario's rules (and kube-proxy),
	// which every run measures otherwise.
	SkipRules bool
	// Encryption adds, to each variant, isthmus with the scenario's peerings
	// encrypted (GENEVE inside WireGuard) and plain WireGuard routing between
	// the sites over the same WireGuard implementation
	// (testenv.DatapathWireGuard), its baseline.
	Encryption bool
	// KubeProxy, when set, runs a real kube-proxy in that mode on every node of
	// the labs with rules, next to the CNI leftovers: each such lab gets its own
	// kube-apiserver (Kubernetes mode, testenv.SourceKube) and a NodePort Service
	// per pod, so every datapath pays for kube-proxy's chains (nat PREROUTING and
	// OUTPUT, filter FORWARD, INPUT and OUTPUT) as on a real node. The measured
	// traffic stays pod to pod.
	KubeProxy testenv.ProxyMode
	// Family is the address family of the measured traffic: Family4 (the
	// default, also ""), Family6 (between the pods' address6: GENEVE and
	// VXLAN over the IPv4 underlay, plain routing over the IPv6 addresses the
	// lab gives it; on a scenario whose underlay is IPv6, as underlay6's,
	// all three over that underlay) or FamilyBoth (both, in the same labs,
	// round by round).
	Family string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Values of Options.Family.
const (
	Family4    = "4"
	Family6    = "6"
	FamilyBoth = "both"
)

// DefaultScenario is the scenario measured in family when none is named:
// the dual-stack twin of the default lab when IPv6 is measured.
func DefaultScenario(family string) string {
	if family == Family6 || family == FamilyBoth {
		return "dualstack"
	}
	return "default"
}

// ipv6Families returns, for each family opts.Family measures in order,
// whether it is IPv6.
func ipv6Families(family string) ([]bool, error) {
	switch family {
	case "", Family4:
		return []bool{false}, nil
	case Family6:
		return []bool{true}, nil
	case FamilyBoth:
		return []bool{false, true}, nil
	}
	return nil, fmt.Errorf("bench: family %q: want 4, 6 or both", family)
}

// Config is one measured configuration.
type Config struct {
	Datapath testenv.Datapath `json:"datapath"`
	// Rules says whether the nodes carry the scenario's CNI leftover rules.
	Rules bool `json:"rules"`
	// Wiring is how the pods are wired to their nodes: the scenario's own, or
	// testenv.PodWiringProxyARP (with no rules).
	Wiring testenv.PodWiring `json:"wiring,omitempty"`
	// Encrypted is isthmus with the scenario's peerings encrypted (WireGuard).
	Encrypted bool `json:"encrypted,omitempty"`
	// IPv6 is the traffic between the pods' address6 (Options.Family); the
	// same lab carries both families.
	IPv6 bool `json:"ipv6,omitempty"`
}

// family names c's address family.
func (c Config) family() string {
	if c.IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Name names the datapath of c: isthmus+wireguard for encrypted isthmus.
func (c Config) Name() string {
	if c.Encrypted {
		return string(c.Datapath) + "+wireguard"
	}
	return string(c.Datapath)
}

// baselines are the configurations c is compared with, of the same variant:
// kernel VXLAN for all but itself; for isthmus plain routing, and for
// encrypted isthmus plain WireGuard routing instead.
func (c Config) baselines() []Config {
	switch {
	case c.Datapath == testenv.DatapathVXLAN:
		return nil
	case c.Encrypted:
		return []Config{c.on(testenv.DatapathVXLAN), c.on(testenv.DatapathWireGuard)}
	case c.Datapath == testenv.DatapathIsthmus:
		return []Config{c.on(testenv.DatapathVXLAN), c.on(testenv.DatapathPlain)}
	}
	return []Config{c.on(testenv.DatapathVXLAN)}
}

func (c Config) String() string {
	rules := "with CNI rules"
	if !c.Rules {
		rules = "no iptables rules"
	}
	if c.Wiring == testenv.PodWiringProxyARP {
		rules += ", proxy-ARP pods"
	}
	if c.IPv6 {
		rules += ", IPv6"
	}
	return c.Name() + " (" + rules + ")"
}

// on returns the configuration of the same variant (rules, wiring) and family
// on datapath dp: what c is compared with.
func (c Config) on(dp testenv.Datapath) Config {
	c.Datapath, c.Encrypted = dp, false
	return c
}

// variant names c's rules and wiring in the report's RULES column; leftovers is
// what the rules are.
func (c Config) variant(leftovers string) string {
	switch {
	case c.Wiring == testenv.PodWiringProxyARP:
		return "none, proxy-ARP pods"
	case c.Rules:
		return leftovers
	}
	return "none"
}

// Sample is one measurement: an iperf3 stream and a sockperf ping-pong.
type Sample struct {
	Gbps        float64 `json:"gbps"`
	Retransmits int     `json:"retransmits"`
	// RTTMicros is the mean round trip of one small TCP request and its
	// response, back to back on one connection (sockperf ping-pong: twice its
	// reported one-way latency), in µs; TPS is the transactions per second it
	// completed. Both 0 when sockperf is missing.
	RTTMicros float64 `json:"rtt_us,omitempty"`
	TPS       float64 `json:"tps,omitempty"`
	// BusyCores is how many of the machine's CPUs were busy, on average,
	// while the stream ran (every process and softirq: the labs' nodes, the
	// userspace WireGuard and iperf3 all run on this machine).
	BusyCores float64 `json:"busy_cores,omitempty"`
}

// CoresPerGbps is the machine's CPU cost of the stream: busy CPUs per Gbit/s.
func (s Sample) CoresPerGbps() float64 {
	if s.Gbps <= 0 {
		return 0
	}
	return s.BusyCores / s.Gbps
}

// Result holds every sample of one configuration.
type Result struct {
	Config  Config   `json:"config"`
	Samples []Sample `json:"samples"`
}

// Median returns the median throughput in Gbit/s, 0 without samples.
func (r Result) Median() float64 {
	v := make([]float64, 0, len(r.Samples))
	for _, s := range r.Samples {
		v = append(v, s.Gbps)
	}
	return median(v)
}

// MedianRTT returns the median request/response round trip in µs.
func (r Result) MedianRTT() float64 {
	v := make([]float64, 0, len(r.Samples))
	for _, s := range r.Samples {
		v = append(v, s.RTTMicros)
	}
	return median(v)
}

// MedianCoresPerGbps returns the median of the samples' busy CPUs per Gbit/s.
func (r Result) MedianCoresPerGbps() float64 {
	v := make([]float64, 0, len(r.Samples))
	for _, s := range r.Samples {
		v = append(v, s.CoresPerGbps())
	}
	return median(v)
}

// MedianTPS returns the median transactions per second.
func (r Result) MedianTPS() float64 {
	v := make([]float64, 0, len(r.Samples))
	for _, s := range r.Samples {
		v = append(v, s.TPS)
	}
	return median(v)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// Report is the outcome of Run.
type Report struct {
	Scenario string        `json:"scenario"`
	Src      string        `json:"src"`
	Dst      string        `json:"dst"`
	Duration time.Duration `json:"duration"`
	Rounds   int           `json:"rounds"`
	Kernel   string        `json:"kernel"`
	// KubeProxy is the kube-proxy mode the labs with rules ran, "" for none.
	KubeProxy testenv.ProxyMode `json:"kube_proxy,omitempty"`
	// Family is Options.Family: 4, 6 or both.
	Family string `json:"family,omitempty"`
	// Underlay6 says the scenario's underlay is IPv6 (as underlay6's): every
	// datapath carries the pods over IPv6 between the nodes.
	Underlay6 bool     `json:"underlay6,omitempty"`
	Results   []Result `json:"results"`
}

// hasIPv6 reports whether any configuration measured IPv6 traffic.
func (r *Report) hasIPv6() bool {
	return slices.ContainsFunc(r.Results, func(res Result) bool { return res.Config.IPv6 })
}

// Result returns the result of c, or false.
func (r *Report) Result(c Config) (Result, bool) {
	for _, res := range r.Results {
		if res.Config == c {
			return res, true
		}
	}
	return Result{}, false
}

// hasRules reports whether any configuration measured carried the rules.
func (r *Report) hasRules() bool {
	for _, res := range r.Results {
		if res.Config.Rules {
			return true
		}
	}
	return false
}

// Ratio returns median(a) / median(b), or 0 if either is missing or b is 0.
func (r *Report) Ratio(a, b Config) float64 {
	ra, ok1 := r.Result(a)
	rb, ok2 := r.Result(b)
	if !ok1 || !ok2 || rb.Median() == 0 {
		return 0
	}
	return ra.Median() / rb.Median()
}

// RoundRatios returns, round by round, a's sample over b's, as metric reads each
// sample (throughput, transactions per second): the rounds are interleaved, so the
// two samples of a round met the same load on the machine. Rounds where either
// sample is 0 (not measured) are left out; nil if either config is missing.
func (r *Report) RoundRatios(a, b Config, metric func(Sample) float64) []float64 {
	ra, ok1 := r.Result(a)
	rb, ok2 := r.Result(b)
	if !ok1 || !ok2 {
		return nil
	}
	var v []float64
	for i := 0; i < len(ra.Samples) && i < len(rb.Samples); i++ {
		if n, d := metric(ra.Samples[i]), metric(rb.Samples[i]); n > 0 && d > 0 {
			v = append(v, n/d)
		}
	}
	return v
}

// Margin is the spread of a datapath's per-round ratios to a baseline: the median
// ratio alone hides how far one round can fall.
type Margin struct {
	Config  Config  `json:"config"`
	Against Config  `json:"against"`
	Metric  string  `json:"metric"`
	Min     float64 `json:"min"`
	Median  float64 `json:"median"`
	Max     float64 `json:"max"`
}

// Gbps and TPS read one metric of a sample, for RoundRatios.
func Gbps(s Sample) float64 { return s.Gbps }
func TPS(s Sample) float64  { return s.TPS }

// Margins returns, for every datapath but VXLAN, the min, median and max of its
// per-round stream and TPS ratios to each of its baselines (VXLAN of the same
// variant; for isthmus also plain routing, for encrypted isthmus plain
// WireGuard routing instead).
func (r *Report) Margins() []Margin {
	var ms []Margin
	for _, res := range r.Results {
		for _, base := range res.Config.baselines() {
			for _, m := range []struct {
				name string
				f    func(Sample) float64
			}{{"stream", Gbps}, {"tps", TPS}} {
				v := r.RoundRatios(res.Config, base, m.f)
				if len(v) == 0 {
					continue
				}
				ms = append(ms, Margin{Config: res.Config, Against: base, Metric: m.name,
					Min: slices.Min(v), Median: median(v), Max: slices.Max(v)})
			}
		}
	}
	return ms
}

// margin returns the spread of c's ratios to against for metric, or false.
func (r *Report) margin(c, against Config, metric string) (Margin, bool) {
	for _, m := range r.Margins() {
		if m.Config == c && m.Against == against && m.Metric == metric {
			return m, true
		}
	}
	return Margin{}, false
}

// String renders the report as a table with ratios to kernel VXLAN and to plain
// routing of the same rules variant, then the spread of the per-round ratios.
func (r *Report) String() string {
	var b strings.Builder
	// With IPv6 rows a FAMILY column follows DATAPATH, and a note says what
	// differs; an IPv4 report keeps the form it always had.
	ipv6 := r.hasIPv6()
	rr := "sockperf ping-pong"
	if ipv6 {
		rr = "IPv4: sockperf ping-pong, IPv6: a ping-pong of this program's own"
		if !slices.ContainsFunc(r.Results, func(res Result) bool { return !res.Config.IPv6 }) {
			rr = "a ping-pong of this program's own"
		}
	}
	fmt.Fprintf(&b, "single TCP stream and TCP request/response (%s) %s -> %s, scenario %s, %d rounds of %s, kernel %s\n\n",
		rr, r.Src, r.Dst, r.Scenario, r.Rounds, r.Duration, r.Kernel)
	leftovers := "CNI leftovers"
	if r.KubeProxy != "" {
		leftovers += " + kube-proxy"
		if r.hasRules() {
			fmt.Fprintf(&b, "with rules: the CNI leftovers and a real kube-proxy (%s mode) with a NodePort Service per pod on every node\n\n", r.KubeProxy)
		}
	}
	name, head := func(c Config) string { return c.Name() }, "DATAPATH"
	if r.Underlay6 {
		b.WriteString(underlay6Note)
	}
	if ipv6 {
		name, head = func(c Config) string { return c.Name() + "\t" + c.family() }, "DATAPATH\tFAMILY"
		if !r.Underlay6 {
			b.WriteString(ipv6PathNote)
		}
		b.WriteString(ipv6Note)
	}
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, head+"\tRULES\tMEDIAN Gbit/s\tSAMPLES\tRETRANSMITS\tvs VXLAN\tvs PLAIN\tvs WIREGUARD\tCPUs per Gbit/s\tRR µs\tRR TPS\tTPS vs VXLAN\tRR µs vs WIREGUARD")
	for _, res := range r.Results {
		var samples, retr []string
		for _, s := range res.Samples {
			samples = append(samples, strconv.FormatFloat(s.Gbps, 'f', 2, 64))
			retr = append(retr, strconv.Itoa(s.Retransmits))
		}
		rules := res.Config.variant(leftovers)
		vx := res.Config.on(testenv.DatapathVXLAN)
		tpsRatio := 0.0
		if v, ok := r.Result(vx); ok && v.MedianTPS() > 0 {
			tpsRatio = res.MedianTPS() / v.MedianTPS()
		}
		// Encrypted isthmus is compared with plain WireGuard routing, the
		// rest with plain routing.
		vsPlain, vsWG, rttWG := fmt.Sprintf("%.2fx", r.Ratio(res.Config, res.Config.on(testenv.DatapathPlain))), "-", "-"
		if res.Config.Encrypted {
			base := res.Config.on(testenv.DatapathWireGuard)
			vsPlain, vsWG = "-", fmt.Sprintf("%.2fx", r.Ratio(res.Config, base))
			if b, ok := r.Result(base); ok && b.MedianRTT() > 0 {
				rttWG = fmt.Sprintf("%.2fx", res.MedianRTT()/b.MedianRTT())
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%.2f\t%s\t%s\t%.2fx\t%s\t%s\t%.3f\t%.1f\t%.0f\t%.2fx\t%s\n", name(res.Config), rules, res.Median(),
			strings.Join(samples, " "), strings.Join(retr, " "),
			r.Ratio(res.Config, vx), vsPlain, vsWG, res.MedianCoresPerGbps(),
			res.MedianRTT(), res.MedianTPS(), tpsRatio, rttWG)
	}
	w.Flush()
	fmt.Fprintf(&b, "\nround by round (each round measures every datapath once, in turn): min / median / max of the %d per-round ratios\n\n", r.Rounds)
	w = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, head+"\tRULES\tAGAINST\tSTREAM min/median/max\tTPS min/median/max")
	for _, res := range r.Results {
		for _, base := range res.Config.baselines() {
			cells := []string{"-", "-"}
			for i, metric := range []string{"stream", "tps"} {
				if m, ok := r.margin(res.Config, base, metric); ok {
					cells[i] = fmt.Sprintf("%.2fx / %.2fx / %.2fx", m.Min, m.Median, m.Max)
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", name(res.Config), res.Config.variant(leftovers), base.Name(), cells[0], cells[1])
		}
	}
	w.Flush()
	return b.String()
}

// underlay6Note heads the table of a report on an IPv6 underlay: how each
// datapath crosses it.
const underlay6Note = "IPv6 underlay: isthmus in GENEVE over IPv6, VXLAN as kernel VXLAN over IPv6 (both carry either pod family inside), plain routing via the nodes' IPv6 underlay addresses (IPv4 pod routes with an IPv6 next hop).\n"

// ipv6PathNote heads the table of a report with IPv6 rows on an IPv4
// underlay: how the overlays and plain routing carry IPv6 pods there.
const ipv6PathNote = "IPv6: isthmus and VXLAN over the IPv4 underlay, plain routing over the lab's IPv6 underlay addresses.\n"

// ipv6Note heads the table of a report with IPv6 rows: what differs there.
const ipv6Note = "IPv6: between the same pods' address6.\n" +
	"IPv6 request/response: 14-byte messages on one TCP connection, blocking sockets, as sockperf's defaults (sockperf 3.7 has no IPv6); compare its RR figures within IPv6 only.\n\n"

// JSON renders the report as indented JSON, with the margins.
func (r *Report) JSON() ([]byte, error) {
	return json.MarshalIndent(struct {
		*Report
		Margins []Margin `json:"margins"`
	}{r, r.Margins()}, "", "  ")
}

// labName names the lab of a configuration: short, [a-z0-9], no dash. Both
// families of a configuration share its lab.
func labName(c Config) string {
	n := map[testenv.Datapath]string{testenv.DatapathIsthmus: "bisth", testenv.DatapathVXLAN: "bvxlan", testenv.DatapathPlain: "bplain", testenv.DatapathWireGuard: "bwg"}[c.Datapath]
	if c.Encrypted {
		n += "wg"
	}
	switch {
	case c.Wiring == testenv.PodWiringProxyARP:
		n += "pa"
	case !c.Rules:
		n += "nr"
	}
	return n
}

// Configs returns the configurations Run measures for opts, in measuring order:
// variant by variant, each family of opts.Family in turn, every datapath of
// it. Encrypted isthmus and plain WireGuard routing are measured in IPv4 only
// (Run refuses Encryption with IPv6). Nil for an unknown family.
func Configs(opts Options) []Config {
	fams, err := ipv6Families(opts.Family)
	if err != nil {
		return nil
	}
	var cs, variants []Config
	if !opts.SkipRules {
		variants = append(variants, Config{Rules: true})
	}
	if opts.WithoutRules {
		variants = append(variants, Config{})
	}
	if opts.ProxyARP {
		variants = append(variants, Config{Wiring: testenv.PodWiringProxyARP})
	}
	for _, v := range variants {
		for _, ipv6 := range fams {
			v.IPv6 = ipv6
			for _, dp := range []testenv.Datapath{testenv.DatapathIsthmus, testenv.DatapathVXLAN, testenv.DatapathPlain} {
				cs = append(cs, v.on(dp))
			}
			if opts.Encryption && !ipv6 {
				enc := v.on(testenv.DatapathIsthmus)
				enc.Encrypted = true
				cs = append(cs, enc, v.on(testenv.DatapathWireGuard))
			}
		}
	}
	return cs
}

// labConfigs returns the configurations of the labs Run builds for configs, in
// order: one per configuration regardless of family, and for each config the
// index of its lab.
func labConfigs(configs []Config) (labs []Config, index []int) {
	for _, c := range configs {
		c4 := c
		c4.IPv6 = false
		i := slices.Index(labs, c4)
		if i < 0 {
			i = len(labs)
			labs = append(labs, c4)
		}
		index = append(index, i)
	}
	return labs, index
}

// podAddr returns the address the measurement of c uses for pod: its address6
// for IPv6, else its address; the zero Addr when it has none.
func podAddr(l *testenv.Lab, pod string, c Config) netip.Addr {
	p, _ := l.Pod(pod)
	if c.IPv6 {
		return p.Address6
	}
	return p.Address
}

// checkPods returns an error unless sc has pods src and dst, both with an
// address6 when ipv6 is measured.
func checkPods(sc *testenv.Scenario, src, dst string, ipv6 bool) error {
	pods := map[string]testenv.PodRef{}
	for _, p := range sc.Pods() {
		pods[p.Name] = p
	}
	for _, name := range []string{src, dst} {
		p, ok := pods[name]
		if !ok {
			return fmt.Errorf("bench: scenario %s has no pod %q", sc.Name, name)
		}
		if ipv6 && !p.Address6.IsValid() {
			return fmt.Errorf("bench: family 6: pod %s of scenario %s has no address6 (the dualstack scenario's pods have one)", name, sc.Name)
		}
	}
	return nil
}

// Run builds one lab per configuration (one for both families of it), measures
// a single TCP stream from Src to Dst in each, round after round, and removes
// the labs again (also on error). It needs root, iperf3 and sockperf.
func Run(ctx context.Context, opts Options) (rep *Report, err error) {
	if opts.Duration < 2*time.Second {
		return nil, fmt.Errorf("bench: duration %s: want at least 2s (the first second is omitted)", opts.Duration)
	}
	if opts.Rounds < 1 {
		return nil, fmt.Errorf("bench: rounds %d: want at least 1", opts.Rounds)
	}
	fams, err := ipv6Families(opts.Family)
	if err != nil {
		return nil, err
	}
	if opts.Family == "" {
		opts.Family = Family4
	}
	if opts.Scenario == "" {
		opts.Scenario = DefaultScenario(opts.Family)
	}
	if opts.Encryption && slices.Contains(fams, true) {
		return nil, fmt.Errorf("bench: encryption with family %s: measured in IPv4 only (the plain WireGuard baseline routes IPv4 only)", opts.Family)
	}
	if len(Configs(opts)) == 0 {
		return nil, errors.New("bench: no variant to measure: the one with rules is skipped and neither the one without rules nor the proxy-ARP one is asked for")
	}
	sc, err := testenv.LoadScenario(opts.Scenario)
	if err != nil {
		return nil, err
	}
	if err := checkPods(sc, opts.Src, opts.Dst, slices.Contains(fams, true)); err != nil {
		return nil, err
	}
	if opts.Encryption && sc.Underlay6() {
		return nil, fmt.Errorf("bench: encryption on scenario %s: its underlay is IPv6, and the plain WireGuard baseline routes over an IPv4 underlay only", sc.Name)
	}
	for _, tool := range []string{"iperf3", "sockperf"} {
		if err := programs.Require(tool); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	logf := func(format string, args ...any) {
		if opts.Log != nil {
			fmt.Fprintf(opts.Log, format+"\n", args...)
		}
	}
	rep = &Report{Scenario: opts.Scenario, Src: opts.Src, Dst: opts.Dst, Duration: opts.Duration, Rounds: opts.Rounds, Kernel: kernelRelease(), KubeProxy: opts.KubeProxy, Family: opts.Family, Underlay6: sc.Underlay6()}
	configs := Configs(opts)
	labConfs, labOf := labConfigs(configs)
	labs := make([]*testenv.Lab, len(labConfs))
	defer func() {
		for _, l := range labs {
			if l != nil {
				if derr := l.Down(); derr != nil {
					err = errors.Join(err, fmt.Errorf("remove lab %s: %w", l.Name, derr))
				}
			}
		}
	}()
	for i, c := range labConfs {
		sc, err := testenv.LoadScenario(opts.Scenario)
		if err != nil {
			return nil, err
		}
		if !c.Rules {
			sc.Defaults.CNILeftovers = testenv.Leftovers{}
			for si := range sc.Sites {
				for ni := range sc.Sites[si].Nodes {
					sc.Sites[si].Nodes[ni].CNILeftovers = nil
				}
			}
		}
		if c.Wiring != "" {
			sc.PodWiring = c.Wiring
		}
		if err := encryptionOf(sc, c); err != nil {
			return nil, fmt.Errorf("bench: %s: %w", c, err)
		}
		name := labName(c)
		// A lab left by an interrupted earlier run would block Up.
		_ = testenv.Down(name, testenv.DownOptions{Binary: opts.Binary})
		logf("bench: building lab %s for %s", name, c)
		lopts := testenv.Options{Name: name, Binary: opts.Binary, Datapath: c.Datapath}
		if c.Rules && opts.KubeProxy != "" {
			lopts.Source = testenv.SourceKube
		}
		l, err := testenv.Up(ctx, sc, lopts)
		if err != nil {
			return nil, fmt.Errorf("bench: build lab for %s: %w", c, err)
		}
		labs[i] = l
		if lopts.Source == testenv.SourceKube {
			logf("bench: kube-proxy (%s) on every node of %s", opts.KubeProxy, name)
			if err := startKubeProxy(ctx, l, opts.KubeProxy); err != nil {
				return nil, fmt.Errorf("bench: %s: %w", c, err)
			}
		}
		// A datapath that does not carry the path would leave the measurement
		// waiting on a connection that never opens: say so instead.
		for _, ipv6 := range fams {
			c.IPv6 = ipv6
			if err := reaches(ctx, l, opts.Src, opts.Dst, c); err != nil {
				return nil, fmt.Errorf("bench: %s: %w", c, err)
			}
		}
	}
	for _, c := range configs {
		rep.Results = append(rep.Results, Result{Config: c})
	}
	for round := 1; round <= opts.Rounds; round++ {
		for i, c := range configs {
			l := labs[labOf[i]]
			s, err := measure(ctx, l, opts, c)
			if err != nil {
				return nil, fmt.Errorf("bench: round %d, %s: %w", round, c, err)
			}
			if s.RTTMicros, s.TPS, err = requestResponse(ctx, l, opts, c); err != nil {
				return nil, fmt.Errorf("bench: round %d, %s: %w", round, c, err)
			}
			logf("bench: round %d/%d %-40s %6.2f Gbit/s (%d retransmits), RR %.1f µs, %.0f/s", round, opts.Rounds, c, s.Gbps, s.Retransmits, s.RTTMicros, s.TPS)
			rep.Results[i].Samples = append(rep.Results[i].Samples, s)
		}
	}
	return rep, nil
}

// encryptionOf prepares sc for c: encrypted isthmus encrypts every peering
// (the pods' MTU follows from the objects); plain WireGuard routing gives the
// pods without an MTU of their own the underlay MTU less WireGuard's 60 bytes,
// its device's.
func encryptionOf(sc *testenv.Scenario, c Config) error {
	switch {
	case c.Encrypted:
		if len(sc.Peerings) == 0 {
			return fmt.Errorf("scenario %s has no peering to encrypt", sc.Name)
		}
		for i := range sc.Peerings {
			sc.Peerings[i].Encryption = "WireGuard"
		}
	case c.Datapath == testenv.DatapathWireGuard:
		mtu := sc.Underlay.MTU
		if mtu == 0 {
			mtu = 1500
		}
		for si := range sc.Sites {
			for ni := range sc.Sites[si].Nodes {
				for pi := range sc.Sites[si].Nodes[ni].Pods {
					if p := &sc.Sites[si].Nodes[ni].Pods[pi]; p.MTU == 0 {
						p.MTU = mtu - testenv.WireGuardOverhead
					}
				}
			}
		}
	}
	return nil
}

// startKubeProxy creates a NodePort Service for every pod of the lab and runs
// kube-proxy in mode on every node, and waits until each has written the rules
// of every Service.
func startKubeProxy(ctx context.Context, l *testenv.Lab, mode testenv.ProxyMode) error {
	var svcs []testenv.Service
	for _, p := range l.Scenario.Pods() {
		// No server listens behind it: only the rules matter here.
		svc, err := l.CreateService(ctx, "bench-"+p.Name, p.Name, 8080)
		if err != nil {
			return err
		}
		svcs = append(svcs, svc)
	}
	if err := l.StartKubeProxy(ctx, mode); err != nil {
		return err
	}
	return l.WaitKubeProxyRules(ctx, mode, svcs, 2*time.Minute)
}

// reaches returns nil once pod src has an answer from pod dst to a ping (to
// its address6 when c is IPv6), an error if it has none within 10 s (a
// WireGuard handshake, neighbour resolution and kube-proxy's first sync all fit
// well within).
func reaches(ctx context.Context, l *testenv.Lab, src, dst string, c Config) error {
	to := podAddr(l, dst, c)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := testenv.Ping(l.PodNS(src), to, time.Second)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pod %s does not reach pod %s (%s): %w", src, dst, to, err)
		}
	}
}

// measure runs one iperf3 stream from opts.Src to opts.Dst in lab l, between
// their address6 when c is IPv6.
func measure(ctx context.Context, l *testenv.Lab, opts Options, c Config) (Sample, error) {
	const port = "5299"
	// A stream that stalls (a path lost in the middle of a run) ends the run
	// rather than waiting on it for ever.
	ctx, cancel := context.WithTimeout(ctx, opts.Duration+30*time.Second)
	defer cancel()
	dst := podAddr(l, opts.Dst, c)
	server := testenv.Command(ctx, l.PodNS(opts.Dst), "iperf3", "--server", "--one-off", "--forceflush",
		"--port", port, "--bind", dst.String())
	stdout, err := server.StdoutPipe()
	if err != nil {
		return Sample{}, fmt.Errorf("start iperf3 server: %w", err)
	}
	server.Stderr = server.Stdout
	if err := server.Start(); err != nil {
		return Sample{}, fmt.Errorf("start iperf3 server: %w", err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	if err := waitListening(stdout, 5*time.Second); err != nil {
		// Say what the pod holds: an address gone from it in the middle of a
		// run has been seen ("Cannot assign requested address").
		addrs, aerr := testenv.Exec(ctx, l.PodNS(opts.Dst), "ip", "-br", "address")
		if aerr != nil {
			addrs = aerr.Error()
		}
		return Sample{}, fmt.Errorf("iperf3 server in %s: %w (the pod's addresses: %s)", opts.Dst, err, strings.Join(strings.Fields(addrs), " "))
	}
	secs := strconv.Itoa(int(opts.Duration.Seconds()))
	before, err := readCPUTimes()
	if err != nil {
		return Sample{}, err
	}
	out, err := testenv.Exec(ctx, l.PodNS(opts.Src), "iperf3", "--client", dst.String(), "--port", port,
		"--time", secs, "--omit", "1", "--connect-timeout", "5000", "--json")
	if err != nil {
		return Sample{}, err
	}
	after, err := readCPUTimes()
	if err != nil {
		return Sample{}, err
	}
	s, err := parseIperf([]byte(out))
	s.BusyCores = after.busyCoresSince(before)
	return s, err
}

// cpuTimes is the machine's CPU time from /proc/stat, in clock ticks.
type cpuTimes struct {
	busy, total uint64
	cpus        int
}

func readCPUTimes() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	return parseProcStat(string(b))
}

// parseProcStat reads the "cpu" line (the sum over CPUs: user nice system idle
// iowait irq softirq steal ...; guest time is already in user) and counts the
// cpuN lines. Idle and iowait are not busy.
func parseProcStat(stat string) (cpuTimes, error) {
	var t cpuTimes
	found := false
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		if f[0] != "cpu" {
			t.cpus++
			continue
		}
		if len(f) < 9 {
			return cpuTimes{}, fmt.Errorf("/proc/stat: short cpu line %q", line)
		}
		for i, v := range f[1:9] { // user .. steal
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("/proc/stat: cpu line %q: %w", line, err)
			}
			t.total += n
			if i != 3 && i != 4 { // idle, iowait
				t.busy += n
			}
		}
		found = true
	}
	if !found || t.cpus == 0 {
		return cpuTimes{}, errors.New("/proc/stat: no cpu lines")
	}
	return t, nil
}

// busyCoresSince returns how many CPUs were busy on average between before and t.
func (t cpuTimes) busyCoresSince(before cpuTimes) float64 {
	if t.total <= before.total {
		return 0
	}
	return float64(t.busy-before.busy) / float64(t.total-before.total) * float64(t.cpus)
}

// requestResponse runs sockperf ping-pong over TCP from opts.Src to opts.Dst for
// opts.Duration (sockperf leaves out its own warm-up) and returns the mean round trip
// in µs and the transactions per second. Over IPv6 (c.IPv6), which sockperf
// 3.7 cannot speak, the ping-pong is this package's own (pingPong), and the
// receiving pod must see the sender's own address6.
func requestResponse(ctx context.Context, l *testenv.Lab, opts Options, c Config) (rttMicros, tps float64, err error) {
	const port = "5298"
	if c.IPv6 {
		dst := netip.AddrPortFrom(podAddr(l, opts.Dst, c), 5298)
		res, err := pingPong(ctx, nsRunner(l.PodNS(opts.Src)), nsRunner(l.PodNS(opts.Dst)), dst, opts.Duration)
		if err != nil {
			return 0, 0, fmt.Errorf("ping-pong to %s: %w", dst, err)
		}
		if want := podAddr(l, opts.Src, c); res.Saw != want {
			return 0, 0, fmt.Errorf("ping-pong to %s: the server saw source %s, want pod %s's own %s", dst, res.Saw, opts.Src, want)
		}
		return res.RTTMicros(), res.TPS(), nil
	}
	dst := l.PodAddr(opts.Dst).String()
	server := testenv.Command(ctx, l.PodNS(opts.Dst), "sockperf", "server", "--tcp", "-i", dst, "-p", port)
	if err := server.Start(); err != nil {
		return 0, 0, fmt.Errorf("start sockperf server: %w", err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	secs := strconv.Itoa(int(opts.Duration.Seconds()))
	for try := 0; ; try++ {
		// The server may not listen yet: a refused connect ends the client at once,
		// and sockperf may still exit 0 then (its output has no result).
		var out string
		out, err = testenv.Exec(ctx, l.PodNS(opts.Src), "sockperf", "ping-pong", "--tcp", "-i", dst, "-p", port, "-t", secs)
		if err == nil {
			rttMicros, tps, err = parseSockperf(out)
		}
		if err == nil || try == 25 {
			return rttMicros, tps, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var (
	sockperfValid   = regexp.MustCompile(`\[Valid Duration\] RunTime=([0-9.]+) sec; SentMessages=[0-9]+; ReceivedMessages=([0-9]+)`)
	sockperfLatency = regexp.MustCompile(`avg-lat(?:ency)?= *([0-9.]+)`)
)

// parseSockperf reads the valid-duration message count and the mean latency (half
// a round trip, in µs) from sockperf ping-pong output.
func parseSockperf(out string) (rttMicros, tps float64, err error) {
	v := sockperfValid.FindStringSubmatch(out)
	lat := sockperfLatency.FindStringSubmatch(out)
	if v == nil || lat == nil {
		return 0, 0, fmt.Errorf("parse sockperf output: no valid duration or latency in %q", out)
	}
	runtime, _ := strconv.ParseFloat(v[1], 64)
	msgs, _ := strconv.ParseFloat(v[2], 64)
	half, _ := strconv.ParseFloat(lat[1], 64)
	if runtime <= 0 || msgs <= 0 {
		return 0, 0, fmt.Errorf("parse sockperf output: no messages in %q", out)
	}
	return 2 * half, msgs / runtime, nil
}

// waitListening reads the iperf3 server's output until it says it listens (a probe
// connection would be taken as the one-off test), then drains the rest.
func waitListening(out io.Reader, limit time.Duration) error {
	listening := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var seen []string
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Server listening") {
				listening <- nil
				io.Copy(io.Discard, out)
				return
			}
			seen = append(seen, sc.Text())
		}
		listening <- fmt.Errorf("exited before listening: %s", strings.Join(seen, "; "))
	}()
	select {
	case err := <-listening:
		return err
	case <-time.After(limit):
		return fmt.Errorf("not listening after %s", limit)
	}
}

// parseIperf reads the receiver's throughput and the sender's retransmits from
// iperf3 --json output.
func parseIperf(out []byte) (Sample, error) {
	var v struct {
		End struct {
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return Sample{}, fmt.Errorf("parse iperf3 output: %w", err)
	}
	if v.Error != "" {
		return Sample{}, fmt.Errorf("iperf3: %s", v.Error)
	}
	if v.End.SumReceived.BitsPerSecond <= 0 {
		return Sample{}, errors.New("parse iperf3 output: no received throughput")
	}
	return Sample{Gbps: v.End.SumReceived.BitsPerSecond / 1e9, Retransmits: v.End.SumSent.Retransmits}, nil
}

// kernelRelease is what `uname -r` prints, without running it.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}
