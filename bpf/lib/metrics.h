/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU packet and byte counters, and the one exit every drop goes through. */
#pragma once

#include "maps.h"
#include "trace.h"

/* Every code and hook has a slot in metrics (enum metric_slots). The last enumerator
 * of each enum is named here: a new one past it must move the assertion along (and
 * TestMetricSlotsCoverBTF checks every enumerator of the compiled object). */
_Static_assert((METRIC_CODES & (METRIC_CODES - 1)) == 0, "METRIC_CODES must be a power of two");
_Static_assert((METRIC_HOOKS & (METRIC_HOOKS - 1)) == 0, "METRIC_HOOKS must be a power of two");
_Static_assert(METRIC_WIREGUARD_SENT < METRIC_CODES, "a METRIC_ code has no slot in metrics");
_Static_assert(-DROP_WIREGUARD_NOT_GENEVE < METRIC_CODES, "a DROP_ reason has no slot in metrics");
_Static_assert(HOOK_WIREGUARD_INGRESS < METRIC_HOOKS, "a HOOK_ has no slot in metrics");

/* Adds one packet of len bytes to the entry key of map, a per-CPU hash of
 * metrics_value (redirect_drops). Returns nothing: a full map loses a count, never a
 * packet. */
static __always_inline void counter_add(void *map, const void *key, __u64 len)
{
	struct metrics_value *v, init = { .packets = 1, .bytes = len };

	v = bpf_map_lookup_elem(map, key);
	if (likely(v)) {
		/* Per-CPU value: no other writer, no atomics needed. */
		v->packets += 1;
		v->bytes += len;
		return;
	}
	if (bpf_map_update_elem(map, key, &init, BPF_NOEXIST) == 0)
		return;
	/* Another program on this CPU created the entry in between: add to it. */
	v = bpf_map_lookup_elem(map, key);
	if (v) {
		v->packets += 1;
		v->bytes += len;
	}
}

/* Returns the slot of metrics that counts (code, hook): a pair out of range counts,
 * visibly, as METRIC_OUT_OF_RANGE (enum metric_slots). Constant for constant
 * arguments, which nearly every call site passes. */
static __always_inline __u32 metrics_slot(__u16 code, __u8 hook)
{
	if (hook >= METRIC_HOOKS)
		return METRIC_SLOT_HOOK_OUT_OF_RANGE;
	if (code >= METRIC_CODES)
		code = METRIC_OUT_OF_RANGE;
	return (__u32)hook * METRIC_CODES + code;
}

/* Adds one packet of len bytes to (code, hook) in metrics. */
static __always_inline void metrics_count(__u16 code, __u8 hook, __u64 len)
{
	__u32 slot = metrics_slot(code, hook);
	struct metrics_value *v;

	/* NULL only for a slot past the array, which metrics_slot never returns. */
	v = bpf_map_lookup_elem(&metrics, &slot);
	if (likely(v)) {
		/* Per-CPU value: no other writer, no atomics needed. */
		v->packets += 1;
		v->bytes += len;
	}
}

/* Counts a drop under (-reason, hook). Returns TC_ACT_SHOT. reason must be negative. */
static __always_inline int tc_drop(struct __sk_buff *skb, int reason, __u8 hook)
{
	trace_drop_tc(skb, reason, hook);
	metrics_count((__u16)(-reason), hook, skb->len);
	return TC_ACT_SHOT;
}

/* Counts a drop under (-reason, hook). Returns XDP_DROP. reason must be negative. */
static __always_inline int xdp_drop(struct xdp_md *ctx, int reason, __u8 hook)
{
	trace_drop_xdp(ctx, reason, hook);
	metrics_count((__u16)(-reason), hook, ctx->data_end - ctx->data);
	return XDP_DROP;
}
