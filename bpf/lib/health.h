/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Health probes answered by the datapath: a probe for this node's tunnel address gets
 * its answer from health_reach, which the agent refreshes, so a node keeps answering
 * while its agent restarts and stops claiming reach once the agent's claims expire. */
#pragma once

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "geneve.h"
#include "trace.h"

/* The wire format of loader/health: the magic "isthmus-health1\0", a kind byte, the
 * prober's round (8 bytes, echoed) and the site's name (the rest of the datagram). */
#define HEALTH_MAGIC_LEN	16
#define HEALTH_HDR_LEN		(HEALTH_MAGIC_LEN + 1 + 8)
#define HEALTH_KIND_PROBE	'P'
#define HEALTH_KIND_REACHES	'R'
#define HEALTH_KIND_UNREACHABLE	'N'

/* The inner UDP header and the fixed part of a probe. */
struct health_msg {
	struct udphdr udp;
	__u32 magic[HEALTH_MAGIC_LEN / 4];	/* the magic, as little-endian words */
	__u8 kind;
	__u8 round[8];
} __attribute__((packed));

_Static_assert(sizeof(struct health_msg) == sizeof(struct udphdr) + HEALTH_HDR_LEN,
	       "health_msg is UDP and the probe header");

/* Returns 1 if the magic is loader/health's ("isthmus-health1\0"). */
static __always_inline int health_magic_ok(const struct health_msg *m)
{
	return m->magic[0] == 0x68747369 && m->magic[1] == 0x2d73756d &&
	       m->magic[2] == 0x6c616568 && m->magic[3] == 0x00316874;
}

/* Returns 1 if the inner packet of a frame geneve_validate accepted is UDP for this
 * node's tunnel address (without options, not a fragment): maybe a health probe. The
 * XDP side leaves such frames whole, so the TC side answers every probe. */
static __always_inline int health_candidate(const struct datapath_config *cfg,
					    const struct decap_info *info)
{
	const struct iphdr *iip = info->inner;

	return cfg->tunnel_ip && info->daddr == cfg->tunnel_ip &&
	       iip->protocol == IPPROTO_UDP && iip->ihl == 5 && !ipv4_is_fragment(iip);
}

/* Swaps the two adjacent n-byte fields at off (MAC addresses, IPv4 addresses, UDP
 * ports; n at most ETH_ALEN). A checksum over both does not change. Returns 0 or a
 * negative errno. */
static __always_inline int health_swap(struct __sk_buff *skb, __u32 off, __u32 n)
{
	__u8 a[2 * ETH_ALEN], b[2 * ETH_ALEN];

	if (bpf_skb_load_bytes(skb, off, a, 2 * n))
		return -1;
	__builtin_memcpy(b, a + n, n);
	__builtin_memcpy(b + n, a, n);
	return bpf_skb_store_bytes(skb, off, b, 2 * n, 0);
}

/* Answers a health probe in frame skb, which tc_decap validated (info), if it is one
 * and health_reach holds a claim for its (port, site), or for (port, "") when the site
 * has none: "reaches" while the claim's deadline has not passed and it says so, else
 * "does not reach". The frame goes back out the device it came in on, to the hop that
 * sent it (paths are symmetric), rewritten in place as the agent's responder would
 * answer: outer and inner MACs, addresses and UDP ports swapped, outer TTL 64 and UDP
 * checksum 0, the kind byte set (inner UDP checksum patched); GENEVE, the round and the
 * site stay. The prober is recorded in health_probers. Returns TC_ACT_REDIRECT, 0 when
 * the frame is no probe this map answers (decapsulation goes on: the agent's socket may
 * answer it), or a negative DROP_*. Counts METRIC_HEALTH_ANSWERED, and
 * METRIC_HEALTH_EXPIRED when the claim had expired. */
