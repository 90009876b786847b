package e2eimages

import (
	"slices"
	"strings"
	"testing"
)

// listImages is the shape of `e2e.test --list-images` of v1.37.2 (a part of
// it, out of order, as it prints a map), with a name printed twice.
const listImages = `registry.k8s.io/e2e-test-images/agnhost:2.66.1
registry.k8s.io/pause:3.10.2
gcr.io/k8s-authenticated-test/agnhost:2.6
registry.k8s.io/e2e-test-images/agnhost:2.55
registry.k8s.io/e2e-test-images/busybox:1.37.0-2
registry.k8s.io/e2e-test-images/node-perf/npb-ep:1.6.0
registry.k8s.io/sig-storage/csi-provisioner:v5.3.0
invalid.registry.k8s.io/invalid/alpine:3.1
registry.k8s.io/e2e-test-images/agnhost-windows:1.0
localhost:5000/e2e/pause-tools:1
registry.k8s.io/pause:3.10.2

`

func TestParseImageList(t *testing.T) {
	refs, err := ParseImageList(listImages)
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) != 10 || !slices.IsSorted(refs) {
		t.Errorf("got %d references (want 10, the duplicate once), sorted %v:\n%s", len(refs), slices.IsSorted(refs), strings.Join(refs, "\n"))
	}
	for _, c := range []struct {
		image string
		want  []string
	}{
		{Agnhost, []string{"gcr.io/k8s-authenticated-test/agnhost:2.6", "registry.k8s.io/e2e-test-images/agnhost:2.55", "registry.k8s.io/e2e-test-images/agnhost:2.66.1"}},
		{Pause, []string{"registry.k8s.io/pause:3.10.2"}},
		{"npb-ep", []string{"registry.k8s.io/e2e-test-images/node-perf/npb-ep:1.6.0"}},
		{"nginx", nil},
	} {
		if got := Select(refs, c.image); !slices.Equal(got, c.want) {
			t.Errorf("Select %s: %q, want %q", c.image, got, c.want)
		}
	}
	if got := Tag("localhost:5000/e2e/pause-tools:1"); got != "1" {
		t.Errorf("Tag: %q", got)
	}
}

// TestParseImageListRejects: output that is not a list of references (a
// log line, a digest, nothing) fails rather than yielding wrong names.
func TestParseImageListRejects(t *testing.T) {
	for _, out := range []string{
		"",
		"\n\n",
		"registry.k8s.io/pause:3.10.2\nI1205 16:55:00.000000 1 test_context.go:462] listing images\n",
		"registry.k8s.io/pause@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
		"pause:3.10.2\n",
		"registry.k8s.io/pause\n",
	} {
		if refs, err := ParseImageList(out); err == nil {
			t.Errorf("ParseImageList(%q) = %q, want an error", out, refs)
		}
	}
}
