/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Opt-in per-packet decision tracing: trace_events records for packets in trace_prefixes. */
#pragma once

#include "common.h"
#include "parse.h"
#include "maps.h"
#include "geneve.h"

/* Cost model (docs/trace.md): with CFG_F_TRACE clear, a decision pays one test of a
 * config word it already holds (trace_tc, trace_xdp), a drop one config lookup and
 * test (trace_drop_*). Everything else lives in the noinline trace_emit_* subprograms,
 * which untraced packets never enter. */

/* Sets the tuple of ev from the IPv4 header iph whose L4 header starts at c->pos. */
static __always_inline void trace_set_tuple(struct trace_event *ev, const struct iphdr *iph,
					    const struct cursor *c)
{
	__be16 *ports = c->pos;

	ev->saddr = iph->saddr;
	ev->daddr = iph->daddr;
	ev->proto = iph->protocol;
	ev->sport = 0;
	ev->dport = 0;
	if (iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP)
		return;
	if (ipv4_is_fragment(iph) && (iph->frag_off & bpf_htons(IP_OFFSET)))
		return;
	if ((void *)(ports + 2) > c->end)
		return;
	ev->sport = ports[0];
	ev->dport = ports[1];
}

/* Describes the frame at c in ev: its IPv4 tuple and, for GENEVE, the outer UDP source
 * port, the outer peer (destination on the encap hooks, source on the underlay) and
 * the inner tuple behind it. Returns 0, or -1 if the frame carries no IPv4 header. */
static __always_inline int trace_parse(struct cursor *c, struct trace_event *ev)
{
	struct genevehdr *gh;
	struct ethhdr *eth;
	struct udphdr *udp;
	struct iphdr *iph;
	int proto;

	if (parse_eth(c, &eth) != ETH_P_IP)
		return -1;
	proto = parse_ipv4(c, &iph);
	if (proto < 0)
		return -1;
	trace_set_tuple(ev, iph, c);
	if (proto != IPPROTO_UDP || parse_udp(c, &udp) < 0 ||
	    udp->dest != bpf_htons(GENEVE_PORT))
		return 0;
	ev->tunnel_sport = udp->source;
	if (!ev->peer)
		ev->peer = ev->hook <= HOOK_OVERLAY_EGRESS ? iph->daddr : iph->saddr;
	gh = c->pos;
	if ((void *)(gh + 1) > c->end)
		return 0;
	/* opt_len is 6 bits: at most 252 bytes of options. */
	c->pos = (void *)(gh + 1) + gh->opt_len * 4;
	if (parse_eth(c, &eth) != ETH_P_IP || parse_ipv4(c, &iph) < 0)
		return 0;
	trace_set_tuple(ev, iph, c);
	return 0;
}

/* Returns 1 if addr is in trace_prefixes. */
static __always_inline int trace_prefix_match(__be32 addr)
{
	struct route_key key = { .prefixlen = 32, .addr = addr };

	return bpf_map_lookup_elem(&trace_prefixes, &key) != NULL;
}

/* Fills the fields of ev that come from the decision: arg is the group (encap,
 * transit), the address and port before translation (SNAT: addr | port << 32) or the
 * target interface (deliveries). */
static __always_inline void trace_set_arg(struct trace_event *ev, __u64 arg)
{
	switch (ev->code) {
	case METRIC_ENCAP:
	case METRIC_TRANSIT:
		ev->group = (__u32)arg;
		break;
	case METRIC_SNAT:
	case METRIC_SNAT_REVERSE:
		ev->nat_addr = (__be32)arg;
		ev->nat_port = (__be16)(arg >> 32);
		break;
	case METRIC_DELIVER_POD:
	case METRIC_DELIVER_HOST:
	case METRIC_DELIVER_FABRIC:
	case METRIC_FABRIC_INGRESS:
		ev->target_ifindex = (__u32)arg;
		break;
	}
}

/* Reserves a record, describes the frame [data, data_end) in it and submits it if the
 * packet matches trace_prefixes (else discards it). A full ring buffer loses the
 * event, never the packet. Returns 0. */
static __always_inline int trace_emit(void *data, void *data_end, __u32 ifindex, __u32 len,
				      int code, __u8 hook, __be32 peer, __u64 arg)
{
	struct cursor c = { .pos = data, .end = data_end };
	struct trace_event *ev;

	ev = bpf_ringbuf_reserve(&trace_events, sizeof(*ev), 0);
	if (!ev)
		return 0;
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->timestamp = bpf_ktime_get_ns();
	ev->code = code;
	ev->hook = hook;
	ev->ifindex = ifindex;
	ev->len = len;
	ev->peer = peer;
	trace_set_arg(ev, arg);
	if (trace_parse(&c, ev) < 0 ||
	    !(trace_prefix_match(ev->saddr) || trace_prefix_match(ev->daddr))) {
		bpf_ringbuf_discard(ev, 0);
		return 0;
	}
	bpf_ringbuf_submit(ev, 0);
	return 0;
}

/* trace_emit for a TC program. A subprogram, so its code stays off the fast path. */
static __noinline int trace_emit_tc(struct __sk_buff *skb, int code, __u8 hook, __be32 peer,
				    __u64 arg)
{
	return trace_emit((void *)(long)skb->data, (void *)(long)skb->data_end, skb->ifindex,
			  skb->len, code, hook, peer, arg);
}

/* trace_emit for an XDP program. */
static __noinline int trace_emit_xdp(struct xdp_md *ctx, int code, __u8 hook, __be32 peer,
				     __u64 arg)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	return trace_emit(data, data_end, ctx->ingress_ifindex, data_end - data, code, hook,
			  peer, arg);
}

/* Records decision code of a TC program if tracing is on (trace_emit says what peer
 * and arg carry). Returns nothing. */
static __always_inline void trace_tc(struct __sk_buff *skb, const struct datapath_config *cfg,
				     int code, __u8 hook, __be32 peer, __u64 arg)
{
	if (unlikely(cfg->flags & CFG_F_TRACE))
		trace_emit_tc(skb, code, hook, peer, arg);
}

/* Records decision code of an XDP program if tracing is on. Returns nothing. */
static __always_inline void trace_xdp(struct xdp_md *ctx, const struct datapath_config *cfg,
				      int code, __u8 hook, __be32 peer, __u64 arg)
{
	if (unlikely(cfg->flags & CFG_F_TRACE))
		trace_emit_xdp(ctx, code, hook, peer, arg);
}

/* Records the drop reason of a TC program if tracing is on. Returns nothing. */
static __always_inline void trace_drop_tc(struct __sk_buff *skb, int reason, __u8 hook)
{
	const struct datapath_config *cfg = config_get();

	if (cfg && unlikely(cfg->flags & CFG_F_TRACE))
		trace_emit_tc(skb, reason, hook, 0, 0);
}

/* Records the drop reason of an XDP program if tracing is on. Returns nothing. */
static __always_inline void trace_drop_xdp(struct xdp_md *ctx, int reason, __u8 hook)
{
	const struct datapath_config *cfg = config_get();

	if (cfg && unlikely(cfg->flags & CFG_F_TRACE))
		trace_emit_xdp(ctx, reason, hook, 0, 0);
}
