"""The launcher the two-rank Python checks share: runs `script MODE RANK STORE TMP` once per rank,
with a file store of its own, and fails the check (printing every rank's stderr) if any rank does.
"""
import os
import subprocess
import sys


def preload_env(build_dir):
    """The ranks' environment: libonebit-preload.so from build_dir, loopback, no ONEBIT_FREEZE_STEP override."""
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(os.path.join(build_dir, "libonebit-preload.so")),
               MASTER_ADDR="127.0.0.1")
    env.pop("ONEBIT_FREEZE_STEP", None)
    return env


def run_ranks(script, mode, world, tmp, env, timeout=300):
    """Every rank's stderr, once all exited 0."""
    store = os.path.join(tmp, f"store-{mode}")
    procs = [subprocess.Popen([sys.executable, script, mode, str(r), store, tmp], env=env, stderr=subprocess.PIPE,
                              text=True) for r in range(world)]
    errors = [p.communicate(timeout=timeout)[1] for p in procs]
    if any(p.returncode for p in procs):
        print("\n".join(errors))
        raise SystemExit(f"FAIL: {mode} run exit codes {[p.returncode for p in procs]}")
    return errors
