package maps

import "testing"

// TestKernelDropReasons: the running kernel's reasons are read from its BTF with the
// names the kfree_skb tracepoint prints; an unnamed code still gets a label.
func TestKernelDropReasons(t *testing.T) {
	names, err := KernelDropReasons()
	if err != nil {
		t.Fatalf("read kernel drop reasons (needs /sys/kernel/btf/vmlinux): %v", err)
	}
	seen := map[string]bool{}
	for _, n := range names {
		seen[n] = true
	}
	for _, want := range []string{"NOT_SPECIFIED", "NO_SOCKET", "NEIGH_FAILED", "QDISC_DROP"} {
		if !seen[want] {
			t.Errorf("kernel reasons lack %s: %v", want, names)
		}
	}
	if got := KernelDropReasonName(names, 1<<31); got != "reason_2147483648" {
		t.Errorf("unnamed reason = %q", got)
	}
	if got := KernelDropReasonName(nil, 2); got != "reason_2" {
		t.Errorf("reason without BTF = %q", got)
	}
}
