package objects

import (
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// labelKeyIndex finds what a label selector selects among many label sets
// without matching every one: most requirements (=, in, exists, gt, lt)
// hold only where their key is, so only the label sets with the rarest such
// key need matching. Each pool's selector against each of 5,000 Nodes was a
// quarter of a million matches per snapshot, twice (validation and the Set's
// index).
type labelKeyIndex struct {
	n        int
	labelsOf func(i int) map[string]string
	byKey    map[string][]int // key -> positions of the label sets holding it, ascending; built on first use
}

// newLabelKeyIndex indexes the n label sets labelsOf returns.
func newLabelKeyIndex(n int, labelsOf func(i int) map[string]string) *labelKeyIndex {
	return &labelKeyIndex{n: n, labelsOf: labelsOf}
}

// selected returns the positions, ascending, of the label sets sel matches.
func (ix *labelKeyIndex) selected(sel labels.Selector) []int {
	if ix.byKey == nil {
		ix.byKey = make(map[string][]int)
		for i := range ix.n {
			for k := range ix.labelsOf(i) {
				ix.byKey[k] = append(ix.byKey[k], i)
			}
		}
	}
	var out []int
	match := func(i int) {
		if sel.Matches(labels.Set(ix.labelsOf(i))) {
			out = append(out, i)
		}
	}
	if candidates, ok := ix.candidates(sel); ok {
		for _, i := range candidates {
			match(i)
		}
		return out
	}
	for i := range ix.n {
		match(i)
	}
	return out
}

// candidates returns the label sets holding the rarest key that sel
// requires, or false when sel requires no key (it may match a set without
// any of its keys).
func (ix *labelKeyIndex) candidates(sel labels.Selector) ([]int, bool) {
	reqs, ok := sel.Requirements()
	if !ok {
		return nil, false
	}
	var best []int
	found := false
	for _, r := range reqs {
		switch r.Operator() {
		case selection.NotIn, selection.NotEquals, selection.DoesNotExist:
			continue // holds where the key is missing
		}
		if c := ix.byKey[r.Key()]; !found || len(c) < len(best) {
			best, found = c, true
		}
	}
	return best, found
}
