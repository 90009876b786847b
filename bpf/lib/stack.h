/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Which pod packets go through the kernel stack (conntrack, kube-proxy's Service NAT,
 * the site's FORWARD filters) rather than around it, and the mark that keeps other
 * CNIs' MASQUERADE off them there. docs/architecture.md, "Netfilter". */
#pragma once

#include "common.h"
#include "parse.h"

/* skb->mark bit on every pod packet isthmus hands to the stack. The agent's rule at the
 * top of nat POSTROUTING accepts marked packets before any other CNI's MASQUERADE or
 * SNAT sees them; loader/datapath.OverlayMark is the same value. 0x1000 is clear of
 * kube-proxy's 0x4000/0x8000, Calico's 0xffff0000 and Cilium's 0x0f00. */
#ifndef OVERLAY_MARK
#define OVERLAY_MARK		0x1000
#endif

#ifndef BPF_F_CURRENT_NETNS
#define BPF_F_CURRENT_NETNS	(-1)
#endif

/* The conntrack kfuncs (net/netfilter/nf_conntrack_bpf.c). opts is the 12-byte form
 * every kernel since 6.0 accepts. nf_conn is opaque here, but must be a struct, not a
 * forward declaration: the loader matches the kfunc's BTF by kind and name. */
struct nf_conn {
	__u64 opaque;
};
struct bpf_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb_ctx, struct bpf_sock_tuple *bpf_tuple,
					 __u32 tuple__sz, struct bpf_ct_opts *opts,
					 __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

/* Returns 1 if kernel conntrack holds an entry, in either direction, for the TCP or UDP
 * flow of iph (l4 its transport header), 0 otherwise: no entry, another protocol, a
 * fragment, or ports past data_end. */
static __always_inline int ct_known(struct __sk_buff *skb, const struct iphdr *iph, void *l4,
				    void *data_end)
{
	struct bpf_ct_opts opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = iph->protocol };
	struct bpf_sock_tuple t = {};
	struct nf_conn *ct;
	__be16 *ports = l4;

	if ((iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP) ||
	    ipv4_is_fragment(iph))
		return 0;
	if ((void *)(ports + 2) > data_end)
		return 0;
	t.ipv4.saddr = iph->saddr;
	t.ipv4.daddr = iph->daddr;
	t.ipv4.sport = ports[0];
	t.ipv4.dport = ports[1];
	ct = bpf_skb_ct_lookup(skb, &t, sizeof(t.ipv4), &opts, sizeof(opts));
	if (!ct)
		return 0;
	bpf_ct_release(ct);
	return 1;
}

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
 * saw on this node keeps the direct path: the stack would call it INVALID. */
static __always_inline int stack_sees(struct __sk_buff *skb, const struct iphdr *iph, void *l4,
				      void *data_end)
{
	return opens_flow(iph, l4, data_end) || ct_known(skb, iph, l4, data_end);
}

/* Leaves a pod's packet to the stack, marked so that no other CNI's MASQUERADE
 * rewrites it. Returns TC_ACT_OK. */
static __always_inline int pod_to_stack(struct __sk_buff *skb)
{
	skb->mark |= OVERLAY_MARK;
	return TC_ACT_OK;
}
