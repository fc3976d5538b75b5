"""The native c10d backend (python/onebit/csrc/c10d_backend.cc) against the installed torch:

  overrides   every virtual of the installed torch's c10d Backend.hpp is overridden by
              OnebitBackend in the source (a virtual it misses would be c10d::Backend's default,
              which throws "does not support ..."), and nothing is marked override that the header
              does not declare, bar the overrides compiled only where it does (#ifdef
              ONEBIT_C10D_HAS_<name>); the check itself refuses a source with one override removed;
  prebuilt    with no compiler or ninja (CXX=/bin/false, an empty PATH and extension cache), the
              module built beside a copy of libonebit.so (what the wheel ships) is a 1-rank group's
              backend, and no Python frame of onebit runs inside its tagged all_reduces (sync,
              async with wait(), async with the future's wait()): profiled on Python's threads,
              and every way the C++ worker has into Python wrapped;
  stale       a prebuilt module recorded for another torch, or whose record cannot be read, is
              said once, then built here; without a compiler init_process_group raises a
              RuntimeError naming why;
  first use   with the compiler, the module is built for this torch (onebit_c10d_<digest>).

    PYTHON tests/python/native_backend_check.py BUILD_DIR
Exit 77 (a skip, with the reason) when this PYTHON's torch has no c10d Backend class.
"""
import json
import os
import re
import shutil
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


def _one_rank(kind, tmp, env, body="BODY"):
    """A 1-rank onebit group in a fresh process: prints the backend's module and an all_reduce's
    result (or `body`'s lines), or the RuntimeError of init_process_group."""
    script = f"""
import torch, torch.distributed as dist, onebit
onebit.register_backend()
try:
    dist.init_process_group("onebit", init_method="file://{tmp}/{kind}.store", rank=0, world_size=1)
except RuntimeError as e:
    print("RAISED:", e); raise SystemExit(0)
x = torch.arange(4.0)
dist.all_reduce(x)
backend = dist.group.WORLD._get_backend(torch.device("cpu"))
print("BACKEND:", type(backend).__module__, x.tolist())
""" + (HOT_PATH if body == "HOT_PATH" else "") + "dist.destroy_process_group()\n"
    return subprocess.run([sys.executable, "-W", "ignore", "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)


# Every Python frame of the onebit package that runs between a tagged all_reduce's call and its
# completion (sync; async with wait(); async with its future's wait()): profiled on the calling
# thread and on threads the threading module starts. The backend's own C++ worker is a thread no
# profile reaches (a thread state PyGILState_Ensure makes later has none), so there every way the
# module has into Python is wrapped instead: the group set-up's methods, OnebitError's construction.
HOT_PATH = """
import os, sys, threading
package = os.path.dirname(onebit.__file__)
t = torch.ones(1000)
onebit.tag(t, "hot")
seen = []
def profile(frame, event, arg):
    if frame.f_code.co_filename.startswith(package):
        seen.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")
def recorded(name, method):
    def call(*args, **kwargs):
        seen.append(name)
        return method(*args, **kwargs)
    return call
from onebit import backend as module, _errors
for name in ("note_coalesced", "split", "merge"):
    setattr(module._GroupSetup, name, recorded(name, getattr(module._GroupSetup, name)))
_errors.OnebitError.__init__ = recorded("OnebitError", _errors.OnebitError.__init__)
threading.setprofile_all_threads(profile) if hasattr(threading, "setprofile_all_threads") else threading.setprofile(profile)
sys.setprofile(profile)
dist.all_reduce(t)
dist.all_reduce(t, async_op=True).wait()
dist.all_reduce(t, async_op=True).get_future().wait()
sys.setprofile(None)
threading.setprofile(None)
print("ONEBIT FRAMES:", sorted(set(seen)))
print("COMPRESSED:", onebit.stats()["compressed_calls"])
"""


def check_prebuilt_and_first_use(build, tmp):
    """The module shipped beside libonebit.so loads with no compiler; one made for another torch is
    said once and built here instead; with neither, init_process_group names the reason."""
    lib = os.path.join(tmp, "lib")
    os.makedirs(lib)
    shutil.copyfile(os.path.join(os.path.abspath(build), "libonebit.so"), os.path.join(lib, "libonebit.so"))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), MASTER_ADDR="127.0.0.1")
    env.pop("LD_PRELOAD", None)
    built = subprocess.run([sys.executable, "-W", "ignore", "-c", f"from onebit import _native; _native.build_into({lib!r})"],
                           env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0 and os.path.isfile(os.path.join(lib, "onebit_c10d.so")), built.stdout + built.stderr
    # No compiler, no ninja on PATH, an empty extension cache: only the prebuilt module can serve.
    bare = dict(env, ONEBIT_LIBRARY=os.path.join(lib, "libonebit.so"), CXX="/bin/false", PATH="/nonexistent",
                TORCH_EXTENSIONS_DIR=os.path.join(tmp, "extensions"))
    run = _one_rank("prebuilt", tmp, bare, body="HOT_PATH")
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "BACKEND: onebit_c10d [0.0, 1.0, 2.0, 3.0]" in run.stdout and "building" not in out, out
    print("prebuilt: with no compiler the shipped module is the group's backend")
    assert "ONEBIT FRAMES: []" in run.stdout and "COMPRESSED: 3" in run.stdout, out
    print("hot path: no Python frame of onebit ran inside 3 tagged all_reduces (sync, wait, future)")

    record = os.path.join(lib, "onebit_c10d.json")
    with open(record) as f:
        made = json.load(f)
    with open(record, "w") as f:
        json.dump(dict(made, torch="0.0.1"), f)
    run = _one_rank("stale", tmp, bare)
    out = run.stdout + run.stderr
    assert out.count("the prebuilt module was made for torch 0.0.1") == 1, out
    assert "RAISED: onebit backend: its native module cannot be loaded or built here: building it against torch" in \
        run.stdout, out
    print("stale: a module made for another torch is said once; without a compiler the group is refused, naming why")
    with open(record, "w") as f:
        f.write('{"torch": ')  # an interrupted copy
    run = _one_rank("broken", tmp, bare)
    out = run.stdout + run.stderr
    assert out.count("the prebuilt module could not be loaded (JSONDecodeError") == 1 and \
        "RAISED: onebit backend: its native module cannot be loaded or built here" in run.stdout, out
    print("broken: an unreadable record is said once and the module built instead (refused here, naming why)")

    run = _one_rank("first-use", tmp, dict(env, ONEBIT_LIBRARY=os.path.join(lib, "libonebit.so")))
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "BACKEND: onebit_c10d_" in run.stdout, out
    print("first use: with the compiler the module is built for this torch")


def main():
    import torch
    if not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} has no c10d Backend class (torch >= 2.0 needed)")
        return 77
    check_overrides(torch)
    with tempfile.TemporaryDirectory() as tmp:
        check_prebuilt_and_first_use(sys.argv[1], tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
