"""The cost model of onebit's allreduce algorithms: seconds per call as a function of the world size W,
the ranks per host L, the element count n, the link's payload rate, the per-message cost and the CPU
passes. docs/scale.md gives the formulas, the fitted constants and the model against measurement.

Every algorithm is written as the schedule the engine runs (engine/compressed_allreduce.cc,
engine/hierarchical_allreduce.cc, engine/ring_allreduce.cc): the same message counts and byte counts
(schedule_*), and a time made of CPU passes and wire phases that overlap the way the engine overlaps
them (time_*). fp32 inputs throughout (4 bytes per element); the baselines `ring_fp32` and
`ring_bf16` are an ideal pipelined ring on the same links with no CPU cost at all (NCCL's ring as a
user compares against), 4 and 2 bytes per element.

Pure Python, no dependencies: the simulation (sim.py) and the test import it.
"""
from dataclasses import dataclass, field, replace

# Engine constants (engine/compressed_round.h, engine/ring_allreduce.cc).
BLOCK_ELEMENTS = 1 << 20           # bits travel in blocks of 2^20 elements (128 KiB)
WORKER_HEAD = 16                   # bytes: [scale][pad][settings digest]
RESULT_HEAD = 24                   # bytes: [scale][first bad][first unlike][pad][digest]
RING_SEGMENT_BYTES = 1 << 20       # the fp32 ring's pipeline segment
# docs/wire_format.md, "Messages": every segment has a 64-byte header; a message of 256 KiB or more
# is split into one segment per socket (ONEBIT_SOCKETS_PER_PEER, default 2), a smaller one is one.
SEGMENT_HEADER = 64
STRIPE_FROM = 256 << 10
SOCKETS_PER_PEER = 2


def on_wire(payload):
    """Bytes a message of `payload` bytes puts on the wire: payload and segment headers."""
    return payload + SEGMENT_HEADER * (SOCKETS_PER_PEER if payload >= STRIPE_FROM else 1)

# Payload rates in bytes per second. "tbf": what tc tbf gives on this machine's emulated links
# (docs/benchmarks.md, measured with one TCP stream: 1gbit -> 118 MB/s, 10gbit -> 1.09 GB/s);
# 25gbit was not measured and is scaled from 10gbit. "real": TCP goodput of a real link at 1500-byte
# frames, 94 % of the line rate.
LINKS_TBF = {"1gbit": 118e6, "10gbit": 1.09e9, "25gbit": 2.725e9}
TBF_BURST = 256 << 10   # tools/ethernet's "burst 256kb": tc's kb are kilobytes
LINKS_REAL = {"1gbit": 0.94 * 1e9 / 8, "10gbit": 0.94 * 10e9 / 8, "25gbit": 0.94 * 25e9 / 8}


@dataclass(frozen=True)
class Machine:
    """What the CPU side costs. Rates are the kernel bench's single-thread rates (bytes the pass must
    touch per second; onebit-kernel-bench, AVX-512, 64 Mi elements, medians, this machine). When the
    ranks on one machine outnumber its cores, every pass takes procs / cores x `cpu_scale` longer
    (`oversub`): the cores are time-shared, and switching between ranks costs on top."""
    worker_rate: float = 17.3e9    # worker_pass fp32: 12.125 bytes/element
    server_rate: float = 15.1e9    # server_pass fp32: W/8 + 8.125 bytes per chunk element
    unpack_rate: float = 23.1e9    # unpack fp32: 4.125 bytes/element
    memcpy_rate: float = 17.5e9    # memcpy (read + write counted), for copies and the ring's adds
    cpu_scale: float = 1.0         # fitted: the cost of time-sharing beyond procs / cores
    host_scale: float = 1.0        # fitted: the hierarchical host copy and host mean against the kernel
                                   # bench's rates (they read other ranks' shared pages, cold)
    alpha: float = 20e-6           # fitted: CPU seconds per message (post, syscalls, wake-up), sender side
    gamma: float = 0.0             # fitted: CPU seconds per byte on the wire (TCP stack, both ends)
    latency: float = 0.0           # one-way network latency of a message (s); ~0 on emulated links
    burst: float = 0.0             # bytes a link sends at once at the start of a call (tc tbf's bucket)
    cores: float = 2.0             # cores of the machine the ranks share; `oversub` uses it
    shared: bool = True            # True: all W ranks on this one machine (emulation, loopback)

    def oversub(self, procs_on_machine):
        """How much longer a CPU pass takes because `procs_on_machine` ranks run it at once on
        `cores` cores: 1 when each rank has a core of its own."""
        if not self.shared or procs_on_machine <= self.cores:
            return 1.0
        return procs_on_machine / self.cores

    def worker_s(self, elements):
        return elements * 12.125 / self.worker_rate

    def mean_worker_s(self, elements, sources):
        # the host mean formed inside the worker pass: reads L fp32 inputs and the error, writes it
        return elements * (4.0 * sources + 8.125) / self.worker_rate * self.host_scale

    def server_s(self, chunk_elements, world):
        return chunk_elements * (world / 8.0 + 8.125) / self.server_rate

    def unpack_s(self, elements):
        return elements * 4.125 / self.unpack_rate

    def copy_s(self, nbytes):
        return 2.0 * nbytes / self.memcpy_rate

    def add_s(self, elements):
        # acc += incoming, fp32: read 8 bytes, write 4
        return elements * 12.0 / self.memcpy_rate


