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
	__be32 peer;		/* the peer node, when group is 0: its underlay IPv4, or the
				 * handle of a peer on the IPv6 underlay (PEER_F_UNDERLAY6) */
	__u32 flags;		/* ROUTE_F_* */
	__u32 group;		/* next-hop group (index into nexthop_groups), 0 = none: use peer */
	__u32 reserved;
};

/* routes6 (LPM trie): routes for IPv6 inner destinations, with the same value. */
struct route6_key {
	__u32 prefixlen;	/* 0..128 */
	__be32 addr[4];		/* inner IPv6 destination */
};

/* route_value.flags */
#define ROUTE_F_VIA_FABRIC	(1 << 0)	/* the next hops are gateways of this node's
						 * own site: a packet from a source in
						 * fabric_prefixes (a declared pod of a site
						 * whose fabric returns its replies) goes to
						 * them by the underlay device, where the
						 * answer arrives (the agent's fabric table;
						 * fabric_egress), not by isthmus0 */
#define ROUTE_F_UNDERLAY	(1 << 1)	/* an exception inside a shorter route: the
						 * prefix is not tunnelled here (a tunnel
						 * endpoint, a local prefix); lookups treat it
						 * as a miss (route_lookup) */
#define ROUTE_F_NOT_FOR_PODS	(1 << 2)	/* for forwarded packets only: a pod's packet
						 * treats it as a miss (pod_route_lookup).
						 * The route to a node of this node's own
						 * site whose pods another CNI owns: its
						 * pods reach that node over the site
						 * fabric, where the answers come */

/* Slots of a next-hop group: a power of two, so a flow hash picks one with a mask. */
#define NHG_SLOTS		64

/* nexthop_groups (array, index = group id; 0 is never used): the healthy members of a
 * group spread over NHG_SLOTS slots by rendezvous hashing, computed by the agent. A
 * flow takes slots[flow_hash % NHG_SLOTS]; a member going down moves only the flows of
 * its own slots, and a packet of a group with no live member is dropped
 * (DROP_NO_NEXTHOP). */
struct nexthop_group {
	__u32 live;		/* members up; 0 = none */
	__be32 slots[NHG_SLOTS];	/* the member that owns each slot, as route_value.peer */
};

/* fabric_prefixes (LPM trie, key struct route_key): inner destinations this node hands
 * to its own site's fabric after decapsulation (the declared pod blocks of an unmanaged
 * site, which the site's own network routes to whichever node holds the pod). Other
 * decapsulated destinations must be local. */
struct fabric_prefix_value {
	__u32 flags;		/* none defined yet */
};

/* snat_exempt (LPM trie, key struct route_key): sources the peers route back to this
 * node (its podCIDRs, its tunnel address, its site's declared pod blocks unless the
 * Site asks for SNAT). A pod packet entering the tunnel from any other source is
 * translated to config.tunnel_ip (return-path SNAT). */
struct snat_exempt_value {
	__u32 flags;		/* none defined yet */
};

/* masq_exempt (LPM trie, key struct route_key): destinations a managed pod reaches
 * with its own address (the Site's nonMasqueradeCIDRs, every connected site's pod and
 * node prefixes). With CFG_F_MASQUERADE, a packet leaving by the underlay device from
 * a source in snat_exempt (this node's pods) to any other destination is translated
 * to config.underlay_ip (egress masquerade, lib/masq.h). */
struct masq_exempt_value {
	__u32 flags;		/* none defined yet */
};

/* nat and masq_nat (hashes, no LRU): both directions of every translated flow, return-path
 * SNAT's in nat and egress masquerade's in masq_nat. The original direction is
 * keyed by the pod's tuple and maps to the translated source; the reply direction is
 * keyed by the reply's tuple (remote -> tunnel address, translated port) and maps back
 * to the pod. For ICMP echo the identifier is the port: sport = id, dport = 0 in the
 * original key; sport = 0, dport = translated id in the reply key. */
struct nat_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;		/* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP */
	__u8 pad[3];
};

