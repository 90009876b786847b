/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Cursor-style header parsing: each parse_* checks bounds beside the access and advances. */
#pragma once

#include "common.h"

/* A position in the packet and the end of its linear data. */
struct cursor {
	void *pos;
	void *end;
};

/* Returns the EtherType (host order) and sets *eth, or -1 if the header is truncated. */
static __always_inline int parse_eth(struct cursor *c, struct ethhdr **eth)
{
	struct ethhdr *h = c->pos;

	if ((void *)(h + 1) > c->end)
		return -1;
	c->pos = h + 1;
	*eth = h;
	return bpf_ntohs(h->h_proto);
}

/* Returns the IP protocol and sets *iph, or -1 if the header is truncated or not a
 * well-formed IPv4 header (version 4, ihl >= 5, options inside the packet). */
static __always_inline int parse_ipv4(struct cursor *c, struct iphdr **iph)
{
	struct iphdr *h = c->pos;
	__u32 hlen;

	if ((void *)(h + 1) > c->end)
		return -1;
	if (h->version != 4 || h->ihl < 5)
		return -1;
	hlen = h->ihl * 4;
	if (c->pos + hlen > c->end)
		return -1;
	c->pos += hlen;
	*iph = h;
	return h->protocol;
}

/* The IPv6 fixed header (RFC 8200, section 3). */
struct ip6_hdr {
	__be32 vtc_flow;	/* version 4 bits, traffic class 8, flow label 20 */
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__be32 saddr[4];
	__be32 daddr[4];
};

/* Returns the next header and sets *ip6h, or -1 if the fixed header is truncated or
 * its version is not 6. Extension headers are not walked. */
static __always_inline int parse_ipv6(struct cursor *c, struct ip6_hdr **ip6h)
{
	struct ip6_hdr *h = c->pos;

	if ((void *)(h + 1) > c->end)
		return -1;
	if ((bpf_ntohl(h->vtc_flow) >> 28) != 6)
		return -1;
	c->pos = h + 1;
	*ip6h = h;
	return h->nexthdr;
}

/* Returns the traffic class (DSCP and ECN) of ip6h. */
static __always_inline __u8 ipv6_tclass(const struct ip6_hdr *ip6h)
{
	return bpf_ntohl(ip6h->vtc_flow) >> 20;
}

/* Returns the flow label of ip6h, raw (network order, the low 20 bits of the word). */
static __always_inline __be32 ipv6_flowlabel(const struct ip6_hdr *ip6h)
{
	return ip6h->vtc_flow & bpf_htonl(0x000fffff);
}

/* Returns 1 if a is an IPv6 address that never leaves its link: the unspecified
 * address (duplicate address detection) or a link-local one (fe80::/10; the stack
 * forwards neither, RFC 4291 section 2.5.6). Neighbour discovery and MLD use them. */
static __always_inline int ipv6_link_scoped(const __be32 a[4])
{
	if ((a[0] & bpf_htonl(0xffc00000)) == bpf_htonl(0xfe800000))
		return 1;
	return !(a[0] | a[1] | a[2] | a[3]);
}

/* Returns 1 if a is a multicast address (ff00::/8). */
static __always_inline int ipv6_multicast(const __be32 a[4])
{
	return (a[0] & bpf_htonl(0xff000000)) == bpf_htonl(0xff000000);
}

/* Returns 1 if the IPv6 address a is all zero (unspecified; none, in the config). */
static __always_inline int ipv6_unset(const __be32 a[4])
{
	return !(a[0] | a[1] | a[2] | a[3]);
}

/* Returns the UDP destination port (host order) and sets *udp, or -1 if truncated. */
static __always_inline int parse_udp(struct cursor *c, struct udphdr **udp)
{
	struct udphdr *h = c->pos;

	if ((void *)(h + 1) > c->end)
		return -1;
	c->pos = h + 1;
	*udp = h;
	return bpf_ntohs(h->dest);
}

