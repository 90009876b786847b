/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* GENEVE header (RFC 8926) and its validation for decapsulation. */
#pragma once

#include "common.h"
#include "parse.h"
#include "maps.h"

/* Fixed GENEVE header, little-endian bitfields (BPF target bpfel). */
struct genevehdr {
	__u8 opt_len:6,		/* options length in 4-byte words */
	     ver:2;		/* version, 0 */
	__u8 rsvd1:6,
	     critical:1,	/* C: critical options present */
	     oam:1;		/* O: control packet */
	__be16 proto_type;	/* payload EtherType, ETH_P_TEB */
	__u8 vni[3];
	__u8 rsvd2;
};

_Static_assert(sizeof(struct genevehdr) == GENEVE_HLEN, "genevehdr is 8 bytes");

/* Returns the VNI word of a GENEVE header (VNI in the top 24 bits, network order). */
static __always_inline __be32 geneve_vni_word(__u32 vni)
{
	return bpf_htonl((vni & 0xffffff) << 8);
}

/* What decapsulation learns from a valid GENEVE frame. */
struct decap_info {
	__be32 peer;		/* the outer source, as peers knows it (a handle for an
				 * IPv6 one; 0 for an IPv6 source peers6 does not hold) */
	__u32 outer_hlen;	/* outer IPv4 header with its options, 20..60 bytes; the
				 * IPv6 fixed header, 40 */
	__u32 optlen;		/* GENEVE option bytes, 0..252 */
	__be32 daddr;		/* inner IPv4 destination; 0 for an IPv6 one */
	__u8 outer_tos;		/* outer DSCP and ECN */
	__u8 from_wireguard;	/* set by the caller: the frame came out of the WireGuard
				 * device (decrypted), not off the underlay */
	__u8 outer6;		/* the outer header is IPv6 (the IPv6 underlay) */
	struct iphdr *inner;	/* inner IPv4 header, valid until the packet changes;
				 * NULL when the inner packet is IPv6 */
	struct ip6_hdr *inner6;	/* inner IPv6 header, likewise; NULL when IPv4 */
};

/* Returns 1 if saddr may never be the source of a packet out of the tunnel, whatever
 * peer_sources allows (a gateway's peer may send from 0.0.0.0/0): "this network"
 * 0/8, loopback 127/8, multicast 224/4, reserved 240/4 with the limited broadcast, and
 * this node's own underlay and tunnel addresses (the stack would take them for its own
 * packets: a martian, or a reply to a connection it never made). */
static __always_inline int inner_src_martian(const struct datapath_config *cfg, __be32 saddr)
{
	__u8 first = bpf_ntohl(saddr) >> 24;

	if (first == 0 || first == 127 || first >= 224)
		return 1;
	return saddr == cfg->underlay_ip || (cfg->tunnel_ip && saddr == cfg->tunnel_ip);
}

/* inner_src_martian for an IPv6 source: the unspecified address, loopback, IPv4-mapped
 * addresses (::ffff:0:0/96, an IPv4 source in disguise that peer_sources never
 * vetted), link-local (fe80::/10, never forwarded) and multicast. */
static __always_inline int inner_src_martian6(const __be32 saddr[4])
{
	if (ipv6_link_scoped(saddr) || ipv6_multicast(saddr))
		return 1;
	if (saddr[0] || saddr[1])
		return 0;
	if (saddr[2] == bpf_htonl(0x0000ffff))
		return 1;
	return !saddr[2] && saddr[3] == bpf_htonl(1);
}

/* The IPv6 half of geneve_validate, at the inner IPv6 header: martian sources
 * (inner_src_martian6, DROP_INNER_MARTIAN), then the peer's allowed sources
 * (peer_sources6, DROP_INNER_SRC_DENIED). Returns 0 with info->inner6 set, or a
 * negative DROP_*. */
static __always_inline int geneve_validate_inner6(struct cursor *c, struct decap_info *info)
{
	struct peer_source6_key skey = { .prefixlen = 32 + 128, .peer = info->peer };
	struct ip6_hdr *ip6h;

	if (parse_ipv6(c, &ip6h) < 0)
		return DROP_INNER_INVALID;
	if (inner_src_martian6(ip6h->saddr))
		return DROP_INNER_MARTIAN;
	__builtin_memcpy(skey.src, ip6h->saddr, sizeof(skey.src));
	if (!bpf_map_lookup_elem(&peer_sources6, &skey))
		return DROP_INNER_SRC_DENIED;
	info->daddr = 0;
	info->inner = NULL;
	info->inner6 = ip6h;
	return 0;
}

