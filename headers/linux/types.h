/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Fixed-width kernel types (__u8 .. __u64, __be16 ..) without the asm/ includes of the UAPI original. */
#pragma once

/* Written for isthmus; same names and widths as include/uapi/linux/types.h and
 * asm-generic/int-ll64.h, so vendored UAPI headers compile against it. The guards
 * stop the real headers from redefining these if something includes them later. */
#ifndef _LINUX_TYPES_H
#define _LINUX_TYPES_H
#define _UAPI_LINUX_TYPES_H
#define __ASM_GENERIC_INT_LL64_H

typedef signed char __s8;
typedef unsigned char __u8;
typedef signed short __s16;
typedef unsigned short __u16;
typedef signed int __s32;
typedef unsigned int __u32;
typedef signed long long __s64;
typedef unsigned long long __u64;

#define __bitwise

typedef __u16 __bitwise __le16;
typedef __u16 __bitwise __be16;
typedef __u32 __bitwise __le32;
typedef __u32 __bitwise __be32;
typedef __u64 __bitwise __le64;
typedef __u64 __bitwise __be64;

typedef __u16 __bitwise __sum16;
typedef __u32 __bitwise __wsum;

#define __aligned_u64 __u64 __attribute__((aligned(8)))
#define __aligned_be64 __be64 __attribute__((aligned(8)))
#define __aligned_le64 __le64 __attribute__((aligned(8)))

#endif /* _LINUX_TYPES_H */
