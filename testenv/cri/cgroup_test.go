package cri

import "testing"

// TestCgroupID: a cgroup directory of the CRI namespace names the sandbox or
// container it belongs to by its first component under k8s.io/, which is how
// Stop tells its own from those of another containerd running beside it.
func TestCgroupID(t *testing.T) {
	for dir, want := range map[string]string{
		"/sys/fs/cgroup/unified/k8s.io/f14869e0b662":         "f14869e0b662",
		"/sys/fs/cgroup/memory/k8s.io/f14869e0b662/child":    "f14869e0b662",
		"/sys/fs/cgroup/unified/k8s.io":                      "",
		"/sys/fs/cgroup/unified/system.slice/k8s.io.service": "",
	} {
		if got := cgroupID(dir); got != want {
			t.Errorf("cgroupID(%q) = %q, want %q", dir, got, want)
		}
	}
}
