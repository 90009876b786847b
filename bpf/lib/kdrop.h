/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Drops after the program returned: the TC programs note the skb they redirect, and a
 * tp_btf/kfree_skb tracer counts it, per kernel drop reason, if the kernel frees it
 * while performing the redirect (docs/metrics.md, "Drops after a redirect"). */
#pragma once

#include "common.h"
#include "maps.h"
#include "metrics.h"

/* The few kernel fields the tracer reads, relocated by CO-RE against the running
 * kernel's BTF (the ___kdrop suffix is dropped when matching). */
struct net;

struct net_device___kdrop {
	int ifindex;
	struct {
		struct net *net;
	} nd_net;
} __attribute__((preserve_access_index));

struct sk_buff___kdrop {
	struct net_device___kdrop *dev;
	unsigned int len;
} __attribute__((preserve_access_index));

/* Returns the kernel's struct sk_buff behind a TC program's context. */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* Returns this CPU's redirect slot (never NULL in practice: a one-entry array). */
static __always_inline struct redirect_slot *redirect_last_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&redirect_last, &zero);
}

/* Records, at the exit of a TC program at hook that owns the skb's life so far (an
 * ingress, or isthmus0's egress), what the kernel is to do with it: if verdict is
 * TC_ACT_REDIRECT, the skb, so that the tracer can recognise it; otherwise nothing
 * (the slot is cleared, so a later skb that reuses a stale pointer is not mistaken for
 * it). Returns verdict. */
static __always_inline int redirect_note(struct __sk_buff *skb, int verdict, __u8 hook)
{
	struct redirect_slot *slot = redirect_last_get();
	struct sk_buff___kdrop *kskb;
	struct net_device___kdrop *dev;

	if (!slot)
		return verdict;
	if (verdict != TC_ACT_REDIRECT) {
		/* A read is cheaper than dirtying the slot's line on every packet. */
		if (slot->skb)
			slot->skb = 0;
		return verdict;
	}
	kskb = bpf_cast_to_kern_ctx(skb);
	dev = kskb->dev;
	slot->skb = (__u64)kskb;
	slot->net = dev ? (__u64)dev->nd_net.net : 0;
	slot->ifindex = skb->ifindex;
	slot->hook = hook;
	return verdict;
}

/* Adds one packet of len bytes freed with the kernel's reason after a redirect at hook. */
static __always_inline void redirect_drop_count(__u32 reason, __u8 hook, __u64 len)
{
	struct redirect_drop_key key = { .reason = reason, .hook = hook };

	counter_add(&redirect_drops, &key, len);
}

/* The kfree_skb tracer's body: skb is being freed with reason. Counts it if it is the
 * skb this CPU's last redirect sent and it is still in the redirect's hands: on a
 * device of the namespace the program ran in, and not handed to the stack through
 * isthmus0 (the host's own drops there, such as NO_SOCKET, are not losses of ours).
 * Every other kfree_skb on the machine costs one map lookup and one compare. */
static __always_inline void kdrop_on_kfree_skb(struct sk_buff___kdrop *skb, __u32 reason)
{
	struct redirect_slot *slot = redirect_last_get();
	const struct datapath_config *cfg;
	struct net_device___kdrop *dev;
	int ifindex;

	if (!slot || slot->skb != (__u64)skb)
		return;
	/* It dies here whatever we decide: never match it again. */
	slot->skb = 0;
	dev = skb->dev;
	if (!dev || (__u64)dev->nd_net.net != slot->net)
		return;
	ifindex = dev->ifindex;
	if (ifindex != slot->ifindex) {
		cfg = config_get();
		if (cfg && ifindex == cfg->overlay_ifindex)
			return;
	}
	redirect_drop_count(reason, slot->hook, skb->len);
}
