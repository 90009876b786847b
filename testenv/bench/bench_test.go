package bench

import (
	"context"
	"encoding/json"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/isthmus-dev/isthmus/testenv"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestParseProcStat: busy time is everything but idle and iowait, over the
// summed cpu line; the CPUs are counted from the cpuN lines.
func TestParseProcStat(t *testing.T) {
	stat := `cpu  100 5 50 800 20 3 7 15 0 0
cpu0 50 2 25 400 10 1 4 8 0 0
cpu1 50 3 25 400 10 2 3 7 0 0
intr 12345
ctxt 999
`
	got, err := parseProcStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := (cpuTimes{busy: 100 + 5 + 50 + 3 + 7 + 15, total: 1000, cpus: 2}); got != want {
		t.Errorf("parseProcStat = %+v, want %+v", got, want)
	}
	later := cpuTimes{busy: got.busy + 150, total: got.total + 200, cpus: 2}
	if c := later.busyCoresSince(got); math.Abs(c-1.5) > 1e-9 {
		t.Errorf("busyCoresSince = %v, want 1.5 (150 of 200 ticks on 2 CPUs)", c)
	}
	for _, bad := range []string{"", "intr 1\n", "cpu 1 2 3\ncpu0 1 2 3\n", "cpu a b c d e f g h\ncpu0 1\n"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q) = nil error", bad)
		}
	}
}

func TestRatioAndTable(t *testing.T) {
	isth := Config{Datapath: testenv.DatapathIsthmus, Rules: true}
	vx := Config{Datapath: testenv.DatapathVXLAN, Rules: true}
	plain := Config{Datapath: testenv.DatapathPlain, Rules: true}
	rep := &Report{Scenario: "default", Src: "a", Dst: "b", Duration: 8 * time.Second, Rounds: 3, Kernel: "6.18", Results: []Result{
		{Config: isth, Samples: []Sample{{Gbps: 14}, {Gbps: 15}, {Gbps: 13}}},
		{Config: vx, Samples: []Sample{{Gbps: 10}, {Gbps: 12}, {Gbps: 11}}},
		{Config: plain, Samples: []Sample{{Gbps: 16}, {Gbps: 20}, {Gbps: 12}}},
	}}
	if got, want := rep.Ratio(isth, vx), 14.0/11.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("Ratio(isthmus, vxlan) = %v, want %v", got, want)
	}
	if got := rep.Ratio(isth, Config{Datapath: testenv.DatapathVXLAN, Rules: false}); got != 0 {
		t.Errorf("Ratio against a missing config = %v, want 0", got)
	}
	table := rep.String()
	for _, row := range []string{
		"isthmus   CNI leftovers  14.00          14.00 15.00 13.00",
		"1.27x     0.88x",
		"vxlan     CNI leftovers  11.00",
	} {
		if !strings.Contains(table, row) {
			t.Errorf("table lacks %q:\n%s", row, table)
		}
	}
}

// TestProxyARPRows: the proxy-ARP variant's rows are compared with VXLAN and
// plain routing of the same variant, never with the rules variant's.
func TestProxyARPRows(t *testing.T) {
	pa := Config{Wiring: testenv.PodWiringProxyARP}
	rep := &Report{Rounds: 1, Results: []Result{
		{Config: Config{Datapath: testenv.DatapathVXLAN, Rules: true}, Samples: []Sample{{Gbps: 1, TPS: 1}}},
		{Config: pa.on(testenv.DatapathIsthmus), Samples: []Sample{{Gbps: 9, TPS: 300, BusyCores: 1.8}}},
		{Config: pa.on(testenv.DatapathVXLAN), Samples: []Sample{{Gbps: 10, TPS: 200}}},
		{Config: pa.on(testenv.DatapathPlain), Samples: []Sample{{Gbps: 12, TPS: 400}}},
	}}
	table := rep.String()
	for _, row := range []string{
		"isthmus   none, proxy-ARP pods  9.00           9.00     0            0.90x     0.75x     -             0.200            0.0    300     1.50x         -",
		"isthmus   none, proxy-ARP pods  vxlan    0.90x / 0.90x / 0.90x  1.50x / 1.50x / 1.50x",
		"isthmus   none, proxy-ARP pods  plain    0.75x / 0.75x / 0.75x  0.75x / 0.75x / 0.75x",
	} {
		if !strings.Contains(table, row) {
			t.Errorf("table lacks %q:\n%s", row, table)
		}
	}
	// The kube-proxy header describes the labs with rules: none here.
	rep.KubeProxy = testenv.ProxyIPTables
	rep.Results = rep.Results[1:]
	if table := rep.String(); strings.Contains(table, "with rules:") {
		t.Errorf("a report without a rules variant describes one:\n%s", table)
	}
	rep.Results = append(rep.Results, Result{Config: Config{Datapath: testenv.DatapathIsthmus, Rules: true}, Samples: []Sample{{Gbps: 1, TPS: 1}}})
	if table := rep.String(); !strings.Contains(table, "with rules: the CNI leftovers and a real kube-proxy (iptables mode)") {
		t.Errorf("a report with a rules variant does not describe its rules:\n%s", table)
	}
	if got := pa.on(testenv.DatapathIsthmus).String(); got != "isthmus (no iptables rules, proxy-ARP pods)" {
		t.Errorf("String() = %q", got)
	}
}

