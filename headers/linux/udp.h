/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* UDP header (UAPI linux/udp.h layout). */
#pragma once

#include <linux/types.h>

struct udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__sum16 check;
};
