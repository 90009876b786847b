/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* GENEVE encapsulation of an inner IPv4 frame toward a peer, and same-node pod delivery. */
#pragma once

#include "common.h"
#include "maps.h"
#include "route.h"
#include "metrics.h"
#include "parse.h"
#include "csum.h"
#include "hash.h"
#include "nexthop.h"
#include "geneve.h"
#include "fib.h"
#include "icmp.h"
#include "tcp.h"
#include "nat.h"
#include "podguard.h"
#include "wireguard.h"

#define ENCAP_FLAGS	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | \
			 BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH | \
			 BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN))
#define ENCAP6_FLAGS	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | \
			 BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH | \
			 BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN))

#ifndef EALREADY
#define EALREADY 114
#endif

/* Makes room for the outer headers after the MAC header. Returns 0 or a negative
 * errno. A packet this node decapsulated and its stack now forwards back into the
 * tunnel (a NodePort dialled through the tunnel whose backend is remote) keeps
 * skb->encapsulation from the pop (this kernel has no BPF_F_ADJ_ROOM_DECAP_L4_UDP),
 * and the encap flags refuse it with -EALREADY. Without GSO the same room made
 * without them gives the same frame: the flags only prepare segmentation. A GSO
 * packet in that state (one that crossed a veth from the node that encapsulated
 * it, whole) stays refused. */
static __always_inline int encap_room(struct __sk_buff *skb, __u32 len, __u64 flags)
{
	int ret = bpf_skb_adjust_room(skb, len, BPF_ADJ_ROOM_MAC, flags);

	if (ret == -EALREADY && !skb->gso_size)
		ret = bpf_skb_adjust_room(skb, len, BPF_ADJ_ROOM_MAC, 0);
	return ret;
}

/* Writes the outer UDP header udp (checksum zero: RFC 8926 section 3.3 over IPv4; over
 * IPv6 docs/architecture.md, "IPv6 underlay", says why) and the GENEVE header gh of a
 * frame for the inner frame behind them, udp_len bytes from udp on. */
static __always_inline void geneve_write(const struct datapath_config *cfg, struct udphdr *udp,
					 struct genevehdr *gh, __u16 sport, __u32 udp_len)
{
	udp->source = bpf_htons(sport);
	udp->dest = bpf_htons(GENEVE_PORT);
	udp->len = bpf_htons(udp_len);
	udp->check = 0;
	*(__u16 *)gh = 0;	/* version 0, no options, O = C = 0 */
	gh->proto_type = bpf_htons(ETH_P_TEB);
	*(__be32 *)gh->vni = geneve_vni_word(cfg->vni);
}

/* encap_push for a peer on the IPv6 underlay (GENEVE_PATH_UNDERLAY6): outer IPv6 from
 * config.underlay_ip6 to the peer's underlay6, traffic class tos, the flow label from
 * the inner flow's hash (RFC 6438: the underlay's ECMP spreads flows as the outer
 * source port does), hop limit OUTER_TTL; sent toward the FIB's next hop. Returns
 * TC_ACT_REDIRECT or a negative DROP_*. */
