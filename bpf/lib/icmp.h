/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMPv4 errors the datapath answers with itself: "fragmentation needed" to a pod,
 * and the error builder lib/nopath.h uses too. */
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

/* Turns the IPv4 frame in skb, which arrived on skb->ifindex, into an ICMP error of
 * type and code (with next-hop MTU mtu for frag needed, 0 otherwise) and sends it back
 * out the same interface: on a pod's host veth, egress delivers it into the pod. The
 * reply quotes the original IPv4 header (with options) and the first 8 bytes after
 * it. Its source is the original destination, as Cilium's dsr_reply_icmp4: the
 * program owns no address on the pod's side (the tunnel address sits on isthmus0,
 * the pod gateway is the CNI's choice), senders match an ICMP error to a socket by
 * the quote, and a pod always routes that address back through this interface, so
 * its rp_filter holds. The cost: tools show the far pod as the sender. There is no
 * rate limit: the only recipient is the sender itself; a per-source token bucket
 * (the kernel's icmp_ratelimit) would bound a sender that ignores them.
 * Returns TC_ACT_REDIRECT, or fail (a negative DROP_*) or DROP_REDIRECT_FAILED.
 * Counts nothing. */
static __always_inline int icmp4_error(struct __sk_buff *skb, __u8 type, __u8 code,
				       __u16 mtu, int fail)
{
	struct icmp4_error e;
	struct ethhdr eth, reth;
	__u32 hlen, qlen;
	__s64 sum;

	__builtin_memset(&e, 0, sizeof(e));
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, &e.ip, sizeof(e.ip)))
		return fail;
	hlen = (e.ip.ihl & 0xf) * 4;
	if (hlen < sizeof(struct iphdr))
		return fail;
	qlen = hlen + ICMP_QUOTE_L4;
	if (qlen > ICMP_QUOTE_MAX || bpf_skb_load_bytes(skb, ETH_HLEN, e.quote, qlen))
		return fail;

	e.icmp.type = type;
	e.icmp.code = code;
	e.icmp.un.frag.mtu = bpf_htons(mtu);
	/* ICMP header and quote are contiguous and a multiple of 4 bytes long. */
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&e.icmp, sizeof(e.icmp) + qlen, 0);
	if (sum < 0)
		return fail;
	e.icmp.checksum = (__sum16)csum_fold32((__u32)sum);

	/* The quote holds the original header; e.ip becomes the reply's. */
	e.ip.daddr = e.ip.saddr;
	__builtin_memcpy(&e.ip.saddr, &e.quote[offsetof(struct iphdr, daddr)], sizeof(__be32));
	e.ip.version = 4;
	e.ip.ihl = 5;
	e.ip.tos = (e.ip.tos & IPTOS_TOS_MASK) | IPTOS_PREC_INTERNETCONTROL;
	e.ip.tot_len = bpf_htons(sizeof(e.ip) + sizeof(e.icmp) + qlen);
	e.ip.id = 0;
	e.ip.frag_off = 0;
	e.ip.ttl = OUTER_TTL;
	e.ip.protocol = IPPROTO_ICMP;
	e.ip.check = 0;
	e.ip.check = ipv4_hdr_csum(&e.ip);

	/* Back to the sender: the MACs swap. */
	__builtin_memcpy(reth.h_dest, eth.h_source, ETH_ALEN);
	__builtin_memcpy(reth.h_source, eth.h_dest, ETH_ALEN);
	reth.h_proto = bpf_htons(ETH_P_IP);
	/* Shrinking also makes the skb linear and drops its GSO state. */
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(e.ip) + sizeof(e.icmp) + qlen, 0) ||
	    bpf_skb_store_bytes(skb, 0, &reth, sizeof(reth), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &e, sizeof(e.ip) + sizeof(e.icmp) + qlen, 0))
		return fail;
	if (bpf_redirect(skb->ifindex, 0) != TC_ACT_REDIRECT)
		return DROP_REDIRECT_FAILED;
	return TC_ACT_REDIRECT;
}

/* Answers the DF packet in skb, too large for the tunnel, with ICMP destination
 * unreachable / fragmentation needed (type 3 code 4) carrying next-hop MTU mtu
 * (RFC 1191), as icmp4_error. Returns TC_ACT_REDIRECT, or a negative DROP_*. Counts
 * METRIC_FRAG_NEEDED_SENT with the refused packet's length. */
static __always_inline int icmp4_frag_needed(struct __sk_buff *skb, __u16 mtu, __u8 hook)
{
	__u32 len = skb->len;
	int rc = icmp4_error(skb, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, mtu, DROP_FRAG_NEEDED);

	if (rc >= 0)
		metrics_count(METRIC_FRAG_NEEDED_SENT, hook, len);
	return rc;
}
