// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* isthmus datapath: GENEVE encapsulation (pod_ingress, overlay_egress) and
 * decapsulation (underlay_ingress, underlay_xdp). The logic lives in lib/; this file
 * only wires it to the hooks. docs/architecture.md is the contract. */

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/metrics.h"

/* Never called: its signature puts decap_meta and the hook, metric and drop_reason
 * enums into the object's BTF, where bpf2go (-type) and the BTF tests find them. A
 * global function in .text that no program calls is not loaded. */
__attribute__((noinline)) int isthmus_btf_types(struct decap_meta *meta, enum hook hook,
						enum metric metric, enum drop_reason reason)
{
	return 0;
}

SEC("tc")
int pod_ingress(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

SEC("tc")
int overlay_egress(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

SEC("tc")
int underlay_ingress(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

SEC("xdp")
int underlay_xdp(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