static __always_inline int encap_push6(struct __sk_buff *skb, const struct datapath_config *cfg,
				       __be32 peer, __u32 hash, __u8 tos, int metric, __u8 hook,
				       __u32 group)
{
	const struct peer_value *pv = bpf_map_lookup_elem(&peers, &peer);
	struct ethhdr *eth, *ieth;
	struct ip6_hdr *oip6;
	struct udphdr *oudp;
	struct genevehdr *gh;
	struct bpf_fib_lookup p;
	void *data_end;
	int rc;

	if (!pv)
		return DROP_NEXTHOP_NOT_PEER;
	if (encap_room(skb, ENCAP6_OVERHEAD, ENCAP6_FLAGS))
		return DROP_ENCAP_FAILED;
	eth = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	oip6 = (void *)(eth + 1);
	oudp = (void *)(oip6 + 1);
	gh = (void *)(oudp + 1);
	ieth = (void *)(gh + 1);
	if ((void *)(ieth + 1) > data_end)
		return DROP_ENCAP_FAILED;
	__builtin_memcpy(ieth, eth, ETH_HLEN);
	eth->h_proto = bpf_htons(ETH_P_IPV6);

	oip6->vtc_flow = bpf_htonl(6U << 28 | (__u32)tos << 20 | (hash & 0xfffff));
	oip6->payload_len = bpf_htons(skb->len - ETH_HLEN - IPV6_HLEN);
	oip6->nexthdr = IPPROTO_UDP;
	oip6->hop_limit = OUTER_TTL;
	__builtin_memcpy(oip6->saddr, cfg->underlay_ip6, 16);
	__builtin_memcpy(oip6->daddr, pv->underlay6, 16);
	geneve_write(cfg, oudp, gh, flow_sport_of(hash), skb->len - ETH_HLEN - IPV6_HLEN);

	fib_params_v6(&p, cfg->underlay_ip6, pv->underlay6, IPPROTO_UDP, skb->ifindex);
	rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
	return send_looked_up(skb, cfg, eth, &p, rc, peer, metric, hook, group);
}

/* Pushes outer IPv4/UDP/GENEVE/inner Ethernet in front of the inner packet (either
 * family: the inner Ethernet header carries its EtherType) and sends the frame to peer
 * on path (geneve_path; over the IPv6 underlay encap_push6 does), with the outer UDP
 * source port from the inner flow's hash (flow_sport_of) and the inner packet's DSCP
 * and ECN tos. Returns TC_ACT_REDIRECT or a negative DROP_*. Counts metric, with
 * group (0 for none) in the trace. */
static __always_inline int encap_push(struct __sk_buff *skb, const struct datapath_config *cfg,
				      __be32 peer, int path, __u32 hash, __u8 tos, int metric,
				      __u8 hook, __u32 group)
{
	void *data, *data_end;
	struct ethhdr *eth, *ieth;
	struct iphdr *oip, ip = {};
	struct udphdr *oudp;
	struct genevehdr *gh;

	if (path == GENEVE_PATH_UNDERLAY6)
		return encap_push6(skb, cfg, peer, hash, tos, metric, hook, group);
	if (encap_room(skb, ENCAP_OVERHEAD, ENCAP_FLAGS))
		return DROP_ENCAP_FAILED;

	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	oip = data + ETH_HLEN;
	oudp = (void *)(oip + 1);
	gh = (void *)(oudp + 1);
	ieth = (void *)(gh + 1);
	if ((void *)(ieth + 1) > data_end)
		return DROP_ENCAP_FAILED;

	/* The inner frame keeps the original Ethernet header; the outer one is rewritten
	 * after the FIB lookup. */
	__builtin_memcpy(ieth, eth, ETH_HLEN);
	eth->h_proto = bpf_htons(ETH_P_IP);

	ip.version = 4;
	ip.ihl = 5;
	ip.tos = tos;
	ip.tot_len = bpf_htons(skb->len - ETH_HLEN);
	ip.frag_off = bpf_htons(IP_DF);
	ip.ttl = OUTER_TTL;
	ip.protocol = IPPROTO_UDP;
	ip.saddr = geneve_outer_src(cfg, path);
	ip.daddr = peer;
	ip.check = ipv4_hdr_csum(&ip);
	__builtin_memcpy(oip, &ip, sizeof(ip));

	geneve_write(cfg, oudp, gh, flow_sport_of(hash), skb->len - ETH_HLEN - sizeof(struct iphdr));

	if (path == GENEVE_PATH_WIREGUARD)
		return send_to_wireguard(skb, cfg, peer, metric, hook, group);
	return send_to_peer(skb, cfg, eth, ip.saddr, peer, metric, hook, group);
}

/* Bytes after the IPv4 header the encap and local-delivery paths read: a whole TCP
 * header without options (stack_sees reads its flags, sequence and acknowledgement
 * numbers; flow_hash and the pod guard, the ports). */
#define ENCAP_PULL_L4	20

