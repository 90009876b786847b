/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Ethernet header and the EtherType values isthmus uses (subset of UAPI linux/if_ether.h). */
#pragma once

#include <linux/types.h>

#define ETH_ALEN	6		/* octets in one Ethernet address */
#define ETH_HLEN	14		/* total octets in header */

#define ETH_P_IP	0x0800		/* IPv4 */
#define ETH_P_ARP	0x0806		/* ARP */
#define ETH_P_IPV6	0x86DD		/* IPv6 */
#define ETH_P_TEB	0x6558		/* transparent Ethernet bridging (GENEVE payload) */

struct ethhdr {
	unsigned char h_dest[ETH_ALEN];
	unsigned char h_source[ETH_ALEN];
	__be16 h_proto;
} __attribute__((packed));
