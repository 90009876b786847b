/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Kernel conntrack from the datapath: the lookup kfuncs, and the fast path for TCP
 * flows conntrack holds as established and does not translate. docs/architecture.md,
 * "The conntrack fast path". */
#pragma once

#include "common.h"
#include "parse.h"
#include "maps.h"

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
union nf_inet_addr___isthmus {
	__be32 ip;
	__be32 ip6[4];
} __attribute__((preserve_access_index));
union nf_conntrack_man_proto___isthmus {
	__be16 all;			/* the port, for TCP */
} __attribute__((preserve_access_index));
struct nf_conntrack_man___isthmus {
	union nf_inet_addr___isthmus u3;
	union nf_conntrack_man_proto___isthmus u;
} __attribute__((preserve_access_index));
/* One direction's tuple as conntrack holds it: the addresses and ports a packet of
 * that direction carries (after translation for the reply direction). */
struct nf_conntrack_tuple___isthmus {
	struct nf_conntrack_man___isthmus src;
	struct {
		union nf_inet_addr___isthmus u3;
		union {
			__be16 all;
		} u;
	} dst;
} __attribute__((preserve_access_index));
struct nf_conntrack_tuple_hash___isthmus {
	struct nf_conntrack_tuple___isthmus tuple;
} __attribute__((preserve_access_index));
struct nf_conn {
	__u32 timeout;			/* expiry, in jiffies (32 bits of them) */
	/* [IP_CT_DIR_ORIGINAL], [IP_CT_DIR_REPLY] */
	struct nf_conntrack_tuple_hash___isthmus tuplehash[2];
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
#define IP_CT_DIR_ORIGINAL		0
#define IP_CT_DIR_REPLY			1
#define IPS_ASSURED			(1 << 2)
#define IPS_CONFIRMED			(1 << 3)
#define IPS_SRC_NAT			(1 << 4)
#define IPS_DST_NAT			(1 << 5)
#define IPS_SEQ_ADJUST			(1 << 6)
#define IPS_DYING			(1 << 9)
#define IPS_OFFLOAD			(1 << 14)

/* Returns 1 if conntrack entry ct of family v6 (1: IPv6) may take the fast path: TCP,
 * established, confirmed and assured (conntrack saw the handshake both ways), not
 * dying, not offloaded to a flowtable, no sequence adjustment (a NAT helper), and
 * untranslated: no SRC_NAT or DST_NAT status bit, and the original tuple is the
 * inverse of the reply tuple (addresses and ports). The bits alone do not say it: IPVS
 * rewrites the reply tuple without setting either, and only the stack reverses any
 * translation. */
static __always_inline int ct_fast_eligible(const struct nf_conn *ct, int v6)
{
	const struct nf_conntrack_tuple___isthmus *o = &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple;
	const struct nf_conntrack_tuple___isthmus *r = &ct->tuplehash[IP_CT_DIR_REPLY].tuple;
	unsigned long status = ct->status;
	int i;

	if (ct->proto.tcp.state != TCP_CONNTRACK_ESTABLISHED ||
	    (status & (IPS_CONFIRMED | IPS_ASSURED)) != (IPS_CONFIRMED | IPS_ASSURED) ||
	    (status & (IPS_SRC_NAT | IPS_DST_NAT | IPS_SEQ_ADJUST | IPS_DYING | IPS_OFFLOAD)))
		return 0;
	if (o->src.u.all != r->dst.u.all || o->dst.u.all != r->src.u.all)
		return 0;
	if (!v6)
		return o->src.u3.ip == r->dst.u3.ip && o->dst.u3.ip == r->src.u3.ip;
#pragma unroll
	for (i = 0; i < 4; i++)
		if (o->src.u3.ip6[i] != r->dst.u3.ip6[i] || o->dst.u3.ip6[i] != r->src.u3.ip6[i])
			return 0;
	return 1;
}

/* Returns the tick rate that explains one reading of jiffies j at CLOCK_MONOTONIC ns,
 * or 0 if none does alone. Linux starts jiffies at INITIAL_JIFFIES, (u32)(-300 * HZ),
 * when the monotonic clock starts at 0, and ticks HZ times a second of it; only the
 * right rate predicts j within half a second. Close to 300 s of uptime the rates
 * predict nearly the same count and none is taken. */
static __always_inline __u32 ct_hz_from_boot(__u64 j, __u64 ns)
{
	static const __u32 rates[] = { 100, 250, 300, 1000 };
	__u32 found = 0;
	int i;

#pragma unroll
	for (i = 0; i < 4; i++) {
		__u64 c = rates[i];
		__s64 err = (__s64)(j - ((1ULL << 32) - 300 * c + ns * c / 1000000000ULL));

		if (err < 0)
			err = -err;
		if (err < (__s64)(c / 2)) {
			if (found)
				return 0;
			found = c;
		}
	}
	return found;
}

/* Returns the kernel's tick rate as this CPU measured it, or 0 while it does not know
 * it yet. The kfunc that sets an expiry takes milliseconds, the sysctls are in jiffies,
 * and HZ is in no header a BPF program can rely on (a kconfig extern needs a config
 * file the agent's container may not have). So each CPU takes a reading of jiffies
 * and CLOCK_MONOTONIC (ct_clock): from its offset since boot (ct_hz_from_boot) at once
 * where that is unambiguous, else once 200 ms have passed since it, from the two
 * differences, rounded to the nearest rate Linux builds with (100, 250, 300 or 1000). Nothing is written to a conntrack entry to find it, so no other packet can
 * observe a value set only to measure. ct_close_track calls it for every fast-path
 * packet, so the measure is taken while a flow runs, not when an expiry is due. */
static __always_inline __u32 ct_hz(void)
{
	struct ct_clock *c;
	__u64 ns, j, dns, hz;
	__u32 zero = 0;

	c = bpf_map_lookup_elem(&ct_clock, &zero);
	if (!c)
		return 0;
	if (likely(c->hz))
		return c->hz;
	ns = bpf_ktime_get_ns();
	j = bpf_jiffies64();
	if (!c->ns) {
		c->ns = ns;
		c->jiffies = j;
		c->hz = ct_hz_from_boot(j, ns);
		return c->hz;
	}
	dns = ns - c->ns;
	if (dns < CT_CLOCK_MIN_NS)
		return 0;
	hz = (j - c->jiffies) * 1000000000ULL / dns;
	if (hz >= 90 && hz <= 110)
		c->hz = 100;
	else if (hz >= 235 && hz <= 265)
		c->hz = 250;
	else if (hz >= 285 && hz <= 315)
		c->hz = 300;
	else if (hz >= 950 && hz <= 1050)
		c->hz = 1000;
	else {
		c->ns = ns;	/* a reading across a stall: start again */
		c->jiffies = j;
	}
	return c->hz;
}

/* Sets entry ct to expire j jiffies from now, with one write. While this CPU does not
 * know HZ yet (ct_hz, the first 200 ms it runs the fast path) it converts as if HZ
 * were 100, the lowest rate: the expiry is then at least j jiffies, never shorter
 * than asked, and the next renewal corrects it. */
static __always_inline void ct_set_expiry(struct nf_conn *ct, unsigned int j)
{
	__u32 hz = ct_hz();
	__u64 ms = (__u64)j * 1000 / (hz ? hz : 100);

	bpf_ct_change_timeout(ct, ms > 0xffffffffULL ? 0xffffffff : (__u32)ms);
}

/* Returns the timeouts of ct's netns, in jiffies, by TCP_CONNTRACK_* state (the
 * nf_conntrack_tcp_timeout_* sysctls). */
static __always_inline const unsigned int *ct_timeouts(const struct nf_conn *ct)
{
	return ct->ct_net.net->ct.nf_ct_proto.tcp.timeouts;
}

/* Returns the key of ct in ct_close: its original tuple. */
static __always_inline struct ct_close_key ct_close_key_of(const struct nf_conn *ct)
{
	const struct nf_conntrack_tuple___isthmus *o = &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple;
	struct ct_close_key k = {
		.saddr = o->src.u3.ip,
		.daddr = o->dst.u3.ip,
		.sport = o->src.u.all,
		.dport = o->dst.u.all,
	};

	return k;
}

/* Returns the key of the IPv6 entry ct in ct_close6: its original tuple. */
static __always_inline struct ct_close6_key ct_close6_key_of(const struct nf_conn *ct)
{
	const struct nf_conntrack_tuple___isthmus *o = &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple;
	struct ct_close6_key k = {
		.sport = o->src.u.all,
		.dport = o->dst.u.all,
	};
	int i;

#pragma unroll
	for (i = 0; i < 4; i++) {
		k.saddr[i] = o->src.u3.ip6[i];
		k.daddr[i] = o->dst.u3.ip6[i];
	}
	return k;
}

/* Returns 1 if close record cv (NULL: none) says the fast path ended its flow: FINs
 * both ways acknowledged, or a RST its receiver has not refused. */
static __always_inline int ct_close_ended(const struct ct_close_value *cv)
{
	return cv && (cv->closed || cv->rst[0] || cv->rst[1]);
}

/* A bare SYN (SYN without ACK) on the tuple of entry ct (of family v6), which the
 * stack will judge. If the fast path ended the flow (ct_close_ended), the entry is
 * expired now (timeout 0: the stack's lookup treats it as gone and conntrack starts a
 * NEW flow, which the site's filters judge). Without this the entry, still ESTABLISHED
 * for conntrack because the fast path carried the close, would make conntrack ignore
 * the SYN and call it ESTABLISHED. */
static __always_inline void ct_close_reopen(struct nf_conn *ct, int v6)
{
	if (v6) {
		struct ct_close6_key k = ct_close6_key_of(ct);

		if (!ct_close_ended(bpf_map_lookup_elem(&ct_close6, &k)))
			return;
		bpf_ct_change_timeout(ct, 0);
		bpf_map_delete_elem(&ct_close6, &k);
	} else {
		struct ct_close_key k = ct_close_key_of(ct);

		if (!ct_close_ended(bpf_map_lookup_elem(&ct_close, &k)))
			return;
		bpf_ct_change_timeout(ct, 0);
		bpf_map_delete_elem(&ct_close, &k);
	}
}

/* Tracks the close of the fast-path flow of entry ct (ct_fast_eligible) for a packet
 * th (not a SYN) sent in direction dir (IP_CT_DIR_*) with payload bytes of TCP
 * payload, on its close record cv (NULL: none; a new one is written to nv and *create
 * set, for the caller to insert), and keeps the entry alive as conntrack would, in
 * this netns's timeouts. Returns 1 if the packet takes the fast path, 0 if the flow
 * was closed on the fast path (the stack judges what still comes).
 *
 * A packet outside the window must not be able to shorten or end a flow, so nothing is
 * taken on a segment's word alone. Only FIN and RST segments create an entry of
 * ct_close, keyed by the original tuple; every other packet only reads it (and writes
 * it once, for the ACK that finishes a direction or refuses a RST). A RST shortens the
 * entry to the CLOSE timeout and records its direction; a later non-RST packet from its
 * receiver shows the receiver refused it (Linux drops an out-of-window RST and answers
 * an in-window inexact one with a challenge ACK, RFC 5961), clears it and renews the
 * entry; a RST accepted leaves the receiver silent and the entry expires. A FIN records
 * its end sequence (seq + payload + 1); only an ACK of exactly that from the other side
 * (which a receiver that did not accept the FIN never sends) marks that direction
 * finished and caps the entry at the TIME_WAIT timeout; with both finished the flow is
 * closed. Renewal otherwise: to the ESTABLISHED timeout (TIME_WAIT once a direction has
 * finished) when less than 63/64 of it is left, so an established flow writes its entry
 * about once in 1/64 of the timeout, never once a packet; a pending RST renews nothing. */
static __always_inline int ct_close_step(struct nf_conn *ct, __u8 dir, const struct tcphdr *th,
					 __s32 payload, struct ct_close_value *cv,
					 struct ct_close_value *nv, int *create)
{
	const unsigned int *timeouts = ct_timeouts(ct);
	__s64 left = (__s32)(ct->timeout - (__u32)bpf_jiffies64());
	int rst = 0, finished = 0;
	__u8 odir;
	__u32 want;

