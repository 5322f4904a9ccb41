"""A torchrun-style training script, as most distributed PyTorch code is written.

    torchrun --nproc-per-node 2 torchrun_train.py EPOCHS SNAPSHOT_EVERY [--batch-size 32]

It reads its rank from the environment torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE), forms its own
process group (gloo: it runs on CPUs), trains a small regression model under DistributedDataParallel,
saves a snapshot on rank 0 every few epochs and resumes from it when started again, and ends its
group. jdist's ranks run it unchanged with ``%run torchrun_train.py EPOCHS SNAPSHOT_EVERY`` in a
``%%distributed`` cell (notebooks/05-torchrun-script.ipynb).
"""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Regression(Dataset):
    """``size`` random inputs of 20 features and a linear target with a little noise (the same on every rank)."""

    def __init__(self, size: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, 20, generator=g)
        self.y = self.x @ torch.linspace(-1, 1, 20).unsqueeze(1) + 0.1 * torch.randn(size, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class Trainer:
    """Epochs of DDP training over ``loader``; rank 0 writes ``snapshot`` every ``snapshot_every`` epochs."""

    def __init__(self, model, loader, optimizer, snapshot_every: int, snapshot: str):
        self.rank = int(os.environ["RANK"])
        self.loader, self.optimizer = loader, optimizer
        self.snapshot_every, self.snapshot = snapshot_every, Path(snapshot)
        self.epoch = 0
        if self.snapshot.exists():
            saved = torch.load(self.snapshot)
            model.load_state_dict(saved["model"])
            self.epoch = saved["epoch"] + 1
            print(f"[rank {self.rank}] resuming at epoch {self.epoch} from {self.snapshot}")
        self.model = DistributedDataParallel(model)

    def _run_batch(self, x, y) -> float:
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        self.loader.sampler.set_epoch(epoch)
        losses = [self._run_batch(x, y) for x, y in self.loader]
        print(f"[rank {self.rank}] epoch {epoch}: {len(losses)} steps, mean loss {sum(losses) / len(losses):.4f}")

    def train(self, epochs: int) -> None:
        for epoch in range(self.epoch, epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and (epoch + 1) % self.snapshot_every == 0:
                torch.save({"model": self.model.module.state_dict(), "epoch": epoch}, self.snapshot)
                print(f"[rank 0] epoch {epoch}: snapshot written to {self.snapshot}")


def main(epochs: int, snapshot_every: int, batch_size: int, snapshot: str = "snapshot.pt") -> None:
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    data = Regression(256)
    loader = DataLoader(data, batch_size=batch_size, sampler=DistributedSampler(data))
    model = torch.nn.Linear(20, 1)
    trainer = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.05), snapshot_every, snapshot)
    trainer.train(epochs)
    dist.barrier()  # every rank is done (rank 0 has written its snapshot) before the group ends
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="DDP training of a small regression model, torchrun-style.")
    parser.add_argument("epochs", type=int, help="train until this many epochs are done")
    parser.add_argument("snapshot_every", type=int, help="rank 0 saves a snapshot every N epochs")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    main(args.epochs, args.snapshot_every, args.batch_size)
