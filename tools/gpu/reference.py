"""docs/algorithm.md in float64 with torch alone (no numpy: a bare GPU machine has pip torch and nothing
else), for the GPU checks: deterministic inputs, the reference results, and the comparison.
"""
import zlib

import torch


def inputs_of(name, n, rank, call, dtype=torch.float32):
    """Rank `rank`'s input to call `call` of tag `name`: normal values, the same on every run."""
    seed = zlib.crc32(name.encode()) * 7919 + 1000 * rank + call
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=generator, dtype=torch.float32).to(dtype)


class Reference:
    """The compressed allreduce with error feedback, in float64: step() takes one call's inputs
    (one tensor per rank) and returns its SUM result (W × the average)."""

    def __init__(self, world, n):
        self.world, self.n = world, n
        self.chunk = ((n + world - 1) // world + 7) // 8 * 8
        self.e = [torch.zeros(n, dtype=torch.float64) for _ in range(world)]
        self.s = [torch.zeros(self._hi(j) - self._lo(j), dtype=torch.float64) for j in range(world)]

    def _lo(self, j):
        return min(self.n, j * self.chunk)

    def _hi(self, j):
        return min(self.n, (j + 1) * self.chunk)

    @staticmethod
    def _sign(v):
        return torch.where(v >= 0, 1.0, -1.0).to(torch.float64)

    def step(self, inputs):
        world, n = self.world, self.n
        y = [inputs[r].double().cpu() + self.e[r] for r in range(world)]
        a = [float(torch.sqrt(torch.mean(y[r] ** 2))) if n else 0.0 for r in range(world)]
        for r in range(world):
            self.e[r] = y[r] - a[r] * self._sign(y[r])
        signed = sum(a[r] * self._sign(y[r]) for r in range(world)) / world
        out = torch.zeros(n, dtype=torch.float64)
        for j in range(world):
            lo, hi = self._lo(j), self._hi(j)
            z = signed[lo:hi] + self.s[j]
            b = float(torch.sqrt(torch.mean(z ** 2))) if hi > lo else 0.0
            sign = self._sign(z)
            self.s[j] = z - b * sign
            out[lo:hi] = b * sign * world
        return out


class HierarchicalReference:
    """The hierarchical rule (docs/design/engine.md) in float64: `local` ranks per host, host-major; each
    host's mean of shard q goes through a Reference of the hosts per shard. step() returns the SUM."""

    def __init__(self, world, local, n):
        self.world, self.local, self.n = world, local, n
        self.shard = ((n + local - 1) // local + 7) // 8 * 8
        self.bounds = [(min(n, q * self.shard), min(n, (q + 1) * self.shard)) for q in range(local)]
        self.rails = [Reference(world // local, hi - lo) for lo, hi in self.bounds]

    def step(self, inputs):
        hosts = self.world // self.local
        out = torch.zeros(self.n, dtype=torch.float64)
        for (lo, hi), rail in zip(self.bounds, self.rails):
            means = [sum(inputs[h * self.local + l][lo:hi].double().cpu() for l in range(self.local)) / self.local
                     for h in range(hosts)]
            out[lo:hi] = rail.step(means) * self.local  # the rail sums over hosts; the job has world ranks
        return out


def mismatches(got, want, tolerance):
    """Elements whose relative error exceeds `tolerance`. A few may: an element whose y is within
    rounding of 0 can take either sign in fp32 (the engine tests allow n/10000 + 1 of them)."""
    got = got.double().cpu()
    error = (got - want).abs() / want.abs().clamp_min(1e-30)
    return int((error > tolerance).sum())
