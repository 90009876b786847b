/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow hash (Bob Jenkins' lookup3 final mix, as the kernel's jhash_3words) and the
 * outer UDP source port derived from it. bpf/encap_test.go has the Go twins (flowHash, flowHash6). */
#pragma once

#include "common.h"
#include "parse.h"

#define JHASH_INITVAL		0xdeadbeef

/* Returns x rotated left by k bits. */
static __always_inline __u32 rol32(__u32 x, int k)
{
	return (x << k) | (x >> (32 - k));
}

/* Returns the jhash of three 32-bit words with seed initval (kernel jhash_3words). */
static __always_inline __u32 jhash_3words(__u32 a, __u32 b, __u32 c, __u32 initval)
{
	initval += JHASH_INITVAL + (3 << 2);
	a += initval;
	b += initval;
	c += initval;
	c ^= b; c -= rol32(b, 14);
	a ^= c; a -= rol32(c, 11);
	b ^= a; b -= rol32(a, 25);
	c ^= b; c -= rol32(b, 16);
	a ^= c; a -= rol32(c, 4);
	b ^= a; b -= rol32(a, 14);
	c ^= b; c -= rol32(b, 24);
	return c;
}

/* Returns non-zero if the flow hash of the IPv4 packet at iph covers its ports: TCP or
 * UDP, and not a fragment. */
static __always_inline int flow_has_ports(const struct iphdr *iph)
{
	return (iph->protocol == IPPROTO_TCP || iph->protocol == IPPROTO_UDP) &&
	       !ipv4_is_fragment(iph);
}

/* Returns the flow hash of the IPv4 packet at iph whose first 4 L4 bytes, raw, are
 * ports (0 when flow_has_ports is false or the packet ends before them). */
static __always_inline __u32 flow_hash_ports(const struct iphdr *iph, __u32 ports)
{
	return jhash_3words(iph->saddr, iph->daddr, ports + iph->protocol, FLOW_HASH_SEED);
}

/* Returns the flow hash of the inner IPv4 packet at iph: jhash_3words over the raw
 * (network order) addresses and, for TCP and UDP when the packet is not a fragment,
 * the raw 4 bytes of the two ports, added to the protocol number. l4 must point just
 * past the IPv4 header. It picks both the outer UDP source port (flow_sport_of) and
 * the member of a next-hop group (nexthop_select): compute it once per packet. */
static __always_inline __u32 flow_hash(const struct iphdr *iph, const void *l4,
				       const void *data_end)
{
	__u32 ports = 0;

	if (flow_has_ports(iph)) {
		const __u32 *p = l4;

		if ((const void *)(p + 1) <= data_end)
			ports = *p;
	}
	return flow_hash_ports(iph, ports);
}

/* Returns the outer UDP source port (host order, SPORT_MIN..SPORT_MAX) of a flow with
 * hash h (flow_hash). */
static __always_inline __u16 flow_sport_of(__u32 h)
{
	return SPORT_MIN + (__u16)(h % (SPORT_MAX - SPORT_MIN + 1));
}

/* Returns the outer UDP source port for the inner IPv4 packet at iph:
 * flow_sport_of(flow_hash(...)). */
static __always_inline __u16 flow_sport(const struct iphdr *iph, const void *l4,
					const void *data_end)
{
	return flow_sport_of(flow_hash(iph, l4, data_end));
}

/* Returns the flow hash of the inner IPv6 packet at ip6h: jhash_3words over the
 * exclusive-or of the words of each address (network order), the second one mixed with
 * the flow label (the sender's own flow identity: a flow that changes it, as Linux does
 * to find another path after a timeout, may take another member and source port), and
 * for TCP and UDP right after the fixed header the raw 4 bytes of the ports (ports: 0
 * unless flow_has_ports6, or when the packet ends before them), added to the next
 * header. */
static __always_inline __u32 flow_hash6_ports(const struct ip6_hdr *ip6h, __u32 ports)
{
	return jhash_3words(ip6h->saddr[0] ^ ip6h->saddr[1] ^ ip6h->saddr[2] ^ ip6h->saddr[3],
			    ip6h->daddr[0] ^ ip6h->daddr[1] ^ ip6h->daddr[2] ^ ip6h->daddr[3] ^
			    ipv6_flowlabel(ip6h),
			    ports + ip6h->nexthdr, FLOW_HASH_SEED);
}

/* Returns non-zero if the flow hash of the IPv6 packet at ip6h covers its ports: TCP
 * or UDP right after the fixed header. */
static __always_inline int flow_has_ports6(const struct ip6_hdr *ip6h)
{
	return ip6h->nexthdr == IPPROTO_TCP || ip6h->nexthdr == IPPROTO_UDP;
}

/* flow_hash6_ports with the ports read from l4, just past the fixed header (0 when
 * the packet ends before them). */
static __always_inline __u32 flow_hash6(const struct ip6_hdr *ip6h, const void *l4,
					const void *data_end)
{
	__u32 ports = 0;

	if (flow_has_ports6(ip6h)) {
		const __u32 *p = l4;

		if ((const void *)(p + 1) <= data_end)
			ports = *p;
	}
	return flow_hash6_ports(ip6h, ports);
}