func TestMargins(t *testing.T) {
	isth := Config{Datapath: testenv.DatapathIsthmus, Rules: true}
	vx := Config{Datapath: testenv.DatapathVXLAN, Rules: true}
	plain := Config{Datapath: testenv.DatapathPlain, Rules: true}
	rep := &Report{Rounds: 3, Results: []Result{
		{Config: isth, Samples: []Sample{{Gbps: 14, TPS: 300}, {Gbps: 15, TPS: 200}, {Gbps: 13, TPS: 100}}},
		{Config: vx, Samples: []Sample{{Gbps: 10, TPS: 100}, {Gbps: 12, TPS: 200}, {Gbps: 11, TPS: 400}}},
		{Config: plain, Samples: []Sample{{Gbps: 5}, {Gbps: 24}, {Gbps: 11}}},
	}}
	// Round by round: isthmus 14/10, 15/12, 13/11 and TPS 3, 1, 0.25 against VXLAN,
	// 14/5, 15/24, 13/11 against plain; plain 0.5, 2, 1 and no TPS (sockperf
	// missing: no margin).
	want := []Margin{
		{Config: isth, Against: vx, Metric: "stream", Min: 13.0 / 11, Median: 1.25, Max: 1.4},
		{Config: isth, Against: vx, Metric: "tps", Min: 0.25, Median: 1, Max: 3},
		{Config: isth, Against: plain, Metric: "stream", Min: 0.625, Median: 13.0 / 11, Max: 2.8},
		{Config: plain, Against: vx, Metric: "stream", Min: 0.5, Median: 1, Max: 2},
	}
	if d := cmp.Diff(want, rep.Margins(), cmpopts.EquateApprox(0, 1e-9)); d != "" {
		t.Errorf("Margins (-want +got):\n%s", d)
	}
	table := rep.String()
	for _, row := range []string{
		"isthmus   CNI leftovers  vxlan    1.18x / 1.25x / 1.40x  0.25x / 1.00x / 3.00x\n",
		"isthmus   CNI leftovers  plain    0.62x / 1.18x / 2.80x  -\n",
		"plain     CNI leftovers  vxlan    0.50x / 1.00x / 2.00x  -\n",
	} {
		if !strings.Contains(table, row) {
			t.Errorf("table lacks %q:\n%s", row, table)
		}
	}
	b, err := rep.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Results []Result `json:"results"`
		Margins []Margin `json:"margins"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	if d := cmp.Diff(want, back.Margins, cmpopts.EquateApprox(0, 1e-9)); d != "" || len(back.Results) != 3 {
		t.Errorf("JSON margins (-want +got):\n%s\n%s", d, b)
	}
}

func TestConfigsAndLabNames(t *testing.T) {
	pa := testenv.PodWiringProxyARP
	got := Configs(Options{WithoutRules: true, ProxyARP: true, Encryption: true})
	isth, vx, plain, wg := testenv.DatapathIsthmus, testenv.DatapathVXLAN, testenv.DatapathPlain, testenv.DatapathWireGuard
	want := []Config{
		{isth, true, "", false, false}, {vx, true, "", false, false}, {plain, true, "", false, false}, {isth, true, "", true, false}, {wg, true, "", false, false},
		{isth, false, "", false, false}, {vx, false, "", false, false}, {plain, false, "", false, false}, {isth, false, "", true, false}, {wg, false, "", false, false},
		{isth, false, pa, false, false}, {vx, false, pa, false, false}, {plain, false, pa, false, false}, {isth, false, pa, true, false}, {wg, false, pa, false, false},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Configs (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]Config{want[10], want[11], want[12]}, Configs(Options{SkipRules: true, ProxyARP: true})); d != "" {
		t.Errorf("Configs of the proxy-ARP variant alone (-want +got):\n%s", d)
	}
	if got := Configs(Options{SkipRules: true}); len(got) != 0 {
		t.Errorf("Configs with every variant left out = %v, want none", got)
	}
	seen := map[string]bool{}
	for _, c := range got {
		n := labName(c)
		if err := testenv.ValidateLabName(n); err != nil {
			t.Errorf("labName(%v) = %q: %v", c, n, err)
		}
		if seen[n] {
			t.Errorf("labName(%v) = %q twice", c, n)
		}
		seen[n] = true
	}
}

// TestConfigsFamilies: family 6 measures the same datapaths and variants
// between the pods' address6; both measures each variant's IPv4 datapaths,
// then its IPv6 ones, in the same labs; encryption stays IPv4.
func TestConfigsFamilies(t *testing.T) {
	isth, vx, plain, wg := testenv.DatapathIsthmus, testenv.DatapathVXLAN, testenv.DatapathPlain, testenv.DatapathWireGuard
	six := Configs(Options{Family: Family6, WithoutRules: true})
	want6 := []Config{
		{isth, true, "", false, true}, {vx, true, "", false, true}, {plain, true, "", false, true},
		{isth, false, "", false, true}, {vx, false, "", false, true}, {plain, false, "", false, true},
	}
	if d := cmp.Diff(want6, six); d != "" {
		t.Errorf("Configs of family 6 (-want +got):\n%s", d)
	}
	if d := cmp.Diff(Configs(Options{WithoutRules: true}), Configs(Options{Family: Family4, WithoutRules: true})); d != "" {
		t.Errorf("family 4 is not the default (-default +4):\n%s", d)
	}
	both := Configs(Options{Family: FamilyBoth, Encryption: true})
	wantBoth := []Config{
		{isth, true, "", false, false}, {vx, true, "", false, false}, {plain, true, "", false, false}, {isth, true, "", true, false}, {wg, true, "", false, false},
		{isth, true, "", false, true}, {vx, true, "", false, true}, {plain, true, "", false, true},
	}
	if d := cmp.Diff(wantBoth, both); d != "" {
		t.Errorf("Configs of both families (-want +got):\n%s", d)
	}
	labs, index := labConfigs(both)
	if d := cmp.Diff(wantBoth[:5], labs); d != "" {
		t.Errorf("labs of both families (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]int{0, 1, 2, 3, 4, 0, 1, 2}, index); d != "" {
		t.Errorf("lab of each config (-want +got):\n%s", d)
	}
	if got := Configs(Options{Family: "5"}); got != nil {
		t.Errorf("Configs of family 5 = %v, want none", got)
	}
	for f, want := range map[string]string{"": "default", Family4: "default", Family6: "dualstack", FamilyBoth: "dualstack"} {
		if got := DefaultScenario(f); got != want {
			t.Errorf("DefaultScenario(%q) = %q, want %q", f, got, want)
		}
	}
	if got := (Config{Datapath: vx, IPv6: true}).String(); got != "vxlan (no iptables rules, IPv6)" {
		t.Errorf("String() = %q", got)
	}
}

// TestRunRefusesFamily: Run says what is wrong before it builds anything: an
// unknown family, encryption with IPv6, pods without an address6.
func TestRunRefusesFamily(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Family: "5"}, `family "5": want 4, 6 or both`},
		{Options{Family: Family6, Encryption: true}, "encryption with family 6: measured in IPv4 only"},
		{Options{Family: FamilyBoth, Encryption: true}, "encryption with family both: measured in IPv4 only"},
		{Options{Family: Family6, Scenario: "default"}, "family 6: pod a1-p1 of scenario default has no address6"},
		{Options{Family: FamilyBoth, Scenario: "dualstack", Dst: "zz"}, `scenario dualstack has no pod "zz"`},
		{Options{Family: Family4, Scenario: "underlay6", Encryption: true}, "encryption on scenario underlay6: its underlay is IPv6"},
	} {
		o := tc.opts
		o.Duration, o.Rounds = 2*time.Second, 1
		if o.Src == "" {
			o.Src = "a1-p1"
		}
		if o.Dst == "" {
			o.Dst = "b1-p1"
		}
		_, err := Run(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v) = %v, want an error saying %q", tc.opts, err, tc.want)
		}
	}
	for _, name := range []string{"dualstack", "default"} {
		sc, err := testenv.LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkPods(sc, "a1-p1", "b1-p1", false); err != nil {
			t.Errorf("IPv4 pods of %s: %v", name, err)
		}
		if err := checkPods(sc, "a2-p2", "b2-p1", true); (err == nil) != (name == "dualstack") {
			t.Errorf("IPv6 pods of %s: %v", name, err)
		}
	}
}

// TestFamilyRows: a report with IPv6 rows gets a FAMILY column in both tables
// and a note on what differs; each family is compared with the baselines of
// its own family only, round by round; the JSON says which rows are IPv6.
func TestFamilyRows(t *testing.T) {
	isth := Config{Datapath: testenv.DatapathIsthmus, Rules: true}
	vx, plain := isth.on(testenv.DatapathVXLAN), isth.on(testenv.DatapathPlain)
	isth6, vx6, plain6 := isth, vx, plain
	isth6.IPv6, vx6.IPv6, plain6.IPv6 = true, true, true
	rep := &Report{Scenario: "dualstack", Src: "a1-p1", Dst: "b1-p1", Duration: 2 * time.Second, Rounds: 2, Kernel: "6.18", Family: FamilyBoth, Results: []Result{
		{Config: isth, Samples: []Sample{{Gbps: 12, TPS: 100}, {Gbps: 12, TPS: 100}}},
		{Config: vx, Samples: []Sample{{Gbps: 10, TPS: 100}, {Gbps: 10, TPS: 100}}},
		{Config: plain, Samples: []Sample{{Gbps: 12, TPS: 100}, {Gbps: 12, TPS: 100}}},
		// Round by round against VXLAN: 0.8, 1.0 (median 0.9); TPS 0.5, 1.
		{Config: isth6, Samples: []Sample{{Gbps: 8, TPS: 50, RTTMicros: 40}, {Gbps: 9, TPS: 80, RTTMicros: 25}}},
		{Config: vx6, Samples: []Sample{{Gbps: 10, TPS: 100, RTTMicros: 20}, {Gbps: 9, TPS: 80, RTTMicros: 25}}},
		{Config: plain6, Samples: []Sample{{Gbps: 12, TPS: 120}, {Gbps: 12, TPS: 120}}},
	}}
	table := rep.String()
	for _, row := range []string{
		"IPv6: between the same pods' address6",
		"DATAPATH  FAMILY  RULES          MEDIAN Gbit/s",
		"isthmus   IPv4    CNI leftovers  12.00          12.00 12.00  0 0          1.20x     1.00x",
		"isthmus   IPv6    CNI leftovers  8.50           8.00 9.00    0 0          0.89x     0.71x     -             0.000            32.5   65      0.72x",
		"vxlan     IPv6    CNI leftovers  9.50",
		"DATAPATH  FAMILY  RULES          AGAINST  STREAM min/median/max  TPS min/median/max",
		"isthmus   IPv6    CNI leftovers  vxlan    0.80x / 0.90x / 1.00x  0.50x / 0.75x / 1.00x",
		"isthmus   IPv6    CNI leftovers  plain    0.67x / 0.71x / 0.75x  0.42x / 0.54x / 0.67x",
		"isthmus   IPv4    CNI leftovers  vxlan    1.20x / 1.20x / 1.20x  1.00x / 1.00x / 1.00x",
	} {
		if !strings.Contains(table, row) {
			t.Errorf("table lacks %q:\n%s", row, table)
		}
	}
	if m, ok := rep.margin(isth6, vx6, "stream"); !ok || math.Abs(m.Median-0.9) > 1e-9 {
		t.Errorf("IPv6 margin against VXLAN = %+v, %v; want a median of 0.9", m, ok)
	}
	if _, ok := rep.margin(isth6, vx, "stream"); ok {
		t.Error("IPv6 isthmus compared with IPv4 VXLAN")
	}
	b, err := rep.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Family  string   `json:"family"`
		Results []Result `json:"results"`
		Margins []Margin `json:"margins"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	if back.Family != FamilyBoth || len(back.Results) != 6 || back.Results[3].Config != isth6 || back.Results[0].Config != isth {
		t.Errorf("JSON: family %q, results %+v", back.Family, back.Results)
	}
	if !strings.Contains(string(b), `"ipv6": true`) {
		t.Errorf("JSON does not mark the IPv6 rows:\n%s", b)
	}
	var six []Margin
	for _, m := range back.Margins {
		if m.Config.IPv6 != m.Against.IPv6 {
			t.Errorf("JSON margin across families: %+v", m)
		}
		if m.Config.IPv6 {
			six = append(six, m)
		}
	}
	if len(six) != 6 { // isthmus vs VXLAN and plain, plain vs VXLAN; stream and TPS each
		t.Errorf("JSON has %d IPv6 margins, want 6: %+v", len(six), six)
	}
	// On an IPv6 underlay the note says how each datapath crosses it, and
	// not that the overlays run over IPv4.
	u6 := *rep
	u6.Scenario, u6.Underlay6 = "underlay6", true
	if table := u6.String(); !strings.Contains(table, "IPv6 underlay: isthmus in GENEVE over IPv6, VXLAN as kernel VXLAN over IPv6") || strings.Contains(table, "over the IPv4 underlay") {
		t.Errorf("an IPv6-underlay report without its note, or with the IPv4 underlay's:\n%s", table)
	}
	// An IPv4 report keeps its columns.
	rep.Results = rep.Results[:3]
	if table := rep.String(); strings.Contains(table, "FAMILY") || strings.Contains(table, "IPv6") {
		t.Errorf("an IPv4 report with a family column or note:\n%s", table)
	}
}

