/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Egress masquerade: a managed pod's packet leaving by the underlay device for a
 * destination outside masq_exempt gets the node's underlay address, by the
 * translation steps of return-path SNAT (lib/nat.h) on a table of its own, masq_nat;
 * replies arriving on the underlay are translated back. */
#pragma once

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "nat.h"

/* Returns 1 if iph is a pod packet this node masquerades: masquerade on, a source in
 * snat_exempt (this node's pods: on a managed site its podCIDRs and tunnel address)
 * that is not the underlay address itself (the host's own traffic and every GENEVE
 * frame), a destination outside masq_exempt. */
static __always_inline int masq_wanted(const struct datapath_config *cfg, const struct iphdr *iph)
{
	struct route_key k = { .prefixlen = 32 };

	if (!(cfg->flags & CFG_F_MASQUERADE) || !cfg->underlay_ip ||
	    iph->saddr == cfg->underlay_ip)
		return 0;
	k.addr = iph->saddr;
	if (!bpf_map_lookup_elem(&snat_exempt, &k))
		return 0;
	k.addr = iph->daddr;
	return !bpf_map_lookup_elem(&masq_exempt, &k);
}

/* TC egress on the underlay device, after the stack: kube-proxy's DNAT and the
 * node's conntrack have seen the packet with the pod's address, as with iptables
 * MASQUERADE in POSTROUTING. A source some netfilter rule has masqueraded already
 * is the underlay address and passes. Returns TC_ACT_OK or a negative DROP_*
 * (fragments and protocols nat_translate_source cannot translate). Counts
 * METRIC_MASQ. */
static __always_inline int masq_egress(struct __sk_buff *skb, __u8 hook)
{
	const struct datapath_config *cfg = config_get();
	struct cursor c;
	struct ethhdr *eth;
	struct iphdr *iph;
	int ret;

	if (!cfg || !(cfg->flags & CFG_F_MASQUERADE))
		return TC_ACT_OK;
	if (pull_ipv4_headers(skb, 0))
		return TC_ACT_OK;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	if (parse_eth(&c, &eth) != ETH_P_IP || parse_ipv4(&c, &iph) < 0)
		return TC_ACT_OK;
	if (!masq_wanted(cfg, iph))
		return TC_ACT_OK;
	ret = nat_translate_source(skb, cfg, &masq_nat, NAT_TABLE_MASQ, iph, cfg->underlay_ip,
				   METRIC_MASQ, hook);
	return ret < 0 ? ret : TC_ACT_OK;
}

/* TC ingress on the underlay device, for a packet that is not GENEVE: a reply to the
 * underlay address of a masqueraded flow (or an ICMP error about one) gets the pod's
 * address and port back, then the stack forwards it to the pod, where conntrack finds
 * the flow it saw leave. A TCP segment to the underlay address that no translation,
 * socket or conntrack entry claims is dropped rather than reset by the host
 * (nat_reply_missed). Returns 1 if rewritten, 0 if untouched, or a negative DROP_*.
 * Counts METRIC_MASQ_REVERSE. */
static __always_inline int masq_reverse(struct __sk_buff *skb, const struct datapath_config *cfg,
					__u8 hook)
{
	if (!(cfg->flags & CFG_F_MASQUERADE))
		return 0;
	if (pull_ipv4_headers(skb, 0))
		return 0;
	return nat_reverse(skb, cfg, &masq_nat, cfg->underlay_ip, METRIC_MASQ_REVERSE, hook);
}
