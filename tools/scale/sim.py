#!/usr/bin/python3
"""onebit's allreduce algorithms on a simulated cluster, with SimGrid (Debian's python3-simgrid 3.32,
`apt-get install python3-simgrid`; the s4u Python bindings). Each rank is a SimGrid actor that runs
its algorithm's message schedule as the engine does (engine/compressed_allreduce.cc,
engine/hierarchical_allreduce.cc, engine/ring_allreduce.cc): the same peers, byte counts and order,
receives posted first, CPU passes as computations on the rank's host, sends issued as the passes
produce their data. The platform is a SimGrid cluster: a star (every host one full-duplex link to a
non-blocking switch, as tools/ethernet's bridge) or a two-level non-blocking fat-tree.

    /usr/bin/python3 tools/scale/sim.py --algo compressed --ranks 16 --n 25000000 --link 10gbit
    /usr/bin/python3 tools/scale/sim.py --sweep --out build/scale/sweep.jsonl   # docs/scale.md's tables

What the simulation takes from the cost model (model.py): the CPU cost of each pass, the CPU cost of
a message (alpha) and of a wire byte (gamma), the links' payload rates; what it adds: the actual
flows, their sharing of links and switches (max-min fair, SimGrid's CM02 model with no TCP window
limit and no cross-traffic), the order in which they start and the waits between phases.

Three simplifications, named in docs/scale.md: tc tbf's bucket (emulated links only) is spent by
the sender of a call's first bytes, the bridge's side of the link is not modelled apart; the blocks and the head of one chunk to one peer
travel as one flow (their message costs are still charged one by one); and a pass that emits more than
GROUPS sends emits them in GROUPS equal batches (each batch after its share of the pass).
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M

GROUPS = 64
SPEED = 1e9  # flops per second of a core: a computation of t seconds is t * SPEED flops


def fat_tree_shape(hosts):
    """Two levels, non-blocking: k hosts per leaf switch, hosts / k leaves, k top switches, each
    leaf one link to every top switch (as many up as down). k the power of two nearest sqrt(hosts)."""
    k = 1 << max(0, round(math.log2(hosts) / 2))
    while hosts % k:
        k //= 2
    return k, hosts // k


def platform_xml(hosts, cores, rate, latency, topology, speed):
    if topology == "fattree" and hosts >= 4:
        k, leaves = fat_tree_shape(hosts)
        topo = f'topology="FAT_TREE" topo_parameters="2;{k},{leaves};1,{k};1,1"'
        lat = latency / 4  # four links host - leaf - top - leaf - host
    else:
        topo = 'topology="FLAT"'
        lat = latency / 2  # two links host - switch - host
    return f"""<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <zone id="world" routing="Full">
    <cluster id="c" prefix="h" suffix="" radical="0-{hosts - 1}" speed="{speed}f" core="{cores}"
             bw="{rate}Bps" lat="{lat}s" sharing_policy="SPLITDUPLEX" loopback_bw="1e15Bps"
             loopback_lat="0s" {topo}/>
  </zone>
