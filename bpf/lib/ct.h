/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Kernel conntrack from the datapath: the lookup kfuncs, and the fast path for TCP
 * flows conntrack holds as established and does not translate. docs/architecture.md,
 * "The conntrack fast path". */
#pragma once

#include "common.h"
#include "parse.h"

#ifndef BPF_F_CURRENT_NETNS
#define BPF_F_CURRENT_NETNS	(-1)
#endif

/* The fields of the kernel's structs the fast path reads, as CO-RE views: the loader
 * relocates each access against the running kernel's BTF, so only the names matter.
 * nf_conn must keep its own name (the kfuncs' BTF is matched by kind and name). */
struct nf_tcp_net___isthmus {
	unsigned int timeouts[14];	/* jiffies, by TCP_CONNTRACK_* state: the sysctls */
} __attribute__((preserve_access_index));
struct nf_ip_net___isthmus {
	struct nf_tcp_net___isthmus tcp;
} __attribute__((preserve_access_index));
struct netns_ct___isthmus {
	struct nf_ip_net___isthmus nf_ct_proto;
} __attribute__((preserve_access_index));
struct net___isthmus {
	struct netns_ct___isthmus ct;
} __attribute__((preserve_access_index));
struct ip_ct_tcp___isthmus {
	__u8 state;			/* TCP_CONNTRACK_* */
} __attribute__((preserve_access_index));
union nf_conntrack_proto___isthmus {
	struct ip_ct_tcp___isthmus tcp;
} __attribute__((preserve_access_index));
struct nf_conn {
	__u32 timeout;			/* expiry, in jiffies (32 bits of them) */
	unsigned long status;		/* IPS_* */
	struct {
		struct net___isthmus *net;
	} ct_net;
	union nf_conntrack_proto___isthmus proto;
} __attribute__((preserve_access_index));

/* The conntrack kfuncs (net/netfilter/nf_conntrack_bpf.c). opts is the 12-byte form
 * every kernel since 6.0 accepts. */
struct bpf_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb_ctx, struct bpf_sock_tuple *bpf_tuple,
					 __u32 tuple__sz, struct bpf_ct_opts *opts,
					 __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;
extern int bpf_ct_change_timeout(struct nf_conn *nfct, __u32 timeout) __ksym;

/* enum tcp_conntrack and enum ip_conntrack_status (uapi nf_conntrack_common.h). */
#define TCP_CONNTRACK_ESTABLISHED	3
#define TCP_CONNTRACK_TIME_WAIT		7
#define TCP_CONNTRACK_CLOSE		8
#define IPS_ASSURED			(1 << 2)
#define IPS_CONFIRMED			(1 << 3)
#define IPS_SRC_NAT			(1 << 4)
#define IPS_DST_NAT			(1 << 5)
#define IPS_SEQ_ADJUST			(1 << 6)
#define IPS_DYING			(1 << 9)
#define IPS_OFFLOAD			(1 << 14)

/* What conntrack says about a packet's flow. */
enum ct_verdict {
	CT_NONE = 0,	/* no entry: a flow this node's stack never saw */
	CT_STACK,	/* an entry: the packet goes through the stack, which keeps it */
	CT_FAST,	/* an established, untranslated TCP entry: the packet skips the stack */
};

/* Returns 1 if conntrack entry ct may take the fast path: TCP, established, confirmed
 * and assured (conntrack saw the handshake both ways), no address or port translation
 * (kube-proxy's DNAT, a SNAT or MASQUERADE: only the stack reverses those), no
 * sequence adjustment (a NAT helper), not dying, not offloaded to a flowtable. */
static __always_inline int ct_fast_eligible(const struct nf_conn *ct)
{
	unsigned long status = ct->status;

	return ct->proto.tcp.state == TCP_CONNTRACK_ESTABLISHED &&
	       (status & (IPS_CONFIRMED | IPS_ASSURED)) == (IPS_CONFIRMED | IPS_ASSURED) &&
	       !(status & (IPS_SRC_NAT | IPS_DST_NAT | IPS_SEQ_ADJUST | IPS_DYING | IPS_OFFLOAD));
}

