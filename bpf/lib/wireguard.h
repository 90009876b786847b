/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* GENEVE inside WireGuard: the tunnel to an encrypted peer (PEER_F_WIREGUARD). The frame
 * is built as for any peer, but its outer IPv4 header goes from this node's tunnel
 * address to the peer's (the address the datapath knows such a peer by), and it is
 * handed to the WireGuard device, which encrypts it to the key its cryptokey routing
 * binds to that destination. Coming back, WireGuard has checked that the outer source
 * belongs to the key that sent it, and wireguard_ingress decapsulates
 * (geneve_peer_path_ok in lib/geneve.h keeps each peer's frames to their path). Nothing for an
 * encrypted peer ever takes the underlay in the clear: when it cannot go into
 * WireGuard it is dropped, with a reason. */
#pragma once

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "trace.h"

/* How a GENEVE frame reaches a peer (geneve_path). */
enum geneve_path {
	GENEVE_PATH_UNDERLAY	= 0,	/* in the clear, from config.underlay_ip, by the FIB */
	GENEVE_PATH_WIREGUARD	= 1,	/* from config.tunnel_ip into config.wg_ifindex */
	GENEVE_PATH_UNDERLAY6	= 2,	/* in the clear over IPv6, from config.underlay_ip6 */
};

/* Returns how a GENEVE frame reaches peer (the 32 bits the datapath knows it by), or a
 * negative DROP_*: DROP_NEXTHOP_NOT_PEER when peers has no entry for it (the tunnel
 * may be an encrypted one: fail closed; the agent writes a peer before any route to
 * it and removes it after), DROP_WIREGUARD_NO_KEY, DROP_WIREGUARD_NO_DEVICE,
 * DROP_NO_UNDERLAY6 (a peer on the IPv6 underlay, and this node has no IPv6 underlay
 * address). */
static __always_inline int geneve_path(const struct datapath_config *cfg, __be32 peer)
{
	const struct peer_value *pv = bpf_map_lookup_elem(&peers, &peer);

	if (unlikely(!pv))
		return DROP_NEXTHOP_NOT_PEER;
	if (likely(!(pv->flags & (PEER_F_WIREGUARD | PEER_F_UNDERLAY6))))
		return GENEVE_PATH_UNDERLAY;
	/* Never in the clear for an encrypted peer, whatever else its flags say. */
	if (!(pv->flags & PEER_F_WIREGUARD))
		return ipv6_unset(cfg->underlay_ip6) ? DROP_NO_UNDERLAY6 : GENEVE_PATH_UNDERLAY6;
	if (pv->flags & PEER_F_WIREGUARD_NO_KEY)
		return DROP_WIREGUARD_NO_KEY;
	if (!cfg->wg_ifindex || !cfg->tunnel_ip)
		return DROP_WIREGUARD_NO_DEVICE;
	return GENEVE_PATH_WIREGUARD;
}

/* The outer source of a GENEVE frame on path (geneve_path). */
static __always_inline __be32 geneve_outer_src(const struct datapath_config *cfg, int path)
{
	return path == GENEVE_PATH_WIREGUARD ? cfg->tunnel_ip : cfg->underlay_ip;
}

/* Returns the MTU of the WireGuard device, 0 if it cannot be read. */
static __always_inline __u32 wireguard_mtu(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	/* A length every device takes: only the MTU reported back is wanted. */
	__u32 mtu = 20;

	if (bpf_check_mtu(skb, cfg->wg_ifindex, &mtu, 0, 0) < 0)
		return 0;
	return mtu;
}

/* Hands a GENEVE frame for an encrypted peer, its outer header written, to the WireGuard
 * device. The frame keeps its outer Ethernet header: a redirect to a device without
 * one (WireGuard's is a layer-3 device) removes it. Returns TC_ACT_REDIRECT or
 * DROP_REDIRECT_FAILED. Counts metric and METRIC_WIREGUARD_SENT. */
static __always_inline int send_to_wireguard(struct __sk_buff *skb,
					     const struct datapath_config *cfg, __be32 peer,
					     int metric, __u8 hook, __u32 group)
{
	if (bpf_redirect(cfg->wg_ifindex, 0) != TC_ACT_REDIRECT)
		return DROP_REDIRECT_FAILED;
	metrics_count(metric, hook, skb->len);
	metrics_count(METRIC_WIREGUARD_SENT, hook, skb->len);
	trace_tc(skb, cfg, metric, hook, peer, group);
	return TC_ACT_REDIRECT;
}
