/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Next-hop selection: the peer a flow takes on a route, directly or through a group. */
#pragma once

#include "common.h"
#include "maps.h"

_Static_assert((NHG_SLOTS & (NHG_SLOTS - 1)) == 0, "NHG_SLOTS must be a power of two");

/* Returns the underlay address of the peer that flow hash h takes on route rt: rt->peer
 * for a route without a group (the common case: no map lookup), else the member that
 * owns slot h % NHG_SLOTS of nexthop_groups[rt->group]. Returns 0 when the group is
 * missing, has no live member, or the slot is empty: the caller drops with
 * DROP_NO_NEXTHOP. */
static __always_inline __be32 nexthop_select(const struct route_value *rt, __u32 h)
{
	const struct nexthop_group *g;
	__u32 id = rt->group;

	if (likely(!id))
		return rt->peer;
	g = bpf_map_lookup_elem(&nexthop_groups, &id);
	if (!g || !g->live)
		return 0;
	return g->slots[h & (NHG_SLOTS - 1)];
}

/* Returns 1 if route rt has a next hop now: its peer, or a group with a live member.
 * A pod's packet is checked before return-path SNAT translates it, so one refused for
 * lack of a next hop keeps its source (the pod gets the ICMP error) and takes no nat
 * entry. */
static __always_inline int nexthop_any(const struct route_value *rt)
{
	const struct nexthop_group *g;
	__u32 id = rt->group;

	if (likely(!id))
		return rt->peer != 0;
	g = bpf_map_lookup_elem(&nexthop_groups, &id);
	return g && g->live;
}
