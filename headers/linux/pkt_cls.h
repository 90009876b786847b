/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* TC verdicts for BPF classifiers (subset of UAPI linux/pkt_cls.h). */
#pragma once

#define TC_ACT_UNSPEC		(-1)
#define TC_ACT_OK		0
#define TC_ACT_RECLASSIFY	1
#define TC_ACT_SHOT		2
#define TC_ACT_PIPE		3
#define TC_ACT_STOLEN		4
#define TC_ACT_QUEUED		5
#define TC_ACT_REPEAT		6
#define TC_ACT_REDIRECT		7
