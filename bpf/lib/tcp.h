/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* TCP MSS clamping of SYN and SYN-ACK segments that enter or leave the tunnel, both families. */
#pragma once

#include "common.h"
#include "parse.h"

#define TCPOPT_EOL		0
#define TCPOPT_NOP		1
#define TCPOPT_MSS		2
#define TCPOLEN_MSS		4
/* Most option bytes a TCP header can carry (data offset 15 words). */
#define TCP_OPT_MAX		40
/* Size of the option buffer: a power of two above TCP_OPT_MAX, so an index masked
 * with OPT_BUF - 1 is in bounds whatever the verifier knows about it. */
#define TCP_OPT_BUF		64
/* Flags byte of the TCP header (offset 13). */
#define TCP_FLAG_SYN		0x02
/* IPv4 and TCP headers without options: tunnel MTU - this = the largest MSS. */
#define TCP_IPV4_HLEN		(sizeof(struct iphdr) + sizeof(struct tcphdr))
/* The same for IPv6 (the fixed header, no extension headers). */
#define TCP_IPV6_HLEN		(sizeof(struct ip6_hdr) + sizeof(struct tcphdr))

/* bpf_loop (Linux 5.17, helper 181): the vendored bpf_helper_defs.h predates it. Drop
 * this when headers/ is refreshed. */
static long (*bpf_loop)(__u32 nr_loops, void *callback_fn, void *callback_ctx,
			__u64 flags) = (void *)181;

/* Most MSS options a TCP header has room for (4 bytes each in TCP_OPT_MAX). */
#define TCP_MSS_MAX		(TCP_OPT_MAX / TCPOLEN_MSS)
/* Size of the array of their offsets: a power of two above TCP_MSS_MAX. */
#define TCP_MSS_BUF		16

/* The state of a walk over a SYN's options, shared with the bpf_loop callback. */
struct tcp_opt_walk {
	__u8 opt[TCP_OPT_BUF];	/* the option bytes; zero past optlen */
	__u32 optlen;		/* 4..TCP_OPT_MAX */
	__u32 pos;		/* start of the next option */
	__u32 nmss;		/* MSS options found, 0..TCP_MSS_MAX */
	__u8 mss[TCP_MSS_BUF];	/* offset in opt of each one's value */
};

/* bpf_loop callback: looks at the option that starts at w->pos and records it in
 * w->mss if it is a well-formed MSS option. Returns 0 to go on to the next option, 1
 * to stop (end of options, or malformed). Every MSS option counts, not only the first:
 * Linux's tcp_parse_options reads them all and keeps the last, so a SYN whose second
 * MSS option is the large one would otherwise pass the clamp. An MSS option of another
 * length is skipped by its length, as Linux skips it. A callback, not inline: the
 * verifier checks its body once instead of once per possible path through 40 option
 * positions, which a plain bounded loop blew past a million instructions. */
static long tcp_opt_step(__u64 index, void *ctx)
{
	struct tcp_opt_walk *w = ctx;
	__u32 i = w->pos;
	__u8 kind, len;

	if (i >= w->optlen)
		return 1;
	kind = w->opt[i & (TCP_OPT_BUF - 1)];
	if (kind == TCPOPT_EOL)
		return 1;
	if (kind == TCPOPT_NOP) {
		w->pos = i + 1;
		return 0;
	}
	if (i + 1 >= w->optlen)
		return 1;
	len = w->opt[(i + 1) & (TCP_OPT_BUF - 1)];
	if (len < 2 || i + len > w->optlen)
		return 1;
	if (kind == TCPOPT_MSS && len == TCPOLEN_MSS && w->nmss < TCP_MSS_MAX) {
		w->mss[w->nmss & (TCP_MSS_BUF - 1)] = i + 2;
		w->nmss++;
	}
	w->pos = i + len;
	return 0;
}

/* Sets the MSS value at offset i of the options w holds (TCP header at l4off of skb)
 * to new_mss, fixing the TCP checksum incrementally. Returns 1 if it did, 0 if a
 * helper refused (the packet is then unchanged). */
static __always_inline int tcp_mss_rewrite(struct __sk_buff *skb, __u32 l4off,
					   const struct tcp_opt_walk *w, __u32 i, __u16 new_mss)
{
	__u16 mss = (w->opt[i & (TCP_OPT_BUF - 1)] << 8) | w->opt[(i + 1) & (TCP_OPT_BUF - 1)];
	__be16 old_be = bpf_htons(mss), new_be = bpf_htons(new_mss), old_cs, new_cs;

	/* The checksum sums 16-bit words from the start of the segment. A value at an odd
	 * offset (a lone NOP before the MSS) straddles two words, each byte in the other
	 * half: its contribution is the byte-swapped value. */
	old_cs = i & 1 ? __builtin_bswap16(old_be) : old_be;
	new_cs = i & 1 ? __builtin_bswap16(new_be) : new_be;
	/* Checksum first: if it fails nothing has changed. If the store then fails, put
	 * the checksum back (that region is writable by now). */
	if (bpf_l4_csum_replace(skb, l4off + offsetof(struct tcphdr, check), old_cs, new_cs,
				sizeof(__u16)))
		return 0;
	if (bpf_skb_store_bytes(skb, l4off + sizeof(struct tcphdr) + i, &new_be,
				sizeof(new_be), 0)) {
		bpf_l4_csum_replace(skb, l4off + offsetof(struct tcphdr, check), new_cs, old_cs,
				    sizeof(__u16));
		return 0;
	}
	return 1;
}

