/* The smallest raw tracepoint program: `tailsight doctor` compiles it to prove bcc + headers work
 * and attaches it to every raw tracepoint a probe needs, one after another. */
int tailsight_noop(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}
