"""DeiT's RASampler (deit/samplers.py, __iter__), transcribed with the epoch's order given instead of
drawn by torch.randperm: checks the ranks' index lists that tests/data/repeated_aug_sampler_test.cpp
wrote, rank by rank and as a union (a multiset), against it. Exit 0 when all agree, 1 otherwise.

    python3 scripts/ra_sampler_reference.py CASES.json
"""
import json
import math
import sys
from collections import Counter


def ra_sampler(order, num_replicas, rank, num_repeats):
    """RASampler.__iter__ for `order` (its randperm or arange), as DeiT writes it."""
    n = len(order)
    num_samples = int(math.ceil(n * num_repeats / num_replicas))
    total_size = num_samples * num_replicas
    num_selected_samples = int(math.floor(n // 256 * 256 / num_replicas))
    indices = [i for i in order for _ in range(num_repeats)]  # torch.repeat_interleave(dim=0)
    padding_size = total_size - len(indices)
    if padding_size > 0:
        indices += indices[:padding_size]
    assert len(indices) == total_size
    indices = indices[rank:total_size:num_replicas]
    assert len(indices) == num_samples
    return indices[:num_selected_samples]


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    failures = 0
    for case in cases:
        world, repeats, order = case["world"], case["repeats"], case["order"]
        ours = case["ranks"]
        theirs = [ra_sampler(order, world, r, repeats) for r in range(world)]
        name = f"n={len(order)} world={world} repeats={repeats}"
        for r in range(world):
            if ours[r] != theirs[r]:
                print(f"{name}: rank {r} differs (ours {len(ours[r])} indices, DeiT's {len(theirs[r])})")
                failures += 1
        union_ours = Counter(i for rank in ours for i in rank)
        union_theirs = Counter(i for rank in theirs for i in rank)
        if union_ours != union_theirs:
            print(f"{name}: the ranks' union differs")
            failures += 1
        else:
            print(f"{name}: {sum(union_ours.values())} indices, {len(union_ours)} distinct: equal")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