/* Sets entry ct to expire j jiffies from now. The kfunc takes milliseconds and the
 * kernel's tick rate is in no header a BPF program can rely on (a kconfig extern needs
 * a config file the agent's container may not have), so it is measured on the entry:
 * one second set, the jiffies it came to read back. Within a tick of j. */
static __always_inline void ct_set_expiry(struct nf_conn *ct, unsigned int j)
{
	__s32 hz;

	bpf_ct_change_timeout(ct, 1000);
	hz = (__s32)(ct->timeout - (__u32)bpf_jiffies64());
	if (hz > 0)
		bpf_ct_change_timeout(ct, (__u64)j * 1000 / hz);
}

/* Keeps entry ct alive as conntrack would for a fast-path packet th, in this netns's
 * own timeouts (the nf_conntrack_tcp_timeout_* sysctls, in jiffies): a FIN or RST
 * shortens what is left to the TIME_WAIT timeout (a FIN) or the CLOSE timeout (a RST),
 * never lengthens it; any other packet renews the ESTABLISHED timeout, unless a FIN or
 * RST has shortened the entry (what is left is at most the TIME_WAIT timeout) or less
 * than 1/64 of it has passed since the last renewal (a write now and then, not one a
 * packet: with the default 5 days, one every 112 minutes). */
static __always_inline void ct_fast_refresh(struct nf_conn *ct, const struct tcphdr *th)
{
	const unsigned int *timeouts = ct->ct_net.net->ct.nf_ct_proto.tcp.timeouts;
	__s64 left = (__s32)(ct->timeout - (__u32)bpf_jiffies64());
	unsigned int est = timeouts[TCP_CONNTRACK_ESTABLISHED];
	unsigned int tw = timeouts[TCP_CONNTRACK_TIME_WAIT];
	unsigned int want;

	if (th->rst || th->fin) {
		want = th->rst ? timeouts[TCP_CONNTRACK_CLOSE] : tw;
		if (left > want)
			ct_set_expiry(ct, want);
		return;
	}
	if (left <= tw || left > est - est / 64)
		return;
	ct_set_expiry(ct, est);
}

/* Returns what conntrack holds for the TCP or UDP flow of iph (l4 its transport
 * header), in either direction: CT_NONE for no entry (also another protocol, a fragment,
 * or ports past data_end), CT_FAST for an entry ct_fast_eligible accepts (renewed by
 * ct_fast_refresh), else CT_STACK. */
static __always_inline enum ct_verdict ct_lookup(struct __sk_buff *skb, const struct iphdr *iph,
						 void *l4, void *data_end)
{
	struct bpf_ct_opts opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = iph->protocol };
	struct bpf_sock_tuple t = {};
	enum ct_verdict v = CT_STACK;
	struct tcphdr *th = l4;
	struct nf_conn *ct;
	__be16 *ports = l4;

	if ((iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP) ||
	    ipv4_is_fragment(iph))
		return CT_NONE;
	if ((void *)(ports + 2) > data_end)
		return CT_NONE;
	t.ipv4.saddr = iph->saddr;
	t.ipv4.daddr = iph->daddr;
	t.ipv4.sport = ports[0];
	t.ipv4.dport = ports[1];
	ct = bpf_skb_ct_lookup(skb, &t, sizeof(t.ipv4), &opts, sizeof(opts));
	if (!ct)
		return CT_NONE;
	if (iph->protocol == IPPROTO_TCP && (void *)(th + 1) <= data_end && ct_fast_eligible(ct)) {
		ct_fast_refresh(ct, th);
		v = CT_FAST;
	}
	bpf_ct_release(ct);
	return v;
}
