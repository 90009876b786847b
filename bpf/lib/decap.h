/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* GENEVE decapsulation: recognising our frames on the underlay and popping them (TC, XDP). */
#pragma once

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "geneve.h"
#include "fib.h"
#include "tcp.h"
#include "transit.h"
#include "csum.h"
#include "health.h"

/* Bytes of an inner L4 header of protocol proto that delivery reads (stack_sees,
 * reverse SNAT, the MSS clamp): all 20 of a TCP header without options, else 8 (UDP, an
 * ICMP header). A packet shorter than that pulls what it has. */
static __always_inline __u32 inner_l4_pull_len(__u8 proto)
{
	return proto == IPPROTO_TCP ? sizeof(struct tcphdr) : 8;
}

/* Returns the bytes of an inner IP packet that delivery reads, from its first ten: an
 * IPv4 header with its options or the IPv6 fixed header (whose next header is byte
 * 6), and inner_l4_pull_len of what follows. */
static __always_inline __u32 inner_ip_pull_len(const __u8 inner[10])
{
	if ((inner[0] >> 4) == 6)
		return sizeof(struct ip6_hdr) + inner_l4_pull_len(inner[6]);
	return (inner[0] & 0xf) * 4 + inner_l4_pull_len(inner[9]);
}

/* Makes linear what decapsulation and delivery read: outer Ethernet, IPv4 with options,
 * UDP, GENEVE with its options, inner Ethernet, inner IPv4 with its options and the
 * first bytes of the inner L4 header (inner_l4_pull_len), with the lengths read from the
 * packet so a frame whose headers are linear already (the common case) pulls nothing.
 * A driver that leaves only the headers GRO parsed (outer Ethernet, IPv4 and UDP: no
 * GRO handler knows GENEVE without a geneve device) in the linear part would otherwise
 * hand delivery an inner packet whose IPv4 options or TCP flags it cannot read.
 * Returns 0, or -1 if the pull failed. */
static __always_inline int pull_geneve_headers(struct __sk_buff *skb)
{
	__u32 off = ETH_HLEN;
	__u8 b, inner[10];	/* the inner IP header up to the IPv4 protocol */

	if (bpf_skb_load_bytes(skb, off, &b, 1))
		return 0;	/* shorter than that: the parsers reject it */
	off += (b & 0xf) * 4 + sizeof(struct udphdr);
	/* The first GENEVE byte is version (2 bits) and option length (6 bits, words). */
	if (!bpf_skb_load_bytes(skb, off, &b, 1))
		off += (b & 0x3f) * 4;
	off += GENEVE_HLEN + ETH_HLEN;
	if (bpf_skb_load_bytes(skb, off, inner, sizeof(inner)))
		return pull_headers(skb, off + sizeof(struct iphdr));
	return pull_headers(skb, off + inner_ip_pull_len(inner));
}

/* Makes the IP header (IPv4 with options, the IPv6 fixed header) and the first
 * inner_l4_pull_len bytes of the L4 header of a frame underlay_xdp popped linear, as pull_geneve_headers does for one
 * TC pops. An XDP program without frags support sees the whole frame linear, and the
 * skb built from it after XDP_PASS keeps it so (GRO only appends later segments), so
 * this pulls nothing in practice: one load and a compare guard against a driver that
 * does otherwise. Returns 0, or -1 if the pull failed. */
static __always_inline int pull_xdp_popped_headers(struct __sk_buff *skb)
{
	__u8 inner[10];

	if (bpf_skb_load_bytes(skb, ETH_HLEN, inner, sizeof(inner)))
		return 0;	/* shorter than that: the parsers reject it */
	return pull_headers(skb, ETH_HLEN + inner_ip_pull_len(inner));
}

#define DECAP_FLAGS	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_DECAP_L3_IPV4)
#define DECAP6_FLAGS	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_DECAP_L3_IPV6)

/* underlay_classify for an outer IPv6 header at c: GENEVE (UDP right after the fixed
 * header, to port 6081) addressed to config.underlay_ip6. info->peer is the source's
 * handle in peers6, 0 when it has none (geneve_validate then refuses it:
 * DROP_UNKNOWN_PEER). Extension headers, a fragment header among them, make it not
 * ours: our peers send neither, and the stack keeps what it is. */
