package agent

import (
	"fmt"
	"path"
	"strings"
)

// ParsePatterns splits a comma-separated list of shell-glob patterns (path.Match
// syntax, such as "pod-*,lxc*") and checks each one. Empty items are ignored.
func ParsePatterns(s string) ([]string, error) {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("parse pod interface pattern %q: %w", p, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// MatchAny reports whether name matches one of patterns.
func MatchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}
