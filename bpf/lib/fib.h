/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* FIB lookups and the redirects that follow them: to a peer, a local pod, or the host. */
#pragma once

#include "common.h"
#include "maps.h"
#include "route.h"
#include "metrics.h"
#include "csum.h"
#include "nat.h"
#include "parse.h"
#include "nexthop.h"
#include "stack.h"

#ifndef AF_INET
#define AF_INET			2
#endif

/* Returns the bpf_fib_lookup verdict (BPF_FIB_LKUP_RET_*, or negative errno) for an
 * IPv4 forwarding lookup from saddr to daddr as if the packet arrived on ifindex.
 * tot_len 0 checks skb against the MTU of the device found (GSO skbs always pass);
 * otherwise the kernel checks tot_len against the route's MTU as forwarding does (a
 * locked route MTU, a learned path MTU, else the device's), before any neighbour
 * lookup. Either way, on
 * BPF_FIB_LKUP_RET_FRAG_NEEDED p->mtu_result holds the MTU it failed. */
static __always_inline void fib_params_v4(struct bpf_fib_lookup *p, __be32 saddr, __be32 daddr,
					  __u8 tos, __u8 proto, __u32 ifindex, __u16 tot_len)
{
	__builtin_memset(p, 0, sizeof(*p));
	p->family = AF_INET;
	p->tot_len = tot_len;
	p->tos = tos;
	p->l4_protocol = proto;
	p->ipv4_src = saddr;
	p->ipv4_dst = daddr;
	p->ifindex = ifindex;
}

#ifndef AF_INET6
#define AF_INET6		10
#endif

/* fib_params_v4 for IPv6: a forwarding lookup from saddr to daddr as if the packet
 * arrived on ifindex. The kernel answers BPF_FIB_LKUP_RET_FWD_DISABLED when IPv6
 * forwarding is off on ifindex, and BPF_FIB_LKUP_RET_NOT_FWDED for a link-local or
 * multicast address. */
static __always_inline void fib_params_v6(struct bpf_fib_lookup *p, const __be32 saddr[4],
					  const __be32 daddr[4], __u8 proto, __u32 ifindex)
{
	__builtin_memset(p, 0, sizeof(*p));
	p->family = AF_INET6;
	p->l4_protocol = proto;
	__builtin_memcpy(p->ipv6_src, saddr, 16);
	__builtin_memcpy(p->ipv6_dst, daddr, 16);
	p->ifindex = ifindex;
}

static __always_inline int fib_lookup_v4(struct __sk_buff *skb, struct bpf_fib_lookup *p,
					 __be32 saddr, __be32 daddr, __u8 tos, __u8 proto,
					 __u32 ifindex, __u16 tot_len)
{
	fib_params_v4(p, saddr, daddr, tos, proto, ifindex, tot_len);
	return bpf_fib_lookup(skb, p, sizeof(*p), 0);
}

/* Returns 1 if delivery to the pod interface whose pod_ifaces entry is pi (NULL: none)
 * may enter the pod straight through its peer (bpf_redirect_peer): it has a peer (not
 * POD_IFACE_F_NO_PEER, such as a bridge). */
static __always_inline int pod_iface_peer(const struct pod_iface_value *pi)
{
	return pi && !(pi->flags & POD_IFACE_F_NO_PEER);
}

/* fib_lookup_v4_fast's want_ifindex for "any pod interface (pod_ifaces)". */
#define FIB_WANT_POD_IFACE	0xffffffffU

