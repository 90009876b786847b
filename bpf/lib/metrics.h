/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU packet and byte counters, and the one exit every drop goes through. */
#pragma once

#include "maps.h"
#include "trace.h"

/* Adds one packet of len bytes to the entry key of map, a per-CPU hash of
 * metrics_value (metrics, redirect_drops). Returns nothing: a full map loses a count,
 * never a packet. */
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

/* Adds one packet of len bytes to (code, hook) in metrics. */
static __always_inline void metrics_count(__u16 code, __u8 hook, __u64 len)
{
	struct metrics_key key = { .code = code, .hook = hook };

	counter_add(&metrics, &key, len);
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
