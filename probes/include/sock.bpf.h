/* Reading a kernel `struct sock *` with offsets taken from BTF at load time (SOCK_FIELDS in
 * tailsight/probes/offsets.py), never from bcc's generic headers, whose layouts are wrong for the
 * running kernel; reads go through kread.bpf.h.  tcpstate.py proves the offsets on a loopback
 * connection before trusting them.
 */
#ifndef TAILSIGHT_SOCK_BPF_H
#define TAILSIGHT_SOCK_BPF_H

#ifndef SOCK_CGROUP_OFF
#error "SOCK_CGROUP_OFF undefined: compile with offsets.SOCK_FIELDS resolved from BTF"
#endif
#ifndef SOCK_NUM_OFF
#error "SOCK_NUM_OFF undefined: compile with offsets.SOCK_FIELDS resolved from BTF"
#endif
#ifndef SOCK_DPORT_OFF
#error "SOCK_DPORT_OFF undefined: compile with offsets.SOCK_FIELDS resolved from BTF"
#endif
#ifndef SOCK_PROTOCOL_OFF
#error "SOCK_PROTOCOL_OFF undefined: compile with offsets.SOCK_FIELDS resolved from BTF"
#endif
#ifndef CGROUP_KN_OFF
#error "CGROUP_KN_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif
#ifndef KERNFS_NODE_ID_OFF
#error "KERNFS_NODE_ID_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif

#include "kread.bpf.h"

/* The cgroup v2 id the socket is charged to, sk->sk_cgrp_data.cgroup->kn->id: the cgroup of the
 * task that created it (an accepted socket inherits its listener's).  0 if a read fails. */
static __always_inline u64 sock_cgroup_id(const void *sk)
{
    const void *cgroup = kread_ptr(sk, SOCK_CGROUP_OFF);
    const void *kn;

    if (!cgroup)
        return 0;
    kn = kread_ptr(cgroup, CGROUP_KN_OFF);
    if (!kn)
        return 0;
    return kread_u64(kn, KERNFS_NODE_ID_OFF);
}

/* Local port in host byte order (skc_num); 0 until bound or if the read fails. */
static __always_inline u16 sock_local_port(const void *sk)
{
    return kread_u16(sk, SOCK_NUM_OFF);
}

/* Remote port in host byte order (skc_dport is stored big-endian); 0 if unset. */
static __always_inline u16 sock_remote_port(const void *sk)
{
    u16 port_be = kread_u16(sk, SOCK_DPORT_OFF);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_bswap16(port_be);
#else
    return port_be;
#endif
}

/* sk->sk_protocol (IPPROTO_TCP = 6); 0 if the read fails. */
static __always_inline u16 sock_protocol(const void *sk)
{
    return kread_u16(sk, SOCK_PROTOCOL_OFF);
}

#endif /* TAILSIGHT_SOCK_BPF_H */