/* fib_lookup_v4 for the lookups every fast-path packet makes (the next hop to a peer,
 * delivery to a local pod, the pod's source check), trying the main table alone first.
 * A full lookup walks the policy rules, and with any rule besides the kernel's three
 * the kernel keeps the local and main tables apart: two tries and the rule list for
 * every lookup, 40% of what the fast path's programs cost in a stream. With
 * CFG_F_FIB_DIRECT the agent has established that every rule on the node is the
 * kernel's own or isthmus' (whose sources are the node's pod blocks, whose tables hold
 * remote prefixes only: docs/architecture.md, "FIB lookups"), so for these lookups
 * the rules could only add the local table: BPF_FIB_LOOKUP_DIRECT answers from main,
 * and the caller takes that answer only when it is the expected one (want_ifindex: that
 * interface; FIB_WANT_POD_IFACE: a pod interface with a peer, a veth end; 0: any
 * SUCCESS or NO_NEIGH, a next hop). Every other outcome asks the
 * full FIB again, so a lookup that falls through to the local table, or fails, is
 * answered as before. Not so an address of the node that a main route covers: the
 * main table answers it with that route's device, where the local table says
 * "local". A veth end holds none of the node's addresses, the underlay device's own
 * one is never a peer; but a bridge among the pod interfaces (POD_IFACE_F_NO_PEER,
 * cni0) holds the node's address in the subnet it routes, often the tunnel address
 * itself, so an answer through a bridge is never taken from main alone (callers of a
 * want_ifindex that may be a bridge pass cfg NULL). flags: extra BPF_FIB_LOOKUP_*
 * flags of both lookups. */
static __always_inline int fib_lookup_v4_fast(struct __sk_buff *skb, const struct datapath_config *cfg,
					      struct bpf_fib_lookup *p, __be32 saddr, __be32 daddr,
					      __u8 tos, __u8 proto, __u32 ifindex, __u32 flags,
					      __u32 want_ifindex)
{
	int rc;

	if (cfg && (cfg->flags & CFG_F_FIB_DIRECT)) {
		fib_params_v4(p, saddr, daddr, tos, proto, ifindex, 0);
		rc = bpf_fib_lookup(skb, p, sizeof(*p), flags | BPF_FIB_LOOKUP_DIRECT);
		if ((rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH) &&
		    (want_ifindex == FIB_WANT_POD_IFACE ?
		     pod_iface_peer(bpf_map_lookup_elem(&pod_ifaces, &p->ifindex)) :
		     !want_ifindex || p->ifindex == want_ifindex))
			return rc;
	}
	fib_params_v4(p, saddr, daddr, tos, proto, ifindex, 0);
	return bpf_fib_lookup(skb, p, sizeof(*p), flags);
}

/* pod_iface_peer of interface ifindex. */
static __always_inline int pod_iface_has_peer(__u32 ifindex)
{
	return pod_iface_peer(bpf_map_lookup_elem(&pod_ifaces, &ifindex));
}

/* Sends the frame toward the next hop p resolved: MACs from the lookup and
 * bpf_redirect on SUCCESS, bpf_redirect_neigh on NO_NEIGH. Returns TC_ACT_REDIRECT or a
 * negative DROP_*. eth must be the frame's (unicast-addressed) Ethernet header. */
static __always_inline int redirect_nexthop(struct ethhdr *eth, struct bpf_fib_lookup *p, int rc,
					    int peer)
{
	long ret;

	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		__builtin_memcpy(eth->h_dest, p->dmac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, p->smac, ETH_ALEN);
		ret = peer ? bpf_redirect_peer(p->ifindex, 0) : bpf_redirect(p->ifindex, 0);
		break;
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		/* redirect_neigh drops frames whose destination is multicast: keep it unicast. */
		__builtin_memset(eth->h_dest, 0, ETH_ALEN);
		/* No next-hop parameters: then the kernel routes the (outer) header itself and
		 * replaces the skb's dst. With parameters it keeps the dst the skb came with,
		 * which on isthmus0 egress is the overlay route, and once ARP resolves the
		 * queued packet is re-sent through isthmus0's neighbour and lost. Only the
		 * first packets toward an unresolved next hop take this path. */
		ret = bpf_redirect_neigh(p->ifindex, NULL, 0, 0);
		break;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		return DROP_FRAG_NEEDED;
	default:
		return DROP_NO_UNDERLAY_ROUTE;
	}
	if (ret != TC_ACT_REDIRECT)
		return DROP_REDIRECT_FAILED;
	return TC_ACT_REDIRECT;
}