/* Encapsulates the inner IPv4 packet iph (encap_push) and redirects it to the underlay
 * next hop of the route's peer: rt->peer, or the member of
 * its next-hop group the flow hashes to (DROP_NO_NEXTHOP if none is live); for an
 * encrypted peer, from the tunnel address into WireGuard (lib/wireguard.h, and its
 * drops when it cannot). forward
 * says whether this hop forwards the inner packet (decrement its TTL; answer DF
 * packets too large for the tunnel with ICMP frag needed). Clamps the MSS of TCP SYNs to the tunnel MTU.
 * Returns TC_ACT_REDIRECT or a negative DROP_*. Counts METRIC_ENCAP (or
 * METRIC_FRAG_NEEDED_SENT for the ICMP reply). */
static __always_inline int encap_geneve(struct __sk_buff *skb, const struct datapath_config *cfg,
					const struct route_value *rt, struct iphdr *iph,
					void *l4, int forward, __u8 hook)
{
	__u32 hash;
	__be32 peer;
	__u8 tos;
	int path, rc;

	/* One hash per packet: it picks the group member and the outer source port. */
	hash = flow_hash(iph, l4, (void *)(long)skb->data_end);
	peer = nexthop_select(rt, hash);
	if (unlikely(!peer))
		return DROP_NO_NEXTHOP;
	path = geneve_path(cfg, peer);
	if (unlikely(path < 0))
		return path;
	/* As a router would: the sender hears where its packet died (traceroute). */
	if (forward && iph->ttl <= 1) {
		rc = icmp4_time_exceeded(skb, cfg->tunnel_ip ? cfg->tunnel_ip : cfg->underlay_ip,
					 hook);
		if (rc >= 0)
			trace_tc(skb, cfg, METRIC_TIME_EXCEEDED_SENT, hook, 0, 0);
		return rc;
	}
	/* Path MTU, in the order of the kernel's ip_forward (TTL, then size, so the quote
	 * shows the header as received). A GSO packet is checked by the segments it will
	 * be cut into, as ip_forward's skb_gso_validate_network_len does. A pod's DF packet
	 * gets ICMP frag needed; one without DF went to the stack to be fragmented
	 * (pod_egress_via_stack); on isthmus0 the host stack has already applied the
	 * device MTU. */
	if (unlikely(cfg->tunnel_mtu && ipv4_wire_len(skb, iph) > cfg->tunnel_mtu)) {
		if (forward && (iph->frag_off & bpf_htons(IP_DF))) {
			rc = icmp4_frag_needed(skb, cfg->tunnel_mtu, hook);
			if (rc >= 0)
				trace_tc(skb, cfg, METRIC_FRAG_NEEDED_SENT, hook, 0, 0);
			return rc;
		}
		return DROP_FRAG_NEEDED;
	}
	if (forward)
		ipv4_decrease_ttl(iph);
	tos = iph->tos;
	/* Last use of iph and l4: the clamp may rewrite the packet. */
	tcp_clamp_mss(skb, cfg->tunnel_mtu);
	return encap_push(skb, cfg, peer, path, hash, tos, METRIC_ENCAP, hook, rt->group);
}

/* encap_geneve for the IPv6 packet ip6h: on isthmus0 (overlay_egress), where the
 * stack has forwarded it (hop limit, the device MTU's Packet Too Big), or at
 * pod_ingress for a packet pod_egress6_direct let through, whose hop limit the caller
 * decremented. A packet (a GSO packet's segment) the tunnel cannot carry is
 * DROP_FRAG_NEEDED. Clamps the MSS of TCP SYNs to the tunnel MTU. Returns
 * TC_ACT_REDIRECT or a negative DROP_*. Counts METRIC_ENCAP. */
