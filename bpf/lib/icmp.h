/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMPv4 errors the datapath answers with itself: "fragmentation needed" and "time
 * exceeded" to a pod. */
#pragma once

#include <linux/icmp.h>

#include "common.h"
#include "csum.h"
#include "metrics.h"

/* Bytes of the refused datagram quoted after its IPv4 header (RFC 792, RFC 1191). */
#define ICMP_QUOTE_L4		8
/* Longest quote: an IPv4 header with 40 bytes of options, then ICMP_QUOTE_L4. */
#define ICMP_QUOTE_MAX		(60 + ICMP_QUOTE_L4)
/* Precedence of ICMP errors, as the kernel's icmp_send (RFC 1812 4.3.2.5). */
#define IPTOS_PREC_INTERNETCONTROL	0xc0
#define IPTOS_TOS_MASK		0x1e

/* What replaces the packet after its Ethernet header. */
struct icmp4_error {
	struct iphdr ip;
	struct icmphdr icmp;
	__u8 quote[ICMP_QUOTE_MAX];
};

/* Returns 1 if an ICMP error may be sent about the IPv4 header ip, whose ICMP type (if
 * it is ICMP) is at offset l4 of skb, as the kernel's icmp_send decides (RFC 1122
 * 3.2.2, RFC 1812 4.3.2.7): never about a fragment after the first (it has no
 * transport header to quote), nor about an ICMP message its icmp_pointers table marks
 * an error (3, 4, 5, 11, 12, and the unassigned 1, 2, 6, 7, 9, 10) or a type it does
 * not know (errors about errors could loop between two nodes). The informational
 * types 0, 8 and 13-18 are answered. */
static __always_inline int icmp4_error_allowed(struct __sk_buff *skb, const struct iphdr *ip,
					       __u32 l4)
{
	__u8 type;

	if (ip->frag_off & bpf_htons(IP_OFFSET))
		return 0;
	if (ip->protocol != IPPROTO_ICMP)
		return 1;
	if (bpf_skb_load_bytes(skb, l4, &type, sizeof(type)))
		return 0;
	return type == ICMP_ECHOREPLY || type == ICMP_ECHO ||
	       (type >= ICMP_TIMESTAMP && type <= NR_ICMP_TYPES);
}

/* Builds in *e the ICMP error type/code, whose second word is rest (the next-hop MTU
 * for frag needed, 0 for time exceeded), about the IPv4 packet at offset off of skb,
 * from source from (0: the packet's destination) to the packet's source: TOS
 * precedence "internetwork control", TTL 64, quoting the IPv4 header (with options) and
 * the 8 bytes after it. Returns the length of the error packet (IPv4 + ICMP + quote,
 * at most sizeof(*e)), or fail (a negative DROP_*) if the packet is too short or may not
 * be answered (icmp4_error_allowed): then the caller's drop is the only outcome. */
static __always_inline int icmp4_error_build(struct __sk_buff *skb, __u32 off, __u8 type,
					     __u8 code, __be32 rest, __be32 from,
					     struct icmp4_error *e, int fail)
{
	__u32 hlen, qlen;
	__s64 sum;

	__builtin_memset(e, 0, sizeof(*e));
	if (bpf_skb_load_bytes(skb, off, &e->ip, sizeof(e->ip)))
		return fail;
	hlen = (e->ip.ihl & 0xf) * 4;
	if (hlen < sizeof(struct iphdr))
		return fail;
	qlen = hlen + ICMP_QUOTE_L4;
	if (qlen > ICMP_QUOTE_MAX || bpf_skb_load_bytes(skb, off, e->quote, qlen))
		return fail;
	if (!icmp4_error_allowed(skb, &e->ip, off + hlen))
		return fail;