/* Sends a GENEVE frame to peer, toward the underlay next hop that lookup p (verdict rc)
 * found, and accounts it as metric, with group (0 for none) in the trace. Returns
 * TC_ACT_REDIRECT or a negative DROP_*. eth is the frame's Ethernet header. */
static __always_inline int send_looked_up(struct __sk_buff *skb, const struct datapath_config *cfg,
					  struct ethhdr *eth, struct bpf_fib_lookup *p, int rc,
					  __be32 peer, int metric, __u8 hook, __u32 group)
{
	rc = redirect_nexthop(eth, p, rc, 0);
	if (rc < 0)
		return rc;
	metrics_count(metric, hook, skb->len);
	trace_tc(skb, cfg, metric, hook, peer, group);
	return rc;
}

/* Sends a GENEVE frame whose outer IPv4 header goes from src to peer toward the peer's
 * underlay next hop (FIB lookup, then send_looked_up). Encapsulation and the ICMP
 * errors of transit end here. Returns TC_ACT_REDIRECT or a negative DROP_*. eth is the
 * frame's Ethernet header. */
static __always_inline int send_to_peer(struct __sk_buff *skb, const struct datapath_config *cfg,
					struct ethhdr *eth, __be32 src, __be32 peer, int metric,
					__u8 hook, __u32 group)
{
	struct bpf_fib_lookup p;
	int rc;

	rc = fib_lookup_v4_fast(skb, cfg, &p, src, peer, 0, IPPROTO_UDP, skb->ifindex, 0, 0);
	return send_looked_up(skb, cfg, eth, &p, rc, peer, metric, hook, group);
}

/* Sends frame eth, already forwarded (TTL or hop limit decremented), to the local pod
 * interface that lookup p (verdict rc) found: MACs from the lookup and
 * bpf_redirect_peer (bpf_redirect for an interface without peer: pod_iface_has_peer),
 * or bpf_redirect_neigh while the pod's neighbour is unresolved.
 * Returns TC_ACT_REDIRECT or a negative DROP_*. Counts METRIC_DELIVER_POD. */
static __always_inline int redirect_to_pod(struct __sk_buff *skb,
					   const struct datapath_config *cfg, struct ethhdr *eth,
					   struct bpf_fib_lookup *p, int rc,
					   const struct pod_iface_value *pi, __u8 hook)
{
	int ret;

	ret = redirect_nexthop(eth, p, rc, pod_iface_peer(pi));
	if (ret < 0)
		return ret;
	metrics_count(METRIC_DELIVER_POD, hook, skb->len);
	trace_tc(skb, cfg, METRIC_DELIVER_POD, hook, 0, p->ifindex);
	return ret;
}

/* Forwards the IPv4 packet iph of frame eth to the local pod interface that lookup p
 * (verdict rc) found: TTL decremented (the caller checked it), then redirect_to_pod.
 * Returns TC_ACT_REDIRECT or a negative DROP_*. Counts METRIC_DELIVER_POD. */
static __always_inline int forward_to_pod(struct __sk_buff *skb,
					  const struct datapath_config *cfg, struct ethhdr *eth,
					  struct iphdr *iph, struct bpf_fib_lookup *p, int rc,
					  const struct pod_iface_value *pi, __u8 hook)
{
	ipv4_decrease_ttl(iph);
	return redirect_to_pod(skb, cfg, eth, p, rc, pi, hook);
}

/* Forwards the decapsulated IPv4 packet iph of frame eth to the site fabric, toward
 * the next hop that lookup p (verdict rc) found: TTL decremented, MACs from the lookup
 * and bpf_redirect, or bpf_redirect_neigh while the neighbour is unresolved. No
 * netfilter, no conntrack. Returns TC_ACT_REDIRECT or a negative DROP_*. Counts
 * METRIC_DELIVER_FABRIC. */