// TestPingPong runs the IPv6 request/response test on the loopback, in both
// families: transactions counted after the warm-up, the server seeing the
// client's address, round trip and rate agreeing; and an address it cannot
// listen on fails at once.
func TestPingPong(t *testing.T) {
	here := func(fn func() error) error { return fn() }
	for _, a := range []string{"127.0.0.1", "::1"} {
		addr := netip.MustParseAddr(a)
		res, err := pingPong(context.Background(), here, here, netip.AddrPortFrom(addr, 0), pingPongWarmup+300*time.Millisecond)
		if err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		t.Logf("%s: %d transactions in %s: %.1f µs, %.0f/s", a, res.Transactions, res.Elapsed, res.RTTMicros(), res.TPS())
		if res.Saw != addr || res.Transactions < 100 || res.Elapsed < 250*time.Millisecond || res.Elapsed > 400*time.Millisecond {
			t.Errorf("%s: %+v; want the server to see %s, at least 100 transactions in about 300 ms", a, res, addr)
		}
		if p := res.RTTMicros() * res.TPS(); math.Abs(p-1e6) > 1 {
			t.Errorf("%s: round trip %.3f µs at %.1f/s: their product is %.3f, want 1e6", a, res.RTTMicros(), res.TPS(), p)
		}
	}
	if _, err := pingPong(context.Background(), here, here, netip.MustParseAddrPort("[2001:db8::1]:5298"), time.Second); err == nil || !strings.Contains(err.Error(), "bind") {
		t.Errorf("ping-pong to an address of no interface: %v, want a bind error", err)
	}
	if _, err := pingPong(context.Background(), here, here, netip.MustParseAddrPort("127.0.0.1:0"), pingPongWarmup); err == nil {
		t.Error("ping-pong no longer than its warm-up: no error")
	}
	if got := (pingPongResult{}).TPS() + (pingPongResult{}).RTTMicros(); got != 0 {
		t.Errorf("an empty result's rate and round trip: %v, want 0", got)
	}
}

