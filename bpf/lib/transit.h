/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Gateway transit: GENEVE whose inner destination (IPv4 or IPv6) routes to another peer
 * goes on to it with its outer IPv4 header rewritten in place; nothing is popped or
 * pushed. */
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
#include "wireguard.h"

/* Returns the route a validated GENEVE frame for inner destination daddr transits by:
 * NULL unless this node is a gateway (CFG_F_TRANSIT) and route_lookup finds daddr, and
 * for a route to a peer on the IPv6 underlay (a handle, 0.0.0.0/8), which transit
 * cannot reach: it rewrites an outer IPv4 header in place. Such a frame is then
 * treated as on any node (delivered, or not local). On any other node this is the
 * flag test only. */
static __always_inline const struct route_value *
transit_route(const struct datapath_config *cfg, __be32 daddr)
{
	const struct route_value *rt;

	if (likely(!(cfg->flags & CFG_F_TRANSIT)))
		return NULL;
	rt = route_lookup(daddr);
	if (rt && !rt->group && !(((const __u8 *)&rt->peer)[0]))
		return NULL;
	return rt;
}

/* transit_route for an inner IPv6 destination (routes6). */
static __always_inline const struct route_value *
transit_route6(const struct datapath_config *cfg, const __be32 daddr[4])
{
	const struct route_value *rt;

	if (likely(!(cfg->flags & CFG_F_TRANSIT)))
		return NULL;
	rt = route_lookup6(daddr);
	if (rt && !rt->group && !(((const __u8 *)&rt->peer)[0]))
		return NULL;
	return rt;
}

/* The headers of a GENEVE frame that transit reads or rewrites. */
struct transit_hdrs {
	struct iphdr *oip;	/* outer IPv4 */
	struct udphdr *udp;	/* outer UDP */
	struct iphdr *iip;	/* inner IPv4 */
	void *l4;		/* just past the inner IPv4 header */
	__u32 udp_off;		/* offsets from the start of the frame */
	__u32 l4_off;
};

/* Walks a frame geneve_validate accepted (so its headers are linear) from the start to
 * the inner Ethernet header: sets *oip, *udp and *optlen (GENEVE option bytes) and
 * leaves c just past the inner Ethernet header. Returns the inner Ethernet type, or
 * DROP_INVALID_PACKET / DROP_GENEVE_TRUNCATED / DROP_INNER_INVALID if the headers are
 * not there after all. */
static __always_inline int transit_parse_outer(struct cursor *c, struct iphdr **oip,
					       struct udphdr **udp, __u32 *optlen)
{
	struct genevehdr *gh;
	struct ethhdr *eth;
	int type;

	if (parse_eth(c, &eth) != ETH_P_IP || parse_ipv4(c, oip) < 0 || parse_udp(c, udp) < 0)
		return DROP_INVALID_PACKET;
	gh = c->pos;
	if ((void *)(gh + 1) > c->end)
		return DROP_GENEVE_TRUNCATED;
	*optlen = gh->opt_len * 4;
	c->pos = (void *)(gh + 1) + *optlen;
	type = parse_eth(c, &eth);
	return type < 0 ? DROP_INNER_INVALID : type;
}

/* Finds the headers of a frame geneve_validate accepted (so they are linear). Returns 0,
 * or DROP_INVALID_PACKET / DROP_INNER_INVALID if they are not there after all. */
static __always_inline int transit_parse(struct __sk_buff *skb, struct transit_hdrs *h)
{
	struct cursor c = { .pos = (void *)(long)skb->data, .end = (void *)(long)skb->data_end };
	__u32 optlen;
	int type = transit_parse_outer(&c, &h->oip, &h->udp, &optlen);

	if (type < 0)
		return type;
	if (type != ETH_P_IP || parse_ipv4(&c, &h->iip) < 0)
		return DROP_INNER_INVALID;
	h->l4 = c.pos;
	h->udp_off = ETH_HLEN + h->oip->ihl * 4;
	h->l4_off = h->udp_off + sizeof(struct udphdr) + GENEVE_HLEN + optlen + ETH_HLEN +
		    h->iip->ihl * 4;
	return 0;
}

