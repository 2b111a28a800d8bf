"""A small data-parallel training run on the CPU (torch DDP, gloo), the workload of torchrun_bench.py.

A 3-layer MLP learns a synthetic regression; each rank trains on its shard of the data, DDP averages
the gradients every step. Runs unchanged under ``torchrun --nproc_per_node N`` and as an N-worker
trainhub job (both give the torchrun variables ``init_process_group("gloo")`` reads); rank 0 prints
the loss per epoch and the training time. ``BENCH_EPOCHS`` (default 8) sets the length.
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    n, dim, batch = 8192, 256, 128
    x = torch.randn(n, dim)
    y = x @ torch.randn(dim, 1) + 0.1 * torch.randn(n, 1)
    x, y = x[rank::world], y[rank::world]  # this rank's shard
    model = DDP(nn.Sequential(nn.Linear(dim, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    start = time.perf_counter()
    for epoch in range(int(os.environ.get("BENCH_EPOCHS", "8"))):
        perm = torch.randperm(len(x))
        for i in range(0, len(x), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"trained in {time.perf_counter() - start:.2f} s on {world} workers, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, torch threads {torch.get_num_threads()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
