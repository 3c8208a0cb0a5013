/* Reading kernel memory at a BTF offset, the same source for both attach modes.
 *
 * tp_btf (compiled with -DTAILSIGHT_TP_BTF): tracepoint arguments are typed pointers and the
 * verifier allows direct loads from them and from the pointers loaded out of them (a faulting
 * load reads 0), ~1 ns each.  raw_tp: bpf_probe_read_kernel, ~47 ns each.  Kept in a header so
 * bcc, which rewrites dereferences only in the main source file, leaves the loads alone.
 */
#ifndef TAILSIGHT_KREAD_BPF_H
#define TAILSIGHT_KREAD_BPF_H

#ifdef TAILSIGHT_TP_BTF
#define KREAD_DEFINE(name, type)                                                                \
    static __always_inline type name(const void *base, unsigned long offset)                   \
    {                                                                                           \
        return *(const volatile type *)((const char *)base + offset);                          \
    }
#else
#define KREAD_DEFINE(name, type)                                                                \
    static __always_inline type name(const void *base, unsigned long offset)                   \
    {                                                                                           \
        type value = 0;                                                                         \
        bpf_probe_read_kernel(&value, sizeof(value), (const char *)base + offset);             \
        return value;                                                                           \
    }
#endif

KREAD_DEFINE(kread_u64, u64)
KREAD_DEFINE(kread_u32, u32)
KREAD_DEFINE(kread_u16, u16)
KREAD_DEFINE(kread_u8, u8)

/* A pointer argument as a number, to hash or compare.  On tp_btf it is a typed pointer, on which
 * the verifier allows no arithmetic: a store into a scratch slot of a map value (the caller's
 * per-CPU one) and a load back hand it over as a plain value.  On raw tracepoints it is one. */
static __always_inline u64 pointer_number(u64 arg, u64 *scratch)
{
#ifdef TAILSIGHT_TP_BTF
    *(volatile u64 *)scratch = arg;
    return *(volatile u64 *)scratch;
#else
    return arg;
#endif
}

/* A pointer member (0 if the read fails). */
static __always_inline const void *kread_ptr(const void *base, unsigned long offset)
{
    return (const void *)kread_u64(base, offset);
}

#endif /* TAILSIGHT_KREAD_BPF_H */
