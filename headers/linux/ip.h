/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv4 header (UAPI linux/ip.h layout, little-endian bitfields only: BPF target bpfel). */
#pragma once

#include <linux/types.h>

#define IP_DF		0x4000		/* don't fragment */
#define IP_MF		0x2000		/* more fragments */
#define IP_OFFSET	0x1FFF		/* fragment offset mask */

struct iphdr {
	__u8 ihl:4,
	     version:4;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
};