static __always_inline int encap_geneve6(struct __sk_buff *skb, const struct datapath_config *cfg,
					 const struct route_value *rt, const struct ip6_hdr *ip6h,
					 const void *l4, __u8 hook)
{
	__u32 hash = flow_hash6(ip6h, l4, (void *)(long)skb->data_end);
	__be32 peer = nexthop_select(rt, hash);
	__u8 tclass;
	int path;

	if (unlikely(!peer))
		return DROP_NO_NEXTHOP;
	path = geneve_path(cfg, peer);
	if (unlikely(path < 0))
		return path;
	if (unlikely(cfg->tunnel_mtu && ipv6_wire_len(skb, ip6h) > cfg->tunnel_mtu))
		return DROP_FRAG_NEEDED;
	tclass = ipv6_tclass(ip6h);
	/* Last use of ip6h: the clamp may rewrite the packet. */
	tcp_clamp_mss(skb, cfg->tunnel_mtu);
	return encap_push(skb, cfg, peer, path, hash, tclass, METRIC_ENCAP, hook,
			  rt->group);
}

/* Same-node delivery of a pod's packet that matched no route: if the FIB sends it out a
 * pod interface, the stack forwards it, marked (both halves of a same-node flow pass
 * here, so conntrack, Service NAT and FORWARD see all of it and no MASQUERADE
 * rewrites it). Returns TC_ACT_OK. */
static __always_inline int deliver_local_pod(struct __sk_buff *skb,
					     const struct datapath_config *cfg,
					     struct ethhdr *eth, struct iphdr *iph, __u8 hook)
{
	struct bpf_fib_lookup p;
	int rc;

	rc = fib_lookup_v4(skb, &p, iph->saddr, iph->daddr, iph->tos, iph->protocol,
			   skb->ifindex, 0);
	/* NO_NEIGH too: the stack resolves the pod's neighbour, and without the mark the
	 * first packet to a pod not yet in the neighbour table met another CNI's
	 * MASQUERADE. */
	if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) ||
	    !bpf_map_lookup_elem(&pod_ifaces, &p.ifindex))
		return TC_ACT_OK;
	metrics_count(METRIC_DELIVER_POD, hook, skb->len);
	trace_tc(skb, cfg, METRIC_DELIVER_POD, hook, 0, p.ifindex);
	return pod_to_stack(skb);
}

/* deliver_local_pod for the IPv6 packet ip6h: marked when the FIB sends it out a
 * pod interface, so no other CNI's IPv6 MASQUERADE rewrites it. Returns TC_ACT_OK. */
static __always_inline int deliver_local_pod6(struct __sk_buff *skb, const struct ip6_hdr *ip6h)
{
	const struct datapath_config *cfg = config_get();
	struct bpf_fib_lookup p;
	int rc;

	if (!cfg)
		return TC_ACT_OK;
	fib_params_v6(&p, ip6h->saddr, ip6h->daddr, ip6h->nexthdr, skb->ifindex);
	rc = bpf_fib_lookup(skb, &p, sizeof(p), BPF_FIB_LOOKUP_SKIP_NEIGH);
	if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_FRAG_NEEDED) ||
	    !bpf_map_lookup_elem(&pod_ifaces, &p.ifindex))
		return TC_ACT_OK;
	metrics_count(METRIC_DELIVER_POD, HOOK_POD_INGRESS, skb->len);
	trace_tc(skb, cfg, METRIC_DELIVER_POD, HOOK_POD_INGRESS, 0, p.ifindex);
	return pod_to_stack(skb);
}

/* Returns 1 if a pod's packet on route rt goes on through the stack, marked, to come
 * back to overlay_egress on isthmus0: it needs fragmenting, or the stack must see it
 * (stack_sees: it opens a flow, so the site's egress filters judge it and conntrack
 * holds the flow after it, or conntrack holds its flow), and the tunnel takes it. A packet the tunnel refuses
 * (an expiring TTL, too large, no live next hop) stays here, where encap_geneve or
 * the caller answers the pod with the ICMP error any hop of the tunnel sends. */
static __always_inline int pod_egress_via_stack(struct __sk_buff *skb,
						const struct datapath_config *cfg,
						const struct route_value *rt, const struct iphdr *iph,
						void *l4, void *data_end, __u8 hook)
{
	/* Refused but longer than the tunnel carries and free to be fragmented (no DF:
	 * a datagram a bridge's netfilter reassembled from the pod's own fragments,
	 * say): the stack fragments it on its way into isthmus0, as ip_forward does, and
	 * overlay_egress encapsulates each piece. An expiring TTL is answered here. */
	if (tunnel_refuses(skb, cfg, iph, 1))
		return iph->ttl > 1 && !(iph->frag_off & bpf_htons(IP_DF));
	if (!nexthop_select(rt, flow_hash(iph, l4, data_end)))
		return 0;
	return stack_sees(skb, iph, l4, data_end, hook);
}

