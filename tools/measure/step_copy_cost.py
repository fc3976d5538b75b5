"""What it costs OnebitAdam's step that the parameters own their storage (docs/design/optimizers.md, "The
parameters own their storage"): the median time of one compression-stage step against the median
time of the parameters' copy into the flat buffer and back, one rank (so no communication), 24
tensors of 1024 x 1024 (25.2 M parameters), or `--demo`: the convergence demo's step-time model
(width 256, its real shapes), whose whole step on emulated 1 GbE
docs/benchmarks/demo.md records.

    /usr/bin/python3 tools/measure/step_copy_cost.py [--demo]   # with libonebit-preload.so or ONEBIT_LIBRARY
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def median_seconds(f, repeats=7):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    import torch
    import torch.distributed as dist
    import onebit
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    torch.manual_seed(0)
    if "--demo" in sys.argv:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demo"))
        demo = __import__("onebit-demo")
        params = list(demo.build_model(torch, 96, 256, 2, 64).parameters())  # vocab: printable ASCII + newline
    else:
        params = [torch.nn.Parameter(torch.randn(1024, 1024)) for _ in range(24)]
    optimizer = onebit.OnebitAdam(params, freeze_step=2)
    for p in params:
        p.grad = torch.randn_like(p)
    for _ in range(3):
        optimizer.step()  # into the compression stage
    step = median_seconds(optimizer.step)

    @torch.no_grad()  # as inside step()
    def copies():
        optimizer._read_parameters()
        optimizer._write_parameters()

    copy = median_seconds(copies)
    print(f"{optimizer._total / 1e6:.1f} M parameters: step {step * 1e3:.1f} ms median, of which the parameters' "
          f"copy in and out {copy * 1e3:.1f} ms ({copy / step * 100:.0f} %)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