/* Returns the flow hash of the inner packet of h, the one encap_geneve computed when it
 * was encapsulated: the ports are read from the packet when they are not linear. */
static __always_inline __u32 transit_flow_hash(struct __sk_buff *skb,
					       const struct transit_hdrs *h)
{
	const __u32 *l4 = h->l4;
	__u32 ports = 0;

	if (!flow_has_ports(h->iip))
		return flow_hash_ports(h->iip, 0);
	if ((void *)(l4 + 1) <= (void *)(long)skb->data_end)
		ports = *l4;
	else if (bpf_skb_load_bytes(skb, h->l4_off, &ports, sizeof(ports)))
		ports = 0;	/* shorter than its ports: so was it for encap_geneve */
	return flow_hash_ports(h->iip, ports);
}

/* transit_hdrs of a frame whose inner packet is IPv6. */
struct transit_hdrs6 {
	struct iphdr *oip;	/* outer IPv4 */
	struct udphdr *udp;	/* outer UDP */
	struct ip6_hdr *iip6;	/* inner IPv6 */
	__u32 udp_off;		/* offsets from the start of the frame */
	__u32 iip_off;
};

/* transit_parse for an inner IPv6 packet. */
static __always_inline int transit_parse6(struct __sk_buff *skb, struct transit_hdrs6 *h)
{
	struct cursor c = { .pos = (void *)(long)skb->data, .end = (void *)(long)skb->data_end };
	__u32 optlen;
	int type = transit_parse_outer(&c, &h->oip, &h->udp, &optlen);

	if (type < 0)
		return type;
	if (type != ETH_P_IPV6 || parse_ipv6(&c, &h->iip6) < 0)
		return DROP_INNER_INVALID;
	h->udp_off = ETH_HLEN + h->oip->ihl * 4;
	h->iip_off = h->udp_off + sizeof(struct udphdr) + GENEVE_HLEN + optlen + ETH_HLEN;
	return 0;
}

/* transit_flow_hash for an inner IPv6 packet: flow_hash6, as encap_geneve6 computed
 * it. */
static __always_inline __u32 transit_flow_hash6(struct __sk_buff *skb,
						const struct transit_hdrs6 *h)
{
	const __u32 *l4 = (const void *)(h->iip6 + 1);
	__u32 ports = 0;

	if (!flow_has_ports6(h->iip6))
		return flow_hash6_ports(h->iip6, 0);
	if ((void *)(l4 + 1) <= (void *)(long)skb->data_end)
		ports = *l4;
	else if (bpf_skb_load_bytes(skb, h->iip_off + sizeof(struct ip6_hdr), &ports,
				    sizeof(ports)))
		ports = 0;
	return flow_hash6_ports(h->iip6, ports);
}

/* Longest outer IPv4 header: with 40 bytes of options. */
#define IPV4_HLEN_MAX		60

/* Answers a transiting frame as a router answers a packet it cannot forward: the inner
 * packet becomes the ICMP error type/code (second word rest) from this node's tunnel
 * address (its underlay address when it has none) to the inner source, and the frame
 * goes back as GENEVE to the hop that sent it (outer source this node, destination
 * that hop, TTL 64, UDP checksum 0; GENEVE and the inner Ethernet header as they
 * came). h is from transit_parse. Returns TC_ACT_REDIRECT or a negative DROP_* (fail
 * if the frame could not be rewritten, DROP_ICMP_GSO for a GSO frame the kernel would
 * not shrink). Counts metric. */