/* Returns 1 if iph comes from this node's own addresses (tunnel or underlay): host
 * traffic on isthmus0, never translated. */
static __always_inline int host_source(const struct datapath_config *cfg, const struct iphdr *iph)
{
	return iph->saddr == cfg->tunnel_ip || iph->saddr == cfg->underlay_ip;
}

/* Returns 1 if daddr is an IPv6 destination that stays on its link and is never
 * tunnelled: link-local, unspecified or multicast (neighbour discovery, MLD, router
 * messages). The stack keeps them. */
static __always_inline int ipv6_never_tunnelled(const __be32 daddr[4])
{
	return ipv6_link_scoped(daddr) || ipv6_multicast(daddr);
}

/* Parses [eth][IPv6] after making the fixed header and ENCAP_PULL_L4 bytes after it
 * linear. Returns 0 with *ip6h and c (at the byte after the fixed header) set, or -1
 * for a frame that is not a well-formed IPv6 one. */
static __always_inline int pull_parse_ipv6(struct __sk_buff *skb, struct cursor *c,
					   struct ip6_hdr **ip6h)
{
	struct ethhdr *eth;

	if (pull_headers(skb, ETH_HLEN + sizeof(**ip6h) + ENCAP_PULL_L4))
		return -1;
	c->pos = (void *)(long)skb->data;
	c->end = (void *)(long)skb->data_end;
	if (parse_eth(c, &eth) != ETH_P_IPV6 || parse_ipv6(c, ip6h) < 0)
		return -1;
	return 0;
}

/* Returns 1 if a pod's IPv6 packet ip6h (its first next header at l4) on route rt
 * goes straight into the tunnel from pod_ingress: a route of the mesh (not over the
 * site fabric) with a live next hop, a hop limit left to decrement, a size the tunnel
 * carries (every segment of a GSO packet), and a packet the stack would do nothing
 * else with (stack_sees6, last: it renews the flow's conntrack entry). Everything else
 * goes through the stack, which forwards it into isthmus0 and answers what the tunnel
 * refuses (Time Exceeded, Packet Too Big) itself. */
static __always_inline int pod_egress6_direct(struct __sk_buff *skb,
					      const struct datapath_config *cfg,
					      const struct route_value *rt,
					      const struct ip6_hdr *ip6h, void *l4, void *data_end,
					      __u8 hook)
{
	if ((rt->flags & ROUTE_F_VIA_FABRIC) || ip6h->hop_limit <= 1 || !nexthop_any(rt))
		return 0;
	if (cfg->tunnel_mtu && ipv6_wire_len(skb, ip6h) > cfg->tunnel_mtu)
		return 0;
	return !stack_sees6(skb, ip6h, l4, data_end, hook);
}

/* pod_ingress for an IPv6 packet. Its source must be the pod's own
 * (pod_source_check6). One for a tunnel route (routes6) is encapsulated here when
 * pod_egress6_direct allows (the conntrack fast path), else goes on through the
 * stack, marked (pod_to_stack), which forwards it into isthmus0 (hop limit, Packet Too
 * Big with the tunnel's MTU, conntrack and the site's FORWARD policy), where
 * overlay_egress encapsulates it; one for a local pod goes through the stack too
 * (deliver_local_pod6); anything else is the stack's as it is, and link-scoped or
 * multicast destinations are never tunnelled. A header the parser refuses goes to the
 * stack, which drops it, as for IPv4. Returns TC_ACT_OK, TC_ACT_REDIRECT or a negative
 * DROP_*. */