struct nat_value {
	__be32 addr;		/* the address to write: translated source, or the pod on replies */
	__be16 port;		/* the port (or ICMP identifier) to write */
	__u8 state;		/* NAT_STATE_* (TCP); timeouts follow it */
	__u8 flags;		/* NAT_F_* */
	__u64 last_seen;	/* bpf_ktime_get_ns() of the last packet either way */
};

#define NAT_F_REPLY		(1 << 0)	/* this entry is the reply direction */

enum nat_state {
	NAT_STATE_NEW		= 0,	/* first packet seen (TCP: SYN only) */
	NAT_STATE_ESTABLISHED	= 1,	/* TCP: the reply came */
	NAT_STATE_CLOSING	= 2,	/* TCP: FIN both ways, or RST */
	NAT_STATE_FIN_ORIG	= 3,	/* TCP: the pod sent FIN, the remote side may still send */
	NAT_STATE_FIN_REPLY	= 4,	/* TCP: the remote side sent FIN, the pod may still send */
	NAT_STATE_RST		= 5,	/* TCP: an RST seen; a flow whose both sides send again
					 * (not an RST) is ESTABLISHED again */
	NAT_STATE_RST_ORIG	= 6,	/* TCP: after an RST the pod sent again, the remote not yet */
	NAT_STATE_RST_REPLY	= 7,	/* TCP: after an RST the remote sent again, the pod not yet */
};

/* Which table a nat_sources entry counts flows in. */
enum nat_table {
	NAT_TABLE_SNAT		= 0,	/* nat: return-path SNAT */
	NAT_TABLE_MASQ		= 1,	/* masq_nat: egress masquerade */
};

/* nat_sources (LRU hash): the flows one pod source holds in one table, the share
 * nat_source_flows_max bounds. The datapath counts a flow when it inserts its original
 * entry and uncounts it when it deletes that entry; the agent's collection of expired
 * entries recounts every source (maps.CollectNat), so a lost count heals. */
struct nat_source_key {
	__be32 addr;		/* the pod's address: the original source of its flows */
	__u32 table;		/* NAT_TABLE_* */
};

struct nat_source_value {
	__u32 flows;		/* original-direction entries of addr in table */
	__u32 pad;
};

/* peers (hash): the address the datapath knows a peer by -> what we know about it: its
 * underlay IPv4, its tunnel address when the tunnel to it runs inside WireGuard
 * (PEER_F_WIREGUARD), or for a peer on the IPv6 underlay (PEER_F_UNDERLAY6) a handle
 * in 0.0.0.0/8, which no peer's IPv4 address can be, with its IPv6 address
 * (peers6 maps the address back). Every map and program that names a peer (routes,
 * nexthop_groups, peer_sources, peer_sources6, traces) uses these 32 bits.
 * Decapsulation drops GENEVE from any outer source that has no entry here, and
 * encapsulation anything for a next hop without one. */
struct peer_value {
	__u32 flags;		/* PEER_F_* */
	__u32 reserved;
	__be32 underlay6[4];	/* PEER_F_UNDERLAY6: the peer's IPv6 underlay address */
};

/* peers6 (hash): the IPv6 underlay address of a peer -> its handle in peers. */
struct peer6_key {
	__be32 addr[4];
};

struct peer6_value {
	__be32 handle;		/* the peer's key in peers (0.0.0.0/8) */
	__u32 reserved;
};

/* peer_value.flags */
#define PEER_F_WIREGUARD	(1 << 0)	/* an encrypted peer (lib/wireguard.h): GENEVE to
						 * it goes from config.tunnel_ip into the
						 * WireGuard device (config.wg_ifindex), GENEVE
						 * from it is accepted only out of that device */
#define PEER_F_WIREGUARD_NO_KEY	(1 << 1)	/* with PEER_F_WIREGUARD: its public key is not
						 * known yet, so WireGuard has no peer for it:
						 * what would go to it is dropped here, counted
						 * (DROP_WIREGUARD_NO_KEY) */
