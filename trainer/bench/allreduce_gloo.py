"""The reference for benches/peer_exchange.rs `ring`: torch.distributed gloo all_reduce of a
10M-element fp32 tensor across 8 local processes (loopback). Prints the median seconds per
all_reduce (the slowest rank's) as `gloo_allreduce_seconds=<s>`.

Install: pip install torch numpy   (from PyPI)
Usage:   python3 allreduce_gloo.py [--params N] [--procs 8]
"""

import argparse
import os
import socket
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    print("torch is not installed: pip install torch", file=sys.stderr)
    sys.exit(3)

ROUNDS = 10


def worker(rank, world, port, params, out):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    x = torch.arange(params, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)  # warm-up: connections and buffers
    times = []
    for _ in range(ROUNDS):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(x)
        x /= world  # an average, like a ring round
        times.append(time.perf_counter() - start)
    times.sort()
    out[rank] = times[len(times) // 2]
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=10_000_000)
    parser.add_argument("--procs", type=int, default=8)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(worker, args=(args.procs, port, args.params, out), nprocs=args.procs)
    print(f"gloo_procs={args.procs}")
    print(f"gloo_params={args.params}")
    print(f"gloo_allreduce_seconds={max(out.values()):.4f}")


if __name__ == "__main__":
    main()
