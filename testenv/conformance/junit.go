package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Summary counts the cases of a run. Passed and Failed are the cases that
// ran; Skipped those the focus selected that did not run, because the skip
// list names them (SkipListed of them) or because the suite skipped them at
// run time (a case that finds its requirement missing, with its reason);
// NotSelected the suite's other cases. A failure of the suite's own setup or
// teardown (its BeforeSuite, AfterSuite and report nodes) counts as a failed
// case named after the node.
type Summary struct {
	Passed, Failed, Skipped, SkipListed, NotSelected int
	// FailedCases and SkippedCases name them, SkippedCases with the
	// suite's reason.
	FailedCases  []string
	SkippedCases []string
}

// Ran is the number of cases that ran.
func (s Summary) Ran() int { return s.Passed + s.Failed }

// String is the one-line summary.
func (s Summary) String() string {
	return fmt.Sprintf("conformance: %d passed, %d failed, %d skipped (%d by the skip list), %d not selected",
		s.Passed, s.Failed, s.Skipped, s.SkipListed, s.NotSelected)
}

// junitSuites is the part of ginkgo's JUnit report Summarize reads (ginkgo
// v2's reporters.JUnitTestSuites, as e2e.test writes it to
// <report-dir>/junit_01.xml).
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name  string      `xml:"name,attr"`
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string `xml:"name,attr"`
	Status  string `xml:"status,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Type string `xml:"type,attr"`
	} `xml:"failure"`
	Error *struct {
		Type string `xml:"type,attr"`
	} `xml:"error"`
}

// itPrefix opens the name of every case (a ginkgo It); other leaf nodes are
// the suite's setup and teardown ("[SynchronizedBeforeSuite]",
// "[ReportAfterSuite] ...").
const itPrefix = "[It] "

// Summarize reads a JUnit report of e2e.test and counts its cases. sel, the
// run's selection, tells a case the skip list removed from one the focus
// never selected (both are "skipped" without a reason in the report); an
// empty sel counts every unexplained skip as not selected.
func Summarize(r io.Reader, sel Selection) (Summary, error) {
	var doc junitSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return Summary{}, fmt.Errorf("read JUnit report: %w", err)
	}
	match := func(expr string) func(string) bool {
		if expr == "" {
			return func(string) bool { return false }
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return func(string) bool { return false }
		}
		return re.MatchString
	}
	focused, skipped := match(sel.Focus), match(sel.Skip)
	var s Summary
	for _, suite := range doc.Suites {
		for _, c := range suite.Cases {
			name, isCase := strings.CutPrefix(c.Name, itPrefix)
			failed := c.Failure != nil || c.Error != nil
			switch c.Status {
			case "failed", "timedout", "panicked", "aborted", "interrupted":
				failed = true
			}
			if !isCase {
				if failed {
					s.Failed++
					s.FailedCases = append(s.FailedCases, c.Name)
				}
				continue
			}
			switch {
			case failed:
				s.Failed++
				s.FailedCases = append(s.FailedCases, name)
			case c.Status == "passed":
				s.Passed++
			case c.Skipped != nil && strings.HasPrefix(c.Skipped.Message, "skipped - "):
				// Skipped at run time, with the suite's reason.
				s.Skipped++
				s.SkippedCases = append(s.SkippedCases, name+": "+strings.TrimPrefix(c.Skipped.Message, "skipped - "))
			case focused(name) && skipped(name):
				s.Skipped++
				s.SkipListed++
				s.SkippedCases = append(s.SkippedCases, name+": in the skip list")
			default:
				// Not selected, or pending.
				s.NotSelected++
			}
		}
	}
	if len(doc.Suites) == 0 {
		return s, fmt.Errorf("read JUnit report: no test suite in it")
	}
	return s, nil
}
