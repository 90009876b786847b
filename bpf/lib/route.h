/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Route lookups: the routes map, with its exceptions (ROUTE_F_UNDERLAY) read as misses,
 * and for a pod's packets its routes for forwarded packets (ROUTE_F_NOT_FOR_PODS) too. */
#pragma once

#include "common.h"
#include "maps.h"

/* Returns the route that tunnels daddr, or NULL when none does: no prefix holds it, or
 * the longest one is an exception (ROUTE_F_UNDERLAY), which leaves daddr to the kernel
 * and the underlay whatever a shorter route says. Every reader of routes goes through
 * here, so an exception is never taken for a tunnel route. */
static __always_inline const struct route_value *route_lookup(__be32 daddr)
{
	struct route_key key = { .prefixlen = 32, .addr = daddr };
	const struct route_value *rt = bpf_map_lookup_elem(&routes, &key);

	if (rt && (rt->flags & ROUTE_F_UNDERLAY))
		return NULL;
	return rt;
}

/* Returns the route that tunnels a pod's packet to daddr: route_lookup's, unless that
 * one serves forwarded packets only (ROUTE_F_NOT_FOR_PODS), which leaves the packet to
 * the kernel's routes as it leaves them out of the pods' table. */
static __always_inline const struct route_value *pod_route_lookup(__be32 daddr)
{
	const struct route_value *rt = route_lookup(daddr);

	if (rt && (rt->flags & ROUTE_F_NOT_FOR_PODS))
		return NULL;
	return rt;
}

/* route_lookup for an IPv6 inner destination (routes6). */
static __always_inline const struct route_value *route_lookup6(const __be32 daddr[4])
{
	struct route6_key key = { .prefixlen = 128 };
	const struct route_value *rt;

	__builtin_memcpy(key.addr, daddr, sizeof(key.addr));
	rt = bpf_map_lookup_elem(&routes6, &key);
	if (rt && (rt->flags & ROUTE_F_UNDERLAY))
		return NULL;
	return rt;
}

/* pod_route_lookup for an IPv6 inner destination. */
static __always_inline const struct route_value *pod_route_lookup6(const __be32 daddr[4])
{
	const struct route_value *rt = route_lookup6(daddr);

	if (rt && (rt->flags & ROUTE_F_NOT_FOR_PODS))
		return NULL;
	return rt;
}
