/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IP protocol numbers isthmus uses (subset of UAPI linux/in.h). */
#pragma once

enum {
	IPPROTO_IP = 0,
	IPPROTO_ICMP = 1,
	IPPROTO_TCP = 6,
	IPPROTO_UDP = 17,
};
