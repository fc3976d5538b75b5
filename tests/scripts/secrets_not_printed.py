"""secrets_not_printed.py SOURCE_DIR ONEBIT_INFO ONEBIT_BENCH LIBONEBIT: ONEBIT_AUTH_KEY is never
printed — by the diagnostics users paste into job logs and bug reports (onebit-info, onebit-run
--check, alone and with a command after it) nor by the library's log at its most verbose level
over a real 2-rank job keyed by it. Each says that the key is set."""
import os
import secrets
import subprocess
import sys

source, info, bench, library = sys.argv[1:5]
key = "key-" + secrets.token_hex(16)
env = dict(os.environ, ONEBIT_AUTH_KEY=key, ONEBIT_LIBRARY=library,
           PYTHONPATH=os.path.join(source, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
env.pop("ONEBIT_DEBUG_FILE", None)
runs = {
    "onebit-info": ([info], "ONEBIT_AUTH_KEY=(set; not shown)"),
    "onebit-run --check": ([sys.executable, "-m", "onebit.run", "--check"], "ONEBIT_AUTH_KEY: (set; not shown)"),
    "onebit-run --check -- true": ([sys.executable, "-m", "onebit.run", "--check", "--", "true"],
                                   "ONEBIT_AUTH_KEY: (set; not shown)"),
    "onebit-bench at ONEBIT_DEBUG=TRACE": ([bench, "--ranks", "2", "-b", "1K", "-e", "1K", "--algo", "compressed,ring"],
                                           "ONEBIT_AUTH_KEY=(set; not shown)"),
}
failed = 0
for name, (command, says) in runs.items():
    run_env = dict(env, ONEBIT_DEBUG="TRACE") if "TRACE" in name else env
    done = subprocess.run(command, env=run_env, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    if done.returncode != 0:
        print(f"FAIL: {name} exited {done.returncode}:\n{out}")
        failed += 1
    elif key in out:
        print(f"FAIL: {name} printed ONEBIT_AUTH_KEY's value:\n{out}")
        failed += 1
    elif says not in out:
        print(f"FAIL: {name} does not say {says!r}:\n{out}")
        failed += 1
    else:
        print(f"OK: {name} says the key is set and never shows it")
print(f"{len(runs) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
