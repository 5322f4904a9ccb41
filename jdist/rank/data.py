"""Data loaders that remember where they are, so a checkpoint can resume mid-epoch.

``jdist.prepare(loader)`` returns a :class:`ResumableLoader`: it iterates exactly like the
DataLoader it wraps and counts the batches handed out in the current epoch.
``jdist.save_checkpoint(..., loader=loader)`` stores ``{"epoch", "position"}``;
``jdist.load_checkpoint(..., loader=loader)`` sets the sampler's epoch and makes the next
pass over that epoch skip the batches already trained on (without loading them).

Exact resume needs a sampler whose order depends only on the epoch, such as
``DistributedSampler`` (seed + epoch), which is what distributed loaders use anyway.

Why not a library's: accelerate's ``skip_first_batches`` skips the same way but builds
accelerate's ``PartialState`` on the rank (its own view of the distributed set-up) and is in an
optional extra, and neither it nor torchdata's ``StatefulDataLoader`` (another loader class in
place of the user's, and another dependency) restores the global RNG around the resumed
iterator, which an exact resume needs (see :meth:`ResumableLoader._skipping`).

Example (on a rank):
    >>> loader = jdist.prepare(DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds)))  # doctest: +SKIP
    >>> for epoch in range(start_epoch, epochs):   # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for xb, yb in loader: ...
"""

from __future__ import annotations

from typing import Any, Iterator


class _SkipBatches:
    """A batch sampler that leaves out the first ``skip`` batches of another."""

    def __init__(self, batch_sampler: Any, skip: int):
        self.batch_sampler, self.skip = batch_sampler, skip

    def __iter__(self) -> Iterator[Any]:
        for i, batch in enumerate(self.batch_sampler):
            if i >= self.skip:
                yield batch

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)


