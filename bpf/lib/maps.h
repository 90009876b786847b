/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The pinned maps of docs/architecture.md, with the structs of types.h. */
#pragma once

#include "common.h"

#ifndef ROUTES_MAX
#define ROUTES_MAX		16384
#endif
#ifndef PEERS_MAX
#define PEERS_MAX		4096
#endif
#ifndef PEER_SOURCES_MAX
#define PEER_SOURCES_MAX	16384
#endif
#ifndef POD_IFACES_MAX
#define POD_IFACES_MAX		4096
#endif
#ifndef POD_ADDRS_MAX
#define POD_ADDRS_MAX		16384
#endif
#ifndef NEXTHOP_GROUPS_MAX
#define NEXTHOP_GROUPS_MAX	1024
#endif
#ifndef FABRIC_PREFIXES_MAX
#define FABRIC_PREFIXES_MAX	1024
#endif
#ifndef SNAT_EXEMPT_MAX
#define SNAT_EXEMPT_MAX		1024
#endif
#ifndef MASQ_EXEMPT_MAX
#define MASQ_EXEMPT_MAX		4096
#endif
#ifndef TRACE_PREFIXES_MAX
#define TRACE_PREFIXES_MAX	256
#endif
/* Bytes of the trace ring buffer: a power of two, a multiple of the page size. */
#ifndef TRACE_RINGBUF_SIZE
#define TRACE_RINGBUF_SIZE	(1 << 20)
#endif
#ifndef HEALTH_REACH_MAX
#define HEALTH_REACH_MAX	1024
#endif
#ifndef HEALTH_PROBERS_MAX
#define HEALTH_PROBERS_MAX	4096
#endif
#ifndef REDIRECT_DROPS_MAX
#define REDIRECT_DROPS_MAX	1024
#endif
/* Default size of the nat and masq_nat tables; the agent sets it at load time
 * (--snat-table-size). */
#ifndef NAT_MAX
#define NAT_MAX			65536
#endif
/* Pod sources whose flows nat_sources counts at once (LRU beyond that). */
#ifndef NAT_SOURCES_MAX
#define NAT_SOURCES_MAX		16384
#endif