static __always_inline int pod_ingress_ipv6(struct __sk_buff *skb, __u8 hook)
{
	const struct datapath_config *cfg = config_get();
	const struct route_value *rt;
	struct ip6_hdr *ip6h;
	struct cursor c;
	int ret;

	if (!cfg)
		return TC_ACT_OK;
	if (pull_parse_ipv6(skb, &c, &ip6h))
		return TC_ACT_OK;
	ret = pod_source_check6(skb, ip6h);
	if (ret < 0)
		return ret;
	ret = pod_geneve_check6(ip6h, c.pos, c.end);
	if (ret < 0)
		return ret;
	if (ipv6_never_tunnelled(ip6h->daddr))
		return TC_ACT_OK;
	rt = pod_route_lookup6(ip6h->daddr);
	if (!rt)
		return deliver_local_pod6(skb, ip6h);
	if (!pod_egress6_direct(skb, cfg, rt, ip6h, c.pos, c.end, hook))
		return pod_to_stack(skb);
	ip6h->hop_limit--;
	return encap_geneve6(skb, cfg, rt, ip6h, c.pos, hook);
}

/* overlay_egress for an IPv6 packet the stack routed into isthmus0: encapsulated on
 * its routes6 route, else DROP_NO_OVERLAY_ROUTE. Link-scoped and multicast ones (the
 * device's own neighbour discovery and MLD) pass to isthmus0p, where IPv6 is off and
 * they end. Returns a TC verdict or a negative DROP_*. */
static __always_inline int overlay_egress_ipv6(struct __sk_buff *skb,
					       const struct datapath_config *cfg, __u8 hook)
{
	const struct route_value *rt;
	struct ip6_hdr *ip6h;
	struct cursor c;

	if (pull_parse_ipv6(skb, &c, &ip6h))
		return TC_ACT_OK;
	if (ipv6_never_tunnelled(ip6h->daddr))
		return TC_ACT_OK;
	rt = route_lookup6(ip6h->daddr);
	if (!rt)
		return DROP_NO_OVERLAY_ROUTE;
	return encap_geneve6(skb, cfg, rt, ip6h, c.pos, hook);
}

/* The encapsulation hooks: parse, look up routes, encapsulate or deliver locally.
 * from_pod selects pod_ingress behaviour (forwarding hop, local delivery on a miss)
 * over overlay_egress (host traffic, a miss is a drop). Returns a TC verdict or a
 * negative DROP_*. */
static __always_inline int handle_encap(struct __sk_buff *skb, int from_pod, __u8 hook)
{
	const struct datapath_config *cfg;
	const struct route_value *rt;
	struct cursor c;
	struct ethhdr *eth;
	struct iphdr *iph;

	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if (from_pod)
			return pod_ingress_ipv6(skb, hook);
		cfg = config_get();
		return cfg ? overlay_egress_ipv6(skb, cfg, hook) : DROP_NO_CONFIG;
	}
	if (pull_ipv4_headers(skb, ENCAP_PULL_L4))
		return TC_ACT_OK;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	if (parse_eth(&c, &eth) != ETH_P_IP)
		return TC_ACT_OK;
	if (parse_ipv4(&c, &iph) < 0)
		return TC_ACT_OK;

	cfg = config_get();
	if (!cfg)
		return from_pod ? TC_ACT_OK : DROP_NO_CONFIG;
	if (from_pod) {
		int guard = pod_source_check(skb, cfg, iph, c.pos, c.end);

		if (guard < 0)
			return guard;
	}

	rt = from_pod ? pod_route_lookup(iph->daddr) : route_lookup(iph->daddr);
	if (rt) {
		int nat;

		/* No live next hop: refused here, where the pod can be answered
		 * (tc_drop_no_path); past the stack, fabric_egress could only drop it. */
		if (from_pod && !nexthop_any(rt))
			return DROP_NO_NEXTHOP;
		/* A declared pod's packet for the gateways of its own site: through the
		 * stack to the underlay, where its answer arrives (fabric_egress). */
		if (from_pod && (rt->flags & ROUTE_F_VIA_FABRIC) && is_fabric_source(iph->saddr))
			return pod_to_stack(skb);
		if (from_pod && pod_egress_via_stack(skb, cfg, rt, iph, c.pos, c.end, hook))
			return pod_to_stack(skb);
		/* Return-path SNAT (lib/nat.h); its rewrite invalidates the pointers. On
		 * isthmus0 too: a pod of an interface isthmus does not own arrives here
		 * through the host stack with its own source, which no peer routes back.
		 * The host's own addresses are exempt. */
		nat = (from_pod || !host_source(cfg, iph)) ? snat_egress(skb, cfg, iph, from_pod, hook) : 0;

		if (nat < 0)
			return nat;
		if (nat > 0) {
			c.pos = (void *)(long)skb->data;
			c.end = (void *)(long)skb->data_end;
			if (parse_eth(&c, &eth) != ETH_P_IP || parse_ipv4(&c, &iph) < 0)
				return DROP_SNAT_REWRITE;
		}
		return encap_geneve(skb, cfg, rt, iph, c.pos, from_pod, hook);
	}
	if (!from_pod)
		return DROP_NO_OVERLAY_ROUTE;
	return deliver_local_pod(skb, cfg, eth, iph, hook);
}

