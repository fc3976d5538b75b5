"""The native c10d backend (python/onebit/csrc/c10d_backend.cc) against the installed torch:

  overrides   every virtual of the installed torch's c10d Backend.hpp is overridden by
              OnebitBackend in the source (a virtual it misses would be c10d::Backend's default,
              which throws "does not support ..."), and nothing is marked override that the header
              does not declare, bar the overrides compiled only where it does (#ifdef
              ONEBIT_C10D_HAS_<name>); the check itself refuses a source with one override removed;
  fallback    with no working compiler (CXX=false, an empty TORCH_EXTENSIONS_DIR) a 1-rank onebit
              group is the Python backend, the "onebit" logger says once why, and all_reduce works
              (on a torch whose Backend cannot be subclassed in Python, 2.5, the group is refused
              with a RuntimeError saying so);
              register_backend(native=True) raises RuntimeError naming the reason instead;
  native      with the compiler, the group's backend is the native one (module onebit_c10d).

    PYTHON tests/python/native_backend_check.py BUILD_DIR
Exit 77 (a skip, with the reason) when this PYTHON's torch has no c10d Backend class.
"""
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
SOURCE = os.path.join(ROOT, "python", "onebit", "csrc", "c10d_backend.cc")


def overridden(source):
    from onebit._native import _body, _without_comments
    body = _body(_without_comments(source), "class OnebitBackend")
    return set(re.findall(r"(?<![~\w])(\w+)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:const\s*)?override\b", body))  # no destructor


def check_overrides(torch):
    from onebit._native import backend_header, declared_virtuals
    header = backend_header(torch)
    with open(header) as f:
        virtuals = declared_virtuals(f.read()) - {"~Backend"}
    with open(SOURCE) as f:
        source = f.read()
    guarded = set(re.findall(r"#ifdef ONEBIT_C10D_HAS_(\w+)", source))  # compiled where the header declares them
    missing, extra = sorted(virtuals - overridden(source)), sorted(overridden(source) - virtuals - guarded)
    assert virtuals and not missing and not extra, (
        f"{SOURCE} against {header}: virtuals not overridden {missing}; overrides the header lacks {extra}")
    broken = source.replace("void waitForPendingWorks() override", "void waitForPendingWorks()")
    assert "waitForPendingWorks" in virtuals - overridden(broken), "the check does not see a missing override"
    print(f"overrides: all {len(virtuals)} virtuals of torch {torch.__version__}'s c10d Backend are OnebitBackend's")


def _one_rank(kind, tmp, env, native="None"):
    """A 1-rank onebit group in a fresh process: prints the backend's module and an all_reduce's
    result, or the RuntimeError of register_backend(native=True)."""
    script = f"""
import torch, torch.distributed as dist, onebit
onebit.register_backend(native={native})
try:
    dist.init_process_group("onebit", init_method="file://{tmp}/{kind}.store", rank=0, world_size=1)
except RuntimeError as e:
    print("RAISED:", e); raise SystemExit(0)
x = torch.arange(4.0)
dist.all_reduce(x)
backend = dist.group.WORLD._get_backend(torch.device("cpu"))
print("BACKEND:", type(backend).__module__, x.tolist())
dist.destroy_process_group()
"""
    return subprocess.run([sys.executable, "-W", "ignore", "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)


def check_fallback_and_native(build, tmp):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), MASTER_ADDR="127.0.0.1",
               ONEBIT_LIBRARY=os.path.join(os.path.abspath(build), "libonebit.so"))
    env.pop("LD_PRELOAD", None)
    broken = dict(env, CXX="false", TORCH_EXTENSIONS_DIR=os.path.join(tmp, "extensions"))
    run = _one_rank("fallback", tmp, broken)
    out = run.stdout + run.stderr
    assert out.count("runs as a Python c10d backend") == 1 and "was not built (building it against torch" in out, out
    if "RAISED:" in run.stdout:  # a torch whose c10d Backend cannot be subclassed in Python (2.5)
        assert "cannot run a c10d Backend written in Python" in run.stdout, out
        print("fallback: this torch has no Python form; without a compiler the group is refused, naming why")
    else:
        assert run.returncode == 0 and "BACKEND: onebit.backend [0.0, 1.0, 2.0, 3.0]" in run.stdout, out
        print("fallback: without a compiler the Python backend, said once")
    run = _one_rank("required", tmp, broken, native="True")
    assert run.returncode == 0 and "RAISED: onebit backend: the native c10d backend is not available: building it" in run.stdout, \
        run.stdout + run.stderr
    print("fallback: native=True raises naming why")
    run = _one_rank("native", tmp, env)
    assert run.returncode == 0 and "BACKEND: onebit_c10d" in run.stdout and "Python c10d backend" not in run.stderr, \
        run.stdout + run.stderr
    print("native: with the compiler the group's backend is onebit_c10d's")


def main():
    import torch
    if not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} has no c10d Backend class (torch >= 2.0 needed)")
        return 77
    check_overrides(torch)
    with tempfile.TemporaryDirectory() as tmp:
        check_fallback_and_native(sys.argv[1], tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
