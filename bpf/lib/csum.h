/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Internet checksums: a full IPv4 header sum, the incremental TTL update, incremental
 * updates of any checksum for a changed 16- or 32-bit field. */
#pragma once

#include "common.h"

/* Returns the 16-bit one's complement of the folded 32-bit sum. */
static __always_inline __u16 csum_fold32(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* Returns the header checksum of a 20-byte IPv4 header whose check field is zero. */
static __always_inline __sum16 ipv4_hdr_csum(const struct iphdr *iph)
{
	const __u16 *w = (const __u16 *)iph;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*iph) / 2); i++)
		sum += w[i];
	return (__sum16)csum_fold32(sum);
}

/* Decrements the TTL and patches the header checksum incrementally (RFC 1624, as the
 * kernel's ip_decrease_ttl). Returns nothing; the caller has checked ttl > 1. */
static __always_inline void ipv4_decrease_ttl(struct iphdr *iph)
{
	__u32 check = (__u32)iph->check;

	check += (__u32)bpf_htons(0x0100);
	iph->check = (__sum16)(check + (check >= 0xFFFF));
	iph->ttl--;
}

/* Returns checksum check updated for a 16-bit word of the summed data changing from
 * from to to (RFC 1624 eqn. 3, as the kernel's csum_replace2). Byte order does not
 * matter as long as all three are in the same one. */
static __always_inline __sum16 csum_replace16(__sum16 check, __be16 from, __be16 to)
{
	return (__sum16)csum_fold32((__u32)(__u16)~check + (__u16)~from + (__u16)to);
}

/* Returns checksum check updated for a 32-bit field changing from from to to (RFC
 * 1624 eqn. 3, as the kernel's csum_replace4). */
static __always_inline __sum16 csum_replace32(__sum16 check, __be32 from, __be32 to)
{
	__u32 nf = ~from;

	return (__sum16)csum_fold32((__u32)(__u16)~check + (nf & 0xffff) + (nf >> 16) +
				    (to & 0xffff) + (to >> 16));
}
