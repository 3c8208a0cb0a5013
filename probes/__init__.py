"""eBPF probes: one probe is ``name.bpf.c`` + ``name.py``; BTF offsets and feature checks."""