static __always_inline int health_answer(struct __sk_buff *skb,
					 const struct datapath_config *cfg,
					 const struct decap_info *info, __u8 hook)
{
	const __u32 ip_off = ETH_HLEN;
	__u32 udp_off = ip_off + (info->outer_hlen & 0x3c);
	__u32 ieth_off = udp_off + sizeof(struct udphdr) + GENEVE_HLEN + (info->optlen & 0xfc);
	__u32 iip_off = ieth_off + ETH_HLEN;
	__u32 iudp_off = iip_off + sizeof(struct iphdr);
	__u32 kind_off = iudp_off + sizeof(struct udphdr) + HEALTH_MAGIC_LEN;
	struct health_prober_key pk = { .addr = info->inner->saddr };
	struct health_prober_value pv;
	struct health_key key = {};
	struct health_reach_value *r;
	struct health_msg m;
	__u32 ulen, site_len;
	__be16 from, to, ttl_from, ttl_to;
	__u64 now;
	int expired;

	if (bpf_ntohs(info->inner->tot_len) < sizeof(struct iphdr) + sizeof(m) ||
	    bpf_skb_load_bytes(skb, iudp_off, &m, sizeof(m)))
		return 0;
	ulen = bpf_ntohs(m.udp.len);
	if (ulen != bpf_ntohs(info->inner->tot_len) - sizeof(struct iphdr) ||
	    !health_magic_ok(&m) || m.kind != HEALTH_KIND_PROBE)
		return 0;
	site_len = ulen - sizeof(m);
	if (site_len > HEALTH_SITE_MAX)
		return 0;	/* the agent's responder answers long names */
	if (site_len > 0 &&
	    bpf_skb_load_bytes(skb, iudp_off + sizeof(m), key.site, site_len))
		return 0;
	key.port = m.udp.dest;
	__builtin_memcpy(pk.site, key.site, sizeof(pk.site));
	r = bpf_map_lookup_elem(&health_reach, &key);
	if (!r && site_len > 0) {
		__builtin_memset(key.site, 0, sizeof(key.site));
		r = bpf_map_lookup_elem(&health_reach, &key);
	}
	if (!r)
		return 0;	/* no claims (yet): the agent answers, if it runs */

	now = bpf_ktime_get_ns();
	expired = now > r->expires;
	from = *(__be16 *)&m.kind;		/* the kind and the first byte of the round */
	m.kind = !expired && (r->flags & HEALTH_F_REACHES) ? HEALTH_KIND_REACHES
							   : HEALTH_KIND_UNREACHABLE;
	to = *(__be16 *)&m.kind;
	pk.port = m.udp.source;
	pv.seen = now;
	bpf_map_update_elem(&health_probers, &pk, &pv, BPF_ANY);	/* a lost entry costs a push */

	if (bpf_skb_load_bytes(skb, ip_off + offsetof(struct iphdr, ttl), &ttl_from, 2))
		return DROP_ENCAP_FAILED;
	ttl_to = ttl_from;
	*(__u8 *)&ttl_to = OUTER_TTL;
	/* In this order: every write needs the bytes the loads above validated. The swaps
	 * leave every checksum as it is; the inner UDP one is patched for the kind byte by
	 * the helper, which knows whether the field holds a full checksum or the seed of a
	 * CHECKSUM_PARTIAL skb (then it needs nothing), and keeps a zero one zero. */
	if (health_swap(skb, 0, ETH_ALEN) ||
	    health_swap(skb, ip_off + offsetof(struct iphdr, saddr), 4) ||
	    bpf_l3_csum_replace(skb, ip_off + offsetof(struct iphdr, check), ttl_from, ttl_to, 2) ||
	    bpf_skb_store_bytes(skb, ip_off + offsetof(struct iphdr, ttl), &ttl_to, 2, 0) ||
	    bpf_skb_store_bytes(skb, udp_off + offsetof(struct udphdr, check), &(__u16){0}, 2, 0) ||
	    health_swap(skb, ieth_off, ETH_ALEN) ||
	    health_swap(skb, iip_off + offsetof(struct iphdr, saddr), 4) ||
	    health_swap(skb, iudp_off, 2) ||
	    bpf_l4_csum_replace(skb, iudp_off + offsetof(struct udphdr, check), from, to,
				BPF_F_MARK_MANGLED_0 | 2) ||
	    bpf_skb_store_bytes(skb, kind_off, &to, 2, 0))
		return DROP_ENCAP_FAILED;
	if (bpf_redirect(skb->ifindex, 0) != TC_ACT_REDIRECT)
		return DROP_REDIRECT_FAILED;
	metrics_count(METRIC_HEALTH_ANSWERED, hook, skb->len);
	if (expired)
		metrics_count(METRIC_HEALTH_EXPIRED, hook, skb->len);
	trace_tc(skb, cfg, METRIC_HEALTH_ANSWERED, hook, info->peer, 0);
	return TC_ACT_REDIRECT;
}
