"""Two ranks of torch.distributed's NCCL backend on one GPU, connected through onebit's NCCL_NET
plugin (distinct NCCL_HOSTID per rank makes NCCL treat them as two hosts; SHM/P2P off leaves it the
network), with libonebit-nccl-preload.so preloaded. Checks, each naming what failed:
  - NCCL's log shows NET/onebit;
  - untagged all_reduces of integer-valued tensors are exact (1 to 16 Mi + 3 floats);
  - a tagged CUDA tensor's all_reduce equals the float64 reference of docs/algorithm.md over 3 calls,
    float32, float16 and bfloat16;
  - a NaN in one rank's input makes that call's result non-finite on both ranks and leaves the
    error state as it was: the next call equals the reference that never saw the NaN call;
  - settings that differ on one rank (onebit_tag_set_step_settings) make that call non-finite on
    both ranks and leave the error state as it was, as the NaN does;
  - untag + re-tag of the name with fewer elements starts from fresh state (the reference anew);
  - a tagged all_reduce captured once in a CUDA graph and replayed 3 times: every replay equals the
    reference's next call (the error feedback builds from replay to replay), and the tag's calls
    (onebit_tag_stats) count the replays;
  - onebit.stats() counts the compressed calls;
  - OnebitAdam, ZeroOneAdam and OnebitLamb on CUDA parameters (two groups, 64 elements that never
    get a gradient) step with the C core's device steps: every step — each stage, each kind of 0/1
    Adam step, LAMB's scaling coefficients — replayed by the C core's host steps on copies of the
    state before it, with the gradients and the averaged buffer the step saw, gives the same bits
    (parameters, m, v, u, v_fresh, the lr sums, LAMB's layer scalars); the dormant count at the
    freeze and the automatic freeze's measurements (device twins) are the host calls' answers;
    OnebitAdam's step() inside a real torch.cuda.graph capture is refused, changing nothing.

    python3 tools/gpu/nccl_job_check.py BUILD_DIR [--logs DIR] [--timeout SECONDS]
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from ranks import Ranks, nccl_env, python_command  # noqa: E402

N = 5003


FAILURES = []  # this rank's failed checks: a run goes on past a failure (the ranks' collectives stay
#               in step), so that one failed check does not hide the others; the rank exits 4 at its end


def fail(rank, what):
    print(f"rank {rank}: FAIL: {what}", flush=True)
    FAILURES.append(what)


def check(rank, what):
    """A progress line before each check: a hang is then placed by the rank logs' last lines."""
    print(f"rank {rank}: check: {what}", flush=True)


def tagged_calls(rank, name, n, dtype, tolerance, reference, calls, start=0):
    import torch
    import torch.distributed as dist
    from reference import inputs_of, mismatches
    t = torch.zeros(n, device="cuda", dtype=dtype)
    import onebit
    onebit.tag(t, name)
    for call in range(start, start + calls):
        t.copy_(inputs_of(name, n, rank, call, dtype))
        dist.all_reduce(t)
        want = reference.step([inputs_of(name, n, r, call, dtype) for r in range(2)])
        bad = mismatches(t, want, tolerance)
        if bad > n // 10000 + 1:
            fail(rank, f"tagged {dtype} '{name}' call {call}: {bad} of {n} elements off the float64 reference")
    return t


def tag_calls(rank, name):
    """onebit_tag_stats' call count for `name` (replays of a captured call included)."""
    import ctypes
    import onebit
    lib = onebit._library()
    calls, sent = ctypes.c_uint64(0), ctypes.c_uint64(0)
    if lib.onebit_tag_stats(name.encode(), ctypes.byref(calls), ctypes.byref(sent)) != 0:
        fail(rank, f"onebit_tag_stats('{name}') failed")
    return calls.value