static __always_inline int transit_icmp_error(struct __sk_buff *skb,
					      const struct datapath_config *cfg,
					      const struct transit_hdrs *h, __u8 type, __u8 code,
					      __be32 rest, int fail, int metric, __u8 hook)
{
	__u32 iip_off = h->l4_off - h->iip->ihl * 4, ohl;
	__be32 prev = h->oip->saddr, src;
	__u8 ohdr[IPV4_HLEN_MAX];
	struct icmp4_error e;
	struct iphdr *oip = (void *)ohdr;
	struct udphdr udp;
	struct ethhdr *eth;
	__u32 tot;
	__s64 sum;
	int elen, path;

	/* Back the way the frame came: into WireGuard for an encrypted peer. */
	path = geneve_path(cfg, prev);
	if (path < 0)
		return path;
	src = geneve_outer_src(cfg, path);

	elen = icmp4_error_build(skb, iip_off, type, code, rest,
				 cfg->tunnel_ip ? cfg->tunnel_ip : cfg->underlay_ip, &e, fail);
	if (elen < 0)
		return elen;
	/* A fixed 60 bytes, options or not: the frame is longer than that before and
	 * after the shrink (UDP, GENEVE, inner Ethernet and IPv4 follow), and a constant
	 * length is one the verifier need not bound. */
	if (elen > (int)sizeof(e) || bpf_skb_load_bytes(skb, ETH_HLEN, ohdr, sizeof(ohdr)) ||
	    bpf_skb_load_bytes(skb, h->udp_off, &udp, sizeof(udp)))
		return fail;
	ohl = oip->ihl * 4;
	tot = iip_off + elen - ETH_HLEN;
	oip->tot_len = bpf_htons(tot);
	oip->ttl = OUTER_TTL;
	oip->saddr = src;
	oip->daddr = prev;
	oip->check = 0;
	/* The outer header may carry options: sum all of it (a multiple of 4 bytes). */
	sum = bpf_csum_diff(NULL, 0, (__be32 *)ohdr, ohl, 0);
	if (sum < 0)
		return fail;
	oip->check = (__sum16)csum_fold32((__u32)sum);
	udp.dest = bpf_htons(GENEVE_PORT);
	udp.len = bpf_htons(tot - ohl);
	udp.check = 0;	/* allowed for IPv4; the inner ICMP has its own */
	/* Shrinking also makes the skb linear and drops its GSO state. The kernel refuses
	 * it (-ENOTSUPP) for an skb it marks encapsulated, which a GENEVE frame that came
	 * over a veth from the node that encapsulated it is: then the bytes past the new
	 * lengths stay, as Ethernet padding would, and every IPv4 receiver (the next
	 * router, the pod) trims them to tot_len. Not so for a GSO frame, which keeps its
	 * GSO state: segmentation (in software, or a NIC's) would cut the rewritten frame
	 * into "TCP segments", its ICMP message and quote rewritten as sequence numbers
	 * and checksums, and the trailing bytes sent as more of them. Such a frame is
	 * DROP_ICMP_GSO, before anything is written. In this order: the 60 bytes of ohdr
	 * reach past the outer header, over bytes the later stores set. */
	if (bpf_skb_change_tail(skb, iip_off + elen, 0) && skb->gso_size)
		return DROP_ICMP_GSO;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, ohdr, sizeof(ohdr), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + ohl, &udp, sizeof(udp), 0) ||
	    bpf_skb_store_bytes(skb, iip_off, &e, elen, 0))
		return fail;
	eth = (void *)(long)skb->data;
	if ((void *)(eth + 1) > (void *)(long)skb->data_end)
		return fail;
	if (path == GENEVE_PATH_WIREGUARD)
		return send_to_wireguard(skb, cfg, prev, metric, hook, 0);
	return send_to_peer(skb, cfg, eth, src, prev, metric, hook, 0);
}

/* ICMP time exceeded (type 11 code 0) for a transiting frame whose inner TTL expired
 * here, so traceroute across sites shows the gateway (transit_icmp_error). Returns
 * TC_ACT_REDIRECT or a negative DROP_* (DROP_TTL_EXCEEDED if the frame could not be
 * rewritten). Counts METRIC_TIME_EXCEEDED_SENT. */
static __always_inline int transit_time_exceeded(struct __sk_buff *skb,
						 const struct datapath_config *cfg,
						 const struct transit_hdrs *h, __u8 hook)
{
	return transit_icmp_error(skb, cfg, h, ICMP_TIME_EXCEEDED, ICMP_EXC_TTL, 0,
				  DROP_TTL_EXCEEDED, METRIC_TIME_EXCEEDED_SENT, hook);
}