</platform>
"""


class Job:
    """One simulated call of one algorithm: the platform, the actors, the time the last rank ends."""

    def __init__(self, algo, n, world, local, rate, machine, topology="star", procs=None):
        self.algo, self.n, self.world, self.local, self.rate, self.m = algo, n, world, local, rate, machine
        self.hosts = world // local
        self.topology = topology
        # the emulation's shared cores: each rank's core runs at 1/f of a core (model.Machine.oversub)
        self.f = machine.oversub(world if procs is None else procs)
        self.end = [0.0] * world
        # tc tbf's bucket on each host's link (model.Machine.burst): the first bytes a host sends in a
        # call leave at once; 0 on a real network
        self.bucket = [machine.burst] * self.hosts

    def sized(self, rank, nbytes):
        """What a send of nbytes from `rank` costs the simulated link: less what its host's bucket
        still holds."""
        host = rank // self.local
        free = min(nbytes, self.bucket[host])
        self.bucket[host] -= free
        return int(max(1, nbytes - free))

    def compute(self, seconds):
        import simgrid
        if seconds > 0:
            simgrid.this_actor.execute(seconds * SPEED)

    # ---- flat compressed, and the rail round of the hierarchical one ------------------------------
    def round(self, me, members, n, mailbox, tag, worker_s):
        """A round of docs/algorithm.md over `members` (global ranks; `me` this rank's index) on n
        elements; `worker_s`: the worker pass's CPU seconds over all n (flat: the fused pass;
        hierarchical: the host mean inside it)."""
        from simgrid import Comm
        m, world = self.m, len(members)
        inbox1 = mailbox(f"{tag}w{members[me]}")
        inbox2 = mailbox(f"{tag}r{members[me]}")
        held = [inbox1.get_async() for _ in range(world - 1)]  # (Comm, payload holder): keep both alive
        gets = [g[0] for g in held]
        # every result block and head of every other member, posted up front as the engine does
        # (a SimGrid send waits for its receive to be posted)
        # (a result's head travels with its last block here)
        expected = sum(M.blocks_of(M.length_of(n, world, j)) for j in range(world) if j != me)
        held += [inbox2.get_async() for _ in range(expected)]
        results = [g[0] for g in held[world - 1:]]
        sends = []
        # worker pass: chunks me+1, me+2, ..., its own last; chunk j's bits and head leave once packed
        order = [(me + k) % world for k in range(1, world + 1)]
        per_group = max(1, math.ceil((world - 1) / GROUPS))
        batch, batch_cpu = [], 0.0
        for j in order:
            length = M.length_of(n, world, j)
            cpu = worker_s * length / max(1, n)
            if j != me:
                nbytes = M.block_bytes(length) + M.on_wire(M.WORKER_HEAD)
                cpu += m.alpha * (M.blocks_of(length) + 1) + m.gamma * 2 * nbytes
                batch.append((j, nbytes))
            batch_cpu += cpu
            if len(batch) >= per_group or j == me:
                self.compute(self.f * batch_cpu)
                for peer, nbytes in batch:
                    sends.append(mailbox(f"{tag}w{members[peer]}").put_async(("w", me),
                                                                              self.sized(members[me], nbytes)))
                batch, batch_cpu = [], 0.0
        Comm.wait_all(gets)
        # server pass, block by block; each result block goes to every member once made
        mine = M.length_of(n, world, me)
        blocks = M.blocks_of(mine)
        for b in range(blocks):
            first = b * M.BLOCK_ELEMENTS
            length = max(0, min(mine, first + M.BLOCK_ELEMENTS) - first) if mine else 0
            nbytes = M.on_wire((length + 7) // 8) + (M.on_wire(M.RESULT_HEAD) if b == blocks - 1 else 0)
            msgs = 1 + (b == blocks - 1)
            self.compute(self.f * (m.server_s(length, world) + (world - 1) * (m.alpha * msgs + m.gamma * 2 * nbytes)))
            for k in range(1, world):
                sends.append(mailbox(f"{tag}r{members[(me + k) % world]}").put_async(
                    ("r", me, b), self.sized(members[me], nbytes)))
        Comm.wait_all(results)
        Comm.wait_all(sends)

    def flat(self, rank):
        import simgrid
        from simgrid import Mailbox
        m, n = self.m, self.n
        self.round(rank, list(range(self.world)), n, Mailbox.by_name, "", m.worker_s(n))
        self.compute(self.f * m.unpack_s(n))
        self.end[rank] = simgrid.Engine.clock

    def hierarchical(self, rank):
        import simgrid
        from simgrid import Mailbox
        m, n, local = self.m, self.n, self.local
        host, lane = divmod(rank, local)
        shard = M.length_of(n, local, lane)
        self.compute(self.f * m.copy_s(4 * n))   # the input into the host segment
        # the host's ranks wait for each other's copies before the mean: a barrier per host
        self.barriers[host].wait()
        rail = [h * local + lane for h in range(self.hosts)]
        self.round(host, rail, shard, Mailbox.by_name, "", m.mean_worker_s(shard, local))
        self.barriers[host].wait()               # the other rails' results, through the segment
        self.compute(self.f * (m.unpack_s(n) + m.copy_s(M.chunk_of(n, local) // 8 * (local - 1))))
        self.end[rank] = simgrid.Engine.clock

    # ---- the rings ------------------------------------------------------------------------------
    def ring(self, rank):
        """The pipelined ring; `element_bytes` 4 (the engine's fp32 ring, with its CPU) or the ideal
        baseline (no CPU: cpu False)."""
        import simgrid
        from simgrid import Comm, Mailbox
        m, n, world = self.m, self.n, self.world
        cpu = self.algo == "ring"
        eb = 2 if self.algo == "ring_bf16" else 4
        chunk = (n + world - 1) // world
        steps = 2 * (world - 1)
        segment = max(1, M.RING_SEGMENT_BYTES // eb)
        while (chunk + segment - 1) // segment * steps > 65535:
            segment *= 2
        segments = max(1, (chunk + segment - 1) // segment)
        right = Mailbox.by_name(f"ring{(rank + 1) % world}")
        inbox = Mailbox.by_name(f"ring{rank}")
        f = self.f if cpu else 1.0
        if cpu:
            self.compute(f * m.copy_s(4 * n))

        def seg_len(t, p):
            j = (rank - t) % world if t < world - 1 else (rank + 1 - (t - world + 1)) % world
            begin, end = min(n, j * chunk), min(n, (j + 1) * chunk)
            return min(end, begin + (p + 1) * segment) - min(end, begin + p * segment)

        def send(t, p):
            # the post costs alpha before the segment leaves; the TCP stack's work on it (gamma)
            # overlaps its transmission, as in model.time_ring
            # (the ideal rings pay alpha too, as in model.time_ring: a step's post is never free)
            nbytes = M.on_wire(seg_len(t, p) * eb)
            self.compute(f * m.alpha)
            comm = right.put_async((t, p), self.sized(rank, nbytes))
            if cpu:
                self.compute(f * m.gamma * 2 * nbytes)
            return comm

        # receives posted a step ahead, as the engine does, so a segment lands as soon as it is sent
        posted = [[inbox.get_async() for _ in range(segments)]]  # (Comm, payload holder): keep both alive
        sends = [send(0, p) for p in range(segments)]
        for t in range(steps):
            if t + 1 < steps:
                posted.append([inbox.get_async() for _ in range(segments)])
            for p in range(segments):
                posted[t][p][0].wait()
                if cpu and t < world - 1:
                    self.compute(f * m.add_s(seg_len(t + 1, p)))
                if t + 1 < steps:
                    sends.append(send(t + 1, p))
            posted[t] = None
        Comm.wait_all(sends)
        if cpu:
            self.compute(f * m.copy_s(4 * n))
        self.end[rank] = simgrid.Engine.clock

    def run(self):
        from simgrid import Barrier, Engine, Host
        engine = Engine([sys.argv[0], "--cfg=network/model:CM02", "--cfg=network/crosstraffic:0",
                         "--cfg=network/TCP-gamma:1e15", "--log=root.thres:critical"])
        # L ranks per host share its one link (and have a core each); their messages to each other
        # take the host's loopback, which costs no link time
        xml = platform_xml(self.hosts, self.local, self.rate, self.m.latency, self.topology, SPEED)
        with tempfile.NamedTemporaryFile("w", suffix=".xml", delete=False) as fh:
            fh.write(xml)
        try:
            engine.load_platform(fh.name)
        finally:
            os.unlink(fh.name)
        body = {"compressed": self.flat, "hierarchical": self.hierarchical}.get(self.algo, self.ring)
        if self.algo == "hierarchical":
            self.barriers = [Barrier(self.local) for _ in range(self.hosts)]
        for rank in range(self.world):
            host = Host.by_name(f"h{rank // self.local}")
            Actor_create(f"rank{rank}", host, body, rank)
        engine.run()
        return max(self.end)


def Actor_create(name, host, fn, *args):
    from simgrid import Actor
    Actor.create(name, host, fn, *args)


def simulate(algo, n, world, local, link, machine, links=M.LINKS_REAL, topology="star", procs=None):
    """Simulated seconds per call. A fresh process per call: SimGrid's engine is a singleton."""
    import subprocess
    spec = json.dumps({"algo": algo, "n": n, "world": world, "local": local, "rate": links[link],
                       "machine": machine.__dict__, "topology": topology, "procs": procs})
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--spec", spec],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"simulation {spec} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def run_spec(spec):
    s = json.loads(spec)
    machine = M.Machine(**s["machine"])
    started = time.time()
    seconds = Job(s["algo"], s["n"], s["world"], s["local"], s["rate"], machine, s["topology"], s["procs"]).run()
    print(json.dumps({"seconds": seconds, "wall": time.time() - started}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--algo", default="compressed",
                        help="compressed, hierarchical, ring (the engine's), ring_fp32, ring_bf16 (ideal baselines)")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--local", type=int, default=1, help="ranks per host (hierarchical)")
    parser.add_argument("--n", type=int, default=25_000_000, help="fp32 elements per call")
    parser.add_argument("--link", default="10gbit", choices=sorted(M.LINKS_REAL))
    parser.add_argument("--topology", default="fattree", choices=["star", "fattree"])
    parser.add_argument("--latency", type=float, default=5e-6, help="one-way network latency (s)")
    parser.add_argument("--fitted", help="fitted.json from fit.py (default: model.FITTED)")
    args = parser.parse_args()
    if args.spec:
        return run_spec(args.spec)
    machine = M.at_scale(M.FITTED, args.latency)
    started = time.time()
    t = simulate(args.algo, args.n, args.ranks, args.local, args.link, machine, topology=args.topology)
    model_t = M.time_of(args.algo, args.n, args.ranks, args.local, args.link, machine, M.LINKS_REAL)
    print(f"{args.algo} W={args.ranks} L={args.local} n={args.n} {args.link} {args.topology}: simulated "
          f"{t * 1e3:.2f} ms, model {model_t * 1e3:.2f} ms ({time.time() - started:.1f} s wall)")


if __name__ == "__main__":
    main()
