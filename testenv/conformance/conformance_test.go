package conformance

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testdata/junit_01.xml was written by ginkgo v2.34.0's JUnit reporter with
// the configuration e2e.test v1.37.2 uses (test/e2e/framework/internal/junit:
// no timelines for passed and skipped specs, no failure message attribute,
// no labels), from a report of: the suite's setup, two passed Granular
// Checks, one failed, one skipped at run time with the suite's reason, the
// SCTP case (selected by the focus, removed by the skip list), a case of
// another SIG the focus did not select, and the suite's teardown and report
// nodes.
func TestSummarizeJUnit(t *testing.T) {
	f, err := os.Open("testdata/junit_01.xml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sel := Selection{Focus: `\[sig-network\] Networking Granular Checks`, Skip: `SCTP`}
	got, err := Summarize(f, sel)
	if err != nil {
		t.Fatal(err)
	}
	const granular = "[sig-network] Networking Granular Checks: Pods should function for "
	want := Summary{
		Passed: 2, Failed: 1, Skipped: 2, SkipListed: 1, NotSelected: 1,
		FailedCases: []string{granular + "node-pod communication: http [LinuxOnly] [NodeConformance] [Conformance]"},
		SkippedCases: []string{
			granular + "node-pod communication: udp [LinuxOnly] [NodeConformance] [Conformance]: Requires at least 2 nodes (not 1)",
			granular + "intra-pod communication: sctp [LinuxOnly] [Feature:SCTPConnectivity]: in the skip list",
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Summarize (-want +got):\n%s", diff)
	}
	if got.Ran() != 3 {
		t.Errorf("Ran() = %d, want 3", got.Ran())
	}
	if s, want := got.String(), "conformance: 2 passed, 1 failed, 2 skipped (1 by the skip list), 1 not selected"; s != want {
		t.Errorf("String() = %q, want %q", s, want)
	}
}

// A failed suite node (the setup the whole run depends on) is a failure,
// whatever the cases did; an empty or foreign document is an error.
func TestSummarizeSuiteFailureAndGarbage(t *testing.T) {
	const doc = `<?xml version="1.0" encoding="UTF-8"?>
  <testsuites tests="2" disabled="0" errors="0" failures="1" time="30">
      <testsuite name="Kubernetes e2e suite" package="/" tests="2" disabled="0" skipped="1" errors="0" failures="1" time="30" timestamp="2026-12-05T17:00:00">
          <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="failed" time="30">
              <failure message="" type="failed">[FAILED] there are currently no ready, schedulable nodes in the cluster</failure>
          </testcase>
          <testcase name="[It] [sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
      </testsuite>
  </testsuites>`
	s, err := Summarize(strings.NewReader(doc), Selection{Focus: `Granular Checks`})
	if err != nil {
		t.Fatal(err)
	}
	if s.Failed != 1 || s.Ran() != 1 || s.Passed != 0 || !slices.Equal(s.FailedCases, []string{"[SynchronizedBeforeSuite]"}) {
		t.Errorf("Summarize = %+v, want the suite's setup as the one failure", s)
	}
	for _, bad := range []string{"", "<testsuites></testsuites>", "not xml"} {
		if _, err := Summarize(strings.NewReader(bad), Selection{}); err == nil {
			t.Errorf("Summarize(%q) = nil error, want one", bad)
		}
	}
}

// The repository's skip list parses, every pattern compiles, and every
// reason names what a case needs (never that it fails).
func TestSkipList(t *testing.T) {
	entries, err := SkipList()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatal("the skip list is empty")
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Reason, "needs ") {
			t.Errorf("skip.txt line %d: reason %q does not say what the case needs", e.Line, e.Reason)
		}
		if regexp.MustCompile(`(?i)\b(fail|flak|broken|bug)`).MatchString(e.Reason) {
			t.Errorf("skip.txt line %d: reason %q: a case is not skipped because it fails", e.Line, e.Reason)
		}
	}
	if _, err := ParseSkipList(strings.NewReader("SCTP\n")); err == nil {
		t.Error("a line without a reason parsed")
	}
	if _, err := ParseSkipList(strings.NewReader("[ # needs a bracket\n")); err == nil {
		t.Error("a pattern that does not compile parsed")
	}
}

// The focus sets select the cases they name and the skip list removes only
// what it names, over the full names of real v1.37 cases.
func TestSelection(t *testing.T) {
	cases := map[string]struct{ short, full bool }{
		"[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http [NodeConformance] [Conformance]":           {true, true},
		"[sig-network] Networking Granular Checks: Pods should function for node-pod communication: udp [LinuxOnly] [NodeConformance] [Conformance]": {true, true},
		"[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: sctp [LinuxOnly] [Feature:SCTPConnectivity]":    {false, false},
		"[sig-network] Networking Granular Checks: Services should function for pod-Service: udp":                                                    {false, true},
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]":                                                               {false, true},
		"[sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]":                                    {false, true},
		"[sig-network] Services should be able to up and down services":                                                                              {false, false},
		"[sig-network] Services should work after restarting kube-proxy [Disruptive]":                                                                {false, false},
		"[sig-network] DNS should provide DNS for services [Conformance]":                                                                            {false, true},
		"[sig-network] Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]":        {false, true},
		"[sig-network] LoadBalancers should be able to change the type and ports of a TCP service [Slow]":                                            {false, false},
		"[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]":                                       {false, false},
		"[sig-storage] EmptyDir volumes should support (root,0644,tmpfs) [LinuxOnly] [NodeConformance] [Conformance]":                                {false, false},
	}
	for _, f := range []Focus{Short, Full} {
		sel, err := Select(f)
		if err != nil {
			t.Fatal(err)
		}
		focus, skip := regexp.MustCompile(sel.Focus), regexp.MustCompile(sel.Skip)
		for name, want := range cases {
			runs := focus.MatchString(name) && !skip.MatchString(name)
			if w := map[Focus]bool{Short: want.short, Full: want.full}[f]; runs != w {
				t.Errorf("focus %s: %q runs = %v, want %v", f, name, runs, w)
			}
		}
	}
	if _, err := ParseFocus("everything"); err == nil {
		t.Error("ParseFocus accepted an unknown focus")
	}
}

// Args passes the kubeconfig, the skeleton provider, the report directory
// and the selection to e2e.test.
func TestArgs(t *testing.T) {
	got := Args(Options{Kubeconfig: "/k", ReportDir: "/r", Kubectl: "/bin/kubectl", Selection: Selection{Focus: "F", Skip: "S"}})
	for _, want := range []string{"--kubeconfig=/k", "--provider=skeleton", "--report-dir=/r", "--ginkgo.focus=F", "--ginkgo.skip=S", "--kubectl-path=/bin/kubectl", "--ginkgo.timeout=1h0m0s"} {
		if !slices.Contains(got, want) {
			t.Errorf("Args = %v, want %s among them", got, want)
		}
	}
}
