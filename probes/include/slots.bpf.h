/* Small slots for what a probe counts per key (a cgroup, a (cgroup, syscall) series): key ->
 * slot in a hash, then the slot indexes plain arrays (histogram rows, counters), so a sample
 * costs array arithmetic instead of a hash lookup-or-init per cell.  Every probe with slots
 * names its maps <probe>_slots (key -> slot), <probe>_slot_owner (slot -> key, the claim) and
 * <probe>_slot_hint (the next free slot); user space (bccprobe.release_slots) relies on these
 * names to give a removed cgroup's slots back.
 *
 * bcc rewrites map operations only in the main source file and never inside a macro, so the
 * probe hands its three map operations in as small always-inline functions; clang inlines
 * them through the constant function pointers (BPF has no indirect calls: if it did not, the
 * program would not compile).
 */
#ifndef TAILSIGHT_SLOTS_BPF_H
#define TAILSIGHT_SLOTS_BPF_H

/* Slots tried from the hint.  Only a new key pays for the walk; user space keeps the hint at
 * the start of a run of free slots (bccprobe.steer_slot_hint) after slots are given back. */
#define SLOT_CLAIM_TRIES 16

/* 0: `slot` is now owned by `key` (a no-exist insert into <probe>_slot_owner). */
typedef int (*slot_own_fn)(u32 *slot, const void *key);
/* 0: `key` now maps to `slot` (a no-exist insert into <probe>_slots). */
typedef int (*slot_bind_fn)(const void *key, u32 *slot);
/* The slot `key` maps to, or NULL (a lookup in <probe>_slots). */
typedef u32 *(*slot_find_fn)(const void *key);

/* A free slot in [first_slot, max_slots) for a key seen for the first time (-1: none left).
 * bcc's target lacks atomic fetch-and-add, so a slot is claimed by a no-exist insert into the
 * owner map, starting at *hint; a CPU that loses the race to bind the same key takes the
 * winner's slot (its own claim is wasted: at most one slot per race). */
static __always_inline s32 slot_claim(u32 *hint, u32 first_slot, u32 max_slots, const void *key,
                                      slot_own_fn own, slot_bind_fn bind, slot_find_fn find)
{
    u32 slot = *hint;
    u32 *winner;

    for (int try = 0; try < SLOT_CLAIM_TRIES; try++) {
        if (slot < first_slot)
            slot = first_slot;
        if (slot >= max_slots)
            return -1;
        if (own(&slot, key) == 0) {
            *hint = slot + 1;
            if (bind(key, &slot) == 0)
                return (s32)slot;
            winner = find(key);
            return winner ? (s32)*winner : -1;
        }
        slot++;
    }
    return -1;
}

#endif /* TAILSIGHT_SLOTS_BPF_H */
