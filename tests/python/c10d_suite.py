"""PyTorch's own distributed suite, DistributedTest._DistTestBase from the installed torch
(torch/testing/_internal/distributed/distributed_test.py, shipped in the wheel), run as torch's
test/distributed/test_distributed_spawn.py runs it — BACKEND=gloo, 2 ranks spawned per test, a
file:// rendezvous in a temporary directory — either on gloo itself or with the onebit backend
making every process group the suite asks gloo for: the default group (init_process_group) and
every new_group / new_subgroups group; split_group's children are onebit's own splits.

    PYTHON tests/python/c10d_suite.py [--backend onebit|gloo] [--subset] [-k PATTERN ...] [-x TEXT ...]
                                      [--json OUT] [--build BUILD_DIR] [--world-size N]
        runs the selection (all of _DistTestBase by default; --subset: the CI subset below;
        -k as unittest's, repeatable; -x leaves out the tests whose name contains TEXT) and prints one line per test (PASS / FAIL / SKIP / ERROR),
        then the counts; --json writes {test: outcome}.
    PYTHON tests/python/c10d_suite.py --compare GLOO.json ONEBIT.json [--torch-refuses TEST,...]
        every test that passes on gloo must pass on onebit, bar NAME_ASSERTING below (and the
        tests named by --torch-refuses: what an older torch refuses to every backend not named
        gloo, tools/oldest-torch.sh): lists those that do not and exits 1 if any.
    PYTHON tests/python/c10d_suite.py --check BUILD_DIR
        the test command's form (python.c10d_suite_pip): the subset on onebit; every one of its
        tests (each passes on gloo) must pass, bar NAME_ASSERTING; exit 77 when this torch lacks the suite
        or the c10d Backend class.

How the backend is substituted: torch.distributed.distributed_c10d._new_process_group_helper (a
private torch function; every group of init_process_group and new_group is made by it, checked on
torch 2.15.0) is wrapped, in the driver and in each spawned rank (spawn imports this file again),
so that a group asked for as "gloo" is made as "onebit". The suite's BACKEND stays "gloo", so its
gloo-only tests run rather than skip; torch records the group's backend as "onebit", which is what
the tests of NAME_ASSERTING compare against BACKEND.
"""
import json
import os
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

# The test command's subset: every collective, point-to-point call, Work and group case of the
# suite that runs on 2 CPU ranks, at least once — each of them passes on gloo (the --backend gloo
# run recorded in docs/benchmarks/torch-suites.md, pip torch 2.15.0). Not in it, as they skip on gloo too: the
# all_to_all tests (MPI only on CPU), the coalescing manager's (NCCL only), the _group tests
# (3 ranks and more), new_subgroups (skipped upstream); tests/python/backend_object_check.py
# covers all_to_all and the coalesced batch_isend_irecv on onebit itself.
SUBSET = [
    "test_broadcast", "test_broadcast_full_group", "test_reduce_sum", "test_reduce_full_group_min",
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_product", "test_all_reduce_full_group_sum",
    "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops", "test_sparse_all_reduce_sum",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_full_group_max",
    "test_scatter", "test_scatter_checks", "test_gather", "test_gather_checks", "test_all_gather",
    "test_all_gather_coalesced_simple", "test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
    "test_scatter_object_list", "test_barrier", "test_barrier_full_group", "test_barrier_timeout_full_group",
    "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup",
    "test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag", "test_isend", "test_irecv",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    "test_get_future", "test_get_backend", "test_destroy_group", "test_get_rank_size_full_group",
    "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync_allreduce_hook",
]

# Tests that assert the group's backend name: test_get_backend compares it with the suite's
# BACKEND ("gloo"; on onebit the name is "onebit", as it should be); test_ddp_logging_data_cpu
# compares DDP's logged backend_name with dist.get_backend(), and torch 2.15 logs "custom" for
# every backend registered through Backend.register_backend.
NAME_ASSERTING = {"test_get_backend", "test_ddp_logging_data_cpu"}

def use_onebit_for_gloo():
    """Makes every process group asked for as "gloo" an onebit group (see the module docstring)."""
    import torch.distributed.distributed_c10d as c10d
    import onebit
    onebit.register_backend()
    helper = c10d._new_process_group_helper
    if getattr(helper, "_onebit_substitute", False):
        return

    def substitute(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        if str(backend).lower() == "gloo":
            backend = c10d.Backend("onebit")
        return helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs)
    substitute._onebit_substitute = True
    c10d._new_process_group_helper = substitute


def environment():
    """What the suite reads from the environment (torch's test_distributed_spawn.py is run with
    BACKEND and WORLD_SIZE set); the spawned ranks inherit it."""
    os.environ.setdefault("BACKEND", "gloo")
    os.environ.setdefault("WORLD_SIZE", "2")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Read at import only, to skip the tests that need a file:// rendezvous (each test makes its
    # own init file, TestDistBackend.init_method): torch's CI runs the suite with both kinds.
    os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(tempfile.gettempdir(), "onebit-c10d-suite-init"))


def setup(backend):
    """For onebit, the substitution: run in the driver and again in every rank that the suite
    spawns."""
    environment()
    if backend == "onebit":
        use_onebit_for_gloo()


def suite_class():
    """torch's test_distributed_spawn.py's class: each test spawns its ranks, which find the class
    by pickle as __main__.TestDistBackendWithSpawn — this file, imported again by spawn."""
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
    TestDistBackendWithSpawn.__module__ = "__main__"
    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    globals()["TestDistBackendWithSpawn"] = TestDistBackendWithSpawn
    return TestDistBackendWithSpawn


