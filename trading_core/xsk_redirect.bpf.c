// SPDX-License-Identifier: GPL-2.0
// Feed steering for the AF_XDP path: IPv4 UDP datagrams to FEED_PORT are redirected to the AF_XDP
// socket registered for the receiving rx queue; everything else (ARP, re-request replies, order
// entry) goes on to the kernel stack. Attached in generic (SKB) mode on a veth, so the kernel
// copies each redirected frame into the socket's UMEM.
// Each redirected frame carries its arrival time (bpf_ktime_get_ns, CLOCK_MONOTONIC, the clock of
// user space's perf_counter_ns) in its own first bytes, written over the Ethernet addresses: the
// socket's reader needs only the EtherType and what follows, and a direct packet write works on
// every kernel that runs XDP. A frame no socket takes goes to the stack with its MACs restored.
// (Not in the XDP metadata: some kernels refuse bpf_xdp_adjust_meta to this program type,
// "program of this type cannot use helper".)
// Compile-time: -DFEED_PORT=<udp port>.
#include <uapi/linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>

#ifndef FEED_PORT
#error "FEED_PORT must be defined (-DFEED_PORT=...)"
#endif

// Read by user space at the frame's start: the magic says the frame was stamped.
#define RX_STAMP_MAGIC 0x78727374U /* "tsrx" */
struct rx_stamp {
    u64 rx_ns;
    u32 magic;
} __attribute__((packed)); /* 12 bytes: the destination and source MAC addresses */

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
    struct rx_stamp *stamp = data; /* within the Ethernet header checked above */
    struct rx_stamp macs = *stamp;
    stamp->rx_ns = now;
    stamp->magic = RX_STAMP_MAGIC;
    // The flags argument is the action when no socket sits at this queue (kernel >= 5.3).
    int action = feed_sockets.redirect_map(ctx->rx_queue_index, XDP_PASS);
    if (action != XDP_REDIRECT)
        *stamp = macs; /* to the stack as it came: a stamped frame would be for another host */
    return count_and(action == XDP_REDIRECT ? 0 : 1, action);
}