// TestEncryptionRows: encrypted isthmus is compared with plain WireGuard
// routing of the same variant (throughput, and request/response latency) and
// with VXLAN, never with plain routing; plain WireGuard routing with VXLAN only.
func TestEncryptionRows(t *testing.T) {
	enc := Config{Datapath: testenv.DatapathIsthmus, Rules: true, Encrypted: true}
	wg := Config{Datapath: testenv.DatapathWireGuard, Rules: true}
	rep := &Report{Rounds: 1, Results: []Result{
		{Config: Config{Datapath: testenv.DatapathVXLAN, Rules: true}, Samples: []Sample{{Gbps: 10, TPS: 100, RTTMicros: 50}}},
		{Config: Config{Datapath: testenv.DatapathPlain, Rules: true}, Samples: []Sample{{Gbps: 20, TPS: 100, RTTMicros: 40}}},
		{Config: enc, Samples: []Sample{{Gbps: 1.8, TPS: 90, RTTMicros: 110}}},
		{Config: wg, Samples: []Sample{{Gbps: 2, TPS: 100, RTTMicros: 100}}},
	}}
	table := rep.String()
	for _, row := range []string{
		"isthmus+wireguard  CNI leftovers  1.80           1.80     0            0.18x     -         0.90x         0.000            110.0  90      0.90x         1.10x",
		"wireguard          CNI leftovers  2.00           2.00     0            0.20x     0.10x     -             0.000            100.0  100     1.00x         -",
		"isthmus+wireguard  CNI leftovers  wireguard  0.90x / 0.90x / 0.90x  0.90x / 0.90x / 0.90x",
	} {
		if !strings.Contains(table, row) {
			t.Errorf("table lacks %q:\n%s", row, table)
		}
	}
	if strings.Contains(table, "isthmus+wireguard  CNI leftovers  plain") {
		t.Errorf("encrypted isthmus compared with plain routing:\n%s", table)
	}
	if n := labName(enc); n != "bisthwg" || labName(wg) != "bwg" {
		t.Errorf("lab names %q, %q", n, labName(wg))
	}
}

