"""The wheel as a PyTorch user gets it (docs/usage/installing.md, "Installing"):

  1. a clean copy of the source tree (git's tracked and unignored files, as a clone has them; no
     build tree) is built with `pip wheel . --no-build-isolation` by the pip-torch venv's Python
     (tools/pip-torch.sh gives it scikit-build-core); the wheel must be py3-none-linux, hold each
     library once (no SONAME symlink copies), never libonebit-preload.so, and depend on no torch;
     it holds the native c10d backend built against the venv's torch, with its record, its source,
     onebit.h and onebit_types.h (for another torch), and the torch.distributed.backends entry point;
  2. a fresh venv sees PyPI's torch through a .pth file naming the pip-torch venv's site-packages (no
     second download) and gets the wheel with `pip install --no-deps`;
  3. from an empty working directory, with PYTHONPATH, LD_LIBRARY_PATH, LD_PRELOAD, ONEBIT_LIBRARY
     and NCCL_NET_PLUGIN cleared, so that nothing comes from the checkout:
     - tests/python/torch_backend_check.py --installed at 2 ranks (tagged vs the float64 reference,
       untagged exact, DDP + OnebitAdam bitwise equal across ranks) from the installed package;
     - with no compiler or ninja (CXX=/bin/false, PATH the venv's bin alone, an empty extension
       cache) the native c10d backend is the wheel's prebuilt module (onebit/lib/onebit_c10d.so),
       and nothing is built into the cache throughout;
     - a script with no `import onebit` runs init_process_group("onebit") under torchrun at 2 ranks
       (the wheel's torch.distributed.backends entry point);
     - JOBS back-to-back 2-rank DDP + OnebitAdam jobs through the compression stage, every rank exit 0
       (half destroying the group, half leaving it to exit; tests/python/backend_exit_check.py runs
       fewer from the build tree, and checks the release);
     - onebit-run --check says the shipped libraries load, from inside the venv;
     - onebit-run --nccl-net --print-env prints the absolute plugin path inside the venv;
     - onebit-run passes a command's exit code through, refuses --gloo-preload for pip's torch
       (exit 2), and keeps LD_PRELOAD free of duplicates with --nccl-allreduce;
     - `auditwheel show` on the wheel (printed for docs/benchmarks/torch-suites.md).

    /usr/bin/python3 tests/packaging/wheel_installed_check.py SOURCE_DIR WORK_DIR

Exit 77 (a skip, with the reason) without the pip-torch venv, or when scikit-build-core is neither
in it nor installable from PyPI. The wheel's CMake build directory is kept in WORK_DIR, so a rerun
recompiles only what changed (the copied sources keep their modification times).
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

SKIP = 77
VENV = os.environ.get("ONEBIT_PIP_TORCH_VENV", "/var/cache/onebit/pip-torch")
LIBRARIES = ("libonebit.so", "libnccl-net-onebit.so")
PREBUILT = "onebit_c10d.so"  # the native c10d backend, built against the venv's torch (cmake/OnebitTorchBackend.cmake)
JOBS = 50  # back-to-back 2-rank DDP + OnebitAdam jobs from the wheel, each to exit 0


def fail(what):
    print(f"FAIL: {what}", flush=True)
    sys.exit(1)


def run(command, what, ok=(0,), **kwargs):
    """Runs `command`, returns (code, output); fails naming `what` when the exit code is not in ok."""
    started = time.monotonic()
    try:  # a command that hangs fails here, naming itself, not at ctest's timeout
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=kwargs.pop("timeout", 600), **kwargs)
    except subprocess.TimeoutExpired as expired:
        fail(f"{what} did not end within {expired.timeout:.0f} s:\n{(expired.output or b'')[-6000:]}")
    print(f"[{time.monotonic() - started:6.1f} s] {what}: exit {done.returncode}", flush=True)
    if done.returncode not in ok:
        fail(f"{what} exited {done.returncode}:\n{done.stdout[-6000:]}")
    return done.returncode, done.stdout


def build_python():
    """The pip-torch venv's Python, with scikit-build-core; None (after saying why) when impossible."""
    python = os.path.join(VENV, "bin", "python")
    if subprocess.run([python, "-W", "ignore", "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"SKIP: no venv with PyPI's torch at {VENV} (tools/pip-torch.sh makes it; it needs PyPI)")
        return None
    if subprocess.run([python, "-c", "import scikit_build_core"], capture_output=True).returncode != 0:
        got = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "scikit-build-core"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if got.returncode != 0:
            print(f"SKIP: scikit-build-core is not in {VENV} and could not be installed from PyPI:\n{got.stdout[-1500:]}")
            return None
    return python


def copy_tree(source, target):
    """The files a clone would have: tracked and untracked-but-not-ignored (so an uncommitted change
    is tested too), without build trees; modification times kept so the cached build stays valid."""
    listed = subprocess.run(["git", "-C", source, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode != 0:
        fail(f"git ls-files in {source}: {listed.stderr.decode()}")
    shutil.rmtree(target, ignore_errors=True)
    for name in sorted(set(listed.stdout.decode().split("\0")) - {""}):
        origin = os.path.join(source, name)
        if os.path.isfile(origin):  # a tracked file deleted in the work tree is not in a clone of it
            os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
            shutil.copy2(origin, os.path.join(target, name))


def build_wheel(python, source, work):
    tree, dist = os.path.join(work, "source"), os.path.join(work, "dist")
    copy_tree(source, tree)
    shutil.rmtree(dist, ignore_errors=True)
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--disable-pip-version-check", "-w", dist,
         "--config-settings", f"build-dir={os.path.join(work, 'wheel-build')}", tree], "pip wheel of the clean copy", env=env)
    wheels = glob.glob(os.path.join(dist, "*.whl"))
    if len(wheels) != 1:
        fail(f"pip wheel made {wheels}, want one wheel")
    return wheels[0]


def check_wheel_shape(wheel):
    """py3-none-linux, every library once and as a plain file, no Gloo preload, no torch requirement.
    Returns whether the NCCL preload is in it."""
    name = os.path.basename(wheel)
    if not re.fullmatch(r"onebit-[0-9.]+-py3-none-linux_[a-z0-9_]+\.whl", name):
        fail(f"wheel {name}: want onebit-VERSION-py3-none-linux_ARCH.whl (ctypes: one wheel for every CPython)")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    shared = sorted(n for n in names if ".so" in os.path.basename(n))
    for library in LIBRARIES + (PREBUILT,):
        if f"onebit/lib/{library}" not in shared:
            fail(f"{library} is not in the wheel's onebit/lib: {shared}")
    expected = {f"onebit/lib/{n}" for n in LIBRARIES + (PREBUILT, "libonebit-nccl-preload.so")}
    if set(shared) - expected:
        fail(f"the wheel holds shared objects it must not (SONAME copies or the Gloo preload): {sorted(set(shared) - expected)}")
    if re.search(r"^Requires-Dist:.*torch", metadata, re.MULTILINE | re.IGNORECASE):
        fail("the wheel requires torch: it must never pull a torch over the user's")
    if "onebit-run = onebit.run:main" not in entry_points:
        fail(f"no onebit-run console script in entry_points.txt:\n{entry_points}")
    if any(n.startswith(("tests/", "tools/")) for n in names):
        fail("the wheel carries tests or tools")
    if "onebit = onebit.backend:register_backend" not in entry_points.split("[torch.distributed.backends]")[-1]:
        fail(f"no torch.distributed.backends entry point for onebit in entry_points.txt:\n{entry_points}")
    for source in ("onebit/csrc/c10d_backend.cc", "onebit/csrc/onebit.h", "onebit/csrc/onebit_types.h",
                   "onebit/lib/onebit_c10d.json"):
        if source not in names:
            fail(f"no {source} in the wheel: the native c10d backend could not be checked or built for another torch")
    if "onebit/py.typed" not in names:
        fail("no onebit/py.typed in the wheel: type checkers would ignore the package's hints (PEP 561)")
    print(f"OK: {name} holds {', '.join(os.path.basename(n) for n in shared)}, once each; no torch requirement")
    return "onebit/lib/libonebit-nccl-preload.so" in shared


def make_venv(work, wheel):
    venv = os.path.join(work, "venv")
    shutil.rmtree(venv, ignore_errors=True)
    run(["/usr/bin/python3", "-m", "venv", venv], "a fresh venv")
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    torch_site = subprocess.run([os.path.join(VENV, "bin", "python"), "-c", "import sysconfig; "
                                 "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                                check=True).stdout.strip()
    # The wheel first: with torch's site-packages already visible, pip would find the onebit that
    # tools/pip-torch.sh installed there and call the requirement satisfied.
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", wheel], "pip install the wheel")
    if not os.path.isfile(os.path.join(site, "onebit", "lib", "libonebit.so")):
        fail(f"pip installed no onebit/lib/libonebit.so into {site}")
    # Appended after the venv's own site-packages: the wheel's onebit wins over any other copy there.
    with open(os.path.join(site, "pip_torch.pth"), "w") as f:
        f.write(torch_site + "\n")
    return venv, site


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    for key in ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "NCCL_NET_PLUGIN", "PYTHONHOME"):
        env.pop(key, None)
    return env


def check_launcher(venv, site, has_preload, cwd, env):
    launcher = os.path.join(venv, "bin", "onebit-run")
    lib = os.path.join(site, "onebit", "lib")
    _, out = run([launcher, "--check"], "onebit-run --check", cwd=cwd, env=env)
    print(out)
    for library in LIBRARIES + (("libonebit-nccl-preload.so",) if has_preload else ()):
        if f"{library}: OK {os.path.join(lib, library)}" not in out:
            fail(f"onebit-run --check does not say that {os.path.join(lib, library)} loads:\n{out}")
    for line in ("libonebit-preload.so: not shipped", "torch gloo: bundled", f"lib_dir: {lib}",
                 f"C library in use: {os.path.join(lib, 'libonebit.so')}, version code "):
        if line not in out:
            fail(f"onebit-run --check lacks {line!r}:\n{out}")
    if not re.search(r"^torch: 2\.\S+ at ", out, re.MULTILINE):
        fail(f"onebit-run --check names no torch 2.x:\n{out}")

    _, out = run([launcher, "--nccl-net", "--print-env"], "onebit-run --nccl-net --print-env", cwd=cwd, env=env)
    want = f"export NCCL_NET_PLUGIN={os.path.join(lib, 'libnccl-net-onebit.so')}\n"
    if out != want:
        fail(f"onebit-run --nccl-net --print-env printed {out!r}, want {want!r}")

    _, out = run([launcher, "--nccl-net", "--print-env"], "onebit-run --nccl-net over another NCCL_NET_PLUGIN",
                 cwd=cwd, env=dict(env, NCCL_NET_PLUGIN="ib"))
    if "warning: NCCL_NET_PLUGIN was 'ib'" not in out or want not in out:
        fail(f"onebit-run --nccl-net replaced NCCL_NET_PLUGIN=ib without the warning, or not at all:\n{out}")

    code, out = run([launcher, "--nccl-net", "--", sys.executable, "-c",
                     "import os, sys; print(os.environ['NCCL_NET_PLUGIN']); sys.exit(7)"],
                    "onebit-run --nccl-net -- COMMAND (exit 7)", ok=(7,), cwd=cwd, env=env)
    if out.strip() != want.split("=", 1)[1].strip():
        fail(f"the command saw NCCL_NET_PLUGIN={out.strip()!r}")

    _, out = run([launcher, "--gloo-preload", "--print-env"], "onebit-run --gloo-preload (pip torch: refused)",
                 ok=(2,), cwd=cwd, env=env)
    if "bundles its own gloo" not in out:
        fail(f"--gloo-preload was refused without the reason:\n{out}")

    if has_preload:
        preload = os.path.join(lib, "libonebit-nccl-preload.so")
        twice = dict(env, LD_PRELOAD=f"{preload} /lib/x86_64-linux-gnu/libm.so.6")
        _, out = run([launcher, "--nccl-allreduce", "--print-env"], "onebit-run --nccl-allreduce, already preloaded",
                     cwd=cwd, env=twice)
        if out != f"export LD_PRELOAD=/lib/x86_64-linux-gnu/libm.so.6:{preload}\n":
            fail(f"--nccl-allreduce left LD_PRELOAD as {out!r}: want the preload once, after the other entry")
    else:
        _, out = run([launcher, "--nccl-allreduce", "--print-env"], "onebit-run --nccl-allreduce (no preload: refused)",
                     ok=(2,), cwd=cwd, env=env)
        if "no libonebit-nccl-preload.so" not in out:
            fail(f"--nccl-allreduce was refused without the reason:\n{out}")
    print("OK: onebit-run checks, prints the plugin's absolute path, passes exit codes, refuses what cannot work")


NO_IMPORT = """
import torch, torch.distributed as dist
dist.init_process_group("onebit")  # found through the wheel's entry point: no import onebit
t = torch.full((8,), float(dist.get_rank() + 1))
dist.all_reduce(t)
assert t.tolist() == [3.0] * 8, t
with open(f"no_import-{dist.get_rank()}.txt", "w") as f:
    f.write(f"{dist.get_backend()} {type(dist.group.WORLD._get_backend(torch.device('cpu'))).__module__}")
dist.destroy_process_group()
"""


def check_no_import(python, cwd, env):
    """init_process_group("onebit") under torchrun in a script that never imports onebit."""
    with open(os.path.join(cwd, "no_import.py"), "w") as f:
        f.write(NO_IMPORT)
    _, out = run([python, "-W", "ignore", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                  "no_import.py"], "torchrun of a script with no import onebit", cwd=cwd, env=env)
    said = []
    for rank in range(2):
        with open(os.path.join(cwd, f"no_import-{rank}.txt")) as f:
            said.append(f.read())
    if said != ["onebit onebit_c10d"] * 2:
        fail(f"the script without import onebit did not run on the native onebit backend on both ranks: {said}\n{out}")
    print("OK: init_process_group(\"onebit\") under torchrun with no import onebit")


JOB = """
import sys, torch, torch.distributed as dist, onebit
rank = int(sys.argv[1])
onebit.register_backend()
dist.init_process_group("onebit", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 4))
optimizer = onebit.OnebitAdam(model.parameters(), lr=1e-3, freeze_step=2)
model.register_comm_hook(optimizer, onebit.ddp_comm_hook)
for step in range(4):
    optimizer.zero_grad()
    model(torch.randn(8, 32)).square().mean().backward()
    optimizer.step()
print("COMPRESSED", onebit.stats()["compressed_calls"])
if sys.argv[3] == "destroy":  # else the group is left to the interpreter's exit
    dist.destroy_process_group()
"""


def check_jobs(python, cwd, env):
    """JOBS back-to-back 2-rank DDP + OnebitAdam jobs through the compression stage, each rank to
    exit 0 (no exit-time abort), half of them ending with destroy_process_group() and half leaving
    the group to the interpreter's exit."""
    with open(os.path.join(cwd, "job.py"), "w") as f:
        f.write(JOB)
    started = time.monotonic()
    for job in range(JOBS):
        store = os.path.join(cwd, f"job-{job}.store")
        ending = "destroy" if job % 2 else "exit"
        ranks = [subprocess.Popen([python, "-W", "ignore", "job.py", str(r), store, ending], cwd=cwd, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = [p.communicate(timeout=300)[0] for p in ranks]
        codes = [p.returncode for p in ranks]
        if codes != [0, 0] or not re.search(r"^COMPRESSED 2$", outs[0], re.MULTILINE):
            fail(f"job {job + 1} of {JOBS}: exit codes {codes}:\n" + "\n--- rank 1\n".join(outs))
    print(f"OK: {JOBS} back-to-back 2-rank DDP + OnebitAdam jobs from the wheel, every rank exit 0 "
          f"({time.monotonic() - started:.0f} s)")


def main():
    source, work = (os.path.abspath(a) for a in sys.argv[1:3])
    python = build_python()
    if python is None:
        return SKIP
    os.makedirs(work, exist_ok=True)
    wheel = build_wheel(python, source, work)
    has_preload = check_wheel_shape(wheel)
    auditwheel = os.path.join(VENV, "bin", "auditwheel")
    if os.path.exists(auditwheel):  # docs/benchmarks/torch-suites.md records it; the tag is the build host's
        print(run([auditwheel, "show", wheel], "auditwheel show", ok=(0, 1))[1])
    else:
        print(f"(no auditwheel in {VENV}: tools/pip-torch.sh installs it)")
    venv, site = make_venv(work, wheel)

    cwd = os.path.join(work, "run")
    shutil.rmtree(cwd, ignore_errors=True)
    os.makedirs(cwd)
    # The backend test and the reference it compares with, alone in an empty folder.
    for part in ("tests/python/torch_backend_check.py", "tools/gpu/reference.py"):
        shutil.copy(os.path.join(source, part), cwd)
    # No compiler, no ninja, an empty extension cache: the wheel's prebuilt module must serve.
    env = dict(clean_env(), TORCH_EXTENSIONS_DIR=os.path.join(work, "torch-extensions"), CXX="/bin/false",
               PATH=os.path.join(venv, "bin"))
    shutil.rmtree(env["TORCH_EXTENSIONS_DIR"], ignore_errors=True)
    python = os.path.join(venv, "bin", "python")
    native = "import onebit._native as n; m = n.native_module(); print(m.__name__, m.__file__)"
    out = run([python, "-W", "ignore", "-c", native], "the native backend, installed, no compiler", cwd=cwd, env=env)[1]
    said = out.split()
    if len(said) != 2 or said[0] != "onebit_c10d" or \
            os.path.realpath(said[1]) != os.path.realpath(os.path.join(site, "onebit", "lib", PREBUILT)):
        fail(f"the installed native backend is not the wheel's prebuilt module: {out}")
    print("OK: with no compiler the native c10d backend is the wheel's prebuilt module")
    print(run([python, "-W", "ignore", "torch_backend_check.py", "--installed", "2"],
              "the 2-rank backend test from the installed wheel", cwd=cwd, env=env)[1])
    check_launcher(venv, site, has_preload, cwd, dict(env, PATH=os.environ.get("PATH", "/usr/bin:/bin")))
    check_no_import(python, cwd, env)
    check_jobs(python, cwd, env)
    if os.listdir(env["TORCH_EXTENSIONS_DIR"]) if os.path.isdir(env["TORCH_EXTENSIONS_DIR"]) else False:
        fail(f"something was built into {env['TORCH_EXTENSIONS_DIR']}: the prebuilt module was not used throughout")
    print("OK: the wheel built from a clean copy works installed, with nothing from the checkout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
