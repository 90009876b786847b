/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Return-path SNAT: a pod source the peers cannot route back is translated to the
 * tunnel address on its way into the tunnel (pod_ingress), and replies, and ICMP
 * errors about translated flows, are translated back after decapsulation. The
 * translation steps here serve egress masquerade (lib/masq.h) too, on its own table:
 * every helper takes the table (nat or masq_nat) and its NAT_TABLE_* number. */
#pragma once

#include <linux/icmp.h>

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "csum.h"
#include "hash.h"
#include "conntrack.h"
#include "ct.h"

/* Ports of the SNAT range tried for a new flow whose own port is taken. */
#ifndef SNAT_PORT_TRIES
#define SNAT_PORT_TRIES		32
#endif
/* Seed of the hash that picks where in the range a flow starts looking; the Go twin in
 * bpf/nat_test.go uses the same value. */
#ifndef SNAT_HASH_SEED
#define SNAT_HASH_SEED		0x5a7c0de1
#endif

/* Flows one pod source may hold in one table (nat or masq_nat) at once; the agent sets
 * it at load time (--snat-flows-per-source). A new flow beyond it is dropped with
 * DROP_NAT_SOURCE_LIMIT, so one pod cannot fill a table the others share. */
#ifndef NAT_SOURCE_FLOWS_MAX
#define NAT_SOURCE_FLOWS_MAX	4096
#endif
volatile const __u32 nat_source_flows_max = NAT_SOURCE_FLOWS_MAX;

/* The vendored linux/icmp.h is trimmed to what the datapath used before. */
#ifndef ICMP_PARAMETERPROB
#define ICMP_PARAMETERPROB	12
#endif

#define IPV4_CHECK_OFF		(ETH_HLEN + offsetof(struct iphdr, check))
#define IPV4_SADDR_OFF		(ETH_HLEN + offsetof(struct iphdr, saddr))
#define IPV4_DADDR_OFF		(ETH_HLEN + offsetof(struct iphdr, daddr))

/* Where the L4 fields of a packet being translated are. */
struct nat_l4 {
	__u32 port_off;		/* the port (or ICMP identifier) to rewrite */
	__u32 csum_off;		/* the L4 checksum */
	__u64 csum_flags;	/* for bpf_l4_csum_replace: UDP keeps a zero checksum zero */
	int pseudo;		/* the checksum covers the addresses (TCP, UDP) */
};

/* Fills t and l from the IPv4 packet iph whose L4 header is at offset l4off: the
 * original direction (the port to rewrite is the source; ICMP echo request, identifier
 * as sport) or, with reply, the reply direction (destination; ICMP echo reply,
 * identifier as dport). Returns 0, 1 if the packet has no translation (another
 * protocol, another ICMP type), or DROP_INVALID_PACKET if its L4 header is truncated. */
static __always_inline int nat_tuple(struct __sk_buff *skb, const struct iphdr *iph,
				     __u32 l4off, int reply, struct ct_tuple *t,
				     struct nat_l4 *l)
{
	__u8 h[14];	/* TCP up to the flags; UDP and ICMP use 8 */

	__builtin_memset(t, 0, sizeof(*t));
	t->key.saddr = iph->saddr;
	t->key.daddr = iph->daddr;
	t->key.proto = iph->protocol;
	l->pseudo = 1;
	l->csum_flags = 0;
	switch (iph->protocol) {
	case IPPROTO_TCP:
		if (bpf_skb_load_bytes(skb, l4off, h, 14))
			return DROP_INVALID_PACKET;
		t->tcp_flags = h[13];
		l->csum_off = l4off + offsetof(struct tcphdr, check);
		break;
	case IPPROTO_UDP:
		if (bpf_skb_load_bytes(skb, l4off, h, 8))
			return DROP_INVALID_PACKET;
		l->csum_off = l4off + offsetof(struct udphdr, check);
		l->csum_flags = BPF_F_MARK_MANGLED_0;
		break;
	case IPPROTO_ICMP:
		if (bpf_skb_load_bytes(skb, l4off, h, 8))
			return DROP_INVALID_PACKET;
		if (h[0] != (reply ? ICMP_ECHOREPLY : ICMP_ECHO))
			return 1;
		__builtin_memcpy(reply ? &t->key.dport : &t->key.sport, &h[4], sizeof(__be16));
		l->port_off = l4off + offsetof(struct icmphdr, un.echo.id);
		l->csum_off = l4off + offsetof(struct icmphdr, checksum);
		l->pseudo = 0;
		return 0;
	default:
		return 1;
	}
	__builtin_memcpy(&t->key.sport, &h[0], sizeof(__be16));
	__builtin_memcpy(&t->key.dport, &h[2], sizeof(__be16));
	l->port_off = l4off + (reply ? 2 : 0);
	return 0;
}

