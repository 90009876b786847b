/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking for return-path SNAT: idle timeouts, TCP state and the refresh of
 * the two nat entries of a flow. The entries themselves are struct nat_key/nat_value. */
#pragma once

#include "common.h"
#include "tcp.h"

#define NSEC_PER_SEC		1000000000ULL

/* Idle timeouts of a nat entry, in nanoseconds. An entry idle for longer counts as
 * absent: its flow starts over and its port may be given to another flow. */
#ifndef NAT_TCP_SYN_TIMEOUT
#define NAT_TCP_SYN_TIMEOUT	(60 * NSEC_PER_SEC)	/* TCP, no reply yet */
#endif
#ifndef NAT_TCP_EST_TIMEOUT
#define NAT_TCP_EST_TIMEOUT	(6 * 3600 * NSEC_PER_SEC)	/* TCP, reply seen */
#endif
#ifndef NAT_TCP_CLOSING_TIMEOUT
#define NAT_TCP_CLOSING_TIMEOUT	(10 * NSEC_PER_SEC)	/* TCP, FIN or RST seen */
#endif
#ifndef NAT_UDP_TIMEOUT
#define NAT_UDP_TIMEOUT		(60 * NSEC_PER_SEC)
#endif
#ifndef NAT_ICMP_TIMEOUT
#define NAT_ICMP_TIMEOUT	(30 * NSEC_PER_SEC)
#endif
/* last_seen is rewritten at most this often while the state stays the same, so a busy
 * flow does not bounce the entries' cache lines between CPUs on every packet. */
#ifndef NAT_REFRESH
#define NAT_REFRESH		NSEC_PER_SEC
#endif

#define TCP_FLAG_FIN		0x01
#define TCP_FLAG_RST		0x04
#define TCP_FLAG_ACK		0x10

/* A packet as connection tracking sees it: its nat_key and, for TCP, its flags. */
struct ct_tuple {
	struct nat_key key;
	__u8 tcp_flags;		/* TCP header byte 13; 0 for other protocols */
};

/* Returns 1 if TCP state state is one of the states after an RST. */
static __always_inline int ct_after_rst(__u8 state)
{
	return state == NAT_STATE_RST || state == NAT_STATE_RST_ORIG || state == NAT_STATE_RST_REPLY;
}

/* Returns the idle timeout (ns) of an entry of protocol proto in state state. */
static __always_inline __u64 ct_timeout(__u8 proto, __u8 state)
{
	if (proto == IPPROTO_TCP) {
		/* Half-closed: the open direction may stay quiet as long as an
		 * established flow. */
		if (state == NAT_STATE_ESTABLISHED || state == NAT_STATE_FIN_ORIG ||
		    state == NAT_STATE_FIN_REPLY)
			return NAT_TCP_EST_TIMEOUT;
		if (state == NAT_STATE_CLOSING || ct_after_rst(state))
			return NAT_TCP_CLOSING_TIMEOUT;
		return NAT_TCP_SYN_TIMEOUT;
	}
	if (proto == IPPROTO_UDP)
		return NAT_UDP_TIMEOUT;
	return NAT_ICMP_TIMEOUT;
}

/* Returns 1 if entry v of protocol proto saw a packet within its timeout before now,
 * 0 if it expired (a last_seen in the future wraps around and counts as expired). */
static __always_inline int ct_live(const struct nat_value *v, __u8 proto, __u64 now)
{
	return now - v->last_seen <= ct_timeout(proto, v->state);
}

/* Returns the state of a flow of protocol proto in state state after a packet with
 * TCP flags flags, in the reply direction or not: an RST starts the states after an
 * RST (NAT_STATE_RST, the closing timeout); a FIN after the other side's closes; a
 * first FIN half-closes (the other side may go on sending, RFC 9293 3.6); a bare SYN
 * from the pod (a new connection on the tuple) starts over; the first reply
 * establishes. After an RST, a packet that is not an RST shows its side still has the
 * connection (a side whose socket the RST closed answers with RSTs, which start over):
 * once both sides have sent one, the flow is ESTABLISHED again, so an RST its receiver
 * did not accept (outside the window, RFC 5961) does not expire a live flow's
 * translation after the closing timeout. UDP and ICMP only record that a reply came. */
static __always_inline __u8 ct_next_state(__u8 proto, __u8 state, __u8 flags, int reply)
{
	if (proto != IPPROTO_TCP)
		return reply ? NAT_STATE_ESTABLISHED : state;
	if (flags & TCP_FLAG_RST)
		return NAT_STATE_RST;
	if (flags & TCP_FLAG_FIN) {
		if (state == NAT_STATE_CLOSING ||
		    state == (reply ? NAT_STATE_FIN_ORIG : NAT_STATE_FIN_REPLY))
			return NAT_STATE_CLOSING;
		return reply ? NAT_STATE_FIN_REPLY : NAT_STATE_FIN_ORIG;
	}
	if (!reply && (flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return NAT_STATE_NEW;
	if (reply && state == NAT_STATE_NEW)
		return NAT_STATE_ESTABLISHED;
	if (ct_after_rst(state)) {
		if (state == (reply ? NAT_STATE_RST_ORIG : NAT_STATE_RST_REPLY))
			return NAT_STATE_ESTABLISHED;
		return reply ? NAT_STATE_RST_REPLY : NAT_STATE_RST_ORIG;
	}
	return state;
}

/* Records a packet of a flow at now in state state on its entry v and on the entry of
 * the other direction o (may be NULL): both carry the same state and time, so they
 * expire together. Returns nothing; writes only on a state change or after
 * NAT_REFRESH. */
static __always_inline void ct_refresh(struct nat_value *v, struct nat_value *o, __u8 state,
				       __u64 now)
{
	if (v->state == state && now - v->last_seen < NAT_REFRESH)
		return;
	v->state = state;
	v->last_seen = now;
	if (o) {
		o->state = state;
		o->last_seen = now;
	}
}