class _Outcomes(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}
        self._started = 0.0

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = outcome
        line = f"{outcome:5} {name} ({time.monotonic() - self._started:.1f} s)"
        if detail:  # the error's own line: the last one naming an exception, else the last
            lines = [l.split("]", 1)[-1].strip() for l in detail.strip().splitlines()]
            named = [l for l in lines if "Error" in l or "Exception" in l or "exit code" in l]
            line += "\n      " + (named or lines)[-1][:300]
        print(line, file=sys.__stdout__, flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "PASS")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "FAIL", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "ERROR", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "SKIP", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "PASS")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "FAIL", "unexpected success")


def run(names, patterns, excluded=()):
    cls = suite_class()
    loader = unittest.TestLoader()
    if patterns:
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in patterns]
    every = loader.getTestCaseNames(cls)
    chosen = [n for n in every if (names is None or n in names) and not any(x in n for x in excluded)]
    missing = sorted(set(names or ()) - set(every))
    if missing:
        print(f"not in this torch's suite: {' '.join(missing)}", flush=True)
    suite = unittest.TestSuite(cls(n) for n in chosen)
    with open(os.devnull, "w") as quiet:
        runner = unittest.TextTestRunner(stream=quiet, resultclass=_Outcomes, verbosity=0)
        started = time.monotonic()
        result = runner.run(suite)
    counts = {k: sum(1 for v in result.outcomes.values() if v == k) for k in ("PASS", "FAIL", "ERROR", "SKIP")}
    print(f"{os.environ.get('ONEBIT_C10D_SUITE_BACKEND', 'gloo')}: {len(result.outcomes)} tests, "
          + ", ".join(f"{v} {k.lower()}" for k, v in counts.items()) + f" in {time.monotonic() - started:.0f} s",
          flush=True)
    return result.outcomes


def compare(gloo, onebit, excepted):
    """Tests that pass on gloo and not on onebit, less `excepted`."""
    return sorted(n for n, v in gloo.items() if v == "PASS" and onebit.get(n) != "PASS" and n not in excepted)


def main(argv):
    if "--compare" in argv:
        i = argv.index("--compare")
        with open(argv[i + 1]) as f:
            gloo = json.load(f)
        with open(argv[i + 2]) as f:
            onebit = json.load(f)
        refused = set(argv[argv.index("--torch-refuses") + 1].split(",")) if "--torch-refuses" in argv else set()
        lost = compare(gloo, onebit, NAME_ASSERTING | refused)
        print(f"gloo: {sum(v == 'PASS' for v in gloo.values())} of {len(gloo)} pass; onebit: "
              f"{sum(v == 'PASS' for v in onebit.values())} of {len(onebit)} pass")
        for name in sorted(NAME_ASSERTING & set(gloo)):
            print(f"excepted: {name} (asserts the backend name): "
                  f"gloo {gloo[name]}, onebit {onebit.get(name)}")
        for name in sorted(refused & set(gloo)):
            print(f"excepted: {name} (this torch refuses it to every backend not named gloo): "
                  f"gloo {gloo[name]}, onebit {onebit.get(name)}")
        for name in lost:
            print(f"passes on gloo, not on onebit: {name} ({onebit.get(name)})")
        return 1 if lost else 0
    check = "--check" in argv
    backend = "onebit" if check else argv[argv.index("--backend") + 1] if "--backend" in argv else "gloo"
    patterns = [argv[i + 1] for i, a in enumerate(argv) if a == "-k"]
    excluded = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    names = SUBSET if check or "--subset" in argv else None
    out = argv[argv.index("--json") + 1] if "--json" in argv else None
    if "--world-size" in argv:
        os.environ["WORLD_SIZE"] = argv[argv.index("--world-size") + 1]
    if check:
        build = argv[argv.index("--check") + 1]
        os.environ.setdefault("ONEBIT_LIBRARY", os.path.join(os.path.abspath(build), "libonebit.so"))
    elif "--build" in argv:
        os.environ.setdefault("ONEBIT_LIBRARY",
                              os.path.join(os.path.abspath(argv[argv.index("--build") + 1]), "libonebit.so"))
    environment()  # distributed_test reads it at import
    import torch
    try:
        import torch.testing._internal.distributed.distributed_test  # noqa: F401
    except ImportError as e:
        print(f"SKIP: torch {torch.__version__} at {torch.__file__} does not ship the distributed suite ({e})")
        return 77
    if not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} has no c10d Backend class (torch >= 2.0)")
        return 77
    os.environ["ONEBIT_C10D_SUITE_BACKEND"] = backend  # the spawned ranks read it at import
    setup(backend)
    print(f"torch {torch.__version__}, BACKEND=gloo served by {backend}, {os.environ['WORLD_SIZE']} ranks", flush=True)
    outcomes = run(names, patterns, excluded)
    if out:
        with open(out, "w") as f:
            json.dump(outcomes, f, indent=1, sort_keys=True)
    if not check:
        return 0 if all(v in ("PASS", "SKIP") for v in outcomes.values()) else 1
    lost = [n for n in SUBSET if outcomes.get(n) != "PASS" and n not in NAME_ASSERTING]
    for name in lost:
        print(f"FAIL: {name} passes on gloo and is {outcomes.get(name)} on onebit")
    if not lost:
        print(f"every one of the {len(SUBSET)} subset tests, which pass on gloo, passes on onebit "
              f"(bar {', '.join(sorted(NAME_ASSERTING))})")
    return 1 if lost else 0


if os.environ.get("ONEBIT_C10D_SUITE_BACKEND"):  # a rank spawned by the suite: imports this file again
    sys.path.insert(0, os.path.join(ROOT, "python"))
    setup(os.environ["ONEBIT_C10D_SUITE_BACKEND"])
    suite_class()
elif __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "python"))
    sys.exit(main(sys.argv[1:]))
