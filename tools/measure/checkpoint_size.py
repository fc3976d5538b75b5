"""What one consolidated checkpoint costs (docs/usage/restarting.md, "Restarting a job"): W ranks on this
machine (gloo under libonebit-preload.so) train a 2.1 M-parameter model (two 1024 x 1024 linear
layers) into the compression stage; then every rank calls consolidate_state_dict() and rank 0
torch.save()s optimizer.state_dict(), as the trainers do. Rank 0 reports the file's bytes, the
tensor bytes under its "onebit" entry (kept once for every rank, and per rank), and its peak
resident memory while consolidating, taking the state dict and saving, above its resident memory
just before (the kernel's high-water mark, VmHWM, reset through /proc/self/clear_refs and read
from /proc/self/status: every allocation, torch's and Python's, not only tracemalloc's). One JSON
line per optimizer and world size.

--file measures onebit's own save instead: every rank calls save_file(path, consolidated=True),
and rank 0 streams the job's one file, each rank's part written as it arrives.

    /usr/bin/python3 tools/measure/checkpoint_size.py BUILD_DIR [--file] [--python DIR] [--world W ...]
                                                      [--optimizer KIND ...]

--python DIR imports onebit from DIR instead of this checkout's python/ (another commit's format:
`git archive COMMIT python | tar -x -C /tmp/COMMIT`, then --python /tmp/COMMIT/python); the
library is BUILD_DIR's either way.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("OnebitAdam", "OnebitLamb", "ZeroOneAdam")
FREEZE, STEPS = 2, 4


def status_kib(field):
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.M).group(1))


def make(onebit, torch, kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1024))
    if kind == "ZeroOneAdam":
        return model, onebit.ZeroOneAdam(model.parameters(), lr=1e-4, var_freeze_step=FREEZE)
    return model, getattr(onebit, kind)(model.parameters(), lr=1e-4, freeze_step=FREEZE)


def tensor_bytes(value):
    import torch
    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(map(tensor_bytes, value.values()))
    return 0


def record_counts(lib, path):
    """{name: values} of every record of the file at `path` (read after the peak was taken)."""
    import ctypes
    handle, count = ctypes.c_void_p(), ctypes.c_size_t()
    if lib.onebit_checkpoint_read(path.encode(), ctypes.byref(handle)) != 0:
        return lib.onebit_last_error().decode()
    lib.onebit_checkpoint_names(handle, None, 0, ctypes.byref(count))
    names = (ctypes.c_char_p * count.value)()
    lib.onebit_checkpoint_names(handle, names, count, ctypes.byref(count))
    counts = {}
    for name in names:
        kind, values = ctypes.c_int(), ctypes.c_size_t()
        lib.onebit_checkpoint_record(handle, name, ctypes.byref(kind), ctypes.byref(values))
        counts[name.decode()] = values.value
    lib.onebit_checkpoint_destroy(handle)
    return counts


def rank_main(kind, world, rank, store, out, python, how):
    sys.path.insert(0, python)
    import torch
    import torch.distributed as dist
    import onebit
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model, optimizer = make(onebit, torch, kind)
    generator = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 1024, generator=generator), torch.randn(16, 1024, generator=generator)
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    if kind == "ZeroOneAdam":
        optimizer.synchronize()  # as onebit.integrations before a save
    dist.barrier()
    before = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS
    if how == "file":
        path = os.path.join(out, "checkpoint.ckpt")
        optimizer.save_file(path, consolidated=True)
        if rank == 0:
            peak = status_kib("VmHWM")
            parameters = sum(p.numel() for p in model.parameters())
            print(json.dumps(dict(optimizer=kind, world=world, parameters=parameters, how="save_file(consolidated)",
                                  file_bytes=os.path.getsize(path),
                                  file_bytes_per_parameter=round(os.path.getsize(path) / parameters, 2),
                                  rss_before_mib=round(before / 1024, 1),
                                  peak_above_before_mib=round((peak - before) / 1024, 1),
                                  records=record_counts(optimizer._lib, path))), flush=True)
        dist.barrier()
        dist.destroy_process_group()
        return
    optimizer.consolidate_state_dict()
    if rank == 0:
        path = os.path.join(out, "checkpoint.pt")
        state = optimizer.state_dict()
        torch.save(state, path)
        peak = status_kib("VmHWM")
        saved = state["onebit"]
        parameters = sum(p.numel() for p in model.parameters())
        result = dict(optimizer=kind, world=world, parameters=parameters, file_bytes=os.path.getsize(path),
                      shared_tensor_bytes=tensor_bytes(saved.get("shared", {})),
                      per_rank_tensor_bytes=[tensor_bytes(part) for part in saved["parts"].values()],
                      rss_before_mib=round(before / 1024, 1), peak_above_before_mib=round((peak - before) / 1024, 1),
                      python=python)
        result["file_bytes_per_parameter"] = round(result["file_bytes"] / parameters, 2)
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 9 and sys.argv[1] == "--rank":
        kind, world, rank, store, out, python, how = sys.argv[2:]
        rank_main(kind, int(world), int(rank), store, out, python, how)
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir")
    parser.add_argument("--file", action="store_true", help="save_file(consolidated=True), not torch.save")
    parser.add_argument("--python", default=os.path.join(HERE, "..", "..", "python"))
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--optimizer", nargs="+", default=list(KINDS), choices=KINDS)
    args = parser.parse_args()
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(os.path.join(args.build_dir, "libonebit-preload.so")),
               MASTER_ADDR="127.0.0.1")
    env.pop("ONEBIT_FREEZE_STEP", None)
    for kind in args.optimizer:
        for world in args.world:
            with tempfile.TemporaryDirectory() as tmp:
                store = os.path.join(tmp, "store")
                procs = [subprocess.Popen([sys.executable, __file__, "--rank", kind, str(world), str(r), store, tmp,
                                           os.path.abspath(args.python), "file" if args.file else "torch"], env=env, stderr=subprocess.PIPE, text=True)
                         for r in range(world)]
                errors = [p.communicate(timeout=600)[1] for p in procs]
                if any(p.returncode for p in procs):
                    print("\n".join(errors), file=sys.stderr)
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