static __always_inline int forward_to_fabric(struct __sk_buff *skb,
					     const struct datapath_config *cfg, struct ethhdr *eth,
					     struct iphdr *iph, struct bpf_fib_lookup *p, int rc,
					     __u8 hook)
{
	int ret;

	if (iph->ttl <= 1)
		return DROP_TTL_EXCEEDED;
	ipv4_decrease_ttl(iph);
	ret = redirect_nexthop(eth, p, rc, 0);
	if (ret < 0)
		return ret;
	metrics_count(METRIC_DELIVER_FABRIC, hook, skb->len);
	trace_tc(skb, cfg, METRIC_DELIVER_FABRIC, hook, 0, p->ifindex);
	return ret;
}

/* Returns 1 if daddr is in fabric_prefixes: this node hands it to its site's fabric. */
static __always_inline int is_fabric_dest(__be32 daddr)
{
	struct route_key key = { .prefixlen = 32, .addr = daddr };

	return bpf_map_lookup_elem(&fabric_prefixes, &key) != NULL;
}

/* Returns 1 if saddr is in fabric_prefixes: the site's fabric carries its replies,
 * so its packets for nodes of the site (ROUTE_F_VIA_FABRIC) go over the fabric too. */
static __always_inline int is_fabric_source(__be32 saddr)
{
	return is_fabric_dest(saddr);
}

/* Hands an overlay packet [eth][IPv4] to this node's stack: into isthmus0's ingress,
 * the device its source routes through, so strict rp_filter holds, with mark added
 * (OVERLAY_MARK for a packet the stack forwards to a pod). Returns TC_ACT_REDIRECT or
 * DROP_REDIRECT_FAILED. Counts metric. */
static __always_inline int deliver_to_stack(struct __sk_buff *skb, const struct datapath_config *cfg,
					    struct ethhdr *eth, __u32 mark, int metric, __u8 hook)
{
	__builtin_memcpy(eth->h_dest, cfg->overlay_mac, ETH_ALEN);
	skb->mark |= mark;
	if (bpf_redirect(cfg->overlay_ifindex, BPF_F_INGRESS) != TC_ACT_REDIRECT)
		return DROP_REDIRECT_FAILED;
	metrics_count(metric, hook, skb->len);
	trace_tc(skb, cfg, metric, hook, 0, cfg->overlay_ifindex);
	return TC_ACT_REDIRECT;
}

/* Returns 1 if daddr is an address of this host that peers reach through the tunnel:
 * its tunnel address, and its underlay address, which a peer's pods reach through the
 * tunnel because this host answers them there (their node's policy rule, docs/agent.md
 * "Routes and rules"): delivered through isthmus0, no routing hop. */
static __always_inline int tunnel_host_dest(const struct datapath_config *cfg, __be32 daddr)
{
	return (cfg->tunnel_ip && daddr == cfg->tunnel_ip) ||
	       (cfg->underlay_ip && daddr == cfg->underlay_ip);
}

/* Hands a decapsulated frame eth for this host itself to its stack, unmarked (the
 * stack's own filters judge it). Returns TC_ACT_REDIRECT or DROP_REDIRECT_FAILED.
 * Counts METRIC_DELIVER_HOST. */
static __always_inline int deliver_host(struct __sk_buff *skb, const struct datapath_config *cfg,
					struct ethhdr *eth, __u8 hook)
{
	return deliver_to_stack(skb, cfg, eth, 0, METRIC_DELIVER_HOST, hook);
}

/* Returns the device this host routes the answer to packet iph (for one of its own
 * addresses) out of: the route from the destination conntrack gives the packet before
 * routing (ct_routed_daddr: a translated flow's untranslated address) back to its
 * source, as strict rp_filter looks it up, with p filled; 0 when there is none. */