def chunk_of(n, world):
    """ChunkGeometry: ceil(n / W) rounded up to a multiple of 8."""
    return (((n + world - 1) // world) + 7) // 8 * 8


def length_of(n, world, j):
    c = chunk_of(n, world)
    return max(0, min(n, (j + 1) * c) - min(n, j * c))


def blocks_of(length):
    return max(1, (length + BLOCK_ELEMENTS - 1) // BLOCK_ELEMENTS)


def block_bytes(length):
    """Wire bytes of a chunk of `length` elements' bits, sent in blocks of BLOCK_ELEMENTS."""
    full, rest = divmod(length, BLOCK_ELEMENTS)
    total = full * on_wire(BLOCK_ELEMENTS // 8)
    if rest or not full:
        total += on_wire((rest + 7) // 8)
    return total


@dataclass
class Schedule:
    """What one rank sends in one call, per phase: messages and payload bytes (headers included)."""
    phases: list = field(default_factory=list)  # [(name, messages, bytes)] per rank, over its link

    @property
    def messages(self):
        return sum(p[1] for p in self.phases)

    @property
    def bytes(self):
        return sum(p[2] for p in self.phases)


def schedule_flat(n, world, rank=0):
    """Rank `rank`'s messages in a flat compressed call (engine/compressed_allreduce.cc): stage 1 sends
    chunk j's bits, in blocks, and a worker head to every other rank j; stage 2 sends its own
    chunk's result bits, in blocks, and a result head to every other rank."""
    if world == 1:
        return Schedule([("worker", 0, 0), ("result", 0, 0)])
    m1 = b1 = 0
    for j in range(world):
        if j == rank:
            continue
        length = length_of(n, world, j)
        m1 += blocks_of(length) + 1
        b1 += block_bytes(length) + on_wire(WORKER_HEAD)
    mine = length_of(n, world, rank)
    m2 = (world - 1) * (blocks_of(mine) + 1)
    b2 = (world - 1) * (block_bytes(mine) + on_wire(RESULT_HEAD))
    return Schedule([("worker", m1, b1), ("result", m2, b2)])


def schedule_hierarchical(n, hosts, local, rank=0):
    """Over the host's link: the rail round of rank `rank` (a flat round over `hosts` ranks on its
    shard of n / L elements). The host reduce and gather go through shared memory, not the link."""
    shard_len = length_of(n, local, rank % local)
    return schedule_flat(shard_len, hosts, rank // local)


def schedule_ring(n, world, element_bytes=4, segment_bytes=RING_SEGMENT_BYTES):
    """The pipelined ring (engine/ring_allreduce.cc, RingPlan): 2(W-1) steps, each one chunk of
    ceil(n/W) elements cut into `segments` messages of 1 MiB (the last ones shorter, even empty)."""
    if world == 1:
        return Schedule([("reduce-scatter", 0, 0), ("allgather", 0, 0)])
    chunk = (n + world - 1) // world
    steps = 2 * (world - 1)
    segment = max(1, segment_bytes // element_bytes)
    while (chunk + segment - 1) // segment * steps > 65535:  # message parts are 16 bits
        segment *= 2
    segments = max(1, (chunk + segment - 1) // segment)

    def chunk_wire(j):
        begin, end = min(n, j * chunk), min(n, (j + 1) * chunk)
        return sum(on_wire((min(end, begin + (p + 1) * segment) - min(end, begin + p * segment)) * element_bytes)
                   for p in range(segments))
    # rank 0 sends chunks 0, W-1, ..., 2 in the reduce-scatter and 1, 0, W-1, ..., 3 in the allgather
    rs = sum(chunk_wire(j) for j in range(world) if j != 1 % world)
    ag = sum(chunk_wire(j) for j in range(world) if j != 2 % world)
    return Schedule([("reduce-scatter", (world - 1) * segments, rs), ("allgather", (world - 1) * segments, ag)])


def burst_split(b1, b2, burst, rate):
    """Wire seconds of two phases of b1 and b2 bytes when the first `burst` bytes of the call leave
    at once (tc tbf's bucket, full at the start of a call)."""
    return max(0.0, b1 - burst) / rate, max(0.0, b2 - max(0.0, burst - b1)) / rate


def time_flat(n, world, rate, m, procs=None, local=1):
    """Flat compressed call (`local` ranks share each host's link; their messages to each other
    stay off it). Stage 1's wire overlaps the worker pass (a chunk leaves as soon as it is
    packed; its own chunk is packed last), stage 2's the server pass (each result block leaves as
    soon as it is made); the server pass waits for all inputs and the unpack for all results.
    Per-message CPU (alpha) and per-byte stack CPU (gamma) load the rank's core like a pass."""
    if world == 1:
        return 0.0
    procs = world if procs is None else procs
    f = m.oversub(procs)
    s = schedule_flat(n, world)
    c = chunk_of(n, world)
    (_, m1, b1), (_, m2, b2) = s.phases
    cw = f * (m.worker_s(n) + m.alpha * m1 + m.gamma * 2 * b1)
    cs = f * (m.server_s(c, world) + m.alpha * m2 + m.gamma * 2 * b2)
    cu = f * m.unpack_s(n)
    share = local * (world - local) / (world - 1)   # this host's ranks' bytes that leave the host
    d1, d2 = burst_split(share * b1, share * b2, m.burst, rate)
    return max(cw, d1 + cw / world) + m.latency + max(cs, d2 + cs / blocks_of(c)) + m.latency + cu


def time_hierarchical(n, hosts, local, rate, m):
    """Hierarchical call, L = `local` ranks per host, H = `hosts`: each rank copies its input into
    the host segment, forms its shard's host mean inside the worker pass, runs a flat round over its
    rail (the L rails share the host's one link), gets the other rails' results through shared
    memory and unpacks all n elements."""
    world = hosts * local
    f = m.oversub(world)
    shard = chunk_of(n, local)
    copy = f * m.copy_s(4 * n) * m.host_scale
    if hosts == 1:
        return copy + f * (m.mean_worker_s(shard, local) + m.unpack_s(n))
    s = schedule_hierarchical(n, hosts, local)
    (_, m1, b1), (_, m2, b2) = s.phases
    c = chunk_of(shard, hosts)
    cw = f * (m.mean_worker_s(shard, local) + m.alpha * m1 + m.gamma * 2 * b1)
    cs = f * (m.server_s(c, hosts) + m.alpha * m2 + m.gamma * 2 * b2)
    cu = f * (m.unpack_s(n) + m.copy_s(shard // 8 * (local - 1)))
    d1, d2 = burst_split(local * b1, local * b2, m.burst, rate)   # L rails on one link
    return copy + max(cw, d1 + cw / hosts) + m.latency + max(cs, d2 + cs / blocks_of(c)) + m.latency + cu


def time_ring(n, world, rate, m, element_bytes=4, cpu=True, procs=None):
    """Pipelined ring. cpu=True: the engine's fp32 ring (copy in, add each arrived segment, copy
    out, all on the rank's core, overlapping the wire); cpu=False: the ideal baseline ring, the wire
    alone. With one segment per step (chunk <= 1 MiB) every step waits for the one before: it pays
    the latency and the message cost each time; with several segments the link never idles."""
    if world == 1:
        return 0.0
    procs = world if procs is None else procs
    f = m.oversub(procs) if cpu else 1.0
    s = schedule_ring(n, world, element_bytes)
    chunk = (n + world - 1) // world
    steps = 2 * (world - 1)
    segments = s.phases[0][1] // (world - 1)
    seg_bytes = min(chunk * element_bytes, RING_SEGMENT_BYTES)
    wire = s.bytes / rate
    msg = m.alpha * s.messages + (m.gamma * 2 * s.bytes if cpu else 0.0)
    add = m.add_s(chunk) * (world - 1) if cpu else 0.0
    copies = m.copy_s(4 * n) * 2 if cpu else 0.0
    if segments == 1:   # store and forward: every step pays its latency
        # the TCP stack's work on a segment overlaps its transmission; the add and the post do not
        stack = f * m.gamma * 2 * seg_bytes if cpu else 0.0
        per_step = max(seg_bytes / rate, stack) + m.latency + f * (m.alpha + (m.add_s(chunk) if cpu else 0.0))
        return f * copies + steps * per_step
    fill = steps * m.latency   # with two or more segments per step the link never waits for a step
    return f * copies + max(wire, f * (add + msg)) + fill


def time_of(algo, n, world, local, link, m, links=LINKS_TBF):
    rate = links[link]
    if algo == "compressed":
        return time_flat(n, world, rate, m, local=local)
    if algo == "hierarchical":
        return time_hierarchical(n, world // local, local, rate, m)
    if algo == "ring":
        return time_ring(n, world, rate, m)
    if algo == "ring_fp32":
        return time_ring(n, world, rate, m, 4, cpu=False)
    if algo == "ring_bf16":
        return time_ring(n, world, rate, m, 2, cpu=False)
    raise ValueError(algo)


# The constants fitted on this machine (fit.py over measure.sh's runs, docs/scale.md): the emulation
# and loopback machine, 2 shared cores, "Intel(R) Xeon(R) Processor" with AVX-512, 2026-12-07.
FITTED = Machine(cpu_scale=1.327, alpha=14.7e-6, gamma=0.482e-9,
                 host_scale=0.97)
GAMMA_LOOPBACK = 0.266e-9   # the TCP stack alone, no veth, bridge or tbf: at scale, a NIC's


def at_scale(m=FITTED, latency=10e-6):
    """The same CPU costs on a cluster: every rank its own core, the TCP stack's per-byte cost
    measured on loopback, a real network's latency, no token bucket."""
    return replace(m, shared=False, latency=latency, gamma=GAMMA_LOOPBACK, burst=0.0)
