"""onebit-run: start a training command with onebit's libraries switched on, or print the settings
that do it (docs/usage/installing.md, "Installing").

    onebit-run [--nccl-net] [--nccl-allreduce] [--gloo-preload] -- COMMAND [ARGS...]
    onebit-run [--nccl-net] [--nccl-allreduce] [--gloo-preload] --print-env
    onebit-run --check

The settings are environment variables (NCCL_NET_PLUGIN, LD_PRELOAD) that must be in place before
the command's process starts, so the launcher sets them and then replaces itself with the command
(os.execvpe): signals reach the command, and its exit code is the launcher's. The onebit backend of
torch.distributed needs nothing here: the package finds its own libonebit.so.

Exit codes: the command's; 0 after --print-env and --check; 2 for a usage error or a front door
this installation cannot serve (with the reason on stderr).
"""
import argparse
import ctypes
import importlib.util
import os
import shlex
import sys

import onebit

USAGE_ERROR = 2


class _Refused(Exception):
    """A request this installation cannot serve; the message says why and what to do instead."""


def _split_preload(value):
    # ld.so separates LD_PRELOAD entries by colons or spaces.
    return [entry for entry in value.replace(":", " ").split() if entry]


def _add_preload(env, path):
    """LD_PRELOAD with `path` appended once: an entry naming the same file (by real path) is dropped."""
    keep = [entry for entry in _split_preload(env.get("LD_PRELOAD", ""))
            if os.path.realpath(entry) != os.path.realpath(path)]
    env["LD_PRELOAD"] = ":".join(keep + [path])


def _torch_dir():
    """The folder of the torch this Python would import, without importing it (None: no torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _torch_gloo(torch_dir):
    """'bundled' (pip's torch: gloo inside libtorch_cpu.so), 'system' (linked with libgloo.so.0, as
    Debian's is), or a sentence saying why it is unknown."""
    library = os.path.join(torch_dir, "lib", "libtorch_cpu.so")
    try:
        needed = onebit._needed_libraries(os.path.realpath(library))
    except (OSError, ValueError) as error:
        return f"unknown ({library}: {error})"
    return "system" if b"libgloo.so" in needed else "bundled"


def _nccl_net(env):
    path = onebit.nccl_net_plugin_path()
    if "," in path:  # NCCL reads NCCL_NET_PLUGIN as a comma-separated list of plugins
        raise _Refused(f"--nccl-net: the plugin's path {path} contains a comma, which NCCL would split: install "
                       "onebit elsewhere, or put its folder on LD_LIBRARY_PATH and set NCCL_NET_PLUGIN=onebit")
    current = env.get("NCCL_NET_PLUGIN")
    if current and current != path:
        print(f"onebit-run: warning: NCCL_NET_PLUGIN was {current!r}; replacing it with {path}", file=sys.stderr)
    env["NCCL_NET_PLUGIN"] = path


def _nccl_allreduce(env):
    path = onebit.nccl_preload_path()
    if path is None:
        raise _Refused(
            "--nccl-allreduce: this onebit has no libonebit-nccl-preload.so (it was built where CMake found no CUDA "
            "compiler or no nccl.h; lib_dir() is " + str(onebit.lib_dir()) + "). Rebuild the wheel on a machine "
            "with the CUDA toolkit and NCCL's headers (NCCL_HOME), or use --nccl-net")
    _add_preload(env, path)


def _gloo_preload(env):
    torch_dir = _torch_dir()
    if torch_dir is None:
        raise _Refused("--gloo-preload: no torch is importable here; the Gloo front door serves Debian's python3-torch")
    gloo = _torch_gloo(torch_dir)
    if gloo != "system":
        raise _Refused(
            f"--gloo-preload: the torch at {torch_dir} does not link the system libgloo.so.0 (gloo: {gloo}); a pip "
            "torch bundles its own gloo, which the preload cannot reach, so nothing would be compressed. Use the "
            "onebit backend instead: onebit.register_backend(); dist.init_process_group(\"onebit\", ...)")
    folder = onebit.lib_dir()
    path = os.path.join(folder, "libonebit-preload.so") if folder else None
    if path is None or not os.path.isfile(path):
        raise _Refused(
            "--gloo-preload: libonebit-preload.so is not part of this onebit (the wheel never ships it: it breaks "
            "pip's torch). Build it with CMake (apt-get install libgloo-dev; cmake --preset release) and run from that "
            "checkout, or set LD_PRELOAD to the built file")
    _add_preload(env, path)


def _loads(path):
    """'OK' when `path` loads into this process, else the loader's error."""
    try:
        ctypes.CDLL(path)
    except OSError as error:
        return f"FAILED: {error}"
    return "OK"


def _nccl_version():
    """NCCL's version as 'X.Y.Z (from)', from the nvidia-nccl wheel's library next to a pip torch or
    from the loader's search path; None when no libnccl.so.2 is found."""
    candidates = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec and spec.submodule_search_locations else []):
        candidates.append(os.path.join(root, "nccl", "lib", "libnccl.so.2"))
    candidates.append("libnccl.so.2")
    for candidate in candidates:
        if os.path.isabs(candidate) and not os.path.isfile(candidate):
            continue
        try:
            nccl = ctypes.CDLL(candidate)
        except OSError:
            continue
        code = ctypes.c_int(0)
        if nccl.ncclGetVersion(ctypes.byref(code)) != 0:
            continue
        v = code.value  # NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9
        return f"{v // 10000}.{v // 100 % 100}.{v % 100} ({candidate})"
    return None


