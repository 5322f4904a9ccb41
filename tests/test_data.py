"""A prepared loader's place in its epoch across a change of the number of ranks (jdist.rank.data): real
DistributedSamplers for each rank (their num_replicas and rank given: no process group is needed for the order),
the samples of an epoch each seen once."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from jdist.rank.data import ResumableLoader


def loaders(size: int, world: int, batch: int = 4, drop_last: bool = False) -> list[ResumableLoader]:
    data = TensorDataset(torch.arange(size))
    return [ResumableLoader(DataLoader(data, batch_size=batch, drop_last=drop_last,
                                       sampler=DistributedSampler(data, num_replicas=world, rank=r, seed=5)))
            for r in range(world)]


def take(loader: ResumableLoader, batches: int | None = None) -> list[int]:
    out: list[int] = []
    for (x,) in itertools.islice(loader, batches):
        out += x.tolist()
    return out


@pytest.mark.parametrize("size, old, new, left_out", [(96, 3, 2, 0), (94, 2, 3, 0), (50, 2, 4, 2)])
def test_an_epoch_goes_on_over_another_number_of_ranks_with_each_sample_once(size, old, new, left_out):
    before = loaders(size, old)
    seen = [i for lo in before for i in take(lo, 2)]  # 2 batches on each old rank
    state = before[0].elastic_state(old)
    assert state == {"epoch": 0, "consumed": 2 * 4 * old, "size": size}
    assert all(lo.elastic_state(old) == state for lo in before)
    after = loaders(size, new)
    lines = [lo.resume_elastic(state, r, new) for r, lo in enumerate(after)]
    rest = [take(lo) for lo in after]
    assert len({len(part) // 4 + bool(len(part) % 4) for part in rest}) == 1  # as many batches on every rank
    everything = seen + [i for part in rest for i in part]
    assert len(everything) == len(set(everything)) == size - left_out  # none twice, none skipped but the said
    assert f"epoch 0 goes on from sample {2 * 4 * old} of {size}" in lines[0]
    assert (f"({left_out} left out: too few for a batch on every rank)" in lines[0]) == bool(left_out), lines[0]
    # the pass after it is the sampler's own again, on the new number of ranks
    assert sorted(i for lo in after for i in take(lo)) == sorted(
        i for r in range(new) for i in DistributedSampler(after[0].dataset, num_replicas=new, rank=r, seed=5))


def test_a_checkpoint_of_the_loader_saved_on_3_ranks_goes_on_on_1():
    from jdist.rank.session import local_session

    before = loaders(60, 3)
    seen = [i for lo in before for i in take(lo, 3)]
    with local_session():  # rank 0 of 1
        state = before[0].state_dict()
        assert state == {"epoch": 0, "position": 3, "world_size": 1, "consumed": 12, "size": 60}  # (this world: 1)
        state.update(world_size=3, consumed=36)  # as rank 0 of the 3 wrote it
        one = loaders(60, 1)[0]
        one.load_state_dict(state)
        assert one.note == ("the loader was saved on 3 ranks, this cluster has 1: epoch 0 goes on from sample 36 of "
                            "60: the 24 left split over 1 ranks, 6 batch(es) each")
        rest = take(one)
    assert sorted(seen + rest) == list(range(60))


def test_a_loader_without_a_distributed_sampler_says_it_starts_its_epoch_again():
    plain = ResumableLoader(DataLoader(TensorDataset(torch.arange(8)), batch_size=2))
    state = plain.elastic_state(2)
    assert state == {"why": "its sampler is not a DistributedSampler: it starts its epoch again"}
    assert plain.resume_elastic(state, 0, 1) == state["why"]
