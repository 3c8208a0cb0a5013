/* Reading a kernel `struct task_struct *` with offsets taken from BTF at load time.
 *
 * The kernel headers bcc compiles against are generic and their struct layouts are wrong for the
 * running kernel, so a task is only ever touched as bytes at an offset passed with -D by
 * tailsight.probes.offsets.verified_offset_cflags() (which also self-checks them), through
 * kread.bpf.h (direct loads on tp_btf, probe reads on raw tracepoints).  Never dereference
 * `struct task_struct` from bcc's headers.
 */
#ifndef TAILSIGHT_TASK_BPF_H
#define TAILSIGHT_TASK_BPF_H

#ifndef TASK_PID_OFF
#error "TASK_PID_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif
#ifndef TASK_TGID_OFF
#error "TASK_TGID_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif
#ifndef TASK_COMM_OFF
#error "TASK_COMM_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif
#ifndef TASK_CGROUPS_OFF
#error "TASK_CGROUPS_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif
#ifndef CSS_SET_DFL_CGRP_OFF
#error "CSS_SET_DFL_CGRP_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif
#ifndef CGROUP_KN_OFF
#error "CGROUP_KN_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif
#ifndef KERNFS_NODE_ID_OFF
#error "KERNFS_NODE_ID_OFF undefined: compile with tailsight.probes.offsets.verified_offset_cflags()"
#endif

#include "kread.bpf.h"

#define TASK_COMM_LEN_BYTES 16

/* Thread id (the kernel's task->pid). 0 if the read fails. */
static __always_inline u32 task_pid(const void *task)
{
    return kread_u32(task, TASK_PID_OFF);
}

/* Process id (task->tgid). 0 if the read fails. */
static __always_inline u32 task_tgid(const void *task)
{
    return kread_u32(task, TASK_TGID_OFF);
}

/* task->comm, NUL-padded; all zero if the read fails (the helper zeroes on error).  Only the
 * raw-tracepoint self-check reads it, so it stays a probe read. */
static __always_inline void task_comm(const void *task, char comm[TASK_COMM_LEN_BYTES])
{
    bpf_probe_read_kernel(comm, TASK_COMM_LEN_BYTES, (const char *)task + TASK_COMM_OFF);
}

/* The task's cgroup v2 id, task->cgroups->dfl_cgrp->kn->id: what bpf_get_current_cgroup_id()
 * returns for current, but for any task (a woken or migrated one).  0 if a read fails (on
 * tp_btf a faulting load reads 0, so a 0 pointer falls through to a 0 id). */
static __always_inline u64 task_cgroup_id(const void *task)
{
    const void *css_set = kread_ptr(task, TASK_CGROUPS_OFF);
    const void *cgroup;
    const void *kn;

    if (!css_set)
        return 0;
    cgroup = kread_ptr(css_set, CSS_SET_DFL_CGRP_OFF);
    if (!cgroup)
        return 0;
    kn = kread_ptr(cgroup, CGROUP_KN_OFF);
    if (!kn)
        return 0;
    return kread_u64(kn, KERNFS_NODE_ID_OFF);
}

#endif /* TAILSIGHT_TASK_BPF_H */
