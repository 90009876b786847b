package objects

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestLabelKeyIndexSelectsAsMatching: for random label sets and random
// selectors of every operator, the index selects exactly the sets that
// labels.Selector.Matches accepts one by one.
func TestLabelKeyIndexSelectsAsMatching(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 2))
	keys := []string{"a", "b", "c", "d"}
	values := []string{"1", "2", "3", "x"}
	ops := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn,
		metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}
	for round := range 300 {
		sets := make([]map[string]string, rng.IntN(40))
		for i := range sets {
			if rng.IntN(5) == 0 {
				continue // no labels at all
			}
			sets[i] = map[string]string{}
			for _, k := range keys {
				if rng.IntN(2) == 0 {
					sets[i][k] = values[rng.IntN(len(values))]
				}
			}
		}
		ls := &metav1.LabelSelector{}
		for range rng.IntN(3) {
			if ls.MatchLabels == nil {
				ls.MatchLabels = map[string]string{}
			}
			ls.MatchLabels[keys[rng.IntN(len(keys))]] = values[rng.IntN(len(values))]
		}
		for range rng.IntN(3) {
			r := metav1.LabelSelectorRequirement{Key: keys[rng.IntN(len(keys))], Operator: ops[rng.IntN(len(ops))]}
			if r.Operator == metav1.LabelSelectorOpIn || r.Operator == metav1.LabelSelectorOpNotIn {
				r.Values = []string{values[rng.IntN(len(values))], values[rng.IntN(len(values))]}
			}
			ls.MatchExpressions = append(ls.MatchExpressions, r)
		}
		sel, err := metav1.LabelSelectorAsSelector(ls)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, s := range []labels.Selector{sel, labels.Nothing(), labels.Everything()} {
			var want []int
			for i, l := range sets {
				if s.Matches(labels.Set(l)) {
					want = append(want, i)
				}
			}
			ix := newLabelKeyIndex(len(sets), func(i int) map[string]string { return sets[i] })
			if got := ix.selected(s); !slices.Equal(got, want) {
				t.Fatalf("round %d: selector %q over %s selects %v, want %v", round, s, fmt.Sprint(sets), got, want)
			}
		}
	}
}