/* Inner destination prefix -> peer underlay address. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct route_key);
	__type(value, struct route_value);
	__uint(max_entries, ROUTES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} routes SEC(".maps");

/* Inner IPv6 destination prefix -> peer underlay address. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct route6_key);
	__type(value, struct route_value);
	__uint(max_entries, ROUTES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} routes6 SEC(".maps");

/* The 32 bits a known peer goes by (its underlay IPv4, tunnel address or handle) ->
 * peer_value. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __be32);
	__type(value, struct peer_value);
	__uint(max_entries, PEERS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} peers SEC(".maps");

/* IPv6 underlay address of a known peer -> its handle in peers. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct peer6_key);
	__type(value, struct peer6_value);
	__uint(max_entries, PEERS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} peers6 SEC(".maps");

/* (peer, inner source prefix) a peer may send from. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct peer_source_key);
	__type(value, struct peer_source_value);
	__uint(max_entries, PEER_SOURCES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} peer_sources SEC(".maps");

/* (peer, inner IPv6 source prefix) a peer may send from. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct peer_source6_key);
	__type(value, struct peer_source_value);
	__uint(max_entries, PEER_SOURCES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} peer_sources6 SEC(".maps");

/* The node's datapath configuration, one entry at index 0. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct datapath_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} config SEC(".maps");

/* Pod-facing host interfaces (ifindex) that get bpf_redirect_peer delivery. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct pod_iface_value);
	__uint(max_entries, POD_IFACES_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_ifaces SEC(".maps");

/* (host interface, address) of every address the CNI plugin reserved for a pod. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct pod_addr_key);
	__type(value, struct pod_addr_value);
	__uint(max_entries, POD_ADDRS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_addrs SEC(".maps");

/* pod_addrs for IPv6 sources. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct pod_addr6_key);
	__type(value, struct pod_addr_value);
	__uint(max_entries, POD_ADDRS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_addrs6 SEC(".maps");

/* Packets and bytes per (code, hook), per CPU: one slot per pair (enum metric_slots),
 * so that counting is an array index, not a hash lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct metrics_value);
	__uint(max_entries, METRIC_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} metrics SEC(".maps");

/* Next-hop groups by id (0 unused): live members spread over slots. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct nexthop_group);
	__uint(max_entries, NEXTHOP_GROUPS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nexthop_groups SEC(".maps");

/* Inner destinations handed to the site fabric after decapsulation. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct route_key);
	__type(value, struct fabric_prefix_value);
	__uint(max_entries, FABRIC_PREFIXES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fabric_prefixes SEC(".maps");

/* Pod sources that keep their address when they enter the tunnel. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct route_key);
	__type(value, struct snat_exempt_value);
	__uint(max_entries, SNAT_EXEMPT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_exempt SEC(".maps");

/* Destinations a managed pod reaches without egress masquerade. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct route_key);
	__type(value, struct masq_exempt_value);
	__uint(max_entries, MASQ_EXEMPT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} masq_exempt SEC(".maps");

/* Both directions of every flow return-path SNAT translated. Not an LRU: a new flow
 * never evicts a live one; each pod source's share is bounded (nat_sources), and
 * expired entries are removed on reuse and by the agent (docs/architecture.md,
 * "The NAT tables"). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nat_key);
	__type(value, struct nat_value);
	__uint(max_entries, NAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nat SEC(".maps");

/* Both directions of every flow egress masquerade translated, as nat. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nat_key);
	__type(value, struct nat_value);
	__uint(max_entries, NAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} masq_nat SEC(".maps");

/* Flows per (pod source, table) in nat and masq_nat. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct nat_source_key);
	__type(value, struct nat_source_value);
	__uint(max_entries, NAT_SOURCES_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nat_sources SEC(".maps");

/* Prefixes whose packets emit trace events while CFG_F_TRACE is set. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct route_key);
	__type(value, struct trace_prefix_value);
	__uint(max_entries, TRACE_PREFIXES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} trace_prefixes SEC(".maps");

/* struct trace_event records of traced packets, read by `isthmus trace`. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, TRACE_RINGBUF_SIZE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} trace_events SEC(".maps");

/* The health responder's claims per (port, site), refreshed by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct health_key);
	__type(value, struct health_reach_value);
	__uint(max_entries, HEALTH_REACH_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} health_reach SEC(".maps");

/* Nodes the datapath answered a health probe for, per site, LRU-bounded. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct health_prober_key);
	__type(value, struct health_prober_value);
	__uint(max_entries, HEALTH_PROBERS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} health_probers SEC(".maps");

/* Returns the node's config, or NULL if the agent has not written it yet. */
static __always_inline const struct datapath_config *config_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&config, &zero);
}

/* The last skb redirected on this CPU (lib/kdrop.h). Scratch state, pinned so that the
 * programs of a restarted agent and its tracer share it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct redirect_slot);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} redirect_last SEC(".maps");

/* (kernel drop reason, hook) -> packets and bytes freed after our redirect. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct redirect_drop_key);
	__type(value, struct metrics_value);
	__uint(max_entries, REDIRECT_DROPS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} redirect_drops SEC(".maps");

#ifndef CT_CLOSE_MAX
#define CT_CLOSE_MAX		65536
#endif
/* How long a CPU reads the clocks before it trusts its measure of HZ (lib/ct.h). */
#ifndef CT_CLOCK_MIN_NS
#define CT_CLOCK_MIN_NS		200000000ULL
#endif

/* The close of conntrack fast-path flows (lib/ct.h ct_close_track), LRU-bounded.
 * Pinned: conntrack still holds a flow the fast path closed as ESTABLISHED, so a
 * restarted agent that forgot the close would carry its late packets around the
 * stack again and renew its entry to the ESTABLISHED timeout. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_close_key);
	__type(value, struct ct_close_value);
	__uint(max_entries, CT_CLOSE_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ct_close SEC(".maps");

/* ct_close for IPv6 flows, pinned for the same reason. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_close6_key);
	__type(value, struct ct_close_value);
	__uint(max_entries, CT_CLOSE_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ct_close6 SEC(".maps");

/* Each CPU's measure of the kernel's tick rate (lib/ct.h ct_hz). Scratch, unpinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_clock);
	__uint(max_entries, 1);
} ct_clock SEC(".maps");
