// Package conformance runs Kubernetes' own network conformance suite (the
// e2e.test binary of the lab's kube release, unmodified) against a cluster:
// a lab cluster (testenv/cluster) or a real one. The cases run are a focus
// set (Short or Full) minus the skip list skip.txt, one file whose every line
// names what a case needs that the lab does not have. The suite writes its
// JUnit report into a report directory; Summarize reads it into one line of
// passed, failed and skipped cases.
package conformance

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Focus names a set of cases.
type Focus string

const (
	// Short is the Granular Checks of Pods: a pod on every node, every pair
	// probed over HTTP and UDP, pod to pod and node to pod (four cases).
	// `make test` runs it.
	Short Focus = "short"
	// Full is every Granular Check (of Pods and of Services: ClusterIP,
	// NodePort, session affinity, endpoints across nodes), the sig-network
	// Services cases of the conformance profile, every other sig-network
	// [Conformance] case, and the NetworkPolicy cases (Netpol, which need a
	// policy engine beside isthmus): 110 cases of v1.37.2. `make
	// conformance` runs it.
	Full Focus = "full"
)

// focusSets are the regular expressions of each focus; a case runs when its
// name matches one of them and no line of the skip list.
var focusSets = map[Focus][]string{
	Short: {`\[sig-network\] Networking Granular Checks: Pods `},
	Full: {
		`\[sig-network\] Networking Granular Checks: `,
		`\[sig-network\] Services .*\[Conformance\]`,
		`\[sig-network\] .*\[Conformance\]`,
		`\[sig-network\] Netpol `,
	},
}

// ParseFocus returns the focus a name ("short", "full") names.
func ParseFocus(name string) (Focus, error) {
	f := Focus(name)
	if _, ok := focusSets[f]; !ok {
		return "", fmt.Errorf("focus %q: want short or full", name)
	}
	return f, nil
}

// Regexp returns the focus as one regular expression, its sets joined by |.
func (f Focus) Regexp() string { return strings.Join(focusSets[f], "|") }

//go:embed skip.txt
var skipFile []byte

// SkipEntry is a line of the skip list.
type SkipEntry struct {
	Pattern string // a regular expression over the case's full name
	Reason  string // what the case needs that the cluster does not have
	Line    int
}

// SkipList returns the repository's skip list (skip.txt beside this file).
func SkipList() ([]SkipEntry, error) { return ParseSkipList(bytes.NewReader(skipFile)) }