static __always_inline int underlay_classify6(struct cursor *c, const struct datapath_config *cfg,
					      struct decap_info *info)
{
	const struct peer6_value *h;
	struct ip6_hdr *ip6h;
	struct udphdr *udp;
	struct peer6_key k;

	if (info->from_wireguard || ipv6_unset(cfg->underlay_ip6))
		return 0;
	if (parse_ipv6(c, &ip6h) < 0)
		return DROP_INVALID_PACKET;
	if (ip6h->nexthdr != IPPROTO_UDP || ip6h->daddr[0] != cfg->underlay_ip6[0] ||
	    ip6h->daddr[1] != cfg->underlay_ip6[1] || ip6h->daddr[2] != cfg->underlay_ip6[2] ||
	    ip6h->daddr[3] != cfg->underlay_ip6[3])
		return 0;
	if (parse_udp(c, &udp) < 0)
		return DROP_INVALID_PACKET;
	if (udp->dest != bpf_htons(GENEVE_PORT))
		return 0;
	__builtin_memcpy(k.addr, ip6h->saddr, sizeof(k.addr));
	h = bpf_map_lookup_elem(&peers6, &k);
	info->peer = h ? h->handle : 0;
	info->outer_tos = ipv6_tclass(ip6h);
	info->outer_hlen = IPV6_HLEN;
	info->outer6 = 1;
	return 1;
}

/* Parses outer Ethernet, IPv4 (or IPv6: underlay_classify6) and UDP at c. Returns 1
 * with info->peer and info->outer_hlen set and c at the GENEVE header if the frame is
 * GENEVE addressed to this node (its underlay address; out of the WireGuard device,
 * info->from_wireguard, its tunnel address), 0 if it is not ours (pass it on), or a
 * negative DROP_* for a packet too malformed to tell. */
static __always_inline int underlay_classify(struct cursor *c, const struct datapath_config *cfg,
					     struct decap_info *info)
{
	struct ethhdr *eth;
	struct iphdr *iph;
	struct udphdr *udp;
	int proto;

	switch (parse_eth(c, &eth)) {
	case ETH_P_IP:
		break;
	case ETH_P_IPV6:
		return underlay_classify6(c, cfg, info);
	default:
		return 0;
	}
	proto = parse_ipv4(c, &iph);
	if (proto < 0)
		return DROP_INVALID_PACKET;
	if (iph->daddr != (info->from_wireguard ? cfg->tunnel_ip : cfg->underlay_ip) ||
	    proto != IPPROTO_UDP)
		return 0;
	/* A later fragment has no ports to tell: the stack's reassembly keeps it and times
	 * it out. A first one that is GENEVE is ours to count: reassembled, it would reach
	 * a port nobody listens on and vanish (our peers send DF, never fragments). */
	if (iph->frag_off & bpf_htons(IP_OFFSET))
		return 0;
	if (parse_udp(c, &udp) < 0)
		return DROP_INVALID_PACKET;
	if (udp->dest != bpf_htons(GENEVE_PORT))
		return 0;
	if (ipv4_is_fragment(iph))
		return DROP_OUTER_FRAGMENT;
	info->peer = iph->saddr;
	info->outer_tos = iph->tos;
	/* The real length: the pop must remove the options that validation skipped, or
	 * it would land inside them, on bytes nobody validated. */
	info->outer_hlen = iph->ihl * 4;
	return 1;
}

#define INET_ECN_MASK		0x03
#define INET_ECN_CE		0x03

/* decap_ecn's answer to an outer CE for the inner IPv6 packet ip6h, as for IPv4: its
 * traffic class has no checksum to patch. */
static __always_inline int decap_ecn6(struct ip6_hdr *ip6h)
{
	__u32 w = bpf_ntohl(ip6h->vtc_flow);
	__u8 ecn = (w >> 20) & INET_ECN_MASK;

	if (ecn == INET_ECN_CE)
		return 0;
	if (!ecn)
		return DROP_ECN_NOT_ECT;
	ip6h->vtc_flow = bpf_htonl(w | (INET_ECN_CE << 20));
	return 0;
}

/* RFC 6040 decapsulation (normal mode), as the kernel's INET_ECN_decapsulate: outer CE
 * on an ECN-capable inner packet marks it CE, with its header checksum patched; outer
 * CE on a Not-ECT one is dropped, because the congestion signal could not reach the
 * receiver. Any other outer codepoint leaves the inner header alone. Returns 0 or
 * DROP_ECN_NOT_ECT. Call it before the pop, while info->inner points into the packet. */