static __always_inline __u32 host_answer_dev(struct __sk_buff *skb,
					     const struct datapath_config *cfg,
					     const struct iphdr *iph, const void *l4,
					     const void *data_end, struct bpf_fib_lookup *p)
{
	__be32 daddr = ct_routed_daddr(skb, iph, l4, data_end);
	int rc;

	rc = fib_lookup_v4(skb, p, daddr, iph->saddr, iph->tos, iph->protocol,
			   cfg->overlay_ifindex, 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return 0;
	return p->ifindex;
}

/* Hands a decapsulated frame eth for this host itself to its stack (deliver_host),
 * on the device strict rp_filter accepts it on (symmetric paths): isthmus0, or the
 * underlay device when the host answers it there (host_answer_dev). That is the case
 * for the answer to a flow the host translated to its underlay address, whose request
 * left by the underlay: kube-proxy's MASQUERADE of its NodePort flow from a pod of a
 * site whose pods reach the remote site over the fabric (the pod's fabric rule), whose
 * answer comes back through the tunnel, to the host's InternalIP. Returns
 * TC_ACT_REDIRECT or DROP_REDIRECT_FAILED. Counts METRIC_DELIVER_HOST. */
static __always_inline int deliver_host_answer(struct __sk_buff *skb,
					       const struct datapath_config *cfg,
					       struct ethhdr *eth, const struct iphdr *iph,
					       const void *l4, const void *data_end, __u8 hook)
{
	struct bpf_fib_lookup p;

	if (host_answer_dev(skb, cfg, iph, l4, data_end, &p) != cfg->underlay_ifindex ||
	    !cfg->underlay_ifindex)
		return deliver_host(skb, cfg, eth, hook);
	/* Addressed to the device, as a frame the stack takes for itself: the lookup's
	 * source MAC is the underlay device's own. */
	__builtin_memcpy(eth->h_dest, p.smac, ETH_ALEN);
	if (bpf_redirect(cfg->underlay_ifindex, BPF_F_INGRESS) != TC_ACT_REDIRECT)
		return DROP_REDIRECT_FAILED;
	metrics_count(METRIC_DELIVER_HOST, hook, skb->len);
	trace_tc(skb, cfg, METRIC_DELIVER_HOST, hook, 0, cfg->underlay_ifindex);
	return TC_ACT_REDIRECT;
}

/* Returns 1 if wire_len, the length of the packet at the start of skb's frame or of
 * one segment of it if skb is GSO (ipv4_wire_len, ipv6_wire_len), is longer than the
 * MTU of device ifindex. */
static __always_inline int longer_than_mtu(struct __sk_buff *skb, __u32 wire_len, __u32 ifindex)
{
	/* A length every device takes: only the MTU bpf_check_mtu reports back is wanted
	 * (it does not check a GSO packet's segments against a given length). */
	__u32 mtu = sizeof(struct iphdr);

	if (bpf_check_mtu(skb, ifindex, &mtu, 0, 0) < 0)
		return 0;
	return wire_len > mtu;
}

/* Delivers a decapsulated frame [eth][IPv6] arriving on the underlay to the local pod
 * the FIB routes it to (pod_ifaces): straight into the pod (hop limit decremented,
 * redirect_to_pod) for what the stack would do nothing else with (stack_sees6, the
 * conntrack fast path) when it has a hop left and fits the pod interface's MTU (every
 * segment of a GSO packet); else through the stack, marked: into isthmus0's ingress,
 * the device the stack routes the sender back through (strict reverse-path filtering
 * holds), where it is forwarded as a router does (hop limit, Time Exceeded, Packet Too
 * Big with the pod's MTU, conntrack, the site's FORWARD policy). Anything else is
 * DROP_NOT_LOCAL: this node's own IPv6 addresses are not reached through the tunnel.
 * Returns TC_ACT_REDIRECT or a negative DROP_*. Counts METRIC_DELIVER_POD. */
static __always_inline int deliver_decapped6(struct __sk_buff *skb,
					     const struct datapath_config *cfg, __u8 hook)
{
	struct cursor c = { .pos = (void *)(long)skb->data, .end = (void *)(long)skb->data_end };
	const struct pod_iface_value *pi;
	struct bpf_fib_lookup p;
	struct ip6_hdr *ip6h;
	struct ethhdr *eth;
	int rc;

	if (parse_eth(&c, &eth) != ETH_P_IPV6 || parse_ipv6(&c, &ip6h) < 0)
		return DROP_INNER_INVALID;
	fib_params_v6(&p, ip6h->saddr, ip6h->daddr, ip6h->nexthdr, skb->ifindex);
	rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH &&
	    rc != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return DROP_NOT_LOCAL;
	pi = bpf_map_lookup_elem(&pod_ifaces, &p.ifindex);
	if (!pi)
		return DROP_NOT_LOCAL;
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED || ip6h->hop_limit <= 1 ||
	    longer_than_mtu(skb, ipv6_wire_len(skb, ip6h), p.ifindex) ||
	    stack_sees6(skb, ip6h, c.pos, c.end, hook))
		return deliver_to_stack(skb, cfg, eth, OVERLAY_MARK, METRIC_DELIVER_POD, hook);
	ip6h->hop_limit--;
	return redirect_to_pod(skb, cfg, eth, &p, rc, pi, hook);
}