#define PEER_F_UNDERLAY6	(1 << 2)	/* reached over the IPv6 underlay at
						 * underlay6, from config.underlay_ip6; the
						 * key is a handle (peers6) */

/* peer_sources (LPM trie): the inner source prefixes each peer may send from. The
 * prefix covers the 32 bits of peer first, so a lookup with prefixlen 64 can only
 * match entries of that exact peer. */
struct peer_source_key {
	__u32 prefixlen;	/* 32 + inner source prefix length */
	__be32 peer;		/* the peer, as route_value.peer */
	__be32 src;		/* inner IPv4 source prefix */
};

struct peer_source_value {
	__u32 flags;		/* none defined yet */
};

/* peer_sources6 (LPM trie): peer_sources for IPv6 inner sources, with the same
 * value. A lookup with prefixlen 160 can only match entries of that exact peer. */
struct peer_source6_key {
	__u32 prefixlen;	/* 32 + inner source prefix length */
	__be32 peer;		/* the peer, as route_value.peer */
	__be32 src[4];		/* inner IPv6 source prefix */
};

/* config (array, one entry at index 0): written by the agent before it attaches. */

/* datapath_config.flags */
#define CFG_F_TRANSIT		(1 << 0)	/* a gateway: GENEVE whose inner destination
						 * routes to another peer is forwarded there */
#define CFG_F_TRACE		(1 << 1)	/* tracing on: packets matching trace_prefixes
						 * emit a trace_event at every decision */
#define CFG_F_MASQUERADE	(1 << 2)	/* a managed site's node: its pods reach
						 * destinations outside masq_exempt from
						 * underlay_ip (egress masquerade) */
#define CFG_F_FABRIC_EGRESS	(1 << 3)	/* a node of a site whose fabric carries its
						 * declared pods' replies: their packets on
						 * ROUTE_F_VIA_FABRIC routes are encapsulated
						 * as they leave the underlay device */
#define CFG_F_FIB_DIRECT	(1 << 4)	/* the node's policy rules are the kernel's
						 * own and isthmus': the fast path's FIB
						 * lookups may go straight to the main table
						 * (lib/fib.h fib_lookup_v4_fast) */
struct datapath_config {
	__u32 vni;		/* GENEVE VNI, host order, low 24 bits */
	__be32 underlay_ip;	/* this node's tunnel endpoint, the outer source */
	__u32 underlay_ifindex;	/* where encapsulated packets leave */
	__u32 overlay_ifindex;	/* isthmus0: decapsulated host traffic enters here */
	__u8 overlay_mac[6];	/* isthmus0's MAC, the inner destination MAC for host traffic */
	__u16 tunnel_mtu;	/* largest inner IPv4 packet that fits the tunnel (non-GSO) */
	__u32 flags;		/* CFG_F_* */
	__be32 tunnel_ip;	/* this node's tunnel address: the SNAT source and the one
				 * local address decapsulation delivers to; 0 = neither */
	__u16 snat_port_min;	/* host order: range for translated ports when the */
	__u16 snat_port_max;	/* original one is taken */
	__u32 wg_ifindex;	/* the WireGuard device encrypted peers' GENEVE goes into and
				 * comes out of (wireguard_ingress); 0 = none: what is for an
				 * encrypted peer is dropped (DROP_WIREGUARD_NO_DEVICE) */
	__be32 underlay_ip6[4];	/* this node's IPv6 tunnel endpoint, the outer source to peers
				 * on the IPv6 underlay; all zero = none */
};

/* pod_ifaces (hash): ifindex of each pod-facing host interface the agent attached to.
 * Delivery to an interface in this map uses bpf_redirect_peer, or bpf_redirect when it
 * has no peer (POD_IFACE_F_NO_PEER). */
struct pod_iface_value {
	__u32 flags;		/* POD_IFACE_F_* */
};