def graph_replays(rank):
    """One tagged call outside capture (it allocates the device state), one captured on a side
    stream, three replays with new inputs: each replay is the reference's next call."""
    import torch
    import torch.distributed as dist
    import onebit
    from reference import Reference, inputs_of, mismatches
    reference = Reference(2, N)
    t = tagged_calls(rank, "graph", N, torch.float32, 1e-4, reference, 1)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph):
            dist.all_reduce(t)  # recorded, not run: the device state does not move
    torch.cuda.current_stream().wait_stream(side)
    for call in (1, 2, 3):
        t.copy_(inputs_of("graph", N, rank, call))
        graph.replay()
        torch.cuda.synchronize()
        want = reference.step([inputs_of("graph", N, r, call) for r in range(2)])
        bad = mismatches(t, want, 1e-4)
        if bad > N // 10000 + 1:
            fail(rank, f"graph replay {call}: {bad} of {N} elements off the float64 reference (error feedback does "
                 "not carry from replay to replay?)")
    calls = tag_calls(rank, "graph")
    if calls != 4:
        fail(rank, f"the tag counts {calls} calls after 1 call and 3 replays, want 4")
    onebit.untag(t)
    return 2  # compressed calls the door saw: the first, and the captured one


def set_settings(name, lr):
    import ctypes
    import onebit
    keys = (ctypes.c_char_p * 1)(b"lr")
    values = (ctypes.c_double * 1)(lr)
    if onebit._library().onebit_tag_set_step_settings(name.encode(), keys, values, 1) != 0:
        raise RuntimeError("onebit_tag_set_step_settings failed")


def call_that_changes_nothing(rank, name, spoil, mend, what):
    """Three tagged calls of `name`: `spoil(t)` before the second makes it non-finite on both ranks,
    `mend()` before the third, which must equal the reference's second — the spoiled call changed
    no state. Returns the compressed calls made."""
    import torch
    import torch.distributed as dist
    import onebit
    from reference import Reference, inputs_of, mismatches
    reference = Reference(2, N)
    t = tagged_calls(rank, name, N, torch.float32, 1e-4, reference, 1)
    t.copy_(inputs_of(name, N, rank, 1))
    spoil(t)
    dist.all_reduce(t)
    if torch.isfinite(t).any():
        fail(rank, f"{what}: the call's result is not non-finite everywhere")
    mend()
    t.copy_(inputs_of(name, N, rank, 2))
    dist.all_reduce(t)
    want = reference.step([inputs_of(name, N, r, 2) for r in range(2)])
    bad = mismatches(t, want, 1e-4)
    if bad > N // 10000 + 1:
        fail(rank, f"{what}: after that call the error state was not the one before it ({bad} elements off)")
    onebit.untag(t)
    return 3


def spoil_with_nan(rank):
    def spoil(t):
        if rank == 1:
            t[17] = float("nan")
    return spoil


def rank_main(rank, store):
    import torch
    import torch.distributed as dist
    import onebit
    from reference import Reference
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=2)
    compressed = 0
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)):
        name = f"momentum-{dtype}"
        check(rank, f"tagged {dtype} all_reduces against the float64 reference")
        t = tagged_calls(rank, name, N, dtype, tolerance, Reference(2, N), 3)
        onebit.untag(t)
        compressed += 3
    # A NaN in rank 1's input, then settings (onebit_tag_set_step_settings) that differ on rank 1:
    # each makes its call non-finite on both ranks and changes no state.
    check(rank, "a NaN on rank 1")
    compressed += call_that_changes_nothing(rank, "nan", spoil_with_nan(rank), lambda: None, "a NaN on rank 1")
    check(rank, "settings that differ on rank 1")
    compressed += call_that_changes_nothing(
        rank, "drift", lambda t: set_settings("drift", 0.002 if rank == 1 else 0.001),
        lambda: set_settings("drift", 0.001), "rank 1's lr differs")
    # Re-tag the name with fewer elements: fresh state, nothing of the old one.
    check(rank, "a re-tagged name")
    t = tagged_calls(rank, "retag", N, torch.float32, 1e-4, Reference(2, N), 2)
    onebit.untag(t)
    t = tagged_calls(rank, "retag", 1001, torch.float32, 1e-4, Reference(2, 1001), 2, start=5)
    onebit.untag(t)
    compressed += 4
    check(rank, "a captured call's graph replays")
    compressed += graph_replays(rank)
    stats = onebit.stats()
    if stats["compressed_calls"] != compressed:
        fail(rank, f"stats count {stats['compressed_calls']} compressed calls, want {compressed}: {stats}")
    check(rank, "untagged all_reduces, exact")
    for n in (1, 1000, 1 << 20, (16 << 20) + 3):
        t = (torch.arange(n, device="cuda", dtype=torch.float32) % 1000) + rank
        dist.all_reduce(t)
        want = 2 * (torch.arange(n, device="cuda", dtype=torch.float32) % 1000) + 1
        if not torch.equal(t, want):
            fail(rank, f"untagged all_reduce of {n} floats is not exact")
    optimizers_on_cuda(rank)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    check(rank, f"done, {len(FAILURES)} failed")
    if FAILURES:
        sys.exit(4)