static __always_inline int decap_ecn(const struct decap_info *info)
{
	struct iphdr *iip = info->inner;
	__be16 from, to;

	if ((info->outer_tos & INET_ECN_MASK) != INET_ECN_CE)
		return 0;
	if (info->inner6)
		return decap_ecn6(info->inner6);
	if (!iip ||
	    (iip->tos & INET_ECN_MASK) == INET_ECN_CE)
		return 0;
	if (!(iip->tos & INET_ECN_MASK))
		return DROP_ECN_NOT_ECT;
	from = *(__be16 *)iip;		/* version, ihl and tos */
	iip->tos |= INET_ECN_CE;
	to = *(__be16 *)iip;
	iip->check = csum_replace16(iip->check, from, to);
	return 0;
}

/* Bytes popped for a validated frame: outer IPv4 with its options, UDP, GENEVE with
 * its options and the inner Ethernet header (the outer Ethernet header stays). */
static __always_inline __u32 decap_len(const struct decap_info *info)
{
	return info->outer_hlen + sizeof(struct udphdr) + GENEVE_HLEN + info->optlen + ETH_HLEN;
}

/* Returns 1 if the inner packet of a validated frame expires on its way to a local
 * destination: inner TTL 1 or 0, not for this host (tunnel_host_dest: no routing hop),
 * and the FIB routes it to a pod interface of this node or it is for the site fabric,
 * the deliveries that forward it. The FIB lookup runs only for such a TTL. */
static __always_inline int decap_expires(struct __sk_buff *skb, const struct datapath_config *cfg,
					 const struct decap_info *info)
{
	const struct iphdr *iip = info->inner;
	struct bpf_fib_lookup p;
	int rc;

	if (likely(iip->ttl > 1) || tunnel_host_dest(cfg, info->daddr))
		return 0;
	if (is_fabric_dest(info->daddr))
		return 1;
	rc = fib_lookup_v4(skb, &p, iip->saddr, iip->daddr, iip->tos, iip->protocol,
			   skb->ifindex, 0);
	return (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH) &&
	       bpf_map_lookup_elem(&pod_ifaces, &p.ifindex);
}

/* Answers a validated frame whose inner packet expires here (decap_expires) with ICMP
 * time exceeded, as transit does: back through the tunnel to the peer that sent it,
 * before anything is popped (a popped skb cannot be encapsulated again), so traceroute
 * across sites shows the receiving node as a hop. Returns TC_ACT_REDIRECT or a
 * negative DROP_*. Counts METRIC_TIME_EXCEEDED_SENT. */
static __always_inline int decap_time_exceeded(struct __sk_buff *skb,
					       const struct datapath_config *cfg, __u8 hook)
{
	struct transit_hdrs h;
	int rc = transit_parse(skb, &h);

	if (rc < 0)
		return rc;
	return transit_time_exceeded(skb, cfg, &h, hook);
}

/* tc_decap of a validated frame whose inner packet is IPv6: on a gateway, over the
 * IPv4 underlay, transit (transit_forward6) when routes6 says so; else popped and
 * delivered (deliver_decapped6). No health probe or expiry here: delivery goes through
 * the stack, which forwards it as a router does. Returns TC_ACT_REDIRECT or a negative
 * DROP_*. */
static __always_inline int tc_decap6(struct __sk_buff *skb, const struct datapath_config *cfg,
				     const struct decap_info *info, __u8 hook)
{
	const struct route_value *rt;
	struct ethhdr *eth;
	int ret;

	if (!info->outer6) {
		rt = transit_route6(cfg, info->inner6->daddr);
		if (rt)
			return transit_forward6(skb, cfg, rt, hook);
	}
	ret = decap_ecn(info);
	if (ret < 0)
		return ret;
	/* DECAP_L3_IPV6 sets skb->protocol; the outer Ethernet header, which stays, must
	 * say so too. */
	if (bpf_skb_adjust_room(skb, -(__s32)decap_len(info), BPF_ADJ_ROOM_MAC, DECAP6_FLAGS))
		return DROP_DECAP_FAILED;
	eth = (void *)(long)skb->data;
	if ((void *)(eth + 1) > (void *)(long)skb->data_end)
		return DROP_DECAP_FAILED;
	eth->h_proto = bpf_htons(ETH_P_IPV6);
	metrics_count(METRIC_DECAP, hook, skb->len);
	trace_tc(skb, cfg, METRIC_DECAP, hook, info->peer, 0);
	tcp_clamp_mss(skb, cfg->tunnel_mtu);	/* the sender's side may not clamp */
	return deliver_decapped6(skb, cfg, hook);
}