/* pod_iface_value.flags */
#define POD_IFACE_F_RESERVED	(1 << 0)	/* the CNI plugin's interface: pod_ingress
						 * accepts only the sources pod_addrs lists
						 * for it, not what the FIB says */
#define POD_IFACE_F_NO_PEER	(1 << 1)	/* not one end of a veth (or netkit) pair:
						 * a bridge whose ports are the pods' veths
						 * (the bridge plugin's, flannel's cni0).
						 * bpf_redirect_peer has no device to enter
						 * there and the kernel drops the packet;
						 * delivery redirects to its egress, and the
						 * bridge forwards to the pod's port */

/* pod_addrs (hash): every address the CNI plugin reserved for the pod behind a host
 * interface, filled by the agent from the IPAM reservations. */
struct pod_addr_key {
	__u32 ifindex;		/* the pod's host-side interface */
	__be32 addr;		/* an IPv4 address reserved for it */
};

struct pod_addr_value {
	__u32 flags;		/* none defined yet */
};

/* pod_addrs6 (hash): pod_addrs for IPv6, with the same value. */
struct pod_addr6_key {
	__u32 ifindex;		/* the pod's host-side interface */
	__be32 addr[4];		/* an IPv6 address reserved for it */
};

/* What one slot of metrics counts: a (code, hook) pair. The map is indexed by
 * metrics_slot (lib/metrics.h), not by this struct; readers convert back. */
struct metrics_key {
	__u16 code;		/* METRIC_* for accounted verdicts, -DROP_* for drops */
	__u8 hook;		/* HOOK_* */
	__u8 reserved;
};

/* The shape of metrics (per-CPU array of metrics_value): slot hook * METRIC_CODES +
 * code for every hook below METRIC_HOOKS and code below METRIC_CODES; a code at or
 * above METRIC_CODES counts as METRIC_OUT_OF_RANGE of its hook, and a hook at or
 * above METRIC_HOOKS in the last slot, METRIC_SLOT_HOOK_OUT_OF_RANGE (read back as
 * code METRIC_OUT_OF_RANGE of hook METRIC_HOOKS). lib/metrics.h checks at compile
 * time that every METRIC_, DROP_ and HOOK_ has a slot. */
enum metric_slots {
	METRIC_CODES		= 256,	/* codes per hook, a power of two */
	METRIC_HOOKS		= 8,	/* hooks, a power of two */
	METRIC_SLOT_HOOK_OUT_OF_RANGE = METRIC_HOOKS * METRIC_CODES,
	METRIC_SLOTS		= METRIC_SLOT_HOOK_OUT_OF_RANGE + 1,	/* max_entries of metrics */
};

struct metrics_value {
	__u64 packets;
	__u64 bytes;
};

/* redirect_last (per-CPU array, one entry): the last skb an isthmus TC program on this
 * CPU returned TC_ACT_REDIRECT for, so the kfree_skb tracer (lib/kdrop.h) can tell a
 * packet the kernel frees while performing that redirect from every other drop. */
struct redirect_slot {
	__u64 skb;		/* the kernel's struct sk_buff *, 0 = none */
	__u64 net;		/* struct net * of the device the program ran on */
	__u32 ifindex;		/* that device */
	__u8 hook;		/* HOOK_* of the program */
	__u8 reserved[3];
};

/* redirect_drops (per-CPU hash): packets and bytes the kernel freed after an isthmus
 * program redirected them, per (kernel drop reason, hook of the program). */
struct redirect_drop_key {
	__u32 reason;		/* enum skb_drop_reason of the running kernel */
	__u8 hook;		/* HOOK_* of the program that redirected the packet */
	__u8 reserved[3];
};

/* Where a program runs; the hook field of metrics_key. */
enum hook {
	HOOK_POD_INGRESS	= 0,	/* TC ingress on a pod-facing host interface */
	HOOK_OVERLAY_EGRESS	= 1,	/* TC egress on isthmus0 (host traffic) */
	HOOK_UNDERLAY_TC	= 2,	/* TC ingress on the underlay device */
	HOOK_UNDERLAY_XDP	= 3,	/* XDP on the underlay device */
	HOOK_UNDERLAY_EGRESS	= 4,	/* TC egress on the underlay device (masquerade) */
	HOOK_WIREGUARD_INGRESS	= 5,	/* TC ingress on the WireGuard device (decrypted GENEVE) */
};