/* Returns 1 if packet iph, leaving by the underlay from the underlay address, was
 * forwarded (it entered the node on another device: a pod's packet the stack
 * translated on its way out) and is no GENEVE frame of this node's. */
static __always_inline int forwarded_translated(const struct __sk_buff *skb,
						 const struct iphdr *iph, const void *l4,
						 const void *data_end)
{
	const struct udphdr *udp = l4;

	if (!skb->ingress_ifindex)
		return 0;	/* the host's own */
	if (iph->protocol != IPPROTO_UDP)
		return 1;
	return (void *)(udp + 1) <= data_end && udp->dest != bpf_htons(GENEVE_PORT);
}

/* Fabric egress, on a node of a site whose fabric carries its declared pods' replies
 * (CFG_F_FABRIC_EGRESS): the stack routes a declared pod's packet (a source in
 * fabric_prefixes) for a route to gateways of this node's own site
 * (ROUTE_F_VIA_FABRIC) to the underlay device, through the agent's fabric table,
 * because that is where the answer arrives: the gateway hands it to the site fabric.
 * Leaving that device it is encapsulated to the gateway the route's group picks, since
 * a routed fabric forwards by destination and would not take it to the gateway plain.
 * The stack forwarded it already (TTL, the route's MTU), so this is no forwarding hop.
 * Returns TC_ACT_REDIRECT, TC_ACT_OK (not fabric egress: untouched) or a negative
 * DROP_*. Counts METRIC_ENCAP under hook. */
static __always_inline int fabric_egress(struct __sk_buff *skb, __u8 hook)
{
	const struct datapath_config *cfg = config_get();
	const struct route_value *rt;
	struct ethhdr *eth;
	struct iphdr *iph;
	struct cursor c;

	if (!cfg || likely(!(cfg->flags & CFG_F_FABRIC_EGRESS)))
		return TC_ACT_OK;
	if (pull_ipv4_headers(skb, ENCAP_PULL_L4))
		return TC_ACT_OK;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	if (parse_eth(&c, &eth) != ETH_P_IP || parse_ipv4(&c, &iph) < 0)
		return TC_ACT_OK;
	/* The host's own packets (every GENEVE frame, on its second pass here after
	 * encap_geneve's redirect) are never a pod's, even where a declared block
	 * holds the underlay address. But a declared pod's packet the stack forwarded
	 * here and then translated to the underlay address (kube-proxy's MASQUERADE of
	 * a NodePort flow the pod opened: routed by the pod's fabric rule before the
	 * translation) is still one: encapsulated as the pod's own, or a routed fabric
	 * drops it, and its answer comes back through the tunnel. */
	if (iph->saddr == cfg->underlay_ip && !forwarded_translated(skb, iph, c.pos, c.end))
		return TC_ACT_OK;
	rt = route_lookup(iph->daddr);
	if (!rt || !(rt->flags & ROUTE_F_VIA_FABRIC) ||
	    (!is_fabric_source(iph->saddr) && iph->saddr != cfg->underlay_ip))
		return TC_ACT_OK;
	return encap_geneve(skb, cfg, rt, iph, c.pos, 0, hook);
}
