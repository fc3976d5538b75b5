"""Who is in a communicator, through the torch doors (docs/reliability.md), 4 ranks:

  subgroups     with ONEBIT_ROOT set (the address every rank is given), a tagged all_reduce on the
                world group and then on two disjoint subgroups {0,1} and {2,3} at once: each group
                gets its own exact sum (constant inputs compress exactly) and each call is compressed.
                Each group's communicator has its own root address, identity and secret (drawn by
                its rank 0, sent over the group's gloo half or gloo context), so the subgroups neither
                wait at one address nor join each other.
  freed-tag     20 times: a tensor tagged and dropped without untag, then a fresh, never-tagged
                tensor of the same size (which the allocator may place at the freed address) is
                all_reduced: never compressed (onebit.stats() counts no compressed call), since a
                tag goes with its storage's memory; and a name whose tensor was freed, tagged
                again, keeps its state (2 calls counted).
  strided-view  all_reduce of buf[::2], where buf[:8] is tagged (same address, same element count):
                refused, naming the reason, and buf is unchanged on every rank — not compressed as if
                it were the tagged buffer.
  stale-store   the world and a subgroup made, used and destroyed on one store, then made again on
                it with every read of a key the first ones left answered with their value, as if
                each read came before the rank that writes the key anew: what a restarted attempt
                can meet under torchrun, which keeps one store across restarts (static rendezvous,
                and c10d's since mid-2024). The new groups form within their timeout and sum
                exactly: onebit's invitation comes over the group, and the gloo half's address keys
                are gone once every rank has read them.
  unservable-root  rank 0 cannot open the bootstrap root (MASTER_ADDR is no address of its host, and
                no ONEBIT_ROOT): rank 0 raises naming the address, and every other rank raises at
                once passing rank 0's reason on — not after the group's timeout.
  root-taken    ONEBIT_ROOT is held by another process (a listener the driver opened there, which
                accepts and says nothing): every rank raises naming the address and "Address
                already in use" — on the backend in init_process_group, on the Gloo door at the
                first tagged all_reduce. The groups' timeout is an hour, longer than the driver
                waits: a rank that waited for a root would fail the mode.
  subgroup-roots  under a launcher's RANK and WORLD_SIZE, with ONEBIT_ROOT set and the world group
                plain gloo, three rounds of two disjoint onebit subgroups {0,1} and {2,3}, each
                round's first tagged call at once: each sums exactly. Only the job's world takes
                ONEBIT_ROOT — here held by another process all along, so a subgroup that took it
                would fail. Before, both subgroups' rank 0 took it, and one of them lost the race.
  loopback-root  ranks 0, 1 on one host and 2, 3 on another (two network namespaces joined by a
                link), MASTER_ADDR=127.0.0.1: rank 0 publishes a root on its loopback. Every rank
                raises naming the address, the ranks that cannot reach it and the first one's
                reason (a loopback address), instead of ranks 2 and 3 dialling their own loopback until the timeout
                while rank 0 waits for them. Needs root (skipped otherwise).

    PYTHON tests/python/membership_check.py BUILD_DIR [preload|onebit] [MODE ...]

The preload door runs with ONEBIT_TRANSPORT=tcp, so that its communicators bootstrap over TCP, and
takes `subgroups`, `freed-tag`, `root-taken`, `subgroup-roots` and `loopback-root`. `strided-view`: Debian's torch 1.13 hands gloo a strided
view's memory as if it were contiguous, with or without onebit (plain gloo sums buf[0:8] there), and
gloo::allreduce — all the Gloo door sees — carries no strides to tell. `stale-store` and
`unservable-root` are the backend's bootstrap: the Gloo door's travels over gloo's context at the
first tagged call, never through a store.
"""
import contextlib
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
from modes import Skipped, require, rank_or_driver  # noqa: E402

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


def _replaying_store(torch_distributed, store, earlier):
    """A store (torch.distributed.Store) that answers this rank's reads of any key `earlier` holds,
    and this process has not written since, with `earlier`'s value: the worst order a restarted
    attempt meets on a store torchrun keeps across restarts, every read before the rank that
    writes the key anew. Everything else goes to `store`; `replayed` lists the keys answered so."""

    class Replaying(torch_distributed.Store):
        def __init__(self):
            super().__init__()
            self.written, self.replayed = set(), []

        def _stale(self, key):
            return key not in self.written and earlier.check([key])

        def set(self, key, value):
            self.written.add(key)
            store.set(key, value)

        def get(self, key):
            if self._stale(key):
                self.replayed.append(key)
                return earlier.get(key)
            return store.get(key)

        def wait(self, keys, timeout=None):
            keys = [key for key in keys if not self._stale(key)]
            if keys:
                store.wait(keys) if timeout is None else store.wait(keys, timeout)

        def add(self, key, amount):
            self.written.add(key)
            return store.add(key, amount)

        def compare_set(self, key, expected, desired):
            self.written.add(key)
            return store.compare_set(key, expected, desired)

        def check(self, keys):
            return all(self._stale(key) or store.check([key]) for key in keys)

        def num_keys(self):
            return store.num_keys()

    return Replaying()