/* Delivers a decapsulated frame [eth][IPv4] arriving on the underlay: to a local pod
 * (pod_ifaces) through the stack when stack_sees says so, or when the packet (a GSO
 * packet's segment) is longer than the pod interface's MTU (the stack's forwarding
 * answers ICMP frag needed to a DF packet, fragments any other), else with
 * bpf_redirect_peer; to this host through isthmus0 ingress; or, for a destination in
 * fabric_prefixes whose next hop is elsewhere, to the site fabric.
 * Returns TC_ACT_REDIRECT or a negative DROP_*. Counts METRIC_DELIVER_*. */
static __always_inline int deliver_decapped(struct __sk_buff *skb,
					    const struct datapath_config *cfg, __u8 hook)
{
	const struct pod_iface_value *pi;
	void *data, *data_end;
	struct bpf_fib_lookup p;
	struct ethhdr *eth;
	struct iphdr *iph;
	struct cursor c;
	int nat, rc;

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return deliver_decapped6(skb, cfg, hook);
	/* Reverse SNAT first (lib/nat.h): it may rewrite the destination to a pod. */
	nat = snat_reverse(skb, cfg, hook);
	if (nat < 0)
		return nat;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	c.pos = data;
	c.end = data_end;
	if (parse_eth(&c, &eth) != ETH_P_IP)
		return DROP_INNER_INVALID;
	if (parse_ipv4(&c, &iph) < 0)
		return DROP_INNER_INVALID;

	rc = fib_lookup_v4_fast(skb, cfg, &p, iph->saddr, iph->daddr, iph->tos, iph->protocol,
				skb->ifindex, 0, FIB_WANT_POD_IFACE);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED) {
		/* Local, broadcast or multicast. Only the node's tunnel and underlay
		 * addresses are the host's to receive through the tunnel, from the sources
		 * peer_sources allowed: loopback, broadcasts and other local addresses
		 * would reach services that trust them from any peer. */
		if (!tunnel_host_dest(cfg, iph->daddr))
			return DROP_NOT_LOCAL;
		return deliver_host_answer(skb, cfg, eth, iph, c.pos, data_end, hook);
	}
	/* FRAG_NEEDED (a plain packet longer than the device's MTU, lookup without
	 * tot_len) comes with the device: the pod's is handled below, where the
	 * redirect would have lost the packet without a word. */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH &&
	    rc != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return DROP_NOT_LOCAL;
	pi = bpf_map_lookup_elem(&pod_ifaces, &p.ifindex);
	if (!pi) {
		if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
			return DROP_NOT_LOCAL;
		/* Never back into the tunnel through isthmus0: that would loop. */
		if (p.ifindex != cfg->overlay_ifindex && is_fabric_dest(iph->daddr))
			return forward_to_fabric(skb, cfg, eth, iph, &p, rc, hook);
		/* A reply translated back to a source the host stack sent through
		 * isthmus0 (another CNI's pod): the stack forwards it, as it did the
		 * request, through its own filters. */
		if (nat > 0 && p.ifindex != cfg->overlay_ifindex)
			return deliver_host(skb, cfg, eth, hook);
		return DROP_NOT_LOCAL;
	}
	/* Too long for the pod: the stack's forwarding says so to the sender (ICMP frag
	 * needed with the pod's MTU, so path MTU discovery converges) or fragments it. A
	 * redirect would drop it unseen, or hand the pod segments over its MTU. So does
	 * a TTL with no hop left (time exceeded): only over the IPv6 underlay, where
	 * nothing answered it before the pop (decap_expires). */
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED || iph->ttl <= 1 ||
	    longer_than_mtu(skb, ipv4_wire_len(skb, iph), p.ifindex) ||
	    stack_sees(skb, iph, c.pos, data_end, hook))
		return deliver_to_stack(skb, cfg, eth, OVERLAY_MARK, METRIC_DELIVER_POD, hook);
	return forward_to_pod(skb, cfg, eth, iph, &p, rc, pi, hook);
}