class ResumableLoader:
    """A DataLoader wrapper with ``epoch``/``position`` state (see the module doc).

    Attributes of the wrapped loader (``dataset``, ``batch_size``, ``sampler``...) are
    reachable as usual; ``loader.loader`` is the DataLoader itself.
    """

    def __init__(self, loader: Any):
        self.loader = loader
        self.epoch = int(getattr(loader.sampler, "epoch", 0))
        self.position = 0  # batches handed out in the current pass
        self._resume: tuple[int, int] | None = None  # (epoch, batches to skip) after a load
        #: after a resize: (epoch, samples of it consumed before, this rank's batches of the rest, world size)
        self._elastic: tuple[int, int, list[list[int]], int] | None = None
        self._pass: tuple[int, int] = (0, 0)  # the current pass's (samples consumed before it, its world size)
        self.note: str | None = None  # what the last load_state_dict did beyond the usual, in words

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: ``sampler.set_epoch`` (reshuffles a DistributedSampler)."""
        sampler = self.loader.sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        epoch = int(getattr(self.loader.sampler, "epoch", self.epoch))
        self.epoch = epoch
        skip = 0
        if self._resume is not None:
            resume_epoch, resume_skip = self._resume
            if resume_epoch == epoch:
                skip = resume_skip
            self._resume = None
        self.position = skip
        self._pass = (0, 0)
        if self._elastic is not None and self._elastic[0] == epoch:
            _, before, batches, world = self._elastic
            self._pass = (before, world)
            source = self._clone(batches)
        else:
            source = self._skipping(skip) if skip else iter(self.loader)
        self._elastic = None
        for batch in source:
            self.position += 1
            yield batch
        if not hasattr(self.loader.sampler, "epoch"):
            self.epoch += 1

    def _skipping(self, skip: int) -> Iterator[Any]:
        ld = self.loader
        if ld.batch_sampler is None:
            raise ValueError(
                "This DataLoader has no batch sampler (batch_size=None), so jdist cannot skip to the resumed "
                "position. Give it a batch_size, or resume at the start of an epoch."
            )
        return self._clone(_SkipBatches(ld.batch_sampler, skip))

    def _clone(self, batch_sampler: Any) -> Iterator[Any]:
        """An iterator of the wrapped loader's batches as ``batch_sampler`` gives their indices."""
        import torch

        ld = self.loader
        clone = torch.utils.data.DataLoader(
            ld.dataset, batch_sampler=batch_sampler, num_workers=ld.num_workers,
            collate_fn=ld.collate_fn, pin_memory=ld.pin_memory, timeout=ld.timeout,
            worker_init_fn=ld.worker_init_fn, multiprocessing_context=ld.multiprocessing_context,
            generator=ld.generator, persistent_workers=ld.persistent_workers,
            **({"prefetch_factor": ld.prefetch_factor} if ld.num_workers > 0 else {}),
        )
        # Starting a DataLoader iterator draws a seed from the global RNG. The interrupted run
        # drew it at the start of this epoch, before the checkpoint's RNG state was taken:
        # drawing again now would shift every random number after the resume.
        rng = torch.get_rng_state()
        it = iter(clone)
        torch.set_rng_state(rng)
        return it

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch": e, "position": batches already handed out in epoch e}``, and where the sampler is a
        DistributedSampler the world size and the samples of the epoch all ranks consumed (:meth:`elastic_state`:
        what a checkpoint loaded on another number of ranks goes on from)."""
        state: dict[str, Any] = {"epoch": self.epoch, "position": self.position}
        world = _world_size()
        if world is not None:
            elastic = self.elastic_state(world)
            if "why" not in elastic:
                state.update(world_size=world, consumed=elastic["consumed"], size=elastic["size"])
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: set the epoch, and skip ``position`` batches on the next pass over it; saved on another number
        of ranks, go on with the samples of the epoch not yet consumed, split over these (:meth:`resume_elastic`;
        :attr:`note` says so, which :func:`jdist.load_checkpoint` passes on)."""
        world = _world_size()
        if world is not None and state.get("world_size") not in (None, world) and "consumed" in state:
            from .session import session

            line = self.resume_elastic(state, session().ctx.rank, world)
            self.note = f"the loader was saved on {state['world_size']} ranks, this cluster has {world}: {line}"
            return
        self.set_epoch(int(state["epoch"]))
        self._resume = (int(state["epoch"]), int(state["position"]))
        self.position = int(state["position"])

    def elastic_state(self, world_size: int) -> dict[str, Any]:
        """Where this epoch is, independently of the number of ranks (a resize, :mod:`jdist.rank.elastic`): the
        samples of the epoch's order that all ranks together consumed. A ``DistributedSampler`` hands rank r the
        positions r, r + W, r + 2W... of its order, so after p batches of B on each of W ranks the first p x B x W
        positions are consumed. ``{"epoch", "consumed", "size"}``, or ``{"why": ...}`` where the loader's order
        is not a DistributedSampler's."""
        ld = self.loader
        sampler = getattr(ld, "sampler", None)
        if not all(hasattr(sampler, a) for a in ("num_replicas", "shuffle", "seed", "set_epoch")):
            return {"why": "its sampler is not a DistributedSampler: it starts its epoch again"}
        if ld.batch_size is None:
            return {"why": "it has no batch_size (a batch sampler of its own): it starts its epoch again"}
        before, world = self._pass if self._pass[1] else (0, world_size)
        size = len(ld.dataset)
        return {"epoch": self.epoch, "consumed": min(size, before + self.position * ld.batch_size * world),
                "size": size}

    def resume_elastic(self, state: dict[str, Any], rank: int, world_size: int) -> str:
        """Go on with the epoch of ``state`` (:meth:`elastic_state` of the old world) on ``world_size`` ranks: the
        samples not yet consumed, in the epoch's order, rank r taking every ``world_size``-th from the r-th (none
        twice, none skipped), cut to the same number of batches on every rank (a collective needs every rank in
        every step): the few a rank has beyond them are left out, and said. Returns one line for the report."""
        import torch

        if "why" in state:
            return state["why"]
        ld, sampler = self.loader, self.loader.sampler
        size, consumed, epoch = len(ld.dataset), int(state["consumed"]), int(state["epoch"])
        if size != state["size"]:
            return f"its dataset has {size} samples, not {state['size']} as before: it starts its epoch again"
        self.set_epoch(epoch)
        if consumed >= size:
            self.set_epoch(epoch + 1)
            return f"epoch {epoch} was done: it goes on with epoch {epoch + 1}"
        if sampler.shuffle:  # (DistributedSampler's own order: seed + epoch)
            g = torch.Generator()
            g.manual_seed(sampler.seed + epoch)
            order = torch.randperm(size, generator=g).tolist()
        else:
            order = list(range(size))
        rest = order[consumed:]
        batch, drop_last = ld.batch_size, ld.drop_last
        shares = [rest[r::world_size] for r in range(world_size)]
        counts = [len(x) // batch if drop_last else -(-len(x) // batch) for x in shares]
        keep = min(counts)
        mine = shares[rank][:keep * batch]
        left_out = sum(len(x) - len(x[:keep * batch]) for x in shares)
        self._elastic = (epoch, consumed, [mine[i:i + batch] for i in range(0, len(mine), batch)], world_size)
        self.position = 0
        line = (f"epoch {epoch} goes on from sample {consumed} of {size}: the {len(rest)} left split over "
                f"{world_size} ranks, {keep} batch(es) each")
        if left_out:
            line += f" ({left_out} left out: too few for a batch on every rank)"
        return line

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"ResumableLoader({self.loader!r}, epoch={self.epoch}, position={self.position})"


def _world_size() -> int | None:
    """This rank's world size, None outside a jdist rank session (none is opened for it)."""
    import sys

    sessions = sys.modules.get("jdist.rank.session")  # (jdist.rank.session is also the function's name)
    current = sessions._current if sessions is not None else None
    return int(current.ctx.world_size) if current is not None else None
