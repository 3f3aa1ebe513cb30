"""The reference for benches/mlp_step.rs: one MLP (784 -> 256 -> 10, ReLU) SGD-with-momentum step
at batch 64 in PyTorch on CPU. Prints samples per second as `torch_samples_per_second=<n>`.

Install: pip install torch   (from PyPI; CPU is used either way)
"""

import os
import sys
import time

try:
    import torch
except ImportError:
    print("torch is not installed: pip install torch", file=sys.stderr)
    sys.exit(3)

threads = int(os.environ.get("BENCH_THREADS", "0"))
if threads > 0:
    torch.set_num_threads(threads)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.rand(64, 784)
y = torch.randint(0, 10, (64,))


def step():
    optim.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optim.step()


for _ in range(50):
    step()
steps = int(os.environ.get("BENCH_STEPS", "2000"))
start = time.perf_counter()
for _ in range(steps):
    step()
elapsed = time.perf_counter() - start
print(f"torch_threads={torch.get_num_threads()}")
print(f"torch_samples_per_second={steps * 64 / elapsed:.0f}")
