/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What a pod may send: only from its own addresses, and no GENEVE to a peer's tunnel
 * endpoint. Checked at pod_ingress before any other decision. */
#pragma once

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "fib.h"

/* Returns 0 if the pod behind the interface the packet arrived on (skb->ifindex) may
 * send iph, whose L4 header starts at l4 (data_end bounds the linear part), or a
 * negative DROP_*:
 * DROP_POD_SRC_NOT_RESERVED, on an interface the CNI plugin made
 * (POD_IFACE_F_RESERVED), when the source is not among the addresses it reserved
 * for that interface (pod_addrs): what the plugin knows, not what a route says.
 * DROP_POD_SRC_SPOOFED, on any other interface, when the source does not route back
 * through it.
 * This is strict rp_filter (RFC 3704) done by the program, because bpf_redirect_peer
 * and the encapsulation redirect skip the interface's own rp_filter. The FIB is the
 * one source that holds every pod, managed or not: isthmus and every routed CNI
 * (Azure CNI, Calico, Cilium in native routing) install a /32 (or the pod's prefix)
 * route through the pod's host interface, and an address the pod does not own has
 * none. BPF_FIB_LOOKUP_SKIP_NEIGH: a pod whose neighbour entry expired still owns its
 * address.
 * DROP_POD_GENEVE for UDP to port 6081 of a known peer: the peer would take it as a
 * tunnel frame from this node once something (another CNI's masquerade) rewrites the
 * source to the node's address, and any inner source would reach its pods. */
static __always_inline int pod_source_check(struct __sk_buff *skb, const struct datapath_config *cfg,
					    const struct iphdr *iph, const void *l4, const void *data_end)
{
	const struct udphdr *udp = l4;
	const struct pod_iface_value *pi;
	struct bpf_fib_lookup p;
	__be32 daddr = iph->daddr;
	__u32 ifindex = skb->ifindex;
	int rc;

	pi = bpf_map_lookup_elem(&pod_ifaces, &ifindex);
	if (pi && (pi->flags & POD_IFACE_F_RESERVED)) {
		struct pod_addr_key k = { .ifindex = ifindex, .addr = iph->saddr };

		if (!bpf_map_lookup_elem(&pod_addrs, &k))
			return DROP_POD_SRC_NOT_RESERVED;
	} else {
		/* Behind a bridge the main table alone would take the node's own
		 * address on it for a pod's (fib_lookup_v4_fast): the whole FIB decides. */
		rc = fib_lookup_v4_fast(skb, pod_iface_peer(pi) ? cfg : NULL, &p, daddr, iph->saddr,
					0, 0, ifindex, BPF_FIB_LOOKUP_SKIP_NEIGH, ifindex);
		/* FRAG_NEEDED still names the route: the helper also weighs the skb against
		 * that device's MTU, and a datagram a bridge's netfilter reassembled from the
		 * pod's fragments is longer than the pod's MTU, yet its source is the pod's. */
		if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_FRAG_NEEDED) ||
		    p.ifindex != ifindex)
			return DROP_POD_SRC_SPOOFED;
	}

	/* A later fragment carries no ports; without its first one it reassembles to
	 * nothing, so only offset 0 needs the check. */
	if (iph->protocol != IPPROTO_UDP || (iph->frag_off & bpf_htons(IP_OFFSET)))
		return 0;
	/* Only the ports are read (ENCAP_PULL_L4 made them linear when present). */
	if ((void *)udp + 4 > data_end)
		return 0;
	if (udp->dest == bpf_htons(GENEVE_PORT) && bpf_map_lookup_elem(&peers, &daddr))
		return DROP_POD_GENEVE;
	return 0;
}

/* Returns DROP_POD_GENEVE if the IPv6 packet ip6h (its first next header at l4,
 * data_end bounding the linear part) is UDP to port 6081 of a peer on the IPv6
 * underlay (peers6), as pod_source_check refuses for IPv4 peers; else 0. */
static __always_inline int pod_geneve_check6(const struct ip6_hdr *ip6h, const void *l4,
					     const void *data_end)
{
	const struct udphdr *udp = l4;
	struct peer6_key k;

	if (ip6h->nexthdr != IPPROTO_UDP || (void *)udp + 4 > data_end ||
	    udp->dest != bpf_htons(GENEVE_PORT))
		return 0;
	__builtin_memcpy(k.addr, ip6h->daddr, sizeof(k.addr));
	return bpf_map_lookup_elem(&peers6, &k) ? DROP_POD_GENEVE : 0;
}

/* pod_source_check for IPv6: only the pod's own sources pass, as for IPv4. Link-scoped sources (ipv6_link_scoped) pass: they stay on the pod's
 * link. On the CNI plugin's interfaces the source must be one it reserved for the
 * interface (pod_addrs6), else DROP_POD_SRC_NOT_RESERVED; on any other, it must route
 * back through the interface, else DROP_POD_SRC_SPOOFED, which is also the answer when
 * the node does not forward IPv6 from that interface (nothing then tells the pod's
 * sources apart). Returns 0 or a negative DROP_*. */
static __always_inline int pod_source_check6(struct __sk_buff *skb, const struct ip6_hdr *ip6h)
{
	const __be32 any[4] = {};
	const struct pod_iface_value *pi;
	struct bpf_fib_lookup p;
	__u32 ifindex = skb->ifindex;
	int rc;

	if (ipv6_link_scoped(ip6h->saddr))
		return 0;
	pi = bpf_map_lookup_elem(&pod_ifaces, &ifindex);
	if (pi && (pi->flags & POD_IFACE_F_RESERVED)) {
		struct pod_addr6_key k = { .ifindex = ifindex };

		__builtin_memcpy(k.addr, ip6h->saddr, sizeof(k.addr));
		if (!bpf_map_lookup_elem(&pod_addrs6, &k))
			return DROP_POD_SRC_NOT_RESERVED;
		return 0;
	}
	/* The reverse route, from the destination, as strict rp_filter looks it up;
	 * from nowhere in particular for a destination on the link (the pod's
	 * gateway fe80::1, neighbour discovery's multicast), for which the kernel
	 * refuses any lookup (NOT_FWDED). */
	fib_params_v6(&p, ipv6_link_scoped(ip6h->daddr) || ipv6_multicast(ip6h->daddr) ? any : ip6h->daddr,
		      ip6h->saddr, 0, ifindex);
	rc = bpf_fib_lookup(skb, &p, sizeof(p), BPF_FIB_LOOKUP_SKIP_NEIGH);
	if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_FRAG_NEEDED) ||
	    p.ifindex != ifindex)
		return DROP_POD_SRC_SPOOFED;
	return 0;
}
