/* Reading a kernel `struct sock *` with offsets taken from BTF at load time (SOCK_FIELDS in
 * tailsight/probes/offsets.py), never from bcc's generic headers, whose layouts are wrong for the
 * running kernel.  tcpstate.py proves the offsets on a loopback connection before trusting them.
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

/* The cgroup v2 id the socket is charged to, sk->sk_cgrp_data.cgroup->kn->id: the cgroup of the
 * task that created it (an accepted socket inherits its listener's).  0 if a read fails. */
static __always_inline u64 sock_cgroup_id(const void *sk)
{
    const char *cgroup = 0;
    const char *kn = 0;
    u64 id = 0;

    if (bpf_probe_read_kernel(&cgroup, sizeof(cgroup), (const char *)sk + SOCK_CGROUP_OFF) ||
        !cgroup)
        return 0;
    if (bpf_probe_read_kernel(&kn, sizeof(kn), cgroup + CGROUP_KN_OFF) || !kn)
        return 0;
    if (bpf_probe_read_kernel(&id, sizeof(id), kn + KERNFS_NODE_ID_OFF))
        return 0;
    return id;
}

/* Local port in host byte order (skc_num); 0 until bound or if the read fails. */
static __always_inline u16 sock_local_port(const void *sk)
{
    u16 port = 0;
    bpf_probe_read_kernel(&port, sizeof(port), (const char *)sk + SOCK_NUM_OFF);
    return port;
}

/* Remote port in host byte order (skc_dport is stored big-endian); 0 if unset. */
static __always_inline u16 sock_remote_port(const void *sk)
{
    u16 port_be = 0;
    bpf_probe_read_kernel(&port_be, sizeof(port_be), (const char *)sk + SOCK_DPORT_OFF);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_bswap16(port_be);
#else
    return port_be;
#endif
}

/* sk->sk_protocol (IPPROTO_TCP = 6); 0 if the read fails. */
static __always_inline u16 sock_protocol(const void *sk)
{
    u16 protocol = 0;
    bpf_probe_read_kernel(&protocol, sizeof(protocol), (const char *)sk + SOCK_PROTOCOL_OFF);
    return protocol;
}

#endif /* TAILSIGHT_SOCK_BPF_H */