/* Returns non-zero if iph is a fragment other than the first, or the first of several:
 * such packets carry no (or not only their own) L4 ports. */
static __always_inline int ipv4_is_fragment(const struct iphdr *iph)
{
	return iph->frag_off & bpf_htons(IP_MF | IP_OFFSET);
}

/* Returns the length from offset off of skb (where the IPv4 header iph of the packet
 * that decides segmentation sits) to the end of the largest packet skb puts on the
 * wire: all of it, or for a GSO packet one segment's, up to and including the IPv4 and
 * TCP (or UDP) headers plus gso_size. A GSO packet's segments must fit the tunnel as
 * much as a plain packet must: gso_size is what the sender's path MTU allowed, not
 * ours. For a tunnelled GSO skb iph is the inner header (gso_size counts the inner
 * payload). */
static __always_inline __u32 ipv4_seg_len(struct __sk_buff *skb, const struct iphdr *iph,
					  __u32 off)
{
	__u32 hlen = iph->ihl * 4;
	__u8 doff;

	if (!skb->gso_size)
		return skb->len - off;
	if (iph->protocol == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(skb, off + hlen + 12, &doff, 1))
			return 0;	/* no TCP header to segment by */
		hlen += (doff >> 4) * 4;
	} else if (iph->protocol == IPPROTO_UDP) {
		hlen += sizeof(struct udphdr);
	}
	return hlen + skb->gso_size;
}

/* Returns the length of the largest IPv4 packet skb (whose IPv4 header is iph, right
 * after the Ethernet header) puts on the wire (ipv4_seg_len). */
static __always_inline __u32 ipv4_wire_len(struct __sk_buff *skb, const struct iphdr *iph)
{
	return ipv4_seg_len(skb, iph, ETH_HLEN);
}

/* ipv4_seg_len for the IPv6 packet ip6h at offset off of skb. A GSO packet's
 * segments carry the fixed header, the TCP (or UDP) header and gso_size bytes: the
 * kernel segments no packet with extension headers in front of them. */
static __always_inline __u32 ipv6_seg_len(struct __sk_buff *skb, const struct ip6_hdr *ip6h,
					  __u32 off)
{
	__u32 hlen = sizeof(*ip6h);
	__u8 doff;

	if (!skb->gso_size)
		return skb->len - off;
	if (ip6h->nexthdr == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(skb, off + hlen + 12, &doff, 1))
			return 0;
		hlen += (doff >> 4) * 4;
	} else if (ip6h->nexthdr == IPPROTO_UDP) {
		hlen += sizeof(struct udphdr);
	}
	return hlen + skb->gso_size;
}

/* ipv4_wire_len for the IPv6 packet ip6h right after the Ethernet header. */
static __always_inline __u32 ipv6_wire_len(struct __sk_buff *skb, const struct ip6_hdr *ip6h)
{
	return ipv6_seg_len(skb, ip6h, ETH_HLEN);
}

/* Makes sure the first min(len, want) bytes are linear. Returns 0, or -1 if the pull
 * failed. Invalidates packet pointers when it pulls. */
static __always_inline int pull_headers(struct __sk_buff *skb, __u32 want)
{
	__u32 len = skb->len < want ? skb->len : want;

	if ((void *)(long)skb->data + len <= (void *)(long)skb->data_end)
		return 0;
	return bpf_skb_pull_data(skb, len) ? -1 : 0;
}

/* Makes the Ethernet header, the IPv4 header with its options and extra bytes after it
 * linear, reading the header length from the packet so the common case (headers already
 * linear) pulls nothing and no payload is ever copied out of the page frags. Returns 0,
 * or -1 if the pull failed. Invalidates packet pointers when it pulls. */
static __always_inline int pull_ipv4_headers(struct __sk_buff *skb, __u32 extra)
{
	__u8 vihl;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &vihl, 1))
		return 0;	/* shorter than that: the parsers reject it */
	return pull_headers(skb, ETH_HLEN + (vihl & 0xf) * 4 + extra);
}
