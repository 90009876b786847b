/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* A pod's packet for a destination no next hop reaches now (no gateway reaches its
 * site): dropped and counted, and answered with ICMP net unreachable. */
#pragma once

#include <linux/icmp.h>

#include "common.h"
#include "drop.h"
#include "icmp.h"
#include "maps.h"
#include "metrics.h"
#include "trace.h"

/* Returns 1 if the IPv4 packet in skb may be answered with an ICMP error: as
 * icmp4_error_allowed judges it, and not from this node's tunnel address (a flow
 * return-path SNAT translated: the error would not reach the pod). */
static __always_inline int no_path_answerable(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	struct iphdr ip;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
		return 0;
	if (cfg->tunnel_ip && ip.saddr == cfg->tunnel_ip)
		return 0;
	return icmp4_error_allowed(skb, &ip, ETH_HLEN + (ip.ihl & 0xf) * 4);
}

/* Drops skb, a pod's packet whose route's next-hop group has no live member, counted
 * as DROP_NO_NEXTHOP with its length; then, when no_path_answerable, turns it into
 * ICMP destination unreachable / net unreachable (type 3 code 0) back to the pod, so
 * the sender fails at once instead of waiting into a black hole. Returns
 * TC_ACT_REDIRECT (the reply, counted METRIC_NO_PATH_UNREACH_SENT) or TC_ACT_SHOT. */
static __always_inline int tc_drop_no_path(struct __sk_buff *skb, __u8 hook)
{
	const struct datapath_config *cfg = config_get();
	int verdict = tc_drop(skb, DROP_NO_NEXTHOP, hook);

	if (!cfg || !no_path_answerable(skb, cfg))
		return verdict;
	if (icmp4_error(skb, ICMP_DEST_UNREACH, ICMP_NET_UNREACH, 0, 0, DROP_NO_NEXTHOP,
			METRIC_NO_PATH_UNREACH_SENT, hook) < 0)
		return verdict;
	trace_tc(skb, cfg, METRIC_NO_PATH_UNREACH_SENT, hook, 0, 0);
	return TC_ACT_REDIRECT;
}