/* TC decapsulation: validate, then forward (transit on a gateway, lib/transit.h) or
 * pop and deliver. from_wireguard: the frame came out of the WireGuard device (with an
 * Ethernet header pushed in front). Returns TC_ACT_OK for frames that are not ours,
 * TC_ACT_REDIRECT when forwarded or delivered, or a negative DROP_*. */
static __always_inline int tc_decap(struct __sk_buff *skb, const struct datapath_config *cfg,
				    int from_wireguard, __u8 hook)
{
	const struct route_value *rt;
	struct decap_info info = { .from_wireguard = from_wireguard };
	struct cursor c;
	int ret;

	if (pull_geneve_headers(skb))
		return TC_ACT_OK;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	ret = underlay_classify(&c, cfg, &info);
	if (ret <= 0)
		return ret;
	ret = geneve_validate(&c, cfg, &info);
	if (ret < 0)
		return ret;
	if (info.inner6)
		return tc_decap6(skb, cfg, &info, hook);
	/* Health probes, transit and the answer to an expiring TTL rewrite or answer
	 * an outer IPv4 header; over the IPv6 underlay the frame is delivered: to a pod
	 * through the stack, whose forwarding answers an expiring TTL, and toward the
	 * fabric not at all (DROP_TTL_EXCEEDED, deliver_decapped). */
	if (!info.outer6) {
		if (health_candidate(cfg, &info)) {
			ret = health_answer(skb, cfg, &info, hook);
			if (ret)
				return ret;
		}
		rt = transit_route(cfg, info.daddr);
		if (rt)
			return transit_forward(skb, cfg, rt, hook);
		if (unlikely(decap_expires(skb, cfg, &info)))
			return decap_time_exceeded(skb, cfg, hook);
	}
	ret = decap_ecn(&info);
	if (ret < 0)
		return ret;
	/* FIXED_GSO: gso_size of a tunnelled GSO packet is the inner MSS already. */
	if (bpf_skb_adjust_room(skb, -(__s32)decap_len(&info), BPF_ADJ_ROOM_MAC,
				DECAP_FLAGS))
		return DROP_DECAP_FAILED;
	if (info.outer6) {
		struct ethhdr *eth = (void *)(long)skb->data;

		/* The outer Ethernet header stays: it said IPv6. */
		if ((void *)(eth + 1) > (void *)(long)skb->data_end)
			return DROP_DECAP_FAILED;
		eth->h_proto = bpf_htons(ETH_P_IP);
	}
	metrics_count(METRIC_DECAP, hook, skb->len);
	trace_tc(skb, cfg, METRIC_DECAP, hook, info.peer, 0);
	tcp_clamp_mss(skb, cfg->tunnel_mtu);	/* the sender's side may not clamp */
	return deliver_decapped(skb, cfg, hook);
}

/* Decapsulation of what comes out of the WireGuard device (wireguard_ingress): GENEVE
 * from an encrypted peer, decrypted, as a bare IPv4 packet (a layer-3 device). An
 * Ethernet header is pushed in front (zero MACs: delivery writes its own), and the
 * frame is then validated, forwarded or delivered as one off the underlay, from the
 * tunnel address of a peer marked encrypted to this node's (tc_decap). Nothing else
 * comes out of isthmus' WireGuard device: anything that is not such GENEVE is
 * DROP_WIREGUARD_NOT_GENEVE, never passed to the stack. Returns TC_ACT_REDIRECT or a
 * negative DROP_*. */
static __always_inline int tc_wireguard_decap(struct __sk_buff *skb,
					      const struct datapath_config *cfg, __u8 hook)
{
	struct ethhdr *eth;
	int ret;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return DROP_WIREGUARD_NOT_GENEVE;
	if (bpf_skb_change_head(skb, ETH_HLEN, 0))
		return DROP_DECAP_FAILED;
	eth = (void *)(long)skb->data;
	if ((void *)(eth + 1) > (void *)(long)skb->data_end)
		return DROP_DECAP_FAILED;
	eth->h_proto = bpf_htons(ETH_P_IP);
	ret = tc_decap(skb, cfg, 1, hook);
	return ret == TC_ACT_OK ? DROP_WIREGUARD_NOT_GENEVE : ret;
}

