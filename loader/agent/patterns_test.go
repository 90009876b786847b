package agent

import "testing"

func TestParsePatternsAndMatch(t *testing.T) {
	ps, err := ParsePatterns(" pod-*, lxc[0-9]*,,azv* ")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 {
		t.Fatalf("patterns = %q, want 3", ps)
	}
	for name, want := range map[string]bool{
		"pod-a": true, "pod-": true, "lxc1abc": true, "lxcabc": false,
		"azv12": true, "eth0": false, "isthmus0": false, "xpod-a": false,
	} {
		if got := MatchAny(ps, name); got != want {
			t.Errorf("MatchAny(%q) = %v, want %v", name, got, want)
		}
	}
	if _, err := ParsePatterns("pod-[a"); err == nil {
		t.Fatal("a malformed glob must be rejected")
	}
}
