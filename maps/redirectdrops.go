package maps

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/isthmus-dev/isthmus/bpf"
)

// The maps of the kfree_skb tracer (bpf/lib/kdrop.h).
const (
	// MapRedirectLast is a per-CPU scratch slot: the last skb an isthmus TC program on
	// that CPU redirected. The datapath owns it.
	MapRedirectLast Name = "redirect_last"
	// MapRedirectDrops counts, per (kernel drop reason, hook), the packets the kernel
	// freed after an isthmus program redirected them. The datapath owns it.
	MapRedirectDrops Name = "redirect_drops"
)

// ProgKfreeSkbTracer is the tp_btf/kfree_skb program that fills MapRedirectDrops.
const ProgKfreeSkbTracer = bpf.IsthmusProgKfreeSkbAfterRedirect

// TracerLinkPin is the name, in the pin directory, of the tracer's pinned link.
const TracerLinkPin = "kfree_skb_tracer"

type (
	// RedirectSlot is struct redirect_slot, the value of MapRedirectLast (key uint32 0).
	RedirectSlot = bpf.IsthmusRedirectSlot
	// RedirectDropKey is struct redirect_drop_key; its value is a MetricsValue.
	RedirectDropKey = bpf.IsthmusRedirectDropKey
)

// RedirectDrop identifies one counter of MapRedirectDrops: the kernel's drop reason
// (enum skb_drop_reason of the running kernel) and the hook of the program that
// redirected the packet.
type RedirectDrop struct {
	Reason uint32
	Hook   Hook
}

// ReadRedirectDrops returns every counter of the per-CPU map m (MapRedirectDrops),
// summed over CPUs.
func ReadRedirectDrops(m *ebpf.Map) (map[RedirectDrop]Counter, error) {
	return readCounters(m, MapRedirectDrops, func(k RedirectDropKey) RedirectDrop {
		return RedirectDrop{Reason: k.Reason, Hook: Hook(k.Hook)}
	})
}

// KernelDropReasons returns the names of the running kernel's enum skb_drop_reason
// by value, as the kfree_skb tracepoint prints them: "NOT_SPECIFIED", "NO_SOCKET".
// The values differ between kernels, so they are read from the kernel's BTF
// (/sys/kernel/btf/vmlinux), never from a table.
func KernelDropReasons() (map[uint32]string, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("load kernel BTF: %w", err)
	}
	var e *btf.Enum
	if err := spec.TypeByName("skb_drop_reason", &e); err != nil {
		return nil, fmt.Errorf("find enum skb_drop_reason in kernel BTF: %w", err)
	}
	out := make(map[uint32]string, len(e.Values))
	for _, v := range e.Values {
		out[uint32(v.Value)] = strings.TrimPrefix(v.Name, "SKB_DROP_REASON_")
	}
	return out, nil
}

// KernelDropReasonName returns names[reason], or "reason_<n>" when the kernel's
// BTF did not name it (or could not be read: names nil).
func KernelDropReasonName(names map[uint32]string, reason uint32) string {
	if n, ok := names[reason]; ok {
		return n
	}
	return fmt.Sprintf("reason_%d", reason)
}