def stale_store(mode, rank, torch, dist, onebit, tmp):
    earlier = dist.FileStore(os.path.join(tmp, "stale-store-earlier"), WORLD)
    names = _sum_in_world_and_subgroup(rank, torch, dist, onebit, earlier, "first")
    fresh = dist.FileStore(os.path.join(tmp, "stale-store-fresh"), WORLD)
    store = _replaying_store(dist, fresh, earlier)
    again = _sum_in_world_and_subgroup(rank, torch, dist, onebit, store, "again")
    require(again == names, f"torch named the groups {names} the first time, {again} the second: their keys no "
            "longer meet, and this case tests nothing")
    print(f"rank {rank}: the world and a subgroup made again on the earlier groups' store sum exactly, compressed; "
          f"{len(store.replayed)} of the earlier groups' values read", flush=True)


def _sum_in_world_and_subgroup(rank, torch, dist, onebit, store, name):
    """The world group made on `store` and a subgroup of ranks 1-3 (its rank 0 is not the world's),
    a tagged all_reduce on each (exact sums, each compressed), then both destroyed, their roots and
    sockets closed: a rank that goes there later waits in vain. The groups' names (their keys'
    prefixes)."""
    import datetime
    dist.init_process_group("onebit", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=30))
    subgroup = dist.new_group([1, 2, 3])  # every rank makes it
    calls = onebit.stats()["compressed_calls"]
    everyone = torch.full((1024,), float(rank + 1))
    onebit.tag(everyone, f"{name}-world")
    dist.all_reduce(everyone)
    require(torch.equal(everyone, torch.full_like(everyone, 10.0)), f"{name}: world sum {everyone[:3].tolist()}, want 10")
    names = [dist.group.WORLD.group_name]
    if rank:
        some = torch.full((1024,), float(rank + 1))
        onebit.tag(some, f"{name}-subgroup")
        dist.all_reduce(some, group=subgroup)
        require(torch.equal(some, torch.full_like(some, 9.0)), f"{name}: subgroup sum {some[:3].tolist()}, want 9")
        names.append(subgroup.group_name)
    calls = onebit.stats()["compressed_calls"] - calls
    require(calls == len(names), f"{name}: {calls} compressed calls, want {len(names)}")
    dist.destroy_process_group()
    return names


stale_store.makes_its_groups = True


def unservable_root(mode, rank, torch, dist, onebit, tmp):
    import datetime
    try:
        dist.init_process_group("onebit", init_method=f"file://{os.path.join(tmp, 'unservable-root')}", rank=rank,
                                world_size=WORLD, timeout=datetime.timedelta(seconds=120))
        message = None
    except Exception as error:  # noqa: BLE001 — which one each rank raises is what is checked
        message = f"{type(error).__name__}: {error}"
    require(message is not None, "the group was made with its bootstrap root on another host's address")
    want = "192.0.2.1" if rank == 0 else "rank 0 could not serve the bootstrap root"
    require(want in message, f"the error does not say '{want}': {message}")
    if rank:
        require("192.0.2.1" in message, f"rank 0's reason is not passed on: {message}")
    print(f"rank {rank}: {message.splitlines()[0][:200]}", flush=True)


unservable_root.makes_its_groups = True


def _error_of_first_group(rank, torch, dist, onebit, tmp, name):
    """The error the job's first onebit communicator raises on this rank (None if it formed): the
    backend's in init_process_group, the Gloo door's at the first tagged all_reduce. An hour's
    timeout: a rank that waits for a root is killed by the driver, failing the mode."""
    import datetime
    preload = "LD_PRELOAD" in os.environ
    try:
        dist.init_process_group("gloo" if preload else "onebit", init_method=f"file://{os.path.join(tmp, name)}",
                                rank=rank, world_size=WORLD, timeout=datetime.timedelta(hours=1))
        if preload:
            tagged = torch.ones(1024)
            onebit.tag(tagged, name)
            dist.all_reduce(tagged)
        return None
    except Exception as error:  # noqa: BLE001 — which one each rank raises is what is checked
        return f"{type(error).__name__}: {error}"


def root_taken(mode, rank, torch, dist, onebit, tmp):
    root = os.environ["ONEBIT_ROOT"]
    message = _error_of_first_group(rank, torch, dist, onebit, tmp, "root-taken")
    require(message is not None, f"the group formed though ONEBIT_ROOT={root} is another process's")
    for want in (root, "Address already in use"):
        require(want in message, f"the error does not say '{want}': {message}")
    print(f"rank {rank}: {message.splitlines()[0][:240]}", flush=True)


root_taken.makes_its_groups = True


