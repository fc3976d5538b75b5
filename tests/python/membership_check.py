"""Who is in a communicator, through the torch doors (docs/reliability.md), 4 ranks:

  subgroups     with ONEBIT_ROOT set (the address every rank is given), a tagged all_reduce on the
                world group and then on two disjoint subgroups {0,1} and {2,3} at once: each group
                gets its own exact sum (constant inputs compress exactly) and each call is compressed.
                Each group's communicator has its own root address, identity and secret (drawn by
                its rank 0, published through its store or gloo context), so the subgroups neither
                wait at one address nor join each other.
  freed-tag     20 times: a tensor tagged and dropped without untag, then a fresh, never-tagged
                tensor of the same size (which the allocator may place at the freed address) is
                all_reduced: never compressed (onebit.stats() counts no compressed call), since a
                tag goes with its storage's memory; and a name whose tensor was freed, tagged
                again, keeps its state (2 calls counted).
  strided-view  all_reduce of buf[::2], where buf[:8] is tagged (same address, same element count):
                refused, naming the reason, and buf is unchanged on every rank — not compressed as if
                it were the tagged buffer.

    PYTHON tests/python/membership_check.py BUILD_DIR [preload|onebit] [MODE ...]

The preload door runs with ONEBIT_TRANSPORT=tcp, so that its communicators bootstrap over TCP, and
takes `subgroups` and `freed-tag` only: Debian's torch 1.13 hands gloo a strided view's memory as if it were
contiguous, with or without onebit (plain gloo sums buf[0:8] there), and gloo::allreduce — all the
Gloo door sees — carries no strides to tell.
"""
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
from modes import require, rank_or_driver  # noqa: E402

WORLD = 4


def subgroups(mode, rank, torch, dist, onebit, tmp):
    everyone = torch.full((1024,), float(rank + 1))
    onebit.tag(everyone, "world")
    dist.all_reduce(everyone)
    require(torch.equal(everyone, torch.full_like(everyone, 10.0)), f"world sum {everyone[:3].tolist()}, want 10")
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group, in one order
    half = torch.full((1024,), float(rank + 1))
    onebit.tag(half, "half")
    dist.all_reduce(half, group=halves[rank // 2])
    want = 3.0 if rank < 2 else 7.0
    require(torch.equal(half, torch.full_like(half, want)),
            f"subgroup {rank // 2} sum {half[:3].tolist()}, want {want} (another group's ranks in this one?)")
    compressed = onebit.stats()["compressed_calls"]
    require(compressed == 2, f"{compressed} compressed calls, want 2 (the world's and the subgroup's)")
    print(f"rank {rank}: world sum 10 and subgroup sum {want}, both compressed", flush=True)


def freed_tag(mode, rank, torch, dist, onebit, tmp):
    reused = 0
    for i in range(20):
        dropped = torch.zeros(4096)
        onebit.tag(dropped, f"dropped-{i}")
        address = dropped.data_ptr()
        del dropped
        fresh = torch.full((4096,), float(rank + 1))
        reused += fresh.data_ptr() == address
        before = onebit.stats()["compressed_calls"]
        dist.all_reduce(fresh)
        require(onebit.stats()["compressed_calls"] == before,
                f"round {i}: a never-tagged tensor {'at the freed tagged address ' if fresh.data_ptr() == address else ''}"
                "was compressed")
        require(torch.equal(fresh, torch.full_like(fresh, 10.0)), f"round {i}: sum {fresh[:3].tolist()}, want 10")
    # A name whose tensor was freed keeps its state: tagged again, it moves (its call count goes on),
    # whenever the collector freed the old memory — as if re-tagged before the free, on every rank.
    import ctypes
    kept = torch.full((4096,), 1.0)
    onebit.tag(kept, "kept")
    dist.all_reduce(kept)
    del kept
    again = torch.full((4096,), 1.0)
    onebit.tag(again, "kept")
    dist.all_reduce(again)
    calls, sent = ctypes.c_uint64(), ctypes.c_uint64()
    lib = onebit._library()
    require(lib.onebit_tag_stats(b"kept", ctypes.byref(calls), ctypes.byref(sent)) == 0, "no tag 'kept'")
    require(calls.value == 2, f"tag 'kept' counts {calls.value} calls after its tensor was freed and re-tagged, want 2")
    print(f"rank {rank}: 20 fresh tensors, {reused} at a freed tagged address, none compressed; a freed name kept "
          "its state", flush=True)


def strided_view(mode, rank, torch, dist, onebit, tmp):
    buf = torch.arange(16, dtype=torch.float32) + rank
    onebit.tag(buf[:8], "head")
    before = buf.clone()
    try:
        dist.all_reduce(buf[::2])
        message = None
    except (RuntimeError, ValueError) as error:
        message = str(error)
    require(message is not None, f"all_reduce of a strided view at a tagged address ran: buf is now {buf.tolist()}")
    require(torch.equal(buf, before), f"buf changed from {before.tolist()} to {buf.tolist()}")
    require("contiguous" in message, f"the refusal does not give the reason: {message}")
    print(f"rank {rank}: refused: {message.splitlines()[0][:160]}", flush=True)


CASES = {"subgroups": subgroups, "freed-tag": freed_tag, "strided-view": strided_view}
_ROOTS = {}


def rank_env(mode, rank, env):
    if mode not in _ROOTS:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            _ROOTS[mode] = f"127.0.0.1:{probe.getsockname()[1]}"
    return dict(env, ONEBIT_ROOT=_ROOTS[mode], ONEBIT_TRANSPORT="tcp", OMP_NUM_THREADS="1")


if __name__ == "__main__":
    sys.exit(rank_or_driver(__file__, CASES, list(CASES), WORLD, rank_env=rank_env, doc=__doc__))
