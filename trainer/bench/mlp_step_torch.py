"""The reference for benches/mlp_step.rs: one SGD-with-momentum step (lr 0.05, momentum 0.9,
cross-entropy) of the same model as murmur's, in PyTorch on CPU.

    python3 mlp_step_torch.py [--model mlp|gn-lenet|logistic] [--batch N] [--steps N] [--threads N]

Prints `torch_threads=<n>` and `torch_samples_per_second=<n>`.

Models (as in trainer/src/model/mod.rs):
- logistic: 784 -> 10
- mlp: 784 -> 256 -> ReLU -> 10
- gn-lenet: three blocks of conv 5x5 (padding 2) -> GroupNorm(2 groups) -> ReLU -> 2x2 max-pool
  (32, 32, 64 channels; 28 -> 14 -> 7 -> 3), then 576 -> 10.

Install: pip install torch   (from PyPI; CPU is used either way)
"""

import argparse
import sys
import time

try:
    import torch
except ImportError:
    print("torch is not installed: pip install torch", file=sys.stderr)
    sys.exit(3)


def block(channels_in, channels_out):
    return [
        torch.nn.Conv2d(channels_in, channels_out, 5, padding=2),
        torch.nn.GroupNorm(2, channels_out),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2, 2),
    ]


def model_for(name):
    if name == "logistic":
        return torch.nn.Linear(784, 10)
    if name == "mlp":
        return torch.nn.Sequential(
            torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
    if name == "gn-lenet":
        return torch.nn.Sequential(
            torch.nn.Unflatten(1, (1, 28, 28)),
            *block(1, 32),
            *block(32, 32),
            *block(32, 64),
            torch.nn.Flatten(),
            torch.nn.Linear(64 * 3 * 3, 10),
        )
    raise SystemExit(f"--model {name}: use logistic, mlp or gn-lenet")


parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mlp")
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--steps", type=int, default=2000)
parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
args = parser.parse_args()

if args.threads > 0:
    torch.set_num_threads(args.threads)
torch.manual_seed(0)
model = model_for(args.model)
optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.rand(args.batch, 784)
y = torch.randint(0, 10, (args.batch,))


def step():
    optim.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optim.step()


for _ in range(max(5, args.steps // 40)):
    step()
start = time.perf_counter()
for _ in range(args.steps):
    step()
elapsed = time.perf_counter() - start
print(f"torch_threads={torch.get_num_threads()}")
print(f"torch_samples_per_second={args.steps * args.batch / elapsed:.0f}")