	dir &= 1;
	odir = dir ^ 1;
	/* Every fast-path packet until this CPU knows HZ, then one array read. */
	ct_hz();
	if (cv) {
		if (cv->closed)
			return 0;
		if (!th->rst) {
			/* An ACK of exactly the other side's FIN: that side has finished. */
			if (cv->fin[odir] && !cv->acked[odir] && th->ack &&
			    bpf_ntohl(th->ack_seq) == cv->fin_end[odir]) {
				cv->acked[odir] = 1;
				if (cv->acked[dir])
					cv->closed = 1;
			}
			/* The receiver of a RST speaks on: it refused the RST. */
			if (cv->rst[odir])
				cv->rst[odir] = 0;
		}
	}
	if (th->rst || (th->fin && !(cv && cv->acked[dir]))) {
		if (!cv) {
			/* Constant indices: the stack slot's address may not be computed. */
			__u32 end = bpf_ntohl(th->seq) + payload + 1;

			cv = nv;
			if (th->rst && dir)
				nv->rst[1] = 1;
			else if (th->rst)
				nv->rst[0] = 1;
			else if (dir)
				nv->fin[1] = 1, nv->fin_end[1] = end;
			else
				nv->fin[0] = 1, nv->fin_end[0] = end;
			*create = 1;
		} else if (th->rst) {
			cv->rst[dir] = 1;
		} else {
			cv->fin_end[dir] = bpf_ntohl(th->seq) + payload + 1;
			cv->fin[dir] = 1;
		}
	}
	if (cv) {
		rst = cv->rst[0] || cv->rst[1];
		finished = cv->acked[0] || cv->acked[1];
	}