/* Returns in *rk the reply key of the flow k translated to addr:port: remote -> addr,
 * the remote port (0 for ICMP) as sport, port as dport. */
static __always_inline void nat_reply_key(struct nat_key *rk, const struct nat_key *k,
					  __be32 addr, __be16 port)
{
	__builtin_memset(rk, 0, sizeof(*rk));
	rk->saddr = k->daddr;
	rk->daddr = addr;
	rk->sport = k->dport;
	rk->dport = port;
	rk->proto = k->proto;
}

/* Rewrites the address at addr_off (the IPv4 source or destination) from -> to and the
 * port at l->port_off pfrom -> pto, fixing the IPv4 checksum and the L4 one with the
 * checksum helpers, which know a CHECKSUM_PARTIAL skb from a local socket (its L4
 * field holds the pseudo-header sum: the address changes it, the port does not).
 * Returns 0 or DROP_SNAT_REWRITE. Invalidates packet pointers. */
static __always_inline int nat_rewrite(struct __sk_buff *skb, const struct nat_l4 *l,
				       __u32 addr_off, __be32 from, __be32 to,
				       __be16 pfrom, __be16 pto)
{
	if (pfrom != pto &&
	    (bpf_l4_csum_replace(skb, l->csum_off, pfrom, pto, l->csum_flags | sizeof(pto)) ||
	     bpf_skb_store_bytes(skb, l->port_off, &pto, sizeof(pto), 0)))
		return DROP_SNAT_REWRITE;
	if (l->pseudo &&
	    bpf_l4_csum_replace(skb, l->csum_off, from, to,
				l->csum_flags | BPF_F_PSEUDO_HDR | sizeof(to)))
		return DROP_SNAT_REWRITE;
	if (bpf_l3_csum_replace(skb, IPV4_CHECK_OFF, from, to, sizeof(to)) ||
	    bpf_skb_store_bytes(skb, addr_off, &to, sizeof(to), 0))
		return DROP_SNAT_REWRITE;
	return 0;
}

/* Returns 1 if the node itself holds the TCP or UDP tuple rk (remote -> a translated
 * address and port): a local socket the packet would reach (a listener, a connected
 * socket, or for TCP a request or TIME_WAIT socket: bpf_skc_lookup_tcp), or a kernel
 * conntrack entry with rk as its original or reply tuple, such as the binding
 * kube-proxy's NodePort masquerade made on the node's address. 0 for other
 * protocols. */
