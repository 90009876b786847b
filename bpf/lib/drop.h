/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Drop reasons. Negative, below every TC and XDP verdict, never renumbered: a retired
 * reason keeps its slot. maps/dropreasons.go names each one; a test checks they agree. */
#pragma once

enum drop_reason {
	DROP_INVALID_PACKET	= -130,	/* truncated or malformed outer L2/L3/L4 header */
	DROP_GENEVE_TRUNCATED	= -131,	/* UDP payload shorter than a GENEVE header */
	DROP_GENEVE_VERSION	= -132,	/* GENEVE version is not 0 */
	DROP_GENEVE_OPT_LEN	= -133,	/* GENEVE options run past the packet */
	DROP_GENEVE_CRITICAL	= -134,	/* critical option (C bit) we do not understand */
	DROP_GENEVE_PROTOCOL	= -135,	/* protocol type is not Ethernet (0x6558) */
	DROP_GENEVE_VNI		= -136,	/* VNI is not ours */
	DROP_UNKNOWN_PEER	= -137,	/* outer source is not a known peer */
	DROP_INNER_SRC_DENIED	= -138,	/* inner source not allowed for that peer */
	DROP_INNER_INVALID	= -139,	/* truncated or malformed inner headers */
	DROP_INNER_UNSUPPORTED	= -140,	/* inner frame is not IPv4 */
	DROP_NO_CONFIG		= -141,	/* config map entry missing */
	DROP_ENCAP_FAILED	= -142,	/* growing or writing the packet failed */
	DROP_DECAP_FAILED	= -143,	/* shrinking the packet failed */
	DROP_NO_UNDERLAY_ROUTE	= -144,	/* no FIB route to the peer's underlay address */
	DROP_NO_OVERLAY_ROUTE	= -145,	/* isthmus0 got a packet no peer owns */
	DROP_NOT_LOCAL		= -146,	/* decapsulated packet is for no local pod or host */
	DROP_TTL_EXCEEDED	= -147,	/* inner TTL would reach zero */
	DROP_FRAG_NEEDED	= -148,	/* inner packet larger than the tunnel MTU */
	DROP_REDIRECT_FAILED	= -149,	/* redirect helper refused the packet */
	DROP_NO_NEXTHOP		= -150,	/* the route's next-hop group has no live member */
	DROP_SNAT_NO_PORT	= -151,	/* no free port in the SNAT range for a new flow */
	DROP_SNAT_INSERT	= -152,	/* the nat table refused a new translation */
	DROP_SNAT_UNSUPPORTED	= -153,	/* needs SNAT but the protocol cannot be translated */
	DROP_SNAT_REWRITE	= -154,	/* rewriting addresses or checksums failed */
	DROP_TRANSIT_LOOP	= -155,	/* transit would send the packet back to its sender */
	DROP_POD_SRC_SPOOFED	= -156,	/* pod source does not route back via its interface */
	DROP_POD_GENEVE		= -157,	/* pod sent UDP to port 6081 of a peer's tunnel endpoint */
	DROP_GENEVE_OAM		= -158,	/* GENEVE control frame (O bit): not for a pod */
	DROP_OUTER_FRAGMENT	= -159,	/* first fragment of a GENEVE datagram: we do not reassemble */
	DROP_ECN_NOT_ECT	= -160,	/* outer CE on a Not-ECT inner packet (RFC 6040) */
	DROP_UNDERLAY_MTU	= -161,	/* transiting frame longer than the next underlay link, inner without DF */
	DROP_POD_SRC_NOT_RESERVED = -162, /* source is no address the CNI reserved for the pod's interface */
	DROP_INNER_MARTIAN	= -163,	/* inner source 0/8, 127/8, 224/4, 240/4 or this node's own */
	DROP_ICMP_GSO		= -164,	/* ICMP error for a GSO frame the kernel would not shrink */
	DROP_NAT_SOURCE_LIMIT	= -165,	/* the pod source holds its whole share of the nat table */
	DROP_NAT_REPLY_UNKNOWN	= -166,	/* TCP to a translated address: no translation, socket or conntrack entry */
	DROP_NEXTHOP_NOT_PEER	= -167,	/* the route's next hop has no peers entry: its tunnel is unknown */
	DROP_WIREGUARD_NO_KEY	= -168,	/* for an encrypted peer whose public key is not known yet */
	DROP_WIREGUARD_NO_DEVICE = -169, /* for an encrypted peer, and no WireGuard device (or tunnel address) */
	DROP_CLEARTEXT_FROM_ENCRYPTED = -170, /* GENEVE in the clear from a peer of an encrypted pair */
	DROP_WIREGUARD_PEER_CLEAR = -171, /* GENEVE out of WireGuard from a peer not marked encrypted */
	DROP_WIREGUARD_NOT_GENEVE = -172, /* out of the WireGuard device, and not GENEVE for this node */
	DROP_NO_UNDERLAY6	= -173,	/* for a peer over the IPv6 underlay, and this node has no IPv6 underlay address */
};
