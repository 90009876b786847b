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

/* Returns 1 if the packet starts a flow as conntrack sees one: a TCP SYN without ACK,
 * a UDP datagram, an ICMP echo request (the caller has found no entry for it). */
static __always_inline int opens_flow(const struct iphdr *iph, void *l4, void *data_end)
{
	if (ipv4_is_fragment(iph))
		return 0;
	switch (iph->protocol) {
	case IPPROTO_TCP: {
		struct tcphdr *th = l4;

		if ((void *)(th + 1) > data_end)
			return 0;
		return th->syn && !th->ack;
	}
	case IPPROTO_UDP:
		return 1;
	case IPPROTO_ICMP: {
		__u8 *type = l4;

		if ((void *)(type + 1) > data_end)
			return 0;
		return *type == 8;	/* echo request */
	}
	}
	return 0;
}

/* Returns 1 if a pod packet isthmus carries must go through the stack, on the node
 * that delivers it to a pod and on the node whose pod sends it: it opens a flow,
 * which the site's filters must judge (and after which conntrack holds the flow), or
 * conntrack knows its flow (its other half went through the stack: a Service's DNAT
 * to reverse, a flow the pod accepted or opened). A packet of a flow conntrack never
 * saw on this node keeps the direct path: the stack would call it INVALID. So does a
 * packet of a TCP flow conntrack holds as established and untranslated (ct_lookup's
 * CT_FAST, counted as METRIC_CT_FAST under hook): every later packet of that flow on
 * this node, both ways, FIN and RST included, takes the direct path too, so the stack
 * never sees a segment past the window it last saw (which it would call INVALID). */
static __always_inline int stack_sees(struct __sk_buff *skb, const struct iphdr *iph, void *l4,
				      void *data_end, __u8 hook)
{
	if (opens_flow(iph, l4, data_end))
		return 1;
	switch (ct_lookup(skb, iph, l4, data_end)) {
	case CT_STACK:
		return 1;
	case CT_FAST:
		metrics_count(METRIC_CT_FAST, hook, skb->len);
		return 0;
	default:
		return 0;
	}
}

/* Leaves a pod's packet to the stack, marked so that no other CNI's MASQUERADE
 * rewrites it. Returns TC_ACT_OK. */
static __always_inline int pod_to_stack(struct __sk_buff *skb)
{
	skb->mark |= OVERLAY_MARK;
	return TC_ACT_OK;
}