// ParseSkipList reads a skip list: one entry a line, "<regexp> # <reason>",
// split at the last " # "; blank lines and lines starting with # are
// comments. Every entry needs a reason and a pattern that compiles.
func ParseSkipList(r io.Reader) ([]SkipEntry, error) {
	var out []SkipEntry
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndex(line, " # ")
		if i < 0 {
			return nil, fmt.Errorf("skip list line %d: %q has no \" # reason\"", n, line)
		}
		e := SkipEntry{Pattern: strings.TrimSpace(line[:i]), Reason: strings.TrimSpace(line[i+3:]), Line: n}
		if e.Pattern == "" || e.Reason == "" {
			return nil, fmt.Errorf("skip list line %d: %q needs a pattern and a reason", n, line)
		}
		if _, err := regexp.Compile(e.Pattern); err != nil {
			return nil, fmt.Errorf("skip list line %d: %w", n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read skip list: %w", err)
	}
	return out, nil
}

// SkipRegexp joins the entries' patterns into one regular expression.
func SkipRegexp(entries []SkipEntry) string {
	var p []string
	for _, e := range entries {
		p = append(p, e.Pattern)
	}
	return strings.Join(p, "|")
}

// Selection is what a run asks the suite for: the cases whose name matches
// Focus and not Skip.
type Selection struct {
	Focus, Skip string
}

// Select returns the selection of a focus with the repository's skip list.
func Select(f Focus) (Selection, error) {
	if _, ok := focusSets[f]; !ok {
		return Selection{}, fmt.Errorf("focus %q: want short or full", f)
	}
	skips, err := SkipList()
	if err != nil {
		return Selection{}, err
	}
	return Selection{Focus: f.Regexp(), Skip: SkipRegexp(skips)}, nil
}

// Options say how Run runs the suite.
type Options struct {
	// E2ETest is the suite's binary (kubebin.E2ETest).
	E2ETest string
	// Kubeconfig reaches the cluster as an administrator.
	Kubeconfig string
	// Kubectl is the kubectl the suite runs for its kubectl cases
	// (--kubectl-path); "" is kubectl on PATH.
	Kubectl string
	// ReportDir receives the suite's JUnit report (junit_01.xml) and
	// Run's log of the suite's output (e2e.log).
	ReportDir string
	// Selection is what runs.
	Selection Selection
	// NetNS, when set, is a network namespace path the suite runs in
	// (nsenter --net): a lab node's, so that what the suite itself dials
	// (rarely: most cases probe from pods) is on the cluster's network, as
	// from a control-plane node.
	NetNS string
	// Timeout bounds the whole suite (--ginkgo.timeout); 0 is an hour.
	Timeout time.Duration
	// Output receives the suite's output as it runs, besides e2e.log.
	Output io.Writer
	// Extra are more arguments for e2e.test.
	Extra []string
}

// Args returns e2e.test's arguments for o. The provider is skeleton: the
// suite's provider for a cluster it knows nothing about (no cloud, no SSH to
// the nodes; "local" would claim SSH and run cases that then fail for want
// of it).
func Args(o Options) []string {
	timeout := o.Timeout
	if timeout == 0 {
		timeout = time.Hour
	}
	args := []string{
		"--kubeconfig=" + o.Kubeconfig,
		"--provider=skeleton",
		"--report-dir=" + o.ReportDir,
		"--ginkgo.focus=" + o.Selection.Focus,
		"--ginkgo.timeout=" + timeout.String(),
		"--ginkgo.no-color",
		"--ginkgo.v",
	}
	if o.Selection.Skip != "" {
		args = append(args, "--ginkgo.skip="+o.Selection.Skip)
	}
	if o.Kubectl != "" {
		args = append(args, "--kubectl-path="+o.Kubectl)
	}
	return append(args, o.Extra...)
}

// JUnitFile returns the path of the suite's JUnit report in a report
// directory.
func JUnitFile(reportDir string) string { return filepath.Join(reportDir, "junit_01.xml") }

// Run runs the suite as o says and returns the summary of its JUnit report.
// A suite that fails exits non-zero: Run then returns the summary (when the
// report was written) and an error. Failed cases are in the summary, not in
// the error's text.
func Run(ctx context.Context, o Options) (Summary, error) {
	if o.E2ETest == "" || o.Kubeconfig == "" || o.ReportDir == "" || o.Selection.Focus == "" {
		return Summary{}, errors.New("run conformance: want the e2e.test binary, a kubeconfig, a report directory and a focus")
	}
	if err := os.MkdirAll(o.ReportDir, 0o755); err != nil {
		return Summary{}, fmt.Errorf("run conformance: %w", err)
	}
	// A report of an earlier run must not stand in for this one's.
	os.Remove(JUnitFile(o.ReportDir))
	logf, err := os.Create(filepath.Join(o.ReportDir, "e2e.log"))
	if err != nil {
		return Summary{}, fmt.Errorf("run conformance: %w", err)
	}
	defer logf.Close()
	var out io.Writer = logf
	if o.Output != nil {
		out = io.MultiWriter(logf, o.Output)
	}
	argv := append([]string{o.E2ETest}, Args(o)...)
	if o.NetNS != "" {
		argv = append([]string{"nsenter", "--net=" + o.NetNS, "--"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	// The suite's working directory holds nothing of ours.
	cmd.Dir = o.ReportDir
	runErr := cmd.Run()
	f, err := os.Open(JUnitFile(o.ReportDir))
	if err != nil {
		return Summary{}, errors.Join(fmt.Errorf("run conformance: e2e.test wrote no report: %w", err), runErr)
	}
	defer f.Close()
	s, err := Summarize(f, o.Selection)
	if err != nil {
		return s, errors.Join(err, runErr)
	}
	if runErr != nil {
		return s, fmt.Errorf("run conformance: e2e.test: %w (%s)", runErr, s)
	}
	return s, nil
}