/* Smallest MTU a frag needed may announce (RFC 791: every host takes 68 bytes). */
#define IPV4_MIN_MTU		68

/* Path MTU of the next underlay link, as ip_forward checks it, for a transiting frame
 * that lookup p (verdict BPF_FIB_LKUP_RET_FRAG_NEEDED) found too long: an inner packet
 * with DF gets ICMP frag needed (type 3 code 4, transit_icmp_error) announcing that
 * MTU less the encapsulation in front of the inner IPv4 header (outer IPv4 with its
 * options, UDP, GENEVE with its options, inner Ethernet), the largest inner packet
 * that fits; its sender lowers its path MTU (RFC 1191). Without DF the frame would
 * have to be fragmented, outer or inner: the outer header of our peers carries DF and
 * the receiver does not reassemble, and fragmenting the inner packet in TC is not
 * possible with the helpers there are, so it is DROP_UNDERLAY_MTU. Returns
 * TC_ACT_REDIRECT or a negative DROP_*. Counts METRIC_FRAG_NEEDED_SENT. */
static __always_inline int transit_frag_needed(struct __sk_buff *skb,
					       const struct datapath_config *cfg,
					       const struct transit_hdrs *h,
					       const struct bpf_fib_lookup *p, __u8 hook)
{
	__u32 overhead = h->l4_off - h->iip->ihl * 4 - ETH_HLEN;
	__u32 mtu = p->mtu_result;

	if (!(h->iip->frag_off & bpf_htons(IP_DF)))
		return DROP_UNDERLAY_MTU;
	mtu = mtu > overhead + IPV4_MIN_MTU ? mtu - overhead : IPV4_MIN_MTU;
	return transit_icmp_error(skb, cfg, h, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED,
				  bpf_htonl(mtu), DROP_UNDERLAY_MTU, METRIC_FRAG_NEEDED_SENT,
				  hook);
}

/* Picks the next hop *nh of a frame from osrc transiting by route rt, flow hash hash
 * (rt->peer, or the group's member for the flow), and the outer source *src toward it.
 * Returns the GENEVE path to it (geneve_path), or DROP_NO_NEXTHOP, DROP_TRANSIT_LOOP
 * (the next hop sent the frame) or geneve_path's drop. */
static __always_inline int transit_next_hop(const struct datapath_config *cfg,
					    const struct route_value *rt, __u32 hash,
					    __be32 osrc, __be32 *nh, __be32 *src)
{
	int path;

	*nh = nexthop_select(rt, hash);
	if (unlikely(!*nh))
		return DROP_NO_NEXTHOP;
	if (*nh == osrc)
		return DROP_TRANSIT_LOOP;
	path = geneve_path(cfg, *nh);
	if (path < 0)
		return path;
	*src = geneve_outer_src(cfg, path);
	return path;
}

/* Looks the next underlay hop up for a transiting frame to next hop nh from src (path
 * from geneve_path), checking wire (its outer length, or one segment's) against the
 * MTU toward it as ip_forward does. Returns the bpf_fib_lookup verdict, p filled. */
static __always_inline int transit_lookup(struct __sk_buff *skb,
					  const struct datapath_config *cfg,
					  struct bpf_fib_lookup *p, int path, __be32 src,
					  __be32 nh, __u32 wire)
{
	if (path == GENEVE_PATH_WIREGUARD) {
		/* No FIB: WireGuard carries it. Its device's MTU is the next link's. */
		p->mtu_result = wireguard_mtu(skb, cfg);
		return p->mtu_result && wire > p->mtu_result ? BPF_FIB_LKUP_RET_FRAG_NEEDED
							     : BPF_FIB_LKUP_RET_SUCCESS;
	}
	return fib_lookup_v4(skb, p, src, nh, 0, IPPROTO_UDP, skb->ifindex,
			     wire > 0xffff ? 0xffff : wire);
}