def _onebit_version():
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("onebit")
    except (ImportError, PackageNotFoundError):
        return "not installed as a distribution (a checkout)"


def check(out=sys.stdout):
    """Print what this installation has and what is in force; returns 0."""
    say = lambda key, value: print(f"{key}: {value}", file=out)  # noqa: E731
    say("onebit", f"{_onebit_version()} at {os.path.dirname(os.path.abspath(onebit.__file__))}")
    say("lib_dir", onebit.lib_dir())
    torch_dir = _torch_dir()
    if torch_dir is None:
        say("torch", "not importable")
    else:
        try:
            import torch
            say("torch", f"{torch.__version__} at {torch_dir}")
        except Exception as error:  # a broken torch is a finding to report, not a crash
            say("torch", f"at {torch_dir}, import failed: {error}")
        say("torch gloo", _torch_gloo(torch_dir))
    say("NCCL", _nccl_version() or "not found")
    folder = onebit.lib_dir()
    for name in ("libonebit.so", "libnccl-net-onebit.so", "libonebit-nccl-preload.so", "libonebit-preload.so"):
        path = os.path.join(folder, name) if folder else None
        if path and os.path.isfile(path):
            say(name, f"{_loads(path)} {path}")
        else:
            say(name, "not shipped")
    try:
        lib = onebit._library()
        where = lib._name or "the copy preloaded into this process (LD_PRELOAD)"
        say("C library in use", f"{where}, version code {lib.onebit_version()}")
    except onebit.OnebitNotLoaded as error:
        say("C library in use", f"FAILED: {error}")
    settings = sorted(k for k in os.environ if k.startswith("ONEBIT_")) + ["NCCL_NET_PLUGIN", "LD_PRELOAD"]
    for key in settings:
        say(key, _shown(key, os.environ[key]) if key in os.environ else "(unset)")
    return 0


def _shown(key, value):
    """What --check prints of `key`: its value, or for a secret (ONEBIT_AUTH_KEY, and any name that
    says key, secret, token or password) only that it is set — this output goes into job logs and
    bug reports. libonebit's logger and onebit-info show the same (common/params.h, secret())."""
    secret = any(word in key.upper() for word in ("KEY", "SECRET", "TOKEN", "PASSWORD"))
    return "(set; not shown)" if secret else value


def _parser():
    p = argparse.ArgumentParser(
        prog="onebit-run", description="Run COMMAND with onebit's front doors switched on, or print their settings.",
        epilog="Example: onebit-run --nccl-net -- torchrun --nproc-per-node 8 train.py")
    p.add_argument("--nccl-net", action="store_true",
                   help="NCCL's network through onebit's TCP: NCCL_NET_PLUGIN=<absolute path of libnccl-net-onebit.so>")
    p.add_argument("--nccl-allreduce", action="store_true",
                   help="compress tagged CUDA tensors' ncclAllReduce: libonebit-nccl-preload.so in LD_PRELOAD")
    p.add_argument("--gloo-preload", action="store_true",
                   help="Debian's torch only: libonebit-preload.so in LD_PRELOAD (refused for a pip torch)")
    p.add_argument("--print-env", action="store_true",
                   help="print the settings as shell `export` lines (sbatch, mpirun -x, a pod spec) and exit")
    p.add_argument("--check", action="store_true",
                   help="print versions, which libraries load and the settings in force, then exit (or run COMMAND)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return p


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.print_env and command:
        parser.error("--print-env prints the settings instead of running a command: give one or the other")
    if not (command or args.print_env or args.check):
        parser.error("nothing to do: give -- COMMAND, --print-env or --check")
    env = dict(os.environ)
    try:
        if args.nccl_net:
            _nccl_net(env)
        if args.nccl_allreduce:
            _nccl_allreduce(env)
        if args.gloo_preload:
            _gloo_preload(env)
    except (_Refused, onebit.OnebitNotLoaded) as error:
        print(f"onebit-run: {error}", file=sys.stderr)
        return USAGE_ERROR
    if args.check:
        check()
    if args.print_env:
        keys = [key for key in ("NCCL_NET_PLUGIN", "LD_PRELOAD") if _sets(args, key)]
        if not keys:
            print("# no front door selected: the onebit backend of torch.distributed needs no settings")
        for key in keys:
            print(f"export {key}={shlex.quote(env[key])}")
        return 0
    if not command:
        return 0
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as error:  # not found, not executable: the shell's codes
        print(f"onebit-run: cannot run {command[0]!r}: {error}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126


def _sets(args, key):
    """Whether the options given set `key` (printed even when the environment held that value already)."""
    if key == "NCCL_NET_PLUGIN":
        return args.nccl_net
    return args.nccl_allreduce or args.gloo_preload


if __name__ == "__main__":
    sys.exit(main())