/* Returns 1 if this node's underlay_xdp popped this frame (its decap_meta is in
 * front), and consumes the metadata. The kernel keeps it in front of the skb wherever
 * the stack or a redirect takes the frame next: through a veth into another node's
 * namespace (a lab, a kind cluster), where that node's underlay_ingress would take a
 * frame another node popped, and handed to the fabric, for its own. */
static __always_inline int tc_xdp_decapped(struct __sk_buff *skb)
{
	struct decap_meta *meta = (void *)(long)skb->data_meta;

	if ((void *)(meta + 1) > (void *)(long)skb->data)
		return 0;
	if (meta->magic != DECAP_META_MAGIC)
		return 0;
	meta->magic = 0;
	return 1;
}

/* XDP decapsulation: validate, pop to [outer Ethernet][inner IP], leave a decap_meta
 * for underlay_ingress. A frame that cannot carry metadata, that will transit, or whose
 * inner TTL may expire here is passed unpopped, for underlay_ingress to decapsulate or forward itself. Returns XDP_PASS or a negative DROP_*. */
static __always_inline int xdp_decap(struct xdp_md *ctx, const struct datapath_config *cfg,
				     __u8 hook)
{
	struct decap_info info = {};
	struct decap_meta *meta;
	struct ethhdr oeth, *eth;
	struct cursor c;
	int ret;

	c.pos = (void *)(long)ctx->data;
	c.end = (void *)(long)ctx->data_end;
	ret = underlay_classify(&c, cfg, &info);
	if (ret <= 0)
		return ret ? ret : XDP_PASS;
	ret = geneve_validate(&c, cfg, &info);
	if (ret < 0)
		return ret;
	/* An IPv6 one that will transit too. */
	if (info.inner6 && !info.outer6 && transit_route6(cfg, info.inner6->daddr))
		return XDP_PASS;
	if (info.inner && !info.outer6) {
		/* A frame that will transit stays whole, without metadata:
		 * underlay_ingress forwards it (a popped frame could not be
		 * encapsulated again, DESIGN.md). */
		if (transit_route(cfg, info.daddr))
			return XDP_PASS;
		/* So does one whose inner TTL expires here: underlay_ingress answers it. */
		if (unlikely(info.inner->ttl <= 1 && !tunnel_host_dest(cfg, info.daddr)))
			return XDP_PASS;
		/* Nor does a frame that may be a health probe: underlay_ingress answers it. */
		if (health_candidate(cfg, &info))
			return XDP_PASS;
	}
	ret = decap_ecn(&info);
	if (ret < 0)
		return ret;

	/* Reserve the metadata before popping. A popped frame without it would reach
	 * underlay_ingress as plain IPv4 on the underlay device, and the stack would
	 * route it there: strict rp_filter drops it uncounted (its source routes via
	 * isthmus0), netfilter sees it. Unpopped, underlay_ingress pops it as without
	 * XDP (a driver without metadata support, or no room left by the driver's). */
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*meta)))
		return XDP_PASS;
	eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return DROP_DECAP_FAILED;
	__builtin_memcpy(&oeth, eth, ETH_HLEN);
	/* Moves the metadata along with the start of the frame. */
	if (bpf_xdp_adjust_head(ctx, decap_len(&info)))
		return DROP_DECAP_FAILED;
	/* The inner Ethernet header now leads the frame: overwrite it with the outer one,
	 * whose destination is this device, so the stack and TC take the frame as ours. */
	eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return DROP_DECAP_FAILED;
	__builtin_memcpy(eth, &oeth, ETH_HLEN);
	eth->h_proto = info.inner6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);
	meta = (void *)(long)ctx->data_meta;
	if ((void *)(meta + 1) > (void *)eth)
		return DROP_DECAP_FAILED;
	meta->magic = DECAP_META_MAGIC;
	meta->peer = info.peer;
	metrics_count(METRIC_DECAP, hook, ctx->data_end - ctx->data);
	trace_xdp(ctx, cfg, METRIC_DECAP, hook, info.peer, 0);
	return XDP_PASS;
}