/* Rewrites the outer IPv4 header oip of a transiting frame (UDP header at udp_off)
 * for next hop nh from src, and sends it by lookup p (verdict rc) or into WireGuard.
 * inner_from and inner_to: a 16-bit word of the inner packet the caller changed
 * (equal when the change kept the UDP payload's sum, as an IPv4 TTL decrement with
 * its checksum update does), for the outer UDP checksum. Returns TC_ACT_REDIRECT or a
 * negative DROP_*. Counts METRIC_TRANSIT. */
static __always_inline int transit_send(struct __sk_buff *skb, const struct datapath_config *cfg,
					struct iphdr *oip, __u32 udp_off, __be16 inner_from,
					__be16 inner_to, __be32 src, __be32 nh, int path,
					struct bpf_fib_lookup *p, int rc,
					const struct route_value *rt, __u8 hook)
{
	const __u64 l4_flags = BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | sizeof(__be32);
	__u32 udp_check_off = udp_off + offsetof(struct udphdr, check);
	__be32 osrc = oip->saddr, odst = oip->daddr;
	struct udphdr *udp;
	struct ethhdr *eth;
	__be16 ttl_from;
	__sum16 check;

	/* The outer header may carry options: patch its checksum rather than recompute. */
	ttl_from = *(__be16 *)&oip->ttl;	/* TTL and protocol */
	oip->ttl = OUTER_TTL;
	check = csum_replace16(oip->check, ttl_from, *(__be16 *)&oip->ttl);
	check = csum_replace32(check, osrc, src);
	oip->check = csum_replace32(check, odst, nh);
	oip->saddr = src;
	oip->daddr = nh;

	/* The outer UDP checksum covers both addresses and the inner packet.
	 * bpf_l4_csum_replace knows what the field holds: a full checksum, or the
	 * pseudo-header seed of a CHECKSUM_PARTIAL or UDP_TUNNEL_CSUM GSO skb, which
	 * segmentation completes later (zeroing that seed would corrupt every segment;
	 * an inner change is left to segmentation too), and it keeps a
	 * CHECKSUM_COMPLETE skb->csum right. MARK_MANGLED_0: a computed 0 is sent as
	 * 0xffff, and a zero field is skipped. */
	udp = (void *)(long)skb->data + udp_off;
	if ((void *)(udp + 1) > (void *)(long)skb->data_end)
		return DROP_ENCAP_FAILED;
	if (udp->check) {
		if (bpf_l4_csum_replace(skb, udp_check_off, osrc, src, l4_flags) ||
		    bpf_l4_csum_replace(skb, udp_check_off, odst, nh, l4_flags))
			return DROP_ENCAP_FAILED;
		if (inner_from != inner_to &&
		    bpf_l4_csum_replace(skb, udp_check_off, inner_from, inner_to,
					BPF_F_MARK_MANGLED_0 | sizeof(__be16)))
			return DROP_ENCAP_FAILED;
	} else if (inner_from != inner_to) {
		/* No checksum to absorb the inner change: a CHECKSUM_COMPLETE skb->csum
		 * (the sum over the packet) takes it. */
		__be32 from = inner_from, to = inner_to;

		bpf_csum_update(skb, bpf_csum_diff(&from, sizeof(from), &to, sizeof(to), 0));
	}

	/* The helpers above may have moved the data: only the Ethernet header is needed. */
	eth = (void *)(long)skb->data;
	if ((void *)(eth + 1) > (void *)(long)skb->data_end)
		return DROP_ENCAP_FAILED;
	if (path == GENEVE_PATH_WIREGUARD)
		return send_to_wireguard(skb, cfg, nh, METRIC_TRANSIT, hook, rt->group);
	return send_looked_up(skb, cfg, eth, p, rc, nh, METRIC_TRANSIT, hook, rt->group);
}