/* Lowers every MSS option of the TCP segment at l4off of skb, if it is a SYN or
 * SYN-ACK, to max_mss where it is larger, and fixes the TCP checksum incrementally
 * (the sum over the segment is unchanged, so a CHECKSUM_COMPLETE skb stays valid; for
 * CHECKSUM_PARTIAL only the payload changes, as it should). l4 points at the segment
 * in the linear data (NULL: read it with a helper). Anything but a SYN leaves after a
 * load or two. Returns 1 if it rewrote an option, 0 if not (also when a helper
 * refused: that option is then unchanged). Invalidates packet pointers. */
static __always_inline int tcp_clamp_syn(struct __sk_buff *skb, const void *l4, __u32 l4off,
					 __u16 max_mss)
{
	const void *data_end = (void *)(long)skb->data_end;
	struct tcp_opt_walk w;
	__u8 hdr[2];		/* TCP bytes 12 and 13: data offset, flags */
	__u32 thlen, k, i;
	__u16 mss;
	int done = 0;

	if (l4 && l4 + 14 <= data_end)
		__builtin_memcpy(hdr, l4 + 12, sizeof(hdr));
	else if (bpf_skb_load_bytes(skb, l4off + 12, hdr, sizeof(hdr)))
		return 0;
	if (!(hdr[1] & TCP_FLAG_SYN))
		return 0;

	/* Slow path from here: SYN and SYN-ACK only. */
	thlen = (hdr[0] >> 4) * 4;
	if (thlen <= sizeof(struct tcphdr))
		return 0;
	__builtin_memset(&w, 0, sizeof(w));
	w.optlen = thlen - sizeof(struct tcphdr);
	if (bpf_skb_load_bytes(skb, l4off + sizeof(struct tcphdr), w.opt,
			       thlen - sizeof(struct tcphdr)))
		return 0;
	/* Each step consumes at least one byte: TCP_OPT_MAX steps cover every layout. */
	bpf_loop(TCP_OPT_MAX, tcp_opt_step, &w, 0);
	for (k = 0; k < TCP_MSS_MAX; k++) {
		if (k >= w.nmss)
			break;
		i = w.mss[k & (TCP_MSS_BUF - 1)];
		mss = (w.opt[i & (TCP_OPT_BUF - 1)] << 8) | w.opt[(i + 1) & (TCP_OPT_BUF - 1)];
		if (mss > max_mss)
			done |= tcp_mss_rewrite(skb, l4off, &w, i, max_mss);
	}
	return done;
}

/* Clamps the MSS of a TCP SYN or SYN-ACK in the IP frame at the start of skb to what
 * the tunnel carries: tunnel_mtu less the IP and TCP headers, 40 bytes for IPv4, 60
 * for IPv6 (tcp_clamp_syn). An IPv4 fragment, or an IPv6 packet whose TCP header does
 * not follow the fixed header (extension headers), is left alone. Returns 1 if it
 * rewrote an option, 0 if not. Invalidates packet pointers. */
static __always_inline int tcp_clamp_mss(struct __sk_buff *skb, __u16 tunnel_mtu)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct cursor c = { .pos = data, .end = data_end };
	struct ip6_hdr *ip6h;
	struct ethhdr *eth;
	struct iphdr *iph;

	switch (parse_eth(&c, &eth)) {
	case ETH_P_IP:
		if (tunnel_mtu <= TCP_IPV4_HLEN || parse_ipv4(&c, &iph) != IPPROTO_TCP ||
		    ipv4_is_fragment(iph))
			return 0;
		return tcp_clamp_syn(skb, c.pos, ETH_HLEN + iph->ihl * 4, tunnel_mtu - TCP_IPV4_HLEN);
	case ETH_P_IPV6:
		if (tunnel_mtu <= TCP_IPV6_HLEN || parse_ipv6(&c, &ip6h) != IPPROTO_TCP)
			return 0;
		return tcp_clamp_syn(skb, c.pos, ETH_HLEN + sizeof(*ip6h), tunnel_mtu - TCP_IPV6_HLEN);
	}
	return 0;
}
