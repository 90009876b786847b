// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* isthmus datapath: GENEVE encapsulation (pod_ingress, overlay_egress) and
 * decapsulation (underlay_ingress, underlay_xdp; wireguard_ingress for encrypted
 * peers), and delivery of overlay packets the site fabric hands over
 * (underlay_ingress). The logic lives in lib/; this file
 * only wires it to the hooks. docs/architecture.md is the contract. */

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/metrics.h"
#include "lib/trace.h"
#include "lib/encap.h"
#include "lib/decap.h"
#include "lib/nopath.h"
#include "lib/masq.h"
#include "lib/kdrop.h"

/* Never called: its signature puts decap_meta, trace_event and the hook, metric and
 * drop_reason enums into the object's BTF, where bpf2go (-type) and the BTF tests find them. A
 * global function in .text that no program calls is not loaded. */
__attribute__((noinline)) int isthmus_btf_types(struct decap_meta *meta, enum hook hook,
						enum metric metric, enum drop_reason reason,
						enum nat_state state)
{
	return 0;
}

/* Never called either: puts metrics_key (what a slot of the metrics array counts) and
 * enum metric_slots (its shape) into the BTF. */
__attribute__((noinline)) int isthmus_btf_metrics_types(struct metrics_key *key, enum metric_slots slots)
{
	return 0;
}

/* Never called either: puts trace_event (only ever a ring buffer record) into the BTF. */
__attribute__((noinline)) int isthmus_btf_trace_types(struct trace_event *ev)
{
	return 0;
}

SEC("tc")
int pod_ingress(struct __sk_buff *skb)
{
	int ret = handle_encap(skb, 1, HOOK_POD_INGRESS);

	if (ret == DROP_NO_NEXTHOP)
		ret = tc_drop_no_path(skb, HOOK_POD_INGRESS);
	else if (ret < 0)
		ret = tc_drop(skb, ret, HOOK_POD_INGRESS);
	return redirect_note(skb, ret, HOOK_POD_INGRESS);
}

SEC("tc")
int overlay_egress(struct __sk_buff *skb)
{
	int ret = handle_encap(skb, 0, HOOK_OVERLAY_EGRESS);

	if (ret < 0)
		ret = tc_drop(skb, ret, HOOK_OVERLAY_EGRESS);
	return redirect_note(skb, ret, HOOK_OVERLAY_EGRESS);
}

SEC("tc")
int underlay_ingress(struct __sk_buff *skb)
{
	const struct datapath_config *cfg = config_get();
	int ret;

	/* No config yet: not ours to judge. Never cut a node off its underlay. */
	if (!cfg)
		return redirect_note(skb, TC_ACT_OK, HOOK_UNDERLAY_TC);
	if (tc_xdp_decapped(skb)) {
		ret = DROP_DECAP_FAILED;	/* passed on, it would reach the underlay's stack */
		if (!pull_xdp_popped_headers(skb)) {
			tcp_clamp_mss(skb, cfg->tunnel_mtu);
			ret = deliver_decapped(skb, cfg, HOOK_UNDERLAY_TC);
		}
	} else {
		ret = tc_decap(skb, cfg, 0, HOOK_UNDERLAY_TC);
		/* Not GENEVE for us: a reply to a masqueraded flow (the stack takes it to
		 * the pod), or an overlay packet the site fabric delivers. */
		if (ret == TC_ACT_OK) {
			ret = masq_reverse(skb, cfg, HOOK_UNDERLAY_TC);
			if (ret == 0)
				ret = fabric_ingress(skb, cfg, HOOK_UNDERLAY_TC);
			else if (ret > 0)
				ret = TC_ACT_OK;
		}
	}
	if (ret < 0)
		ret = tc_drop(skb, ret, HOOK_UNDERLAY_TC);
	return redirect_note(skb, ret, HOOK_UNDERLAY_TC);
}

/* GENEVE of encrypted peers, decrypted by WireGuard (lib/wireguard.h). Fails closed:
 * without config, or for anything that is not such GENEVE, the packet is dropped. */
SEC("tc")
int wireguard_ingress(struct __sk_buff *skb)
{
	const struct datapath_config *cfg = config_get();
	int ret = cfg ? tc_wireguard_decap(skb, cfg, HOOK_WIREGUARD_INGRESS) : DROP_NO_CONFIG;

	if (ret < 0)
		ret = tc_drop(skb, ret, HOOK_WIREGUARD_INGRESS);
	return redirect_note(skb, ret, HOOK_WIREGUARD_INGRESS);
}

/* No redirect_note: a packet another program redirected to the underlay passes here
 * on its way out, and its note must survive until the device has it. */
SEC("tc")
int underlay_egress(struct __sk_buff *skb)
{
	/* A declared pod's packet the stack routed here for its site's gateways
	 * (lib/encap.h), or a managed pod's to masquerade (lib/masq.h): never both. */
	int ret = fabric_egress(skb, HOOK_UNDERLAY_EGRESS);

	if (ret == TC_ACT_OK)
		ret = masq_egress(skb, HOOK_UNDERLAY_EGRESS);

	return ret < 0 ? tc_drop(skb, ret, HOOK_UNDERLAY_EGRESS) : ret;
}

SEC("xdp")
int underlay_xdp(struct xdp_md *ctx)
{
	const struct datapath_config *cfg = config_get();
	int ret;

	if (!cfg)
		return XDP_PASS;
	ret = xdp_decap(ctx, cfg, HOOK_UNDERLAY_XDP);
	return ret < 0 ? xdp_drop(ctx, ret, HOOK_UNDERLAY_XDP) : ret;
}

/* Every skb the kernel frees with a drop reason, on every device of the machine: counts
 * the ones an isthmus program redirected and the kernel then lost (lib/kdrop.h). The
 * tracepoint's arguments (6.18): skb, location, reason, rx_sk. */
SEC("tp_btf/kfree_skb")
int kfree_skb_after_redirect(__u64 *ctx)
{
	kdrop_on_kfree_skb((struct sk_buff___kdrop *)ctx[0], (__u32)ctx[2]);
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