/* Forwards a GENEVE frame tc_decap validated, whose inner destination hit route rt on a
 * gateway, to the route's next hop: rt->peer, or the member of its group for the flow
 * (the hash encapsulation uses, so the flow keeps one gateway). The inner TTL is
 * decremented; the outer IPv4 header gets this node's underlay address (its tunnel
 * address when the next hop is an encrypted peer: then the frame goes into WireGuard,
 * lib/wireguard.h) as source, the next hop as destination and TTL 64, its checksum
 * patched; a non-zero outer UDP checksum is patched for the two addresses, a zero one
 * stays zero; the UDP source port, GENEVE and the inner frame are left as they are.
 * Then the FIB lookup and redirect of encapsulation, the lookup also checking the
 * frame against the route's MTU (transit_frag_needed). Returns TC_ACT_REDIRECT or a
 * negative DROP_*: DROP_NO_NEXTHOP, DROP_TRANSIT_LOOP (the next hop sent it),
 * DROP_TTL_EXCEEDED, DROP_UNDERLAY_MTU. Counts METRIC_TRANSIT
 * (METRIC_TIME_EXCEEDED_SENT, METRIC_FRAG_NEEDED_SENT for the ICMP replies). */
static __always_inline int transit_forward(struct __sk_buff *skb,
					   const struct datapath_config *cfg,
					   const struct route_value *rt, __u8 hook)
{
	struct bpf_fib_lookup p;
	struct transit_hdrs h;
	__be32 nh, src;
	__u32 iip_off, wire;
	int path, rc;

	rc = transit_parse(skb, &h);
	if (rc < 0)
		return rc;
	path = transit_next_hop(cfg, rt, transit_flow_hash(skb, &h), h.oip->saddr, &nh, &src);
	if (path < 0)
		return path;
	if (h.iip->ttl <= 1)
		return transit_time_exceeded(skb, cfg, &h, hook);
	/* Then the size, as ip_forward (so a frag needed quotes the header as received):
	 * the frame, or each segment of a GSO one, against the route's MTU toward the
	 * next hop. The outer header's length does not change here. */
	iip_off = h.l4_off - h.iip->ihl * 4;
	wire = iip_off - ETH_HLEN + ipv4_seg_len(skb, h.iip, iip_off);
	rc = transit_lookup(skb, cfg, &p, path, src, nh, wire);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return transit_frag_needed(skb, cfg, &h, &p, hook);
	/* Incremental: the sum over each header is unchanged, so a checksum covering it (the
	 * outer UDP one, a CHECKSUM_COMPLETE skb->csum) needs no fix for these writes. */
	ipv4_decrease_ttl(h.iip);
	return transit_send(skb, cfg, h.oip, h.udp_off, 0, 0, src, nh, path, &p, rc, rt, hook);
}

/* transit_forward for an inner IPv6 packet, whose route rt is from routes6: the same
 * next hop, loop and size checks and outer rewrite, the inner hop limit decremented
 * (a non-zero outer UDP checksum patched for it). No ICMPv6 answer comes from here:
 * hop limit 1 or 0 is DROP_TTL_EXCEEDED, a frame longer than the next link
 * DROP_UNDERLAY_MTU (the node has no IPv6 address to send the error from). Returns
 * TC_ACT_REDIRECT or a negative DROP_*. Counts METRIC_TRANSIT. */
static __always_inline int transit_forward6(struct __sk_buff *skb,
					    const struct datapath_config *cfg,
					    const struct route_value *rt, __u8 hook)
{
	struct bpf_fib_lookup p;
	struct transit_hdrs6 h;
	__be16 hop_from, hop_to;
	__be32 nh, src;
	__u32 wire;
	int path, rc;

	rc = transit_parse6(skb, &h);
	if (rc < 0)
		return rc;
	path = transit_next_hop(cfg, rt, transit_flow_hash6(skb, &h), h.oip->saddr, &nh, &src);
	if (path < 0)
		return path;
	if (h.iip6->hop_limit <= 1)
		return DROP_TTL_EXCEEDED;
	wire = h.iip_off - ETH_HLEN + ipv6_seg_len(skb, h.iip6, h.iip_off);
	rc = transit_lookup(skb, cfg, &p, path, src, nh, wire);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return DROP_UNDERLAY_MTU;
	hop_from = *(__be16 *)&h.iip6->nexthdr;	/* next header and hop limit */
	h.iip6->hop_limit--;
	hop_to = *(__be16 *)&h.iip6->nexthdr;
	return transit_send(skb, cfg, h.oip, h.udp_off, hop_from, hop_to, src, nh, path, &p,
			    rc, rt, hook);
}