def subgroup_roots(mode, rank, torch, dist, onebit, tmp):
    import datetime
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'subgroup-roots')}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(hours=1))
    backend = "gloo" if "LD_PRELOAD" in os.environ else "onebit"
    want = 3.0 if rank < 2 else 7.0
    for round in range(3):
        halves = [dist.new_group([0, 1], backend=backend), dist.new_group([2, 3], backend=backend)]
        half = torch.full((1024,), float(rank + 1))
        onebit.tag(half, f"half-{round}")
        dist.all_reduce(half, group=halves[rank // 2])
        require(torch.equal(half, torch.full_like(half, want)),
                f"round {round}: subgroup {rank // 2} sum {half[:3].tolist()}, want {want}")
        onebit.untag(half)
    compressed = onebit.stats()["compressed_calls"]
    require(compressed == 3, f"{compressed} compressed calls, want 3 (one per round)")
    print(f"rank {rank}: three rounds of subgroups beside each other, each sum {want}, compressed", flush=True)


subgroup_roots.makes_its_groups = True


def loopback_root(mode, rank, torch, dist, onebit, tmp):
    if os.geteuid() != 0:
        raise Skipped("loopback-root needs root for network namespaces")
    message = _error_of_first_group(rank, torch, dist, onebit, tmp, "loopback-root")
    require(message is not None, "the group formed with its root on rank 0's loopback and ranks on another host")
    for want in ("127.0.0.1:", "rank(s) 2, 3 (2 of 4) cannot reach the root",
                 "rank 2 cannot reach rank 0's bootstrap root", "only ranks on rank 0's host find the root there"):
        require(want in message, f"the error does not say '{want}': {message}")
    print(f"rank {rank}: {message.splitlines()[0][:240]}", flush=True)


loopback_root.makes_its_groups = True


CASES = {"subgroups": subgroups, "freed-tag": freed_tag, "strided-view": strided_view, "stale-store": stale_store,
         "unservable-root": unservable_root, "root-taken": root_taken, "subgroup-roots": subgroup_roots,
         "loopback-root": loopback_root}
_ROOTS = {}
_HELD = []  # the listeners root-taken's and subgroup-roots' ONEBIT_ROOT are held by, for the driver's life


@contextlib.contextmanager
def two_hosts(mode):
    """For loopback-root: ranks 0, 1 in one network namespace and 2, 3 in another, joined by a
    veth link (10.233.0.1 and .2 on eth0; gloo told to use it); the command wraps each rank's."""
    if mode != "loopback-root":
        yield None
        return
    if os.geteuid() != 0:  # the ranks skip
        yield None
        return
    hosts = [f"onebit-mem-{os.getpid()}-{h}" for h in range(2)]
    try:
        for h, ns in enumerate(hosts):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", "eth0", "netns", hosts[0], "type", "veth", "peer", "name", "eth0",
                        "netns", hosts[1]], check=True)
        for h, ns in enumerate(hosts):
            for args in (["addr", "add", f"10.233.0.{h + 1}/24", "dev", "eth0"], ["link", "set", "eth0", "up"],
                         ["link", "set", "lo", "up"]):
                subprocess.run(["ip", "-n", ns, *args], check=True)
        yield lambda rank, argv: ["ip", "netns", "exec", hosts[rank // 2], *argv]
    finally:
        for ns in hosts:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def rank_env(mode, rank, env):
    env = dict(env, RANK=str(rank), WORLD_SIZE=str(WORLD)) if mode == "subgroup-roots" else env
    if mode == "loopback-root":  # rank 0 publishes 127.0.0.1: no ONEBIT_ROOT, MASTER_ADDR on the loopback
        env = {key: value for key, value in env.items() if key != "ONEBIT_ROOT"}
        return dict(env, MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="eth0", ONEBIT_TRANSPORT="tcp",
                    OMP_NUM_THREADS="1")
    if mode in ("root-taken", "subgroup-roots") and mode not in _ROOTS:
        _HELD.append(socket.create_server(("127.0.0.1", 0)))
        _ROOTS[mode] = f"127.0.0.1:{_HELD[-1].getsockname()[1]}"
    if mode == "unservable-root":  # rank 0 listens on MASTER_ADDR's host, here an address of no host (RFC 5737;
        # a host with net.ipv4.ip_nonlocal_bind=1 would bind it, and the ranks then fail at the timeout)
        env = {key: value for key, value in env.items() if key != "ONEBIT_ROOT"}
        return dict(env, MASTER_ADDR="192.0.2.1", ONEBIT_TRANSPORT="tcp", OMP_NUM_THREADS="1")
    if mode not in _ROOTS:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            _ROOTS[mode] = f"127.0.0.1:{probe.getsockname()[1]}"
    return dict(env, ONEBIT_ROOT=_ROOTS[mode], ONEBIT_TRANSPORT="tcp", OMP_NUM_THREADS="1")


if __name__ == "__main__":
    sys.exit(rank_or_driver(__file__, CASES, list(CASES), WORLD, rank_env=rank_env, around_mode=two_hosts,
                            doc=__doc__))