// TestEncryptionOf: encrypted isthmus encrypts every peering of the scenario;
// plain WireGuard routing gives the pods without an MTU the device's.
func TestEncryptionOf(t *testing.T) {
	sc, err := testenv.LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	if err := encryptionOf(sc, Config{Datapath: testenv.DatapathIsthmus, Encrypted: true}); err != nil {
		t.Fatal(err)
	}
	for _, p := range sc.Peerings {
		if p.Encryption != "WireGuard" {
			t.Errorf("peering %s: encryption %q", p.Name, p.Encryption)
		}
	}
	if got := sc.PodMTU("site-a", testenv.Pod{}); got != 1390 {
		t.Errorf("encrypted pods' MTU %d, want 1390", got)
	}
	sc, _ = testenv.LoadScenario("default")
	if err := encryptionOf(sc, Config{Datapath: testenv.DatapathWireGuard}); err != nil {
		t.Fatal(err)
	}
	for _, p := range sc.Pods() {
		if p.MTU != 1440 {
			t.Errorf("pod %s MTU %d under plain WireGuard, want 1440", p.Name, p.MTU)
		}
	}
	sc.Peerings = nil
	if err := encryptionOf(sc, Config{Datapath: testenv.DatapathIsthmus, Encrypted: true}); err == nil {
		t.Error("a scenario without peerings encrypted")
	}
}