static __always_inline int nat_node_holds(struct __sk_buff *skb, const struct nat_key *rk)
{
	struct bpf_ct_opts opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = rk->proto };
	struct bpf_sock_tuple st = {};
	struct nf_conn *ct;
	struct bpf_sock *sk;

	if (rk->proto != IPPROTO_TCP && rk->proto != IPPROTO_UDP)
		return 0;
	st.ipv4.saddr = rk->saddr;
	st.ipv4.daddr = rk->daddr;
	st.ipv4.sport = rk->sport;
	st.ipv4.dport = rk->dport;
	if (rk->proto == IPPROTO_TCP)
		sk = bpf_skc_lookup_tcp(skb, &st, sizeof(st.ipv4), BPF_F_CURRENT_NETNS, 0);
	else
		sk = bpf_sk_lookup_udp(skb, &st, sizeof(st.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (sk) {
		bpf_sk_release(sk);
		return 1;
	}
	ct = bpf_skb_ct_lookup(skb, &st, sizeof(st.ipv4), &opts, sizeof(opts));
	if (ct) {
		bpf_ct_release(ct);
		return 1;
	}
	return 0;
}

/* Port states for allocation. */
#define SNAT_PORT_TAKEN		0
#define SNAT_PORT_FREE		1	/* no live entry, no local socket or conntrack entry */
#define SNAT_PORT_OURS		2	/* a live reply entry already leads back to this flow */

/* Returns SNAT_PORT_* for the reply key rk of flow k (pod's tuple) in table tbl at now.
 * A live entry for rk belongs to another flow unless it leads back to k (the orphaned
 * half of k's own translation); an expired one is deleted. A tuple the node holds
 * (nat_node_holds: a local socket, or a netfilter NAT binding of the same tuple) takes
 * the port too. */
static __always_inline int snat_port_state(struct __sk_buff *skb, void *tbl,
					   const struct nat_key *rk, const struct nat_key *k,
					   __u64 now)
{
	struct nat_value *v;

	v = bpf_map_lookup_elem(tbl, rk);
	if (v) {
		if (ct_live(v, rk->proto, now)) {
			if ((v->flags & NAT_F_REPLY) && v->addr == k->saddr && v->port == k->sport)
				return SNAT_PORT_OURS;
			return SNAT_PORT_TAKEN;
		}
		bpf_map_delete_elem(tbl, rk);
	}
	return nat_node_holds(skb, rk) ? SNAT_PORT_TAKEN : SNAT_PORT_FREE;
}

/* Counts a new flow of pod source addr in table (NAT_TABLE_*) against
 * nat_source_flows_max. Returns 0, DROP_NAT_SOURCE_LIMIT if the source holds its whole
 * share, or DROP_SNAT_INSERT if nat_sources refused the source. */
static __always_inline int nat_source_take(__be32 addr, __u32 table)
{
	struct nat_source_key k = { .addr = addr, .table = table };
	struct nat_source_value zero = {}, *v;

	v = bpf_map_lookup_elem(&nat_sources, &k);
	if (!v) {
		bpf_map_update_elem(&nat_sources, &k, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&nat_sources, &k);
		if (!v)
			return DROP_SNAT_INSERT;
	}
	/* CPUs racing past the test together overshoot by at most one flow each. */
	if (v->flows >= nat_source_flows_max)
		return DROP_NAT_SOURCE_LIMIT;
	__sync_fetch_and_add(&v->flows, 1);
	return 0;
}

/* Uncounts a flow of pod source addr in table (its original entry is gone). */
static __always_inline void nat_source_put(__be32 addr, __u32 table)
{
	struct nat_source_key k = { .addr = addr, .table = table };
	struct nat_source_value *v = bpf_map_lookup_elem(&nat_sources, &k);

	if (v && v->flows > 0)
		__sync_fetch_and_add(&v->flows, -1);
}

/* Deletes the original entry k (a pod's tuple) of table tbl and uncounts its flow if
 * this call removed it. */
static __always_inline void nat_delete_flow(void *tbl, __u32 table, const struct nat_key *k)
{
	if (bpf_map_delete_elem(tbl, k) == 0)
		nat_source_put(k->saddr, table);
}

/* Returns the hash (SNAT_HASH_SEED) of flow k that picks where in the port range its
 * search starts: the raw address words and the raw port word plus the protocol. */
static __always_inline __u32 snat_hash(const struct nat_key *k)
{
	__u32 ports;

	__builtin_memcpy(&ports, &k->sport, sizeof(ports));
	return jhash_3words(k->saddr, k->daddr, ports + k->proto, SNAT_HASH_SEED);
}

/* Creates the translation of the new flow t to address to in table tbl (number
 * table): port want if its reply tuple is free,
 * else up to SNAT_PORT_TRIES ports of [snat_port_min, snat_port_max] from the flow's
 * hash on. The flow counts against its source's share first (nat_source_take).
 * Inserts the reply entry, then the original one, both BPF_NOEXIST. A failed
 * second insert means another CPU translated the same flow in between: if its entry
 * leads to the same port it relies on our reply entry, and so does this packet; else
 * the reply entry is removed. Returns 0 with *port set (network order), or
 * DROP_NAT_SOURCE_LIMIT / DROP_SNAT_NO_PORT / DROP_SNAT_INSERT (a full table). Counts
 * METRIC_SNAT_NEW. */
static __always_inline int snat_new(struct __sk_buff *skb, const struct datapath_config *cfg,
				    void *tbl, __u32 table, const struct ct_tuple *t, __be32 to,
				    __be16 want, __u64 now, __be16 *port, __u8 hook)
{
	__u32 min = cfg->snat_port_min, max = cfg->snat_port_max;
	struct nat_value fv = {}, rv = {};
	struct nat_key rk;
	__u32 span = 0, h, i;
	int st;

	st = nat_source_take(t->key.saddr, table);
	if (st < 0)
		return st;
	nat_reply_key(&rk, &t->key, to, want);
	st = snat_port_state(skb, tbl, &rk, &t->key, now);
	if (st == SNAT_PORT_TAKEN) {
		if (min && max >= min)
			span = max - min + 1;
		h = snat_hash(&t->key);
		for (i = 0; i < SNAT_PORT_TRIES; i++) {
			if (i >= span)
				break;
			rk.dport = bpf_htons((__u16)(min + (h + i) % span));
			st = snat_port_state(skb, tbl, &rk, &t->key, now);
			if (st != SNAT_PORT_TAKEN)
				break;
		}
		if (st == SNAT_PORT_TAKEN) {
			nat_source_put(t->key.saddr, table);
			return DROP_SNAT_NO_PORT;
		}
	}

	rv.addr = t->key.saddr;
	rv.port = t->key.sport;
	rv.state = ct_next_state(t->key.proto, NAT_STATE_NEW, t->tcp_flags, 0);
	rv.flags = NAT_F_REPLY;
	rv.last_seen = now;
	fv.addr = to;
	fv.port = rk.dport;
	fv.state = rv.state;
	fv.last_seen = now;
	/* The reply entry claims the port; a concurrent first packet of another flow that
	 * claimed it in between makes this insert fail. */
	if (st == SNAT_PORT_FREE && bpf_map_update_elem(tbl, &rk, &rv, BPF_NOEXIST)) {
		nat_source_put(t->key.saddr, table);
		return DROP_SNAT_INSERT;
	}
	if (bpf_map_update_elem(tbl, &t->key, &fv, BPF_NOEXIST)) {
		const struct nat_value *won = bpf_map_lookup_elem(tbl, &t->key);

		/* The other CPU's insert counted the flow. */
		nat_source_put(t->key.saddr, table);
		if (won && !(won->flags & NAT_F_REPLY) && won->addr == fv.addr &&
		    won->port == fv.port) {
			*port = fv.port;
			return 0;
		}
		if (st == SNAT_PORT_FREE)
			bpf_map_delete_elem(tbl, &rk);
		return DROP_SNAT_INSERT;
	}
	metrics_count(METRIC_SNAT_NEW, hook, skb->len);
	*port = rk.dport;
	return 0;
}

/* Finds the live translation of flow t to address to in table tbl (both halves
 * present and pointing at each other) and records the packet on it, or creates one:
 * on the flow's own port for an expired flow, on its old port for one that lost its
 * reply half (the agent's collection, or an entry deleted by hand).
 * Returns 0 with *port set (network order), or a negative DROP_*. */
static __always_inline int snat_flow(struct __sk_buff *skb, const struct datapath_config *cfg,
				     void *tbl, __u32 table, const struct ct_tuple *t, __be32 to,
				     __u64 now, __be16 *port, __u8 hook)
{
	struct nat_value *fwd, *rev;
	__be16 want = t->key.sport;
	struct nat_key rk;

	fwd = bpf_map_lookup_elem(tbl, &t->key);
	if (fwd) {
		if (fwd->addr == to && !(fwd->flags & NAT_F_REPLY) &&
		    ct_live(fwd, t->key.proto, now)) {
			nat_reply_key(&rk, &t->key, fwd->addr, fwd->port);
			rev = bpf_map_lookup_elem(tbl, &rk);
			if (rev && (rev->flags & NAT_F_REPLY) && rev->addr == t->key.saddr &&
			    rev->port == t->key.sport) {
				ct_refresh(fwd, rev, ct_next_state(t->key.proto, fwd->state,
								   t->tcp_flags, 0), now);
				*port = fwd->port;
				return 0;
			}
			want = fwd->port;
		}
		nat_delete_flow(tbl, table, &t->key);
	}
	return snat_new(skb, cfg, tbl, table, t, to, want, now, port, hook);
}

/* Translates the source of iph (linear, at ETH_HLEN) to address to, by the flow's
 * entry in table tbl (number table) or a new one (snat_flow): TCP and UDP by source
 * port, ICMP echo request by identifier. The one translation step of return-path SNAT
 * (nat) and of egress masquerade (masq_nat, lib/masq.h). Returns 1 (rewritten: packet pointers are invalid) or a
 * negative DROP_*: DROP_SNAT_UNSUPPORTED for fragments (a non-first fragment carries
 * no ports, so nothing tells its flow; translating only the first would not deliver
 * the datagram either; there is no fragment tracking), other protocols and other
 * ICMP. Counts metric per translated packet. */
static __always_inline int nat_translate_source(struct __sk_buff *skb,
						const struct datapath_config *cfg,
						void *tbl, __u32 table, struct iphdr *iph,
						__be32 to, __u16 metric, __u8 hook)
{
	struct ct_tuple t;
	struct nat_l4 l = {};
	__be16 port = 0;
	int ret;

	if (ipv4_is_fragment(iph))
		return DROP_SNAT_UNSUPPORTED;
	ret = nat_tuple(skb, iph, ETH_HLEN + iph->ihl * 4, 0, &t, &l);
	if (ret < 0)
		return ret;
	if (ret > 0)
		return DROP_SNAT_UNSUPPORTED;
	ret = snat_flow(skb, cfg, tbl, table, &t, to, bpf_ktime_get_ns(), &port, hook);
	if (ret < 0)
		return ret;
	ret = nat_rewrite(skb, &l, IPV4_SADDR_OFF, t.key.saddr, to, t.key.sport, port);
	if (ret < 0)
		return ret;
	metrics_count(metric, hook, skb->len);
	trace_tc(skb, cfg, metric, hook, 0, t.key.saddr | (__u64)t.key.sport << 32);
	return 1;
}

/* Returns 1 if encap_geneve refuses iph by its header: an expiring TTL where this hop
 * forwards it (forward: pod_ingress; on isthmus0 the host stack already has, and a
 * TTL of 1 is encapsulated), or a size above the tunnel MTU. Such a packet gets its
 * ICMP error from the datapath, quoting the pod's own header. */
static __always_inline int tunnel_refuses(struct __sk_buff *skb, const struct datapath_config *cfg,
					  const struct iphdr *iph, int forward)
{
	return (forward && iph->ttl <= 1) ||
	       (cfg->tunnel_mtu && ipv4_wire_len(skb, iph) > cfg->tunnel_mtu);
}

/* Return-path SNAT of a pod's packet about to enter the tunnel; iph is its (linear)
 * IPv4 header, forward as encap_geneve's (this hop forwards it: pod_ingress). Packets
 * the tunnel refuses (tunnel_refuses) keep their source, so the ICMP error the pod
 * gets quotes its own header. Returns 1 if it
 * rewrote the packet (packet pointers are then invalid), 0 if the source stays (no
 * tunnel address configured, an exempt source, or a refused packet), or a negative
 * DROP_*. Counts METRIC_SNAT per translated packet. */
static __always_inline int snat_egress(struct __sk_buff *skb, const struct datapath_config *cfg,
				       struct iphdr *iph, int forward, __u8 hook)
{
	struct route_key ek = { .prefixlen = 32 };

	if (!cfg->tunnel_ip)
		return 0;
	ek.addr = iph->saddr;
	if (bpf_map_lookup_elem(&snat_exempt, &ek))
		return 0;
	if (tunnel_refuses(skb, cfg, iph, forward))
		return 0;
	return nat_translate_source(skb, cfg, &nat, NAT_TABLE_SNAT, iph, cfg->tunnel_ip,
				    METRIC_SNAT, hook);
}

/* Translates back an ICMP error (its header at icmp_off) to addr (the tunnel
 * address, or the underlay address for masquerade) whose quote is a translated flow
 * (addr:port -> remote): the outer destination,
 * the quoted source address and port (identifier for a quoted echo request), the
 * quoted IPv4 checksum, the quoted L4 checksum as Linux NAT does (UDP when non-zero;
 * TCP when its whole header is quoted, else it lies past the 8 bytes a quote must
 * hold; the quoted echo's ICMP checksum), the ICMP checksum and the outer IPv4 one.
 * All by incremental update, so the sum over the packet is unchanged. Returns 1 if
 * rewritten, 0 if the error quotes no live translation, or DROP_SNAT_REWRITE. */
static __always_inline int snat_reverse_icmp_error(struct __sk_buff *skb, void *tbl,
						   __be32 addr, __u32 icmp_off, __u64 now)
{
	__u32 qoff = icmp_off + sizeof(struct icmphdr), ql4, poff, coff = 0;
	__sum16 icheck, qcheck, l4check, nl4check;
	struct nat_value *rev;
	struct nat_key rk = {};
	__be32 from, to;
	__be16 pto;
	struct iphdr q;
	__u8 qh[8];

	if (bpf_skb_load_bytes(skb, qoff, &q, sizeof(q)))
		return 0;
	if (q.version != 4 || q.ihl < 5 || q.saddr != addr ||
	    (q.frag_off & bpf_htons(IP_OFFSET)))
		return 0;
	ql4 = qoff + q.ihl * 4;
	if (bpf_skb_load_bytes(skb, ql4, qh, sizeof(qh)))
		return 0;
	rk.saddr = q.daddr;
	rk.daddr = q.saddr;
	rk.proto = q.protocol;
	switch (q.protocol) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
		__builtin_memcpy(&rk.sport, &qh[2], sizeof(__be16));
		__builtin_memcpy(&rk.dport, &qh[0], sizeof(__be16));
		poff = ql4;
		if (q.protocol == IPPROTO_UDP)
			coff = ql4 + offsetof(struct udphdr, check);
		else if (ql4 + sizeof(struct tcphdr) <= skb->len)
			coff = ql4 + offsetof(struct tcphdr, check);
		break;
	case IPPROTO_ICMP:
		if (qh[0] != ICMP_ECHO)
			return 0;
		__builtin_memcpy(&rk.dport, &qh[4], sizeof(__be16));
		poff = ql4 + offsetof(struct icmphdr, un.echo.id);
		coff = ql4 + offsetof(struct icmphdr, checksum);
		break;
	default:
		return 0;
	}
	rev = bpf_map_lookup_elem(tbl, &rk);
	if (!rev || !(rev->flags & NAT_F_REPLY) || !ct_live(rev, rk.proto, now))
		return 0;
	from = q.saddr;
	to = rev->addr;
	pto = rev->port;

	if (bpf_skb_load_bytes(skb, icmp_off + offsetof(struct icmphdr, checksum), &icheck,
			       sizeof(icheck)))
		return 0;
	qcheck = csum_replace32(q.check, from, to);
	icheck = csum_replace16(icheck, q.check, qcheck);
	icheck = csum_replace32(icheck, from, to);
	icheck = csum_replace16(icheck, rk.dport, pto);
	if (coff) {
		if (bpf_skb_load_bytes(skb, coff, &l4check, sizeof(l4check)))
			return 0;
		if (q.protocol == IPPROTO_UDP && !l4check) {
			coff = 0;	/* no checksum: stays none */
		} else {
			nl4check = csum_replace16(l4check, rk.dport, pto);
			if (q.protocol != IPPROTO_ICMP)
				nl4check = csum_replace32(nl4check, from, to);
			if (q.protocol == IPPROTO_UDP && !nl4check)
				nl4check = (__sum16)0xffff;
			icheck = csum_replace16(icheck, l4check, nl4check);
		}
	}

	if (bpf_skb_store_bytes(skb, qoff + offsetof(struct iphdr, saddr), &to, sizeof(to), 0) ||
	    bpf_skb_store_bytes(skb, qoff + offsetof(struct iphdr, check), &qcheck,
				sizeof(qcheck), 0) ||
	    bpf_skb_store_bytes(skb, poff, &pto, sizeof(pto), 0) ||
	    (coff && bpf_skb_store_bytes(skb, coff, &nl4check, sizeof(nl4check), 0)) ||
	    bpf_skb_store_bytes(skb, icmp_off + offsetof(struct icmphdr, checksum), &icheck,
				sizeof(icheck), 0) ||
	    bpf_l3_csum_replace(skb, IPV4_CHECK_OFF, from, to, sizeof(to)) ||
	    bpf_skb_store_bytes(skb, IPV4_DADDR_OFF, &to, sizeof(to), 0))
		return DROP_SNAT_REWRITE;
	return 1;
}