def step_refused_under_capture(rank, opt, params, flat):
    """step() inside a real CUDA graph capture is refused before it queues anything: the capture
    ends empty, and the parameters and m are as they were."""
    import torch
    p, m = flat(params), opt._m.detach().cpu().clone()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            opt.step()
    except RuntimeError as error:
        if "OnebitAdam.step() was called during CUDA graph capture" not in str(error):
            fail(rank, f"OnebitAdam.step() under capture failed otherwise than refused: {error}")
    else:
        fail(rank, "OnebitAdam.step() inside torch.cuda.graph was not refused")
    torch.cuda.synchronize()
    if not torch.equal(flat(params), p) or not torch.equal(opt._m.detach().cpu(), m):
        fail(rank, "the refused OnebitAdam.step() under capture changed the parameters or m")


def optimizers_on_cuda(rank, device="cuda"):
    """The optimizers' CUDA steps against the C core's host steps (their oracle), through the
    Python shims as a training loop drives them: every step replayed on host copies of the state
    before it, with the gradients and the averaged buffer the step saw, and the results compared
    bit for bit. (device="cpu" checks the check itself, on the host steps, where no GPU is.)"""
    import ctypes
    import torch
    import onebit
    from onebit import zero_one_adam
    lib = onebit._library()

    def ptr(t):
        return ctypes.c_void_p(t.data_ptr())

    def model():
        torch.manual_seed(7)  # the same parameters on both ranks; one layer of several LAMB tiles
        return [torch.nn.Parameter(torch.randn(5003).to(device)), torch.nn.Parameter(torch.randn(300).to(device))]

    def groups(params):
        return [{"params": params[:1]}, {"params": params[1:], "lr": 3e-3, "weight_decay": 0.01}]

    def set_gradients(params, step):
        g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(device)
        params[0].grad[:64] = 0  # never a gradient: dormant once the variance freezes

    def flat(params):
        return torch.cat([p.detach().reshape(-1) for p in params]).cpu()

    def own_gradients(params):
        """This rank's own gradients, flat: what a step that takes no average reads (on the CPU the
        shims read them where they lie, and their flat gradient buffer is not filled)."""
        return torch.cat([p.grad.detach().reshape(-1) for p in params]).cpu()

    def host(tensor):
        return tensor.detach().cpu().clone()

    def same(what, got, want):
        got = got.detach().cpu()
        if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
            fail(rank, f"{what}: {int((got.view(torch.int32) != want.view(torch.int32)).sum())} of {want.numel()} "
                       "elements differ in their bits from the C core's host step")

    def ok(result, what):
        if result != 0:
            fail(rank, f"the host {what} failed: {lib.onebit_last_error().decode()}")

    def recording(opt):
        """The tagged buffer of each step as the step sent it and as it came back averaged (host copies)."""
        seen, average = {}, opt._average_tagged

        def record(buffer, *args, **kwargs):
            seen["sent"] = host(buffer)
            average(buffer, *args, **kwargs)
            seen["averaged"] = host(buffer)
        opt._average_tagged = record
        return seen

    def each_group(opt, call):
        for group, (lo, hi) in zip(opt.param_groups, opt._ranges):
            ok(call(ctypes.byref(opt._config(group)), lo, ctypes.c_size_t(hi - lo)), "step")

    check(rank, "OnebitAdam's CUDA steps against the host core")
    # 1-bit Adam: warmup from the exact average; the compression stage from the averaged momentum.
    params = model()
    opt = onebit.OnebitAdam(groups(params), lr=1e-3, freeze_step=2, name="cuda/onebit_adam")
    seen = recording(opt)
    for step in range(5):
        set_gradients(params, step)
        compressing, p, m, v = opt.compressing, flat(params), host(opt._m), host(opt._v)
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if not compressing:
            g = host(opt._grad)  # averaged over the ranks
            each_group(opt, lambda c, lo, n: lib.onebit_adam_warmup_step(c, ptr(p[lo:]), ptr(m[lo:]), ptr(v[lo:]),
                                                                         ptr(g[lo:]), n))
        else:
            same(f"OnebitAdam step {step}: the momentum kept before the step", opt._m_before, m)
            sent, own = m.clone(), own_gradients(params)
            each_group(opt, lambda c, lo, n: lib.onebit_adam_momentum_step(c, ptr(sent[lo:]), ptr(own[lo:]), n))
            same(f"OnebitAdam step {step}: the momentum sent", seen["sent"], sent)
            m = seen["averaged"]
            each_group(opt, lambda c, lo, n: lib.onebit_adam_apply_step(c, ptr(p[lo:]), ptr(m[lo:]), ptr(v[lo:]), n))
        stage = "compression" if compressing else "warmup"
        same(f"OnebitAdam {stage} step {step}: parameters", flat(params), p)
        same(f"OnebitAdam {stage} step {step}: m", opt._m, m)
        same(f"OnebitAdam {stage} step {step}: v", opt._v, v)
    if opt.dormant_elements != 64:
        fail(rank, f"OnebitAdam: {opt.dormant_elements} dormant elements at the freeze, want the 64 without gradient")
    if device == "cuda":
        check(rank, "OnebitAdam.step() under a real CUDA graph capture")
        step_refused_under_capture(rank, opt, params, flat)
    opt.close()

    check(rank, "OnebitAdam's automatic freeze's measurements")
    # 1-bit Adam's automatic freeze: every measurement (the device twin's, over the CUDA v) is the
    # host call's over copies of v and v_then, the same double; max_freeze_step ends the warmup.
    params = model()
    opt = onebit.OnebitAdam(groups(params), lr=1e-3, freeze_step="auto", freeze_window=1, freeze_threshold=1e-12,
                            max_freeze_step=3, name="cuda/onebit_adam_auto")
    for step in range(4):
        set_gradients(params, step)
        v_then, measured = host(opt._v_then), len(opt.variance_changes)
        opt.step()
        if len(opt.variance_changes) == measured:
            continue
        v, change = host(opt._v), ctypes.c_double()
        ok(lib.onebit_adam_variance_change(ptr(v), ptr(v_then), ctypes.c_size_t(v.numel()), ctypes.byref(change)),
           "variance change")
        if opt.variance_changes[-1][1] != change.value:
            fail(rank, f"OnebitAdam auto freeze, step {step}: the device measured {opt.variance_changes[-1][1]!r}, "
                       f"the host call {change.value!r}")
    if opt.freeze_step != 3 or len(opt.variance_changes) != 3:
        fail(rank, f"OnebitAdam auto freeze: freeze_step {opt.freeze_step} after {opt.variance_changes}, want 3 "
                   "after 3 measurements")
    opt.close()

    check(rank, "ZeroOneAdam's CUDA steps against the host core")
    # 0/1 Adam: every kind of step (variance, compressed, sync, local).
    params = model()
    opt = onebit.ZeroOneAdam(groups(params), lr=1e-3, var_freeze_step=4, var_update_scaler=2, local_step_scaler=1,
                             local_step_clipper=2, name="cuda/zero_one_adam")
    seen = recording(opt)
    kinds = []
    for step in range(8):
        set_gradients(params, step)
        kind = opt.next_step_kind()
        kinds.append(kind)
        p, m, v, u, p_sync = flat(params), host(opt._m), host(opt._v), host(opt._u), host(opt._p_sync)
        lrs = [ctypes.c_float(l.value) for l in opt._lrs]
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        g = host(opt._grad) if kind == zero_one_adam.VARIANCE_STEP else own_gradients(params)  # averaged, or own
        if kind in (zero_one_adam.VARIANCE_STEP, zero_one_adam.COMPRESSED_STEP):
            variance = kind == zero_one_adam.VARIANCE_STEP
            if not variance:
                same(f"ZeroOneAdam step {step}: the gradients sent", seen["sent"], g)
            averaged = g if variance else seen["averaged"]
            each_group(opt, lambda c, lo, n: lib.onebit_zero_one_adam_gradient_step(
                c, ptr(p[lo:]), ptr(m[lo:]), ptr(v[lo:]), ptr(averaged[lo:]), n, int(variance)))
        else:
            for index, (group, (lo, hi)) in enumerate(zip(opt.param_groups, opt._ranges)):
                config, n = ctypes.byref(opt._config(group)), ctypes.c_size_t(hi - lo)
                ok(lib.onebit_zero_one_adam_local_step(config, ptr(p[lo:]), ptr(m[lo:]), ptr(v[lo:]), ptr(u[lo:]),
                                                       ctypes.byref(lrs[index]), ptr(g[lo:]), n), "local step")
                if kind == zero_one_adam.SYNC_STEP:
                    ok(lib.onebit_zero_one_adam_sync_begin(config, ptr(u[lo:]), ptr(v[lo:]), lrs[index], n),
                       "sync begin")
            if kind == zero_one_adam.SYNC_STEP:
                same(f"ZeroOneAdam step {step}: the update sent", seen["sent"], u)
                u = seen["averaged"]
                for index, (group, (lo, hi)) in enumerate(zip(opt.param_groups, opt._ranges)):
                    ok(lib.onebit_zero_one_adam_sync_end(ctypes.byref(opt._config(group)), ptr(p[lo:]),
                                                         ptr(p_sync[lo:]), ptr(m[lo:]), ptr(u[lo:]), ptr(v[lo:]),
                                                         ctypes.byref(lrs[index]), ctypes.c_size_t(hi - lo)),
                       "sync end")
            same(f"ZeroOneAdam step {step} (kind {kind}): u", opt._u, u)
            same(f"ZeroOneAdam step {step} (kind {kind}): params at the last sync", opt._p_sync, p_sync)
            if [l.value for l in lrs] != [l.value for l in opt._lrs]:
                fail(rank, f"ZeroOneAdam step {step}: lr sums {[l.value for l in opt._lrs]}, the host step's "
                           f"{[l.value for l in lrs]}")
        same(f"ZeroOneAdam step {step} (kind {kind}): parameters", flat(params), p)
        same(f"ZeroOneAdam step {step} (kind {kind}): m", opt._m, m)
        same(f"ZeroOneAdam step {step} (kind {kind}): v", opt._v, v)
    want = [0, 0, 1, 0, 1, 3, 2, 3]
    if kinds != want:
        fail(rank, f"ZeroOneAdam took the steps {kinds}, the check was written for {want}")
    opt.close()

    check(rank, "OnebitLamb's CUDA steps against the host core")
    # 1-bit LAMB: warmup, the scaling coefficients, the compression stage (layers' scalars too).
    params = model()
    opt = onebit.OnebitLamb(groups(params), lr=1e-3, freeze_step=2, name="cuda/onebit_lamb")
    seen = recording(opt)
    for step in range(4):
        set_gradients(params, step)
        p, m, v, v_fresh, m_last = flat(params), host(opt._m), host(opt._v), host(opt._v_fresh), host(opt._m_last)
        layers = type(opt._layers).from_buffer_copy(opt._layers)
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        g = host(opt._grad) if step < opt.freeze_step else own_gradients(params)  # averaged in warmup, else own
        if step == opt.freeze_step:
            ok(lib.onebit_lamb_scaling_coeffs(ptr(m), opt._counts, ctypes.c_size_t(len(layers)), layers),
               "scaling coefficients")
        for j, ((lo, hi), group) in enumerate(zip(opt._slices, opt._layer_groups)):
            config, layer, n = ctypes.byref(opt._config(group)), ctypes.byref(layers[j]), ctypes.c_size_t(hi - lo)
            if step < opt.freeze_step:
                ok(lib.onebit_lamb_warmup_step(config, layer, ctypes.c_int64(step), ptr(p[lo:]), ptr(m[lo:]),
                                               ptr(v[lo:]), ptr(v_fresh[lo:]), ptr(g[lo:]), n), "warmup step")
            else:
                ok(lib.onebit_lamb_momentum_step(config, layer, ptr(m[lo:]), ptr(m_last[lo:]), ptr(g[lo:]), n),
                   "momentum step")
        if step >= opt.freeze_step:
            same(f"OnebitLamb step {step}: the momentum sent", seen["sent"], m)  # the momentum steps' result
            m = seen["averaged"]
            for j, ((lo, hi), group) in enumerate(zip(opt._slices, opt._layer_groups)):
                ok(lib.onebit_lamb_apply_step(ctypes.byref(opt._config(group)), ctypes.byref(layers[j]), ptr(p[lo:]),
                                              ptr(m[lo:]), ptr(m_last[lo:]), ptr(v[lo:]), ptr(v_fresh[lo:]),
                                              ctypes.c_size_t(hi - lo)), "apply step")
            same(f"OnebitLamb step {step}: the momentum kept before the step", opt._m_last, m_last)
        stage = "compression" if step >= opt.freeze_step else "warmup"
        same(f"OnebitLamb {stage} step {step}: parameters", flat(params), p)
        same(f"OnebitLamb {stage} step {step}: m", opt._m, m)
        same(f"OnebitLamb {stage} step {step}: v", opt._v, v)
        same(f"OnebitLamb {stage} step {step}: v_fresh", opt._v_fresh, v_fresh)
        if bytes(layers) != bytes(opt._layers):
            fail(rank, f"OnebitLamb {stage} step {step}: the layers' scalars differ from the host step's: "
                       f"{[(l.coeff_freeze, l.last_factor, l.scaling_coeff, l.lamb_coeff) for l in opt._layers]} vs "
                       f"{[(l.coeff_freeze, l.last_factor, l.scaling_coeff, l.lamb_coeff) for l in layers]}")
    opt.close()


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build")
    parser.add_argument("--logs", help="folder for rank0.log and rank1.log (appended); default: a temporary one")
    parser.add_argument("--timeout", type=float, default=240, help="seconds the ranks may take in all")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    with tempfile.TemporaryDirectory() as tmp:
        ranks = Ranks(args.logs or tmp, "nccl job")
        store = os.path.join(tmp, "store")
        for rank in range(2):
            ranks.start(rank, python_command(__file__, "rank", str(rank), store), nccl_env(build, rank))
        codes = ranks.wait(args.timeout)
        text = ranks.text()
    used = "NET/onebit" in text
    print(f"nccl job: exit codes {codes}; NET/onebit in NCCL's log: {used}")
    failures = [line for line in text.splitlines() if "FAIL" in line]
    if not used or any(code != 0 for code in codes):
        print("\n".join(failures) if failures else text[-4000:])
        return 1
    print("nccl job: over onebit's NCCL_NET plugin (2 ranks, one GPU, distinct NCCL_HOSTID): untagged all_reduces "
          "exact; tagged float32/float16/bfloat16 all_reduces match the float64 reference over 3 calls; a NaN call "
          "is non-finite on both ranks and leaves the state as it was; a re-tagged name starts fresh; a captured call's "
          "3 graph replays each match the reference's next call; the three optimizers' CUDA steps give the C core's "
          "host bits at every step, and their measurements the host calls' answers; a step under capture is refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