	if (rst) {
		want = timeouts[TCP_CONNTRACK_CLOSE];
		if (left > want)
			ct_set_expiry(ct, want);
		return 1;
	}
	want = timeouts[finished ? TCP_CONNTRACK_TIME_WAIT : TCP_CONNTRACK_ESTABLISHED];
	if (left > want || left < want - want / 64)
		ct_set_expiry(ct, want);
	return 1;
}

/* ct_close_step on the record of entry ct (of family v6) in ct_close or ct_close6,
 * which it creates when the step asks for one. */
static __always_inline int ct_close_track(struct nf_conn *ct, int v6, __u8 dir,
					  const struct tcphdr *th, __s32 payload)
{
	struct ct_close_value nv = {};
	int create = 0, fast;

	if (v6) {
		struct ct_close6_key k = ct_close6_key_of(ct);

		fast = ct_close_step(ct, dir, th, payload, bpf_map_lookup_elem(&ct_close6, &k),
				     &nv, &create);
		if (create)
			bpf_map_update_elem(&ct_close6, &k, &nv, BPF_NOEXIST);
	} else {
		struct ct_close_key k = ct_close_key_of(ct);

		fast = ct_close_step(ct, dir, th, payload, bpf_map_lookup_elem(&ct_close, &k),
				     &nv, &create);
		if (create)
			bpf_map_update_elem(&ct_close, &k, &nv, BPF_NOEXIST);
	}
	return fast;
}

/* Returns the destination IPv4 packet iph will have when the kernel routes it: for a
 * TCP or UDP packet (ports read at l4, before data_end) in the reply direction of a
 * flow kernel conntrack holds, the original direction's source, which conntrack
 * writes back over the destination of a flow it translated (MASQUERADE, SNAT) before
 * the routing decision; iph->daddr for everything else. The kernel's reverse-path
 * check of the packet uses that address as the source of its lookup. */
static __always_inline __be32 ct_routed_daddr(struct __sk_buff *skb, const struct iphdr *iph,
					      const void *l4, const void *data_end)
{
	struct bpf_ct_opts opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = iph->protocol };
	const __be16 *ports = l4;
	struct bpf_sock_tuple t = {};
	__be32 daddr = iph->daddr;
	struct nf_conn *ct;