/* Returns DROP_NAT_REPLY_UNKNOWN for a TCP segment t (to a translated address) that
 * has no live translation, when the host would answer it with a reset although the
 * flow may be live (its translation expired or was removed while the remote side
 * still talks): neither an RST nor a bare SYN (a new connection, the host's to refuse),
 * and the node holds no socket or conntrack entry for it (nat_node_holds: then the
 * stack's conntrack and sockets judge it). 0 if the stack may have it. */
static __always_inline int nat_reply_missed(struct __sk_buff *skb, const struct ct_tuple *t)
{
	if (t->key.proto != IPPROTO_TCP || (t->tcp_flags & TCP_FLAG_RST) ||
	    (t->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return 0;
	return nat_node_holds(skb, &t->key) ? 0 : DROP_NAT_REPLY_UNKNOWN;
}

/* Reverse translation of a frame [eth][IPv4] at the start of skb addressed to addr
 * (the tunnel address after decapsulation; the underlay address for masquerade), by
 * table tbl: a reply whose reply tuple has a live entry gets the pod's address and
 * port (identifier) back, both entries record it; an ICMP error quoting a translated
 * flow is translated as snat_reverse_icmp_error says. Returns 1 if rewritten (packet
 * pointers are then invalid), 0 if untouched (no address, another destination, a
 * fragment, no live entry), DROP_NAT_REPLY_UNKNOWN for a TCP segment nat_reply_missed
 * refuses, or DROP_SNAT_REWRITE. Counts metric. */
static __always_inline int nat_reverse(struct __sk_buff *skb, const struct datapath_config *cfg,
				       void *tbl, __be32 addr, __u16 metric, __u8 hook)
{
	struct cursor c = { .pos = (void *)(long)skb->data, .end = (void *)(long)skb->data_end };
	struct nat_value *rev, *fwd;
	struct nat_key fk;
	struct ethhdr *eth;
	struct iphdr *iph;
	struct ct_tuple t;
	struct nat_l4 l;
	__u32 l4off;
	__u64 now;
	__u8 type;
	int ret;

	if (!addr)
		return 0;
	if (parse_eth(&c, &eth) != ETH_P_IP || parse_ipv4(&c, &iph) < 0)
		return 0;
	/* A fragment to the address carries no (or not only) ports: the host's. */
	if (iph->daddr != addr || ipv4_is_fragment(iph))
		return 0;
	l4off = ETH_HLEN + iph->ihl * 4;
	now = bpf_ktime_get_ns();
	ret = nat_tuple(skb, iph, l4off, 1, &t, &l);
	if (ret == 1 && t.key.proto == IPPROTO_ICMP) {
		if (bpf_skb_load_bytes(skb, l4off, &type, sizeof(type)))
			return 0;
		if (type != ICMP_DEST_UNREACH && type != ICMP_TIME_EXCEEDED &&
		    type != ICMP_PARAMETERPROB)
			return 0;
		ret = snat_reverse_icmp_error(skb, tbl, addr, l4off, now);
		if (ret > 0) {
			metrics_count(metric, hook, skb->len);
			trace_tc(skb, cfg, metric, hook, 0, 0);
		}
		return ret;
	}
	if (ret)
		return 0;

	rev = bpf_map_lookup_elem(tbl, &t.key);
	if (!rev || !(rev->flags & NAT_F_REPLY) || !ct_live(rev, t.key.proto, now))
		return nat_reply_missed(skb, &t);
	/* The original direction's key: pod -> remote. */
	__builtin_memset(&fk, 0, sizeof(fk));
	fk.saddr = rev->addr;
	fk.daddr = t.key.saddr;
	fk.sport = rev->port;
	fk.dport = t.key.sport;
	fk.proto = t.key.proto;
	fwd = bpf_map_lookup_elem(tbl, &fk);
	ct_refresh(rev, fwd, ct_next_state(t.key.proto, rev->state, t.tcp_flags, 1), now);
	ret = nat_rewrite(skb, &l, IPV4_DADDR_OFF, t.key.daddr, rev->addr, t.key.dport,
			  rev->port);
	if (ret < 0)
		return ret;
	metrics_count(metric, hook, skb->len);
	trace_tc(skb, cfg, metric, hook, 0, t.key.daddr | (__u64)t.key.dport << 32);
	return 1;
}

/* Reverse SNAT of a decapsulated frame [eth][IPv4] at the start of skb, before
 * delivery: nat_reverse to the tunnel address by nat, so the FIB lookup that follows
 * finds the pod; untouched frames go to the host as before. Counts
 * METRIC_SNAT_REVERSE. */
static __always_inline int snat_reverse(struct __sk_buff *skb, const struct datapath_config *cfg,
					__u8 hook)
{
	return nat_reverse(skb, cfg, &nat, cfg->tunnel_ip, METRIC_SNAT_REVERSE, hook);
}