/* Returns 0 if a GENEVE frame from peer (its peers entry pv) may be decapsulated where
 * it arrived (out of the WireGuard device when from_wireguard, else on the underlay),
 * else DROP_CLEARTEXT_FROM_ENCRYPTED (an encrypted peer's frame in the clear: forged,
 * or a peer that lost its configuration; either way not to be trusted) or
 * DROP_WIREGUARD_PEER_CLEAR (a frame out of WireGuard from a peer this node tunnels to
 * in the clear: the two ends disagree). */
static __always_inline int geneve_peer_path_ok(const struct peer_value *pv, int from_wireguard)
{
	int encrypted = !!(pv->flags & PEER_F_WIREGUARD);

	if (likely(encrypted == from_wireguard))
		return 0;
	return encrypted ? DROP_CLEARTEXT_FROM_ENCRYPTED : DROP_WIREGUARD_PEER_CLEAR;
}

/* Validates the GENEVE header and the inner Ethernet and IP headers at c (an inner
 * IPv6 packet: geneve_validate_inner6), for a
 * frame from outer source info->peer. Returns 0 and fills the rest of *info, or a
 * negative DROP_* (DROP_INNER_MARTIAN for a source no peer may send from,
 * inner_src_martian, before DROP_INNER_SRC_DENIED; geneve_peer_path_ok's for a frame
 * on the wrong path for its peer). The order of checks fixes which reason a frame with several faults
 * gets. */
static __always_inline int geneve_validate(struct cursor *c, const struct datapath_config *cfg,
					   struct decap_info *info)
{
	__be32 peer = info->peer;
	struct peer_source_key skey = { .prefixlen = 64, .peer = peer };
	const struct peer_value *pv;
	int ret;
	struct genevehdr *gh = c->pos;
	struct ethhdr *ieth;
	struct iphdr *iiph;
	__u32 optlen;

	if ((void *)(gh + 1) > c->end)
		return DROP_GENEVE_TRUNCATED;
	if (gh->ver != 0)
		return DROP_GENEVE_VERSION;
	optlen = gh->opt_len * 4;
	if ((void *)(gh + 1) + optlen > c->end)
		return DROP_GENEVE_OPT_LEN;
	if (gh->critical)
		return DROP_GENEVE_CRITICAL;
	/* A control message for the tunnel endpoint (RFC 8926 3.4); we speak none. */
	if (gh->oam)
		return DROP_GENEVE_OAM;
	if (gh->proto_type != bpf_htons(ETH_P_TEB))
		return DROP_GENEVE_PROTOCOL;
	/* The last byte of this word is reserved: ignored, as Linux geneve does. */
	if ((*(__be32 *)gh->vni & bpf_htonl(0xffffff00)) != geneve_vni_word(cfg->vni))
		return DROP_GENEVE_VNI;
	pv = bpf_map_lookup_elem(&peers, &peer);
	/* A handle is a peer only over the IPv6 underlay (underlay_classify6 found it
	 * in peers6): an outer IPv4 source 0.x.y.z is anyone's forgery. */
	if (!pv || !!(pv->flags & PEER_F_UNDERLAY6) != info->outer6)
		return DROP_UNKNOWN_PEER;
	ret = geneve_peer_path_ok(pv, info->from_wireguard);
	if (ret)
		return ret;
	/* Non-critical options are skipped unread; they are popped with the header. */
	c->pos = (void *)(gh + 1) + optlen;

	info->optlen = optlen;
	switch (parse_eth(c, &ieth)) {
	case ETH_P_IP:
		break;
	case ETH_P_IPV6:
		return geneve_validate_inner6(c, info);
	case -1:
		return DROP_INNER_INVALID;
	default:
		return DROP_INNER_UNSUPPORTED;
	}
	if (parse_ipv4(c, &iiph) < 0)
		return DROP_INNER_INVALID;
	if (inner_src_martian(cfg, iiph->saddr))
		return DROP_INNER_MARTIAN;

	skey.src = iiph->saddr;
	if (!bpf_map_lookup_elem(&peer_sources, &skey))
		return DROP_INNER_SRC_DENIED;

	info->daddr = iiph->daddr;
	info->inner = iiph;
	info->inner6 = NULL;
	return 0;
}
