"""Data-parallel training of a cgru GRU on local CPU processes (torch.distributed, gloo).

    python examples/ddp_train.py [--steps 5] [--world-size 2] [--dtype float32]

Every rank builds the same model (same seed), takes its slice of one global batch, and
``DistributedDataParallel`` averages the gradients across ranks: each step equals one SGD
step of a single process on the whole batch.  Rank 0 prints the whole batch's loss per step.
``--save PREFIX`` writes each rank's per-step losses, gradients and weights to
``PREFIX.rank{r}.pt`` (``tests/test_ddp.py`` compares them with a single-process run).
"""
import argparse
import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import cgru.torch

BATCH, STEPS, FEATURES, HIDDEN = 8, 12, 6, 16


class Model(nn.Module):
    """A 2-layer cgru GRU reading a sequence, and a linear head on its last output."""

    def __init__(self):
        super().__init__()
        self.rnn = cgru.torch.GRU(FEATURES, HIDDEN, num_layers=2, batch_first=True)
        self.rnn.num_threads = 1                # one core per rank
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


def make_model(dtype):
    torch.manual_seed(0)
    return Model().to(dtype)


def make_batch(dtype):
    """The global batch: ``x`` ``[BATCH, STEPS, FEATURES]`` and a target ``[BATCH, 1]``."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, STEPS, FEATURES, generator=g, dtype=dtype)
    return x, x[:, :, 0].mean(dim=1, keepdim=True)


def train(model, x, target, steps, report=None):
    """SGD steps on ``(x, target)``; returns ``[(loss, grads, weights)]`` per step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    history = []
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()                        # DDP all-reduces the gradients here
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        history.append((loss.detach(), grads, [p.detach().clone() for p in model.parameters()]))
        if report:
            report(step, loss.detach())
    return history


def worker(rank, world_size, port, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        dtype = getattr(torch, args.dtype)
        model = DistributedDataParallel(make_model(dtype))
        x, target = make_batch(dtype)
        part = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)

        reduced = []                           # kept until the process group is gone (below)

        def report(step, loss):                # the mean of the ranks' losses: the batch's
            dist.all_reduce(loss)
            reduced.append(loss)
            if rank == 0:
                print(f"step {step + 1}: loss {loss.item() / world_size:.6f}", flush=True)

        history = train(model, x[part], target[part], args.steps, report)
        if args.save:
            torch.save(history, f"{args.save}.rank{rank}.pt")
    finally:
        # Gloo's worker threads finish a collective after it returns (dropping its tensors,
        # which may need the GIL); destroy_process_group holds the GIL while it waits for them
        # (a deadlock: PyTorch issue 56297). So the tensors passed to collectives are still
        # referenced here, and a barrier, then a moment without the GIL, let the workers go
        # idle before the group is destroyed.
        try:
            dist.barrier()
            time.sleep(0.05)
        finally:
            dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--save", metavar="PREFIX", help="save each rank's history")
    args = parser.parse_args()
    if BATCH % args.world_size:
        parser.error(f"--world-size must divide the batch of {BATCH}")
    port = args.port or free_port()
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")    # gloo on the loopback only
    mp.spawn(worker, args=(args.world_size, port, args), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
