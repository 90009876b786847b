/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Which pod packets go through the kernel stack (conntrack, kube-proxy's Service NAT,
 * the site's FORWARD filters) rather than around it, and the mark that keeps other
 * CNIs' MASQUERADE off them there. docs/architecture.md, "Netfilter". */
#pragma once

#include "common.h"
#include "parse.h"
#include "metrics.h"
#include "ct.h"

/* skb->mark bit on every pod packet isthmus hands to the stack. The agent's rule at the
 * top of nat POSTROUTING accepts marked packets before any other CNI's MASQUERADE or
 * SNAT sees them; loader/datapath.OverlayMark is the same value. 0x1000 is clear of
 * kube-proxy's 0x4000/0x8000, Calico's 0xffff0000 and Cilium's 0x0f00. */
#ifndef OVERLAY_MARK
#define OVERLAY_MARK		0x1000
#endif

/* Returns the TCP payload bytes from th (whose 20-byte header the caller checked lies
 * before data_end) to the end of skb: all GSO segments' payload together, so a FIN,
 * if any, ends the last one; 0 when the header claims more than there is. */
static __always_inline __u32 tcp_payload_len(struct __sk_buff *skb, const struct tcphdr *th)
{
	__s32 payload = (__s32)skb->len - (__s32)((void *)th - (void *)(long)skb->data) -
			th->doff * 4;

	return payload < 0 ? 0 : payload;
}

/* Returns 0 after counting METRIC_CT_FAST under hook: the packet takes the direct
 * path. The tail of stack_sees and stack_sees6. */
static __always_inline int stack_skipped(struct __sk_buff *skb, __u8 hook)
{
	metrics_count(METRIC_CT_FAST, hook, skb->len);
	return 0;
}

/* Returns 1 if a pod packet isthmus carries must go through the stack, on the node
 * that delivers it to a pod and on the node whose pod sends it; 0 if it takes the
 * direct path (counted as METRIC_CT_FAST under hook). Fail closed: the direct path only
 * for what the datapath has positively established the stack would do nothing else
 * with: a TCP segment, not a fragment, whose whole 20-byte header lies before data_end,
 * not a SYN, of a flow kernel conntrack holds (either direction) as established,
 * assured and untranslated, and that has not been closed on the fast path
 * (ct_fast_path). Everything else is the stack's to judge: fragments (the first one
 * too), UDP, ICMP of every type, other protocols, unreadable headers, SYNs, packets of
 * flows conntrack does not hold (never seen, expired, or deleted by an operator: the
 * way to cut a flow), translated or not yet established ones. docs/architecture.md,
 * "The conntrack fast path". */
static __always_inline int stack_sees(struct __sk_buff *skb, const struct iphdr *iph, void *l4,
				      void *data_end, __u8 hook)
{
	struct tcphdr *th = l4;

	if (iph->protocol != IPPROTO_TCP || ipv4_is_fragment(iph))
		return 1;
	if ((void *)(th + 1) > data_end)
		return 1;
	if (!ct_fast_path(skb, iph, th, tcp_payload_len(skb, th)))
		return 1;
	return stack_skipped(skb, hook);
}

/* stack_sees for IPv6 packet ip6h, whose first next header starts at l4: the direct
 * path only for a TCP segment right after the fixed header (any extension header, a
 * fragment's included, is the stack's) that ct_fast_path6 lets through; the rest as
 * for IPv4. */
static __always_inline int stack_sees6(struct __sk_buff *skb, const struct ip6_hdr *ip6h,
				       void *l4, void *data_end, __u8 hook)
{
	struct tcphdr *th = l4;

	if (ip6h->nexthdr != IPPROTO_TCP)
		return 1;
	if ((void *)(th + 1) > data_end)
		return 1;
	if (!ct_fast_path6(skb, ip6h, th, tcp_payload_len(skb, th)))
		return 1;
	return stack_skipped(skb, hook);
}

/* Leaves a pod's packet to the stack, marked so that no other CNI's MASQUERADE
 * rewrites it. Returns TC_ACT_OK. */
static __always_inline int pod_to_stack(struct __sk_buff *skb)
{
	skb->mark |= OVERLAY_MARK;
	return TC_ACT_OK;
}