func TestParseIperf(t *testing.T) {
	s, err := parseIperf([]byte(`{"end":{"sum_sent":{"retransmits":7},"sum_received":{"bits_per_second":12500000000}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if s != (Sample{Gbps: 12.5, Retransmits: 7}) {
		t.Errorf("parseIperf = %+v", s)
	}
	for _, bad := range []string{`not json`, `{"error":"unable to connect"}`, `{"end":{}}`} {
		if _, err := parseIperf([]byte(bad)); err == nil {
			t.Errorf("parseIperf(%s) = nil error", bad)
		}
	}
}

// Bounds of TestRunShort, from docs/benchmarks.md's claims and runs of it
// under the kernel lock on this project's 2 shared cores.
const (
	// shortRounds of 2 s (1 s measured) per datapath.
	shortRounds = 3
	// shortFloorGbps: every datapath's median stream, so that a stalled
	// baseline cannot pass the ratio below. docs/benchmarks.md's lowest
	// median of a datapath is 5.37 Gbit/s, measured under the heaviest load
	// recorded here (single rounds fell to 0.03); the floor is half of it.
	// A run of this test under the kernel lock: medians 11.35 (VXLAN) to
	// 13.50 Gbit/s.
	shortFloorGbps = 2.5
	// shortMinRatio: the median per-round ratio of isthmus to VXLAN. The
	// claim is at or above 1.0x; docs/benchmarks.md's runs with the fast path
	// had medians of per-round ratios from 1.06x to 1.58x (single rounds from
	// 0.60x under heavy load, so no single round is judged); 0.9x leaves
	// 15% below the lowest median for 1 s measurements. Two runs of this test
	// under the kernel lock: rounds 1.09x, 1.26x, 1.17x (median 1.17x) and
	// 1.08x, 1.01x, 1.16x (median 1.08x). The same bound holds the IPv6
	// stream: docs/benchmarks.md's IPv6 runs with the CNI leftovers and
	// kube-proxy had medians of per-round ratios of 1.16x and 1.20x (rounds
	// from 1.12x), with IPv6 flows through the stack on both nodes.
	shortMinRatio = 0.9
)

// TestRunShort runs the real benchmark briefly on the dual-stack twin of the
// default lab, in both families, with a real kube-proxy (iptables mode) on
// every node as `isthmus-lab bench` runs by default: every datapath must carry
// the stream with kube-proxy's rules written (Run waits for them), over IPv4
// and over IPv6, so a broken baseline or a broken isthmus fails here rather
// than in a benchmark nobody runs; and isthmus must keep its claimed margin
// over VXLAN in each family (shortMinRatio).
func TestRunShort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestRunShort needs root: it builds network namespaces and loads BPF programs")
	}
	bin, err := testenv.BuildBinaries(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := Run(ctx, Options{Scenario: "dualstack", Family: FamilyBoth, Binary: bin, Src: "a1-p1", Dst: "b1-p1",
		Duration: 2 * time.Second, Rounds: shortRounds, KubeProxy: testenv.ProxyIPTables, Log: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", rep)
	t.Logf("the run took %s", time.Since(start).Round(time.Second))
	if !strings.Contains(rep.String(), "CNI leftovers + kube-proxy") {
		t.Errorf("the report does not say kube-proxy ran:\n%s", rep)
	}
	if len(rep.Results) != 6 {
		t.Fatalf("got %d results, want 6 (three datapaths, two families)", len(rep.Results))
	}
	for _, r := range rep.Results {
		// The IPv6 streams run at the IPv4 ones' rates here (8-13 Gbit/s
		// medians in docs/benchmarks.md, "IPv6"): one floor for both.
		if len(r.Samples) != shortRounds || r.Median() < shortFloorGbps {
			t.Errorf("%s: samples %+v, want %d with a median of at least %v Gbit/s", r.Config, r.Samples, shortRounds, shortFloorGbps)
		}
		for _, s := range r.Samples {
			if s.TPS <= 0 || s.RTTMicros <= 0 {
				t.Errorf("%s: a sample without request/response: %+v", r.Config, s)
			}
		}
	}
	// The claim (docs/benchmarks.md): one TCP stream with the CNI leftovers
	// and kube-proxy runs at or above kernel VXLAN, in each family. The
	// median of the per-round ratios (each round met one load on the
	// machine) must reach shortMinRatio.
	for _, ipv6 := range []bool{false, true} {
		isth := Config{Datapath: testenv.DatapathIsthmus, Rules: true, IPv6: ipv6}
		vx := isth.on(testenv.DatapathVXLAN)
		ratios := rep.RoundRatios(isth, vx, Gbps)
		t.Logf("%s: isthmus vs VXLAN round by round: %.2f (median %.2fx, want at least %.2fx)", isth.family(), ratios, median(ratios), shortMinRatio)
		if len(ratios) != shortRounds || median(ratios) < shortMinRatio {
			t.Errorf("%s: isthmus vs VXLAN, round by round: %.2f, want %d rounds with a median of at least %.2fx", isth.family(), ratios, shortRounds, shortMinRatio)
		}
	}
	for _, c := range Configs(Options{}) {
		if left, _ := filepath.Glob("/run/netns/isl-" + labName(c) + "-*"); len(left) > 0 {
			t.Errorf("lab %s left namespaces: %v", labName(c), left)
		}
	}
}

// TestBaselineLabs6: the baselines of `bench --family 6` carry IPv6 pods.
// The dualstack lab with kernel VXLAN and with plain routing, each with the
// scenario's CNI leftovers (ip6tables MASQUERADE of the pod blocks, FORWARD
// policy DROP, the strict IPv6 rpfilter): every pair the isthmus lab probes
// over IPv6 must pass ICMPv6, TCP and UDP, each server seeing the other pod's
// own address6 (the pod-to-pod exemption from MASQUERADE).
func TestBaselineLabs6(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestBaselineLabs6 needs root: it builds network namespaces")
	}
	for _, dp := range []testenv.Datapath{testenv.DatapathVXLAN, testenv.DatapathPlain} {
		sc, err := testenv.LoadScenario("dualstack")
		if err != nil {
			t.Fatal(err)
		}
		es6, skipped := sc.Expectations6()
		if len(es6) != 56 || len(skipped) != 0 {
			t.Fatalf("dualstack: %d IPv6 pairs, %d left out; want every one of the 56", len(es6), len(skipped))
		}
		var pairs [][2]string
		for _, e := range es6 {
			pairs = append(pairs, [2]string{e.Src, e.Dst})
		}
		name := "b6" + string(dp)
		_ = testenv.Down(name, testenv.DownOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		start := time.Now()
		l, err := testenv.Up(ctx, sc, testenv.Options{Name: name, Datapath: dp})
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", dp, err)
		}
		up := time.Since(start)
		m, err := l.CheckPairs(ctx, pairs, testenv.CheckOptions{Family: testenv.IPv6})
		if err != nil {
			if m != nil {
				t.Logf("%s:\n%s", dp, m)
			}
			t.Errorf("%s: %v", dp, err)
		} else if t.Logf("%s: lab up in %s, %d IPv6 probes passed", dp, up.Round(time.Millisecond), len(m.Probes)); len(m.Probes) != 3*56 {
			t.Errorf("%s: %d IPv6 probes, want %d", dp, len(m.Probes), 3*56)
		}
		if err := l.Down(); err != nil {
			t.Errorf("%s: %v", dp, err)
		}
		cancel()
	}
}

// TestBaselineLabsUnderlay6: the baselines of `bench --scenario underlay6` carry
// both pod families over the IPv6-only underlay. The underlay6 lab with kernel
// VXLAN and with plain routing: every pair of pods on different sites must
// pass ICMP, TCP and UDP in each family, each server seeing the other pod's
// own address; in the VXLAN lab tshark on the router port of a1 must see the
// pod pings as VXLAN (UDP 4789, the scenario's VNI) between the nodes' IPv6
// underlay addresses, carrying the pods' IPv6 and IPv4 packets alike, and
// vxlan0 has the underlay MTU less 70.
func TestBaselineLabsUnderlay6(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestBaselineLabsUnderlay6 needs root: it builds network namespaces")
	}
	for _, dp := range []testenv.Datapath{testenv.DatapathVXLAN, testenv.DatapathPlain} {
		sc, err := testenv.LoadScenario("underlay6")
		if err != nil {
			t.Fatal(err)
		}
		site := map[string]string{}
		for _, p := range sc.Pods() {
			site[p.Name] = p.Site
		}
		crossSite := func(es []testenv.Expectation) [][2]string {
			var pairs [][2]string
			for _, e := range es {
				if site[e.Src] != site[e.Dst] {
					pairs = append(pairs, [2]string{e.Src, e.Dst})
				}
			}
			return pairs
		}
		es6, _ := sc.Expectations6()
		pairs4, pairs6 := crossSite(sc.Expectations()), crossSite(es6)
		if len(pairs4) != 32 || len(pairs6) != 32 {
			t.Fatalf("underlay6: %d IPv4 and %d IPv6 pairs across the sites, want 32 each", len(pairs4), len(pairs6))
		}
		name := "u6" + string(dp)
		_ = testenv.Down(name, testenv.DownOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		start := time.Now()
		l, err := testenv.Up(ctx, sc, testenv.Options{Name: name, Datapath: dp})
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", dp, err)
		}
		up := time.Since(start)
		for _, fam := range []struct {
			name   string
			family testenv.Family
			pairs  [][2]string
		}{{"IPv4", testenv.IPv4, pairs4}, {"IPv6", testenv.IPv6, pairs6}} {
			m, err := l.CheckPairs(ctx, fam.pairs, testenv.CheckOptions{Family: fam.family})
			if err != nil {
				if m != nil {
					t.Logf("%s %s:\n%s", dp, fam.name, m)
				}
				t.Errorf("%s %s: %v", dp, fam.name, err)
			} else if t.Logf("%s: lab up in %s, %d %s probes passed", dp, up.Round(time.Millisecond), len(m.Probes), fam.name); len(m.Probes) != 3*32 {
				t.Errorf("%s %s: %d probes, want %d", dp, fam.name, len(m.Probes), 3*32)
			}
		}
		if dp == testenv.DatapathVXLAN {
			checkVXLANOverIPv6(ctx, t, l)
		}
		if err := l.Down(); err != nil {
			t.Errorf("%s: %v", dp, err)
		}
		cancel()
		if left, _ := filepath.Glob("/run/netns/isl-" + name + "-*"); len(left) > 0 {
			t.Errorf("lab %s left namespaces: %v", name, left)
		}
	}
}

// checkVXLANOverIPv6 captures, on the router port of a1 in the underlay6 VXLAN
// lab l, a ping from a1-p1 to b1-p1 in each family, and wants VXLAN frames
// (UDP 4789, VNI 4242) between a1's and b1's IPv6 underlay addresses that
// carry the pods' own packets; and vxlan0's MTU the underlay's 1500 less 70.
func checkVXLANOverIPv6(ctx context.Context, t *testing.T, l *testenv.Lab) {
	t.Helper()
	a1, _ := l.Node("a1")
	b1, _ := l.Node("b1")
	src, _ := l.Pod("a1-p1")
	dst, _ := l.Pod("b1-p1")
	outer := []string{"-e", "ipv6.src", "-e", "ipv6.dst", "-e", "udp.dstport", "-e", "vxlan.vni"}
	for _, c := range []struct {
		inner  string // the pods' family
		to     netip.Addr
		fields []string // tshark's fields past the outer ones
		want   []string // the fields of the request
	}{
		// An inner IPv6 packet adds its addresses to the outer ones' fields.
		{"IPv6", dst.Address6, nil, []string{a1.Address.String() + "," + src.Address6.String(), b1.Address.String() + "," + dst.Address6.String(), "4789", "4242"}},
		{"IPv4", dst.Address, []string{"-e", "ip.src", "-e", "ip.dst"}, []string{a1.Address.String(), b1.Address.String(), "4789", "4242", src.Address.String(), dst.Address.String()}},
	} {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		args := append([]string{"-i", testenv.RouterPort("a1"), "-f", "udp port 4789 and ip6", "-c", "2", "-T", "fields", "-E", "occurrence=a"}, outer...)
		out, err := testenv.Capture(cctx, l.RouterNS(), append(args, c.fields...),
			func() { _ = testenv.Ping(l.PodNS("a1-p1"), c.to, time.Second) })
		cancel()
		if err != nil {
			t.Errorf("capture VXLAN over IPv6 (%s inside): %v\n%s", c.inner, err, out)
			continue
		}
		if want := strings.Join(c.want, "\t"); !strings.Contains(out, want+"\n") {
			t.Errorf("VXLAN over IPv6 with %s inside: want a line %q in tshark's:\n%s", c.inner, want, out)
		}
	}
	link, err := l.Exec(ctx, l.NodeNS("a1"), "ip", "-o", "link", "show", testenv.VXLANDev)
	if err != nil || !strings.Contains(link, " mtu 1430 ") {
		t.Errorf("a1: %s (%v): %q, want mtu 1430", testenv.VXLANDev, err, link)
	}
}

func TestSNATReport(t *testing.T) {
	rep := &SNATReport{Scenario: "seed000", Src: "aks1-ext", Dst: "flex-p1", Rounds: 3, Workers: 4, Duration: 5 * time.Second,
		Results: []SNATResult{
			{Config: SNATIsthmus, Samples: []SNATSample{{ConnsPerSec: 3000, Gbps: 12}, {ConnsPerSec: 2800, Gbps: 10}, {ConnsPerSec: 3200, Gbps: 11}}},
			{Config: SNATMasquerade, Samples: []SNATSample{{ConnsPerSec: 2000, Gbps: 10}, {ConnsPerSec: 2500, Gbps: 11}, {ConnsPerSec: 1500, Gbps: 9}}},
		}}
	// Round by round: conns 1.5, 1.12, 2.13; Gbit/s 1.2, 0.91, 1.22. The
	// medians of each side alone would give 1.5 and 1.1.
	conns, gbps := rep.Ratios()
	if math.Abs(conns-1.5) > 1e-9 || math.Abs(gbps-1.2) > 1e-9 {
		t.Errorf("Ratios = %v, %v, want 1.5, 1.2", conns, gbps)
	}
	// One round in which isthmus met a load spike the other side did not:
	// the pairs say 1.04, 0.53, 1.00 (median 1.00); the medians of each side
	// alone (3819 / 5095) would say 0.75.
	spike := &SNATReport{Results: []SNATResult{
		{Config: SNATIsthmus, Samples: []SNATSample{{ConnsPerSec: 5653, Gbps: 1}, {ConnsPerSec: 2716, Gbps: 1}, {ConnsPerSec: 3819, Gbps: 1}}},
		{Config: SNATMasquerade, Samples: []SNATSample{{ConnsPerSec: 5429, Gbps: 1}, {ConnsPerSec: 5095, Gbps: 1}, {ConnsPerSec: 3814, Gbps: 1}}},
	}}
	if c, _ := spike.Ratios(); math.Abs(c-3819.0/3814) > 1e-9 {
		t.Errorf("Ratios of the spiked report = %v, want %v", c, 3819.0/3814)
	}
	table := rep.String()
	for _, want := range []string{"isthmus BPF SNAT    3000", "vxlan + MASQUERADE  2000", "1.50x connection rate, 1.20x throughput"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if c, g := (&SNATReport{}).Ratios(); c != 0 || g != 0 {
		t.Errorf("Ratios of an empty report = %v, %v, want 0, 0", c, g)
	}
}

// TestRunSNATShort runs the SNAT benchmark briefly on seed000: both source NATs
// must carry connections and a stream with the translated address, so a broken
// BPF SNAT or a broken MASQUERADE baseline fails here, and BPF SNAT must not
// fall far behind MASQUERADE (snatMinRatio).
func TestRunSNATShort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestRunSNATShort needs root: it builds network namespaces and loads BPF programs")
	}
	bin, err := testenv.BuildBinaries(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := RunSNAT(ctx, SNATOptions{Scenario: "seed000", Binary: bin, Src: "aks1-ext", Dst: "flex-p1",
		Duration: 2 * time.Second, Rounds: shortRounds, Workers: 2, Log: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", rep)
	if rep.SeenAs.String() != "100.64.0.4" {
		t.Errorf("seen as %s, want aks-1's tunnel address 100.64.0.4", rep.SeenAs)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("got %d results, want 2", len(rep.Results))
	}
	for _, r := range rep.Results {
		// Every source NAT working, so that a stalled baseline cannot pass
		// the ratios below: docs/benchmarks.md measured medians of 4738 and
		// 6416 conn/s, 10.76 and 13.65 Gbit/s; a quarter of the lower
		// connection rate, and shortFloorGbps.
		if len(r.Samples) != shortRounds || r.MedianConns() < 1000 || r.MedianGbps() < shortFloorGbps {
			t.Errorf("%s: samples %+v, want %d with medians of at least 1000 conn/s and %v Gbit/s", r.Config, r.Samples, shortRounds, shortFloorGbps)
		}
	}
	// Both ratios are medians of the rounds' ratios (each round measures
	// both in turn), so one round that met a load spike on one side alone
	// cannot decide them; RunSNAT fails a round in which the per-source share
	// dropped a flow, so they compare translation, not that bound. A BPF SNAT
	// that falls to three quarters of MASQUERADE fails.
	const snatMinRatio = 0.75
	conns, gbps := rep.Ratios()
	t.Logf("BPF SNAT vs MASQUERADE: %.2fx connection rate, %.2fx throughput (want at least %.2fx each)", conns, gbps, snatMinRatio)
	if conns < snatMinRatio || gbps < snatMinRatio {
		t.Errorf("BPF SNAT vs MASQUERADE: %.2fx connection rate, %.2fx throughput, want at least %.2fx each", conns, gbps, snatMinRatio)
	}
	for _, c := range SNATConfigs {
		if left, _ := filepath.Glob("/run/netns/isl-" + c.labName() + "-*"); len(left) > 0 {
			t.Errorf("lab %s left namespaces: %v", c.labName(), left)
		}
	}
}

// TestParseSockperf reads a real sockperf 3.7 ping-pong run (loopback, 1 s; colour
// escapes as sockperf prints them).
func TestParseSockperf(t *testing.T) {
	out := "sockperf: [Total Run] RunTime=1.011 sec; Warm up time=400 msec; SentMessages=16765; ReceivedMessages=16764\n" +
		"sockperf: ========= Printing statistics for Server No: 0\n" +
		"sockperf: [Valid Duration] RunTime=0.516 sec; SentMessages=9375; ReceivedMessages=9375\n" +
		"sockperf: \x1b[2;35m====> avg-latency=27.464 (std-dev=608.286)\x1b[0m\n" +
		"sockperf: Summary: Latency is 27.464 usec\n"
	rtt, tps, err := parseSockperf(out)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(rtt-54.928) > 1e-9 || math.Abs(tps-9375/0.516) > 1e-6 {
		t.Errorf("parseSockperf = %v µs, %v/s; want 54.928 µs, %v/s", rtt, tps, 9375/0.516)
	}
	if _, _, err := parseSockperf("sockperf: ERROR: connect failed"); err == nil {
		t.Error("parseSockperf of a failed run = nil error")
	}
}

// logWriter sends a benchmark's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
