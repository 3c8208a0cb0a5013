/* Start-up self-check of the BTF offsets in task.bpf.h.
 *
 * On a syscall from one thread of ours (SELF_TGID/SELF_TID, passed with -D), read pid, tgid, comm
 * and cgroup id of current through task.bpf.h, next to what the BPF helpers say about the same
 * task.  User space compares both with what it knows about itself (see offsets.py).
 */
#include "task.bpf.h"

#if !defined(SELF_TGID) || !defined(SELF_TID)
#error "SELF_TGID and SELF_TID must be defined: the self-check only watches the checking thread"
#endif

struct selfcheck_record {
    u64 hits;
    u64 helper_pid_tgid;
    u64 helper_cgroup_id;
    u64 read_cgroup_id;
    u32 read_pid;
    u32 read_tgid;
    char helper_comm[TASK_COMM_LEN_BYTES];
    char read_comm[TASK_COMM_LEN_BYTES];
};

BPF_ARRAY(selfcheck_records, struct selfcheck_record, 1);

RAW_TRACEPOINT_PROBE(sys_enter)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (pid_tgid != (((u64)SELF_TGID << 32) | (u64)SELF_TID))
        return 0;

    u32 zero = 0;
    struct selfcheck_record *record = selfcheck_records.lookup(&zero);
    if (!record)
        return 0;

    const void *task = (const void *)bpf_get_current_task();
    record->helper_pid_tgid = pid_tgid;
    record->helper_cgroup_id = bpf_get_current_cgroup_id();
    bpf_get_current_comm(record->helper_comm, sizeof(record->helper_comm));
    record->read_pid = task_pid(task);
    record->read_tgid = task_tgid(task);
    record->read_cgroup_id = task_cgroup_id(task);
    task_comm(task, record->read_comm);
    __sync_fetch_and_add(&record->hits, 1);
    return 0;
}
