package datapath

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeRules is a RuleSet that records each operation as a line of text.
type fakeRules struct {
	srcs []netip.Prefix
	log  []string
}

func (f *fakeRules) List() ([]netip.Prefix, error) { return slices.Clone(f.srcs), nil }

func (f *fakeRules) Add(p netip.Prefix) error {
	f.log = append(f.log, "add from "+p.String())
	f.srcs = append(f.srcs, p)
	return nil
}

func (f *fakeRules) Delete(p netip.Prefix) error {
	f.log = append(f.log, "delete from "+p.String())
	f.srcs = slices.DeleteFunc(f.srcs, func(q netip.Prefix) bool { return q == p })
	return nil
}

func TestSyncRulesTranscript(t *testing.T) {
	p := netip.MustParsePrefix
	f := &fakeRules{srcs: []netip.Prefix{p("10.16.9.0/24"), p("10.16.2.0/24")}}
	res, err := SyncRules(f, []netip.Prefix{p("10.16.3.7/24"), p("10.16.2.0/24"), p("fd00::/64"), p("10.16.3.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"add from 10.16.3.0/24", "delete from 10.16.9.0/24"}
	if diff := cmp.Diff(want, f.log); diff != "" {
		t.Fatalf("transcript (-want +got):\n%s", diff)
	}
	if res != (RuleResult{Added: 1, Deleted: 1}) {
		t.Fatalf("result = %+v", res)
	}
	f.log = nil
	if res, err := SyncRules(f, []netip.Prefix{p("10.16.2.0/24"), p("10.16.3.0/24")}); err != nil || res != (RuleResult{}) || f.log != nil {
		t.Fatalf("second sync: %+v %v %v, want nothing to do", res, err, f.log)
	}
}