/* Accounted verdicts other than drops; the code field of metrics_key. */
enum metric {
	METRIC_OUT_OF_RANGE	= 0,	/* a code or hook metrics has no slot for (enum metric_slots) */
	METRIC_ENCAP		= 1,	/* pushed GENEVE and sent to a peer */
	METRIC_DECAP		= 2,	/* popped GENEVE from a known peer */
	METRIC_DELIVER_POD	= 3,	/* redirected to a local pod interface */
	METRIC_DELIVER_HOST	= 4,	/* handed to this node's stack through isthmus0 */
	METRIC_FRAG_NEEDED_SENT	= 5,	/* too big for the tunnel, DF: answered with ICMP frag needed */
	METRIC_DELIVER_FABRIC	= 6,	/* decapsulated and handed to the site fabric */
	METRIC_SNAT		= 7,	/* source translated to the tunnel address */
	METRIC_SNAT_REVERSE	= 8,	/* reply translated back to the pod */
	METRIC_SNAT_NEW		= 9,	/* new translation (both directions) inserted */
	METRIC_FABRIC_INGRESS	= 10,	/* overlay packet from the site fabric delivered to a pod */
	METRIC_TRANSIT		= 11,	/* GENEVE forwarded to another peer (gateway) */
	METRIC_TIME_EXCEEDED_SENT = 12,	/* TTL expired here: answered with ICMP time exceeded */
	METRIC_NO_PATH_UNREACH_SENT = 13, /* no live next hop: answered with ICMP net unreachable */
	METRIC_HEALTH_ANSWERED	= 14,	/* health probe answered by the datapath (lib/health.h) */
	METRIC_HEALTH_EXPIRED	= 15,	/* ... with "does not reach": the agent's claim expired */
	METRIC_MASQ		= 16,	/* pod source masqueraded to the underlay address */
	METRIC_MASQ_REVERSE	= 17,	/* reply to a masqueraded flow translated back */
	METRIC_CT_FAST		= 18,	/* established, untranslated TCP: skipped the stack (lib/ct.h) */
	METRIC_WIREGUARD_SENT	= 19,	/* GENEVE for an encrypted peer handed to the WireGuard device */
};

/* Written by underlay_xdp in front of a frame it has popped (XDP metadata), read by
 * underlay_ingress from skb->data_meta, so the TC side delivers without parsing again. */
struct decap_meta {
	__u32 magic;		/* DECAP_META_MAGIC */
	__be32 peer;		/* the peer that sent the frame (decap_meta), as route_value.peer */
};

/* decap_meta.magic: marks metadata written by underlay_xdp ("isth"). */
#define DECAP_META_MAGIC	0x69737468

/* trace_prefixes (LPM trie, key struct route_key): while CFG_F_TRACE is set, a packet
 * whose inner source or destination (behind the outer header on the underlay) falls in
 * one of these emits a trace_event at every decision. Written by `isthmus trace`. */
struct trace_prefix_value {
	__u32 flags;		/* none defined yet */
};

/* trace_events (ring buffer): one record per decision on a traced packet. Addresses
 * and ports are those of the inner packet as it is at the decision (after a rewrite
 * for METRIC_SNAT and METRIC_SNAT_REVERSE); fields a decision does not have are 0. */
