/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map keys and values shared with Go: maps/types.go mirrors each struct field by field,
 * and a test in maps/ checks sizes and offsets against the BTF of the compiled object. */
#pragma once

#include <linux/types.h>

/* routes (LPM trie): inner IPv4 destination prefix -> the peer that owns it. */
struct route_key {
	__u32 prefixlen;	/* 0..32 */
	__be32 addr;		/* inner IPv4 destination */
};

struct route_value {
	__be32 peer;		/* underlay IPv4 of the peer node: the tunnel endpoint */
	__u32 flags;		/* ROUTE_F_*, none defined yet */
};

/* peers (hash): underlay IPv4 of a peer -> what we know about it. Decapsulation drops
 * GENEVE from any outer source that has no entry here. */
struct peer_value {
	__u32 flags;		/* PEER_F_*, none defined yet */
	__u32 reserved;
};

/* peer_sources (LPM trie): the inner source prefixes each peer may send from. The
 * prefix covers the 32 bits of peer first, so a lookup with prefixlen 64 can only
 * match entries of that exact peer. */
struct peer_source_key {
	__u32 prefixlen;	/* 32 + inner source prefix length */
	__be32 peer;		/* underlay IPv4 of the peer */
	__be32 src;		/* inner IPv4 source prefix */
};

struct peer_source_value {
	__u32 flags;		/* none defined yet */
};

/* config (array, one entry at index 0): written by the agent before it attaches. */
struct datapath_config {
	__u32 vni;		/* GENEVE VNI, host order, low 24 bits */
	__be32 underlay_ip;	/* this node's tunnel endpoint, the outer source */
	__u32 underlay_ifindex;	/* where encapsulated packets leave */
	__u32 overlay_ifindex;	/* isthmus0: decapsulated host traffic enters here */
	__u8 overlay_mac[6];	/* isthmus0's MAC, the inner destination MAC for host traffic */
	__u16 tunnel_mtu;	/* largest inner IPv4 packet that fits the tunnel (non-GSO) */
	__u32 flags;		/* CFG_F_* */
};

/* pod_ifaces (hash): ifindex of each pod-facing host interface the agent attached to.
 * Delivery to an interface in this map uses bpf_redirect_peer. */
struct pod_iface_value {
	__u32 flags;		/* none defined yet */
};

/* metrics (per-CPU hash): packets and bytes per (code, hook). */
struct metrics_key {
	__u16 code;		/* METRIC_* for accounted verdicts, -DROP_* for drops */
	__u8 hook;		/* HOOK_* */
	__u8 reserved;
};

struct metrics_value {
	__u64 packets;
	__u64 bytes;
};

/* Where a program runs; the hook field of metrics_key. */
enum hook {
	HOOK_POD_INGRESS	= 0,	/* TC ingress on a pod-facing host interface */
	HOOK_OVERLAY_EGRESS	= 1,	/* TC egress on isthmus0 (host traffic) */
	HOOK_UNDERLAY_TC	= 2,	/* TC ingress on the underlay device */
	HOOK_UNDERLAY_XDP	= 3,	/* XDP on the underlay device */
};

/* Accounted verdicts other than drops; the code field of metrics_key. */
enum metric {
	METRIC_ENCAP		= 1,	/* pushed GENEVE and sent to a peer */
	METRIC_DECAP		= 2,	/* popped GENEVE from a known peer */
	METRIC_DELIVER_POD	= 3,	/* redirected to a local pod interface */
	METRIC_DELIVER_HOST	= 4,	/* handed to this node's stack through isthmus0 */
	METRIC_FRAG_NEEDED_SENT	= 5,	/* too big for the tunnel, DF: answered with ICMP frag needed */
};

/* Written by underlay_xdp in front of a frame it has popped (XDP metadata), read by
 * underlay_ingress from skb->data_meta, so the TC side delivers without parsing again. */
struct decap_meta {
	__u32 magic;		/* DECAP_META_MAGIC */
	__be32 peer;		/* the outer source: the peer that sent the frame */
};

/* decap_meta.magic: marks metadata written by underlay_xdp ("isth"). */
#define DECAP_META_MAGIC	0x69737468