	e->icmp.type = type;
	e->icmp.code = code;
	e->icmp.un.gateway = rest;
	/* ICMP header and quote are contiguous and a multiple of 4 bytes long. */
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&e->icmp, sizeof(e->icmp) + qlen, 0);
	if (sum < 0)
		return fail;
	e->icmp.checksum = (__sum16)csum_fold32((__u32)sum);

	/* The quote holds the original header; e->ip becomes the reply's. */
	e->ip.daddr = e->ip.saddr;
	if (from)
		e->ip.saddr = from;
	else
		__builtin_memcpy(&e->ip.saddr, &e->quote[offsetof(struct iphdr, daddr)],
				 sizeof(__be32));
	e->ip.version = 4;
	e->ip.ihl = 5;
	e->ip.tos = (e->ip.tos & IPTOS_TOS_MASK) | IPTOS_PREC_INTERNETCONTROL;
	e->ip.tot_len = bpf_htons(sizeof(e->ip) + sizeof(e->icmp) + qlen);
	e->ip.id = 0;
	e->ip.frag_off = 0;
	e->ip.ttl = OUTER_TTL;
	e->ip.protocol = IPPROTO_ICMP;
	e->ip.check = 0;
	e->ip.check = ipv4_hdr_csum(&e->ip);
	return sizeof(e->ip) + sizeof(e->icmp) + qlen;
}

/* Turns the IPv4 frame in skb, which arrived on skb->ifindex, into the ICMP error that
 * icmp4_error_build describes and sends it back out the same interface with the MACs
 * swapped: on a pod's host veth, egress delivers it into the pod. Returns
 * TC_ACT_REDIRECT, or fail (a negative DROP_*) if the packet could not be rewritten, or
 * DROP_REDIRECT_FAILED. Counts metric with the refused packet's length. */
static __always_inline int icmp4_error(struct __sk_buff *skb, __u8 type, __u8 code, __be32 rest,
				       __be32 from, int fail, __u16 metric, __u8 hook)
{
	struct icmp4_error e;
	struct ethhdr eth, reth;
	__u32 len = skb->len;
	int elen;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)))
		return fail;
	elen = icmp4_error_build(skb, ETH_HLEN, type, code, rest, from, &e, fail);
	if (elen < 0)
		return elen;
	if (elen > (int)sizeof(e))
		return fail;
	/* Back to the sender: the MACs swap. */
	__builtin_memcpy(reth.h_dest, eth.h_source, ETH_ALEN);
	__builtin_memcpy(reth.h_source, eth.h_dest, ETH_ALEN);
	reth.h_proto = bpf_htons(ETH_P_IP);
	/* Shrinking also makes the skb linear and drops its GSO state. */
	if (bpf_skb_change_tail(skb, ETH_HLEN + elen, 0) ||
	    bpf_skb_store_bytes(skb, 0, &reth, sizeof(reth), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &e, elen, 0))
		return fail;
	if (bpf_redirect(skb->ifindex, 0) != TC_ACT_REDIRECT)
		return DROP_REDIRECT_FAILED;
	metrics_count(metric, hook, len);
	return TC_ACT_REDIRECT;
}

/* ICMP destination unreachable / fragmentation needed (type 3 code 4) carrying
 * next-hop MTU mtu, to a pod whose DF packet does not fit the tunnel. Its source is the
 * original destination, as Cilium's dsr_reply_icmp4: the program owns no address on
 * the pod's side (the tunnel address sits on isthmus0, the pod gateway is the CNI's
 * choice), senders accept frag-needed from any source and match it to a socket by the
 * quote (RFC 1191), and a pod always routes that address back through this interface,
 * so its rp_filter holds. The cost: tools show the far pod as the sender. There is no
 * rate limit: the only recipient is the sender itself, which lowers its path MTU on
 * the first reply; a per-source token bucket (the kernel's icmp_ratelimit) would bound
 * a sender that ignores them. Returns TC_ACT_REDIRECT, or a negative DROP_*. Counts
 * METRIC_FRAG_NEEDED_SENT. */
static __always_inline int icmp4_frag_needed(struct __sk_buff *skb, __u16 mtu, __u8 hook)
{
	return icmp4_error(skb, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, bpf_htonl(mtu), 0,
			   DROP_FRAG_NEEDED, METRIC_FRAG_NEEDED_SENT, hook);
}

/* ICMP time exceeded in transit (type 11 code 0) to a pod whose packet's TTL expires
 * at this hop, from this node's address from, so traceroute shows the node (its
 * tunnel address: every pod and peer routes it back here). Returns TC_ACT_REDIRECT, or
 * a negative DROP_*. Counts METRIC_TIME_EXCEEDED_SENT. */
static __always_inline int icmp4_time_exceeded(struct __sk_buff *skb, __be32 from, __u8 hook)
{
	return icmp4_error(skb, ICMP_TIME_EXCEEDED, ICMP_EXC_TTL, 0, from, DROP_TTL_EXCEEDED,
			   METRIC_TIME_EXCEEDED_SENT, hook);
}