struct trace_event {
	__u64 timestamp;	/* bpf_ktime_get_ns() */
	__s32 code;		/* METRIC_* (positive) or DROP_* (negative) */
	__u8 hook;		/* HOOK_* */
	__u8 proto;		/* inner IP protocol */
	__be16 tunnel_sport;	/* outer UDP source port when the packet is GENEVE */
	__u32 ifindex;		/* the interface the program runs on */
	__u32 len;		/* packet length at the decision */
	__be32 saddr;		/* inner IPv4 source */
	__be32 daddr;		/* inner IPv4 destination */
	__be16 sport;		/* inner TCP/UDP ports; 0 for other protocols */
	__be16 dport;
	__be32 peer;		/* encap: the chosen peer; decap: the sender; transit: the next
				 * hop; drops of GENEVE: the outer source (underlay) or
				 * destination (encap hooks) */
	__u32 group;		/* encap, transit: the route's next-hop group, 0 = none */
	__be32 nat_addr;	/* SNAT: the source before; reverse SNAT: the destination before */
	__be16 nat_port;	/* and its port (ICMP: identifier) */
	__u16 reserved;
	__u32 target_ifindex;	/* deliveries: the interface the packet went to */
};

/* Longest site name a health_key holds; a probe naming a longer one is left to the
 * agent's responder. */
#define HEALTH_SITE_MAX		64

/* health_reach (hash): what this node's health responder claims, per (UDP port, site),
 * written by the agent every health interval with a deadline, so the datapath answers
 * probes across an agent restart but stops claiming reach once the agent has been gone
 * for longer than the deadline (lib/health.h, docs/gateways.md). Site "" is the
 * default: the answer for a site without an entry, and for a liveness-only probe. */
struct health_key {
	__be16 port;		/* the responder's UDP port (--health-port) */
	__u16 reserved;
	__u8 site[HEALTH_SITE_MAX];	/* the site's name, zero-padded; "" = the default */
};

/* health_reach_value.flags */
#define HEALTH_F_REACHES	(1 << 0)	/* this node reaches the site */

struct health_reach_value {
	__u64 expires;		/* bpf_ktime_get_ns() (CLOCK_MONOTONIC) deadline of the claim:
				 * after it, every answer says "does not reach" */
	__u32 flags;		/* HEALTH_F_* */
	__u32 reserved;
};

/* health_probers (LRU hash): who probed this node about which site, and when, as the
 * datapath answered them; the agent tells them at once when its reach to the site
 * changes, rather than at their next probe. */
struct health_prober_key {
	__be32 addr;		/* the prober's (inner) IPv4 source */
	__be16 port;		/* its UDP source port */
	__u16 reserved;
	__u8 site[HEALTH_SITE_MAX];	/* the site the probe named, as in health_key */
};

struct health_prober_value {
	__u64 seen;		/* bpf_ktime_get_ns() of its last probe */
};

/* ct_close (LRU hash, lib/ct.h): the close of a conntrack fast-path flow, keyed by the
 * original tuple of its conntrack entry. Written only by FIN and RST segments and by
 * the ACK that finishes a direction; read by every fast-path packet. */
struct ct_close_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

/* ct_close6 (LRU hash, lib/ct.h): ct_close for IPv6 flows, keyed by the same original
 * tuple with IPv6 addresses; the value is struct ct_close_value. */
struct ct_close6_key {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
};

/* Each field by direction d of the sender: [IP_CT_DIR_ORIGINAL], [IP_CT_DIR_REPLY]. One
 * byte a fact, each written whole, so that packets on two CPUs never lose each other's. */
struct ct_close_value {
	__u32 fin_end[2];	/* host order: the sequence number after d's FIN */
	__u8 fin[2];		/* d sent a FIN */
	__u8 acked[2];		/* the other side acknowledged exactly d's FIN */
	__u8 rst[2];		/* d sent a RST its receiver has not refused (yet) */
	__u8 closed;		/* both directions finished: the flow is closed */
	__u8 reserved;
};

/* ct_clock (per-CPU array, one entry, lib/ct.h): this CPU's measure of HZ. */
struct ct_clock {
	__u64 jiffies;		/* bpf_jiffies64() at ns */
	__u64 ns;		/* bpf_ktime_get_ns() of the first reading, 0 = none yet */
	__u32 hz;		/* the tick rate found, 0 = not yet */
	__u32 reserved;
};
