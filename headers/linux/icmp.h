/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP header (UAPI linux/icmp.h layout) and the types isthmus uses. */
#pragma once

#include <linux/types.h>

#define ICMP_ECHOREPLY		0
#define ICMP_DEST_UNREACH	3
#define ICMP_SOURCE_QUENCH	4
#define ICMP_REDIRECT		5
#define ICMP_ECHO		8
#define ICMP_TIME_EXCEEDED	11
#define ICMP_PARAMETERPROB	12
#define ICMP_TIMESTAMP		13
#define NR_ICMP_TYPES		18
#define ICMP_NET_UNREACH	0	/* code of ICMP_DEST_UNREACH */
#define ICMP_FRAG_NEEDED	4	/* code of ICMP_DEST_UNREACH */
#define ICMP_EXC_TTL		0	/* code of ICMP_TIME_EXCEEDED */

struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	union {
		struct {
			__be16 id;
			__be16 sequence;
		} echo;
		__be32 gateway;
		struct {
			__be16 __unused;
			__be16 mtu;
		} frag;
		__u8 reserved[4];
	} un;
};
