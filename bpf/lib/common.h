/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Includes every program needs, wire constants, and tunables (override before including). */
#pragma once

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "types.h"
#include "drop.h"

/* GENEVE over UDP, RFC 8926. */
#ifndef GENEVE_PORT
#define GENEVE_PORT		6081
#endif

/* Outer IPv4 TTL of encapsulated packets. */
#ifndef OUTER_TTL
#define OUTER_TTL		64
#endif

/* Range of the outer UDP source port chosen by the flow hash (RFC 8926 3.3 / RFC 6335). */
#ifndef SPORT_MIN
#define SPORT_MIN		49152
#endif
#ifndef SPORT_MAX
#define SPORT_MAX		65535
#endif

/* Seed of the flow hash; maps/ and the Go twin in bpf/ use the same value. */
#ifndef FLOW_HASH_SEED
#define FLOW_HASH_SEED		0x15743b5d
#endif

#define GENEVE_HLEN		8
/* Outer IPv4 + UDP + GENEVE (no options) + inner Ethernet: bytes pushed by encap. */
#define ENCAP_OVERHEAD		(sizeof(struct iphdr) + sizeof(struct udphdr) + \
				 GENEVE_HLEN + sizeof(struct ethhdr))
/* The same over the IPv6 underlay: a 40-byte outer IPv6 header. */
#define IPV6_HLEN		40
#define ENCAP6_OVERHEAD		(IPV6_HLEN + sizeof(struct udphdr) + GENEVE_HLEN + \
				 sizeof(struct ethhdr))

#ifndef likely
#define likely(x)		__builtin_expect(!!(x), 1)
#endif
#ifndef unlikely
#define unlikely(x)		__builtin_expect(!!(x), 0)
#endif