/* Returns 1 if frame eth, arriving on skb->ifindex with a source of route rt, comes
 * from the neighbour this node itself reaches rt's peer through: the site router, the
 * one L2 neighbour a remote site's source can legitimately arrive from (in a routed
 * fabric every node's frames do). That is strict rp_filter one layer down: any other
 * L2 neighbour on the underlay (another tenant's host, a node of another site sharing
 * the segment) claiming a remote pod's source is refused. For a group route, member 0
 * stands for the group: members are reached the same way. While that neighbour has
 * no entry, the device alone decides, as for strict rp_filter. */
static __always_inline int from_site_router(struct __sk_buff *skb,
					    const struct datapath_config *cfg,
					    const struct ethhdr *eth, const struct route_value *rt)
{
	const __u16 *src = (const __u16 *)eth->h_source;
	struct bpf_fib_lookup p;
	__be32 peer = nexthop_select(rt, 0);
	__u16 *mac;
	int rc;

	if (!peer)
		return 0;
	rc = fib_lookup_v4(skb, &p, cfg->underlay_ip, peer, 0, IPPROTO_UDP, skb->ifindex, 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return 0;
	if (p.ifindex != skb->ifindex)
		return 0;
	/* No neighbour entry to compare with (expired, or never resolved since the
	 * node last sent that way): strict rp_filter's own test, the device, is all
	 * there is. Refusing would drop every first packet after the entry expires. */
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return 1;
	/* In 16-bit words: dmac sits at an offset of 58 in the lookup struct. */
	mac = (__u16 *)p.dmac;
	return mac[0] == src[0] && mac[1] == src[1] && mac[2] == src[2];
}

/* Returns 1 if this node routes the answer to iph (from its destination back to its
 * source) out of the device the packet arrived on: strict rp_filter accepts it there,
 * so the stack takes it where it is (symmetric paths). A source of the overlay map can
 * be one: the route to a node of this site's own underlay address, which the node
 * reaches on the underlay, names that node as its peer. */
static __always_inline int answer_leaves_by_ingress(struct __sk_buff *skb,
						    const struct iphdr *iph)
{
	struct bpf_fib_lookup p;
	int rc;

	rc = fib_lookup_v4(skb, &p, iph->daddr, iph->saddr, iph->tos, iph->protocol,
			   skb->ifindex, 0);
	return (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH) &&
	       p.ifindex == skb->ifindex;
}

/* A packet from a remote overlay source for this host's tunnel address, handed over
 * by the site fabric (the tunnel address lies in the site's declared pod block: a
 * bridge CNI's gateway address), for a flow the host translated to that address
 * (kube-proxy's MASQUERADE of a NodePort flow it forwarded into isthmus0): it enters
 * the stack through isthmus0 when that is where the host routes its source from the
 * flow's untranslated address (host_answer_dev). Anything else is left to
 * fabric_ingress's other tests (the host's own flows from its tunnel address leave by
 * the fabric, its fabric rule, and are answered there). Returns TC_ACT_OK (not
 * taken), TC_ACT_REDIRECT (METRIC_DELIVER_HOST) or a negative DROP_*. */
static __always_inline int fabric_host_reply(struct __sk_buff *skb,
					     const struct datapath_config *cfg,
					     struct ethhdr *eth, const struct iphdr *iph,
					     const void *l4, const void *data_end, __u8 hook)
{
	struct bpf_fib_lookup p;

	if (ct_routed_daddr(skb, iph, l4, data_end) == iph->daddr ||
	    host_answer_dev(skb, cfg, iph, l4, data_end, &p) != cfg->overlay_ifindex)
		return TC_ACT_OK;
	return deliver_host(skb, cfg, eth, hook);
}

/* Fabric ingress: the site fabric hands this node a plain IPv4 packet on the underlay
 * for a local pod, from a remote overlay source (another node of the site decapsulated
 * it and delivered it by fabric). Strict rp_filter would drop it on the underlay (the
 * route back to the source is into isthmus0), so it is delivered as decapsulated
 * packets are: through isthmus0 into the stack when stack_sees says so, else
 * straight to the pod. Only a packet for a destination in fabric_prefixes, from a
 * source in routes that the node does not route back out of the underlay
 * (answer_leaves_by_ingress), arriving from the site router (from_site_router), whose
 * FIB next hop is a pod interface, qualifies. Returns TC_ACT_REDIRECT, TC_ACT_OK for everything else (untouched; also
 * for an expiring TTL, so the stack answers), or a negative DROP_*. Counts
 * METRIC_FABRIC_INGRESS. The caller has made the IPv4 header linear. */
static __always_inline int fabric_ingress(struct __sk_buff *skb,
					  const struct datapath_config *cfg, __u8 hook)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct cursor c = { .pos = data, .end = data_end };
	const struct route_value *rt;
	struct bpf_fib_lookup p;
	struct ethhdr *eth;
	struct iphdr *iph;
	int rc;

	if (parse_eth(&c, &eth) != ETH_P_IP)
		return TC_ACT_OK;
	if (parse_ipv4(&c, &iph) < 0)
		return TC_ACT_OK;
	/* Cheapest tests first: most underlay traffic is for this node itself. */
	if (iph->daddr == cfg->underlay_ip || !is_fabric_dest(iph->daddr))
		return TC_ACT_OK;
	rt = route_lookup(iph->saddr);
	if (!rt)
		return TC_ACT_OK;
	/* For this host's tunnel address, the answer to a flow the host translated: its
	 * request was routed before the translation gave it this source (kube-proxy's
	 * MASQUERADE of a NodePort's forwarded flow, out of isthmus0), and goes back the
	 * way the untranslated address routes (fabric_host_reply). */
	if (cfg->tunnel_ip && iph->daddr == cfg->tunnel_ip) {
		int ret = fabric_host_reply(skb, cfg, eth, iph, c.pos, data_end, hook);

		if (ret != TC_ACT_OK)
			return ret;
	}
	/* A source this node reaches over the fabric (ROUTE_F_VIA_FABRIC) answers over
	 * it too: the stack takes the packet on the underlay, where it routes that source,
	 * marked, so that no other CNI's MASQUERADE rewrites it on the way to the pod. */
	if (rt->flags & ROUTE_F_VIA_FABRIC) {
		skb->mark |= OVERLAY_MARK;
		return TC_ACT_OK;
	}
	if (answer_leaves_by_ingress(skb, iph))
		return TC_ACT_OK;
	if (!from_site_router(skb, cfg, eth, rt))
		return TC_ACT_OK;
	rc = fib_lookup_v4(skb, &p, iph->saddr, iph->daddr, iph->tos, iph->protocol,
			   skb->ifindex, 0);
	if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) ||
	    !bpf_map_lookup_elem(&pod_ifaces, &p.ifindex) || iph->ttl <= 1)
		return TC_ACT_OK;
	if (stack_sees(skb, iph, c.pos, data_end, hook))
		return deliver_to_stack(skb, cfg, eth, OVERLAY_MARK, METRIC_FABRIC_INGRESS, hook);
	ipv4_decrease_ttl(iph);
	rc = redirect_nexthop(eth, &p, rc, pod_iface_has_peer(p.ifindex));
	if (rc < 0)
		return rc;
	metrics_count(METRIC_FABRIC_INGRESS, hook, skb->len);
	trace_tc(skb, cfg, METRIC_FABRIC_INGRESS, hook, 0, p.ifindex);
	return rc;
}