	if ((iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP) ||
	    (void *)(ports + 2) > data_end)
		return daddr;
	t.ipv4.saddr = iph->saddr;
	t.ipv4.daddr = iph->daddr;
	t.ipv4.sport = ports[0];
	t.ipv4.dport = ports[1];
	ct = bpf_skb_ct_lookup(skb, &t, sizeof(t.ipv4), &opts, sizeof(opts));
	if (!ct)
		return daddr;
	if (opts.dir == IP_CT_DIR_REPLY)
		daddr = ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple.src.u3.ip;
	bpf_ct_release(ct);
	return daddr;
}

/* Returns 1 if TCP segment th (its whole header read; payload its bytes of TCP
 * payload, all GSO segments' together) of the packet whose socket tuple is t (tsz:
 * sizeof its ipv4 or ipv6 member, as v6 says) belongs to a flow kernel conntrack
 * holds, in either direction, as established and untranslated (ct_fast_eligible) and
 * not closed on the fast path (ct_close_track, which also renews the entry): the
 * packet may skip the stack. 0 for everything else: no entry, a translated or not yet
 * established one, a SYN (for which ct_close_reopen expires the entry of a flow the
 * fast path closed). */
static __always_inline int ct_fast_tuple(struct __sk_buff *skb, struct bpf_sock_tuple *t,
					 __u32 tsz, int v6, const struct tcphdr *th, __s32 payload)
{
	struct bpf_ct_opts opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = IPPROTO_TCP };
	struct nf_conn *ct;
	int fast = 0;

	ct = bpf_skb_ct_lookup(skb, t, tsz, &opts, sizeof(opts));
	if (!ct)
		return 0;
	if (th->syn) {
		if (!th->ack)
			ct_close_reopen(ct, v6);
	} else if (ct_fast_eligible(ct, v6)) {
		fast = ct_close_track(ct, v6, opts.dir, th, payload);
	}
	bpf_ct_release(ct);
	return fast;
}

/* ct_fast_tuple for TCP segment th of IPv4 packet iph (not a fragment). */
static __always_inline int ct_fast_path(struct __sk_buff *skb, const struct iphdr *iph,
					const struct tcphdr *th, __s32 payload)
{
	struct bpf_sock_tuple t = {};

	t.ipv4.saddr = iph->saddr;
	t.ipv4.daddr = iph->daddr;
	t.ipv4.sport = th->source;
	t.ipv4.dport = th->dest;
	return ct_fast_tuple(skb, &t, sizeof(t.ipv4), 0, th, payload);
}

/* ct_fast_tuple for TCP segment th of IPv6 packet ip6h (TCP its first next header). */
static __always_inline int ct_fast_path6(struct __sk_buff *skb, const struct ip6_hdr *ip6h,
					 const struct tcphdr *th, __s32 payload)
{
	struct bpf_sock_tuple t = {};

	__builtin_memcpy(t.ipv6.saddr, ip6h->saddr, 16);
	__builtin_memcpy(t.ipv6.daddr, ip6h->daddr, 16);
	t.ipv6.sport = th->source;
	t.ipv6.dport = th->dest;
	return ct_fast_tuple(skb, &t, sizeof(t.ipv6), 1, th, payload);
}
