// SPDX-License-Identifier: GPL-2.0
// Feed steering for the AF_XDP path: IPv4 UDP datagrams to FEED_PORT are redirected to the AF_XDP
// socket registered for the receiving rx queue; everything else (ARP, re-request replies, order
// entry) goes on to the kernel stack. Attached in generic (SKB) mode on a veth, so the kernel
// copies each redirected frame into the socket's UMEM.
// Each redirected frame carries its arrival time (bpf_ktime_get_ns, CLOCK_MONOTONIC, the clock of
// user space's perf_counter_ns) in the XDP metadata just before the frame; copy mode copies the
// metadata into the UMEM with the frame.
// Compile-time: -DFEED_PORT=<udp port>.
#include <uapi/linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>

#ifndef FEED_PORT
#error "FEED_PORT must be defined (-DFEED_PORT=...)"
#endif

// Read by user space at (frame address - sizeof): the magic says the stamp is this frame's.
#define RX_META_MAGIC 0x747372786d657461ULL
struct rx_meta {
    u64 magic;
    u64 rx_ns;
};

BPF_XSKMAP(feed_sockets, 64);
// [0] frames redirected to a socket, [1] frames passed to the stack.
BPF_ARRAY(steering_frames, u64, 2);

static __always_inline int count_and(int slot, int action)
{
    u64 *frames = steering_frames.lookup(&slot);
    if (frames)
        __sync_fetch_and_add(frames, 1);
    return action;
}

int xsk_redirect(struct xdp_md *ctx)
{
    u64 now = bpf_ktime_get_ns();
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end || eth->h_proto != htons(ETH_P_IP))
        return count_and(1, XDP_PASS);
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_UDP || ip->ihl < 5)
        return count_and(1, XDP_PASS);
    // A fragment other than the first carries no UDP header.
    if (ip->frag_off & htons(0x1FFF))
        return count_and(1, XDP_PASS);
    struct udphdr *udp = (void *)ip + ip->ihl * 4;
    if ((void *)(udp + 1) > data_end || udp->dest != htons(FEED_PORT))
        return count_and(1, XDP_PASS);
    if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct rx_meta)) == 0) {
        // Every packet pointer is invalid after the adjustment: load them again.
        struct rx_meta *meta = (void *)(long)ctx->data_meta;
        if ((void *)(meta + 1) <= (void *)(long)ctx->data) {
            meta->magic = RX_META_MAGIC;
            meta->rx_ns = now;
        }
    }
    // The flags argument is the action when no socket sits at this queue (kernel >= 5.3).
    int action = feed_sockets.redirect_map(ctx->rx_queue_index, XDP_PASS);
    return count_and(action == XDP_REDIRECT ? 0 : 1, action);
}
