"""The two rank processes of a GPU check: started with unbuffered output appended to rank0.log and
rank1.log in a log folder (tools/gpu-check.sh's --out, so that a hang leaves its last lines there;
a temporary folder otherwise), waited for within the check's own deadline, killed past it or soon
after another rank has failed.
"""
import os
import select
import subprocess
import sys
import time


def nccl_env(build, rank):
    """A rank's environment for torch's NCCL backend through onebit's NCCL_NET plugin, the NCCL
    preload loaded: distinct NCCL_HOSTID per rank (two hosts to NCCL), SHM and P2P off (the network
    it is), NCCL's INFO log on the rank's output (never in NCCL_DEBUG_FILE: the checks read it), and
    onebit's too (ONEBIT_DEBUG=INFO: a tagged call forwarded to NCCL uncompressed says why)."""
    env = dict(os.environ, LD_PRELOAD=os.path.join(build, "libonebit-nccl-preload.so"), NCCL_NET_PLUGIN="onebit",
               NCCL_HOSTID=f"onebit-host-{rank}", NCCL_SHM_DISABLE="1", NCCL_P2P_DISABLE="1", NCCL_DEBUG="INFO",
               NCCL_DEBUG_SUBSYS="INIT,NET", ONEBIT_DEBUG="INFO",
               LD_LIBRARY_PATH=build + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
    env.pop("NCCL_DEBUG_FILE", None)
    return env


class Ranks:
    def __init__(self, log_dir, title):
        self.log_dir, self.title = log_dir, title
        self.procs, self.logs, self.offsets = [], [], []

    def start(self, rank, command, env):
        """Runs `command` (argv) as rank `rank`, its output appended to rank<rank>.log."""
        path = os.path.join(self.log_dir, f"rank{rank}.log")
        log = open(path, "a+")
        log.write(f"=== {self.title}, rank {rank}, {time.strftime('%H:%M:%S')}\n")
        log.flush()
        self.offsets.append(log.tell())
        self.logs.append(log)
        env = dict(env, PYTHONUNBUFFERED="1")
        self.procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))

    def wait(self, seconds, grace=15):
        """Exit codes, every rank waited for at most `seconds` in all. Once a rank has failed, the
        others get at most `grace` seconds more (they may be waiting in a collective with it), so
        that a failure costs seconds, not the whole timeout. The ranks still running then are
        killed, their code None, and the reason and each rank's last lines printed. Each exit is
        seen as it happens (a pidfd per rank, select), not polled for."""
        deadline = time.monotonic() + max(seconds, 1)
        running = {os.pidfd_open(p.pid): rank for rank, p in enumerate(self.procs)}
        failed = None
        try:
            while running and time.monotonic() < deadline:
                exited, _, _ = select.select(list(running), [], [], max(deadline - time.monotonic(), 0))
                for fd in exited:
                    rank = running.pop(fd)
                    os.close(fd)
                    if self.procs[rank].wait() != 0 and failed is None:
                        failed = rank
                        deadline = min(deadline, time.monotonic() + grace)
        finally:
            for fd in running:
                os.close(fd)
        codes = [p.poll() for p in self.procs]
        if all(code is not None for code in codes):
            return codes
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        why = (f"rank {failed} failed (exit {codes[failed]}) and the others did not finish within {grace} s"
               if failed is not None else f"timed out after {seconds:.0f} s (a hang?)")
        print(f"{self.title}: {why}; killed; the last lines of each rank:", flush=True)
        print(self.tails(20), flush=True)
        return codes

    def text(self):
        """What the ranks wrote in this run, rank 0 first."""
        text = ""
        for log, offset in zip(self.logs, self.offsets):
            log.seek(offset)
            text += log.read()
        return text

    def tails(self, lines):
        out = []
        for rank, (log, offset) in enumerate(zip(self.logs, self.offsets)):
            log.seek(offset)
            out.append(f"--- rank {rank}, last {lines} lines:")
            out.extend(log.read().splitlines()[-lines:])
        return "\n".join(out)


def python_command(script, *args):
    return [sys.executable, "-u", os.path.abspath(script), *args]
