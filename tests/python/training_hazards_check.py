"""What a real training job throws at onebit's optimizers (issue 25), 2 ranks of real
torch.distributed each:

  mlp-adam, mlp-lamb, mlp-zero_one
      A 4-layer ReLU MLP (1024 -> 512 -> 512 -> 512 -> 1024), one fixed batch of 16 per rank, DDP
      with onebit.ddp_comm_hook, the variance frozen after step 3: units dead on the batch leave
      elements with v = 0 (dormant, onebit.h) and many with a v far below their later gradients.
      Before the frozen-variance rules every optimizer reached NaN within 7 steps of the freeze.
      Now: 40 finite steps, the loss falls, both ranks bitwise equal, rank 0 names the dormant
      elements in one line.
  disagree      ONEBIT_FREEZE_STEP 1 on rank 0 and 3 on rank 1: every rank's constructor refuses,
                naming freeze_step and both values (before: both waited in different all_reduces).
  disagree-auto freeze_step="auto" with freeze_window 2 and 3: refused, naming freeze_window.
  other-model   Linear(8, 4) on rank 0, Linear(5, 6) on rank 1: the same 36 parameters in other
                shapes (before: trained on, averaging unrelated numbers); every optimizer refuses,
                naming the shapes' CRC.
  same-name     a second live optimizer of one name is refused; close() or collection frees it.
  uncompressed  a plain gloo group with neither the preload nor the backend: rank 0 warns once, at
                the first compression step, that its all_reduce was not compressed.
  synchronize   ZeroOneAdam.synchronize() mid local-step stage: replicas bitwise equal after one
                compressed call; a second call sends nothing; the next scheduled sync still agrees.
  foreign-hook  onebit.ddp_comm_hook registered with torch.optim.Adam: the backward pass fails naming it.
  no-hook       DDP without the hook: correct (ranks bitwise equal) and rank 0 warns once that the
                gradients arrive averaged, naming the fp32 bytes DDP goes on sending.
  no-sync       Gradient accumulation with DDP's no_sync(): bitwise the run without DDP that
                accumulates the same two micro-batches by hand.
  autocast      torch.autocast(bfloat16) forward passes: trains, ranks bitwise equal; bfloat16
                parameters and parameters that require no grad are refused by name.
  none-grads    A head that gets no gradient on some steps on rank 0 only: ranks stay bitwise equal,
                and equal the run that passes zeros instead (the documented rule).
  nan           A NaN gradient on rank 1 in the compression stage: every rank's step fails naming
                the step, the stage and the likely causes; nothing changed. On the onebit backend
                the error is an onebit.OnebitError with the code NUMERIC_ERROR.
  capture       step() (and ZeroOneAdam.synchronize()) inside CUDA graph capture, the capture
                stood in for here (torch.cuda.is_current_stream_capturing answering True): every
                optimizer refuses, naming itself and the call, with parameters and state unchanged;
                the next step outside capture proceeds and the ranks stay bitwise equal. A DDP
                backward pass through onebit.ddp_comm_hook under capture: refused while the
                optimizer can still change whether the hook averages, accepted from then on.
  damaged-file  save_file() on each rank, then rank 1's file damaged or missing: every rank's
                load_file() fails at once, rank 1 naming its file and what is wrong (before the
                agreement: rank 0 would wait in it until the timeout); each own file resumes exactly.
                The job's one file (save_file(consolidated=True)): unwritable on rank 0, every
                rank's save fails at once naming it; written, every rank resumes exactly from its part;
                with one per-parameter field short (v, v_fresh, u), refused with nothing changed
                (before: m and v written, then a RuntimeError).
  compile       torch.compile of a whole training step (zero_grad, forward, backward, step()) with
                OnebitAdam and ZeroOneAdam, dynamo with its "eager" backend (inductor's kernels
                round differently from eager's, and 1-bit compression turns last bits into signs):
                bitwise the eager run's parameters, losses and stage (the step's C calls break
                dynamo's graph and run eagerly). Skipped on a torch without torch.compile.
  fsdp          Parameters sharded by FSDP (FullyShardedDataParallel, with and without
                use_orig_params; FSDP2's fully_shard, DTensors): each rank holds another part of
                the model, which averaging would mix (before: trained silently, or failed deep in
                DTensor). Every optimizer's constructor refuses, naming the parameter and FSDP. The
                kinds this torch cannot make on the CPU are skipped; none at all is a skip.
  scaler        torch.amp.GradScaler (loss scaling, on the CPU) with OnebitAdam and OnebitLamb under
                DDP and the hook: without overflow bitwise the unscaled run, also when a compressed
                step fails once and is retried (before: unscaled twice); an overflow on rank 1
                only, in the compression stage, skips that step on every rank (before: rank 0
                waited in the compressed all_reduce until the timeout) and the ranks stay equal.
  deepspeed     OnebitAdam(deepspeed_schedule=True, freeze_step=4) is bitwise the default schedule
                with freeze_step 3 on the same gradients less the first call's.
  changed-params  The parameters changed under an optimizer in the compression stage — one frozen
                (requires_grad False; before, it kept moving as fast as those that train), one or a
                group appended (before: never trained), one removed (before: the others shifted onto
                its moments): every optimizer refuses the step naming the change, nothing changed;
                a ZeroOneAdam group whose lr was 0 through a sync interval on rank 1 alone: the sync
                refused on every rank, rank 1 naming the group (before: the C core's bare
                "learning-rate sum of 0"; then rank 0 waited in the sync until the timeout). A warmup
                checkpoint resumed with a later freeze_step goes on with it (before: OnebitAdam kept the
                checkpoint's);
                a compression-stage one with another freeze_step is refused. A checkpoint loaded into
                an optimizer whose compressed calls have run is refused on every rank with nothing
                changed (before: step, m, v and param_groups overwritten first). A state_dict of torch
                Adam, of another onebit optimizer or of another model of the same size:
                load_state_dict refuses it by name; on one rank only, every rank refuses.
  two-optimizers  OnebitAdam for the body, torch SGD for the head, one DDP with the hook: the head's
                gradients averaged in the compression stage too (before: the ranks' heads drifted
                apart); bitwise the run without DDP that averages them by hand. Once with the head
                in the body's bucket, once in a bucket of its own (a small bucket_cap_mb), once
                with gradient_as_bucket_view; a sparse embedding trained by SGD stays equal too.
  adam-names    Each optimizer's adam_state_dict() mid compression stage loaded by torch.optim.Adam:
                exp_avg, exp_avg_sq and step are this rank's m, v and step, and the next step is
                Adam's from them; with a parameter removed from param_groups it is refused.

    PYTHON tests/python/training_hazards_check.py BUILD_DIR [preload|onebit] [MODE ...]

"preload" (the default): Debian's torch with libonebit-preload.so under gloo; "onebit": pip's torch
with the onebit backend (exit 77, a skip, where that torch has no c10d Backend class).
"""
import os
import pathlib
import resource
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from modes import CheckFailed, Skipped, fit, rank_or_driver, require  # noqa: E402

WORLD, FREEZE, MLP_STEPS = 2, 3, 40
MODES = ("mlp-adam", "mlp-lamb", "mlp-zero_one", "disagree", "disagree-auto", "other-model", "same-name",
         "uncompressed", "synchronize", "foreign-hook", "no-hook", "no-sync", "autocast", "none-grads", "nan", "nan-sync", "capture",
         "compile", "fsdp", "scaler", "deepspeed", "changed-params", "two-optimizers", "adam-names", "damaged-file")


def flat(model):
    import torch
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(torch, dist, tensor, what):
    """Bitwise: every rank's copy of `tensor` equals rank 0's (broadcast, exact)."""
    theirs = tensor.clone()
    dist.broadcast(theirs, 0)
    require(torch.equal(theirs, tensor), f"{what}: this rank differs from rank 0 (max |diff| "
                                         f"{(theirs - tensor).abs().max().item():.3g})")


def make_optimizer(onebit, kind, params, freeze=FREEZE, **options):
    if kind == "adam":
        return onebit.OnebitAdam(params, lr=1e-4, freeze_step=freeze, **options)
    if kind == "lamb":
        return onebit.OnebitLamb(params, lr=1e-3, freeze_step=freeze, **options)
    return onebit.ZeroOneAdam(params, lr=1e-4, var_freeze_step=freeze, **dict(dict(local_step_clipper=4), **options))


def mlp_case(mode, rank, torch, dist, onebit, out):
    kind = mode.split("-", 1)[1]
    torch.manual_seed(0)
    layers = []
    for a, b in ((1024, 512), (512, 512), (512, 512)):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(512, 1024))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = make_optimizer(onebit, kind, ddp.parameters())
    ddp.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    generator = torch.Generator().manual_seed(10 + rank)
    x = torch.rand(16, 1024, generator=generator)  # one fixed batch; non-negative inputs leave units dead on it
    y = torch.rand(16, 1024, generator=generator)
    losses = fit(torch, ddp, optimizer, x, y, MLP_STEPS)
    mean = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean)
    mean = (mean / WORLD).tolist()
    require(all(v == v and abs(v) < 1e6 for v in mean), f"{kind}: losses not finite: {mean}")
    require(mean[-1] < 0.5 * mean[0], f"{kind}: the loss did not fall by half: {mean[0]:.4f} -> {mean[-1]:.4f}")
    require(min(mean[FREEZE + 1:]) < mean[FREEZE], f"{kind}: no progress in the compression stage: {mean}")
    require(optimizer.dormant_elements and optimizer.dormant_elements > 0,
            f"{kind}: no dormant element: the case does not test the rule ({optimizer.dormant_elements})")
    same_on_every_rank(torch, dist, flat(model), f"{kind}: parameters after {MLP_STEPS} steps")
    if rank == 0:
        print(f"{kind}: losses {mean[0]:.4f} -> {mean[FREEZE]:.4f} (freeze) -> {mean[-1]:.4f}; "
              f"{optimizer.dormant_elements} dormant elements", flush=True)


def disagree_case(mode, rank, torch, dist, onebit, out):
    model = torch.nn.Linear(8, 4)
    for kind in ("adam", "lamb"):
        try:
            make_optimizer(onebit, kind, model.parameters(), freeze=5)
        except onebit.OnebitError as error:  # the C core's words, as the C++ shims say them
            text = str(error)
            require(error.code == onebit.OnebitError.MISMATCH
                    and "the ranks disagree on freeze_step: rank 0 has 1, rank 1 has 3; every rank must be given the "
                    "same value (ONEBIT_FREEZE_STEP set on some ranks only?" in text,
                    f"{kind}: the error does not name freeze_step and both values: {text}")
            continue
        raise CheckFailed(f"{kind}: ranks with ONEBIT_FREEZE_STEP 1 and 3 were accepted")


def disagree_auto_case(mode, rank, torch, dist, onebit, out):
    """Ranks whose automatic freeze would measure at different steps: refused by name."""
    model = torch.nn.Linear(8, 4)
    try:
        onebit.OnebitAdam(model.parameters(), freeze_step="auto", freeze_window=2 + rank)
    except RuntimeError as error:
        require("disagree on freeze_window: rank 0 has 2, rank 1 has 3" in str(error), f"unclear error: {error}")
    else:
        raise CheckFailed("ranks with freeze_window 2 and 3 were accepted")


def other_model_case(mode, rank, torch, dist, onebit, out):
    model = torch.nn.Linear(8, 4) if rank == 0 else torch.nn.Linear(5, 6)  # 36 parameters each
    for kind, name in (("adam", "OnebitAdam"), ("lamb", "OnebitLamb"), ("zero_one", "ZeroOneAdam")):
        try:
            make_optimizer(onebit, kind, model.parameters())
        except RuntimeError as error:
            require(f"{name}: the ranks disagree on parameter_shapes_crc32: rank 0 has " in str(error),
                    f"{name}: the refusal does not name the shapes: {error}")
        else:
            raise CheckFailed(f"{name}: ranks with different models of the same size were not refused")


def same_name_case(mode, rank, torch, dist, onebit, out):
    """An optimizer's name is its own while it lives: a second live one of that name is refused;
    close() or dropping it (even in a reference cycle) frees the name on every rank alike."""
    model = torch.nn.Linear(8, 4)
    first = onebit.OnebitAdam(model.parameters(), freeze_step=0)
    try:
        onebit.OnebitAdam(model.parameters(), freeze_step=0)
    except ValueError as error:
        require("the name 'onebit_adam/momentum' is tagged by another live buffer" in str(error),
                f"unclear error: {error}")
    else:
        raise CheckFailed("a second live optimizer took the first one's name")
    first.close()
    second = onebit.OnebitAdam(model.parameters(), freeze_step=0)
    second.cycle = second  # dropped below, but only a collection frees it
    del second
    third = onebit.OnebitAdam(model.parameters(), freeze_step=0)
    model(torch.ones(2, 8)).sum().backward()
    third.step()  # a compressed step: the ranks' call sequences for the name agree
    third.close()


def uncompressed_case(mode, rank, torch, dist, onebit, out):
    """A plain gloo group (no preload in this process, no onebit backend on it): training works,
    and rank 0 warns once at the first compression step that nothing is compressed."""
    group = dist.new_group(backend="gloo")
    model = torch.nn.Linear(16, 4)
    optimizer = onebit.OnebitAdam(model.parameters(), lr=1e-2, freeze_step=2, process_group=group)
    fit(torch, model, optimizer, torch.randn(8, 16) + rank, torch.zeros(8, 4), 5)
    require(onebit.stats()["compressed_calls"] == 0, "something was compressed after all")


def synchronize_case(mode, rank, torch, dist, onebit, out):
    """ZeroOneAdam's replicas differ between syncs (local steps on local data); synchronize() makes
    them bitwise equal with one compressed call, is a no-op when they already are, and training
    goes on (the next scheduled sync still lands every rank on the same parameters)."""
    torch.manual_seed(8)
    model = torch.nn.Linear(16, 4)
    optimizer = onebit.ZeroOneAdam(model.parameters(), lr=1e-2, var_freeze_step=2, local_step_scaler=2,
                                   local_step_clipper=8)
    generator = torch.Generator().manual_seed(80 + rank)

    def steps(n):
        for _ in range(n):
            optimizer.zero_grad()
            model(torch.randn(8, 16, generator=generator)).pow(2).mean().backward()
            optimizer.step()

    local = onebit.zero_one_adam.LOCAL_STEP
    while True:  # through the variance stage (steps 0-2) to just after a local step that is not a sync
        kind = optimizer.next_step_kind()
        steps(1)
        if kind == local:
            break
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    theirs = weights.clone()
    dist.broadcast(theirs, 0)
    require(rank == 0 or not torch.equal(theirs, weights), "the replicas were equal before synchronize(): no test")
    calls = onebit.stats()["compressed_calls"]
    optimizer.synchronize()
    same_on_every_rank(torch, dist, flat(model), "after synchronize()")
    require(onebit.stats()["compressed_calls"] == calls + 1, "synchronize() did not take one compressed call")
    optimizer.synchronize()  # already equal: nothing sent
    require(onebit.stats()["compressed_calls"] == calls + 1, "a second synchronize() communicated")
    steps(11)
    while optimizer.next_step_kind() != onebit.zero_one_adam.SYNC_STEP:
        steps(1)
    steps(1)
    same_on_every_rank(torch, dist, flat(model), "after the next scheduled sync")


def foreign_hook_case(mode, rank, torch, dist, onebit, out):
    model = torch.nn.Linear(8, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(torch.optim.Adam(model.parameters()), onebit.ddp_comm_hook)
    try:
        ddp(torch.ones(2, 8)).sum().backward()
    except (TypeError, RuntimeError) as error:
        require("register it with the optimizer" in str(error), f"unclear error: {error}")
        return
    raise CheckFailed("the hook ran with torch.optim.Adam as its state")


def no_hook_case(mode, rank, torch, dist, onebit, out):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = onebit.OnebitAdam(ddp.parameters(), lr=1e-2, freeze_step=FREEZE)
    generator = torch.Generator().manual_seed(20 + rank)
    x, y = torch.randn(32, 16, generator=generator), torch.randn(32, 2, generator=generator)
    fit(torch, ddp, optimizer, x, y, 8)
    same_on_every_rank(torch, dist, flat(model), "DDP without the hook")


def accumulate(torch, dist, onebit, rank, use_ddp):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if use_ddp else model
    optimizer = onebit.OnebitAdam(wrapped.parameters(), lr=1e-2, freeze_step=FREEZE)
    if use_ddp:
        wrapped.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    generator = torch.Generator().manual_seed(30 + rank)
    for _ in range(8):
        batches = [(torch.randn(8, 16, generator=generator), torch.randn(8, 2, generator=generator)) for _ in range(2)]
        optimizer.zero_grad()
        for i, (x, y) in enumerate(batches):
            if use_ddp and i == 0:
                with wrapped.no_sync():
                    torch.nn.functional.mse_loss(wrapped(x), y).backward()
            else:
                torch.nn.functional.mse_loss(wrapped(x), y).backward()
        optimizer.step()
    optimizer.close()
    return flat(model)


def no_sync_case(mode, rank, torch, dist, onebit, out):
    with_ddp = accumulate(torch, dist, onebit, rank, True)
    by_hand = accumulate(torch, dist, onebit, rank, False)
    require(torch.equal(with_ddp, by_hand), "no_sync() accumulation differs from accumulating by hand "
                                            f"(max |diff| {(with_ddp - by_hand).abs().max().item():.3g})")
    same_on_every_rank(torch, dist, with_ddp, "no_sync() accumulation")


def autocast_case(mode, rank, torch, dist, onebit, out):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = onebit.OnebitAdam(ddp.parameters(), lr=1e-2, freeze_step=FREEZE)
    ddp.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    generator = torch.Generator().manual_seed(40 + rank)
    x, y = torch.randn(32, 16, generator=generator), torch.randn(32, 2, generator=generator)
    losses = []
    for _ in range(12):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out_ = ddp(x)
        loss = torch.nn.functional.mse_loss(out_.float(), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    require(all(v == v for v in losses) and losses[-1] < losses[0], f"autocast: the loss did not fall: {losses}")
    same_on_every_rank(torch, dist, flat(model), "autocast")
    refusals = (([torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))], "float32, not torch.bfloat16"),
                ([torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2), requires_grad=False)],
                 "parameter 1 of group 0 (shape (2,)) does not require grad"))
    for params, words in refusals:
        try:
            onebit.OnebitAdam(params)
        except ValueError as error:
            require(words in str(error), f"the refusal does not say '{words}': {error}")
            continue
        raise CheckFailed(f"accepted what should be refused ({words})")


def heads(torch, dist, onebit, rank, zeros_for_none):
    torch.manual_seed(4)
    trunk, a, b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 2), torch.nn.Linear(32, 2)
    params = list(trunk.parameters()) + list(a.parameters()) + list(b.parameters())
    optimizer = onebit.OnebitAdam(params, lr=1e-2, weight_decay=0.01, freeze_step=FREEZE)
    generator = torch.Generator().manual_seed(50 + rank)
    for step in range(10):
        x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 2, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        h = torch.tanh(trunk(x))
        skip_b = rank == 0 and step % 2 == 1  # head b unused on rank 0 at odd steps: its grads stay None
        out_ = a(h) if skip_b else a(h) + b(h)
        torch.nn.functional.mse_loss(out_, y).backward()
        if zeros_for_none:
            for p in b.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        optimizer.step()
    optimizer.close()
    return torch.cat([p.detach().reshape(-1) for p in params])


def none_grads_case(mode, rank, torch, dist, onebit, out):
    with_none = heads(torch, dist, onebit, rank, False)
    with_zeros = heads(torch, dist, onebit, rank, True)
    require(torch.equal(with_none, with_zeros), "None gradients are not taken as zeros")
    same_on_every_rank(torch, dist, with_none, "None gradients on one rank")


def nan_case(mode, rank, torch, dist, onebit, out):
    torch.manual_seed(5)
    model = torch.nn.Linear(64, 8)
    optimizer = onebit.OnebitAdam(model.parameters(), lr=1e-2, freeze_step=FREEZE)
    generator = torch.Generator().manual_seed(60 + rank)
    for step in range(FREEZE + 2):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(4, 64, generator=generator)), torch.zeros(4, 8)).backward()
        if step < FREEZE + 1:
            optimizer.step()
            continue
        if rank == 1:
            model.weight.grad[0, 0] = float("nan")
        before = flat(model).clone()
        state = optimizer.state_dict()["onebit"]["parts"][rank]
        try:
            optimizer.step()
        except RuntimeError as error:
            text = str(error)
            for words in (f"OnebitAdam step {FREEZE + 1}", f"compression stage since step {FREEZE}", "NaN or Inf",
                          "learning rate too high", "A step fails on NaN or Inf"):
                require(words in text, f"the error does not say '{words}': {text}")
            require(torch.equal(flat(model), before), "the failed step moved the parameters")
            require(torch.equal(optimizer.state_dict()["onebit"]["parts"][rank]["m"], state["m"]), "the failed step changed m")
            if dist.get_backend() == "onebit":  # the backend's error keeps its class and code (the preload's is gloo's)
                require(isinstance(error, onebit.OnebitError) and error.code == onebit.OnebitError.NUMERIC_ERROR,
                        f"not an OnebitError with code NUMERIC_ERROR: {error!r} (code {getattr(error, 'code', None)})")
            return
        raise CheckFailed("a NaN gradient in the compression stage did not fail the step")


def nan_sync_case(mode, rank, torch, dist, onebit, out):
    """ZeroOneAdam: a sync step that fails (a NaN in one rank's accumulated update) changes nothing on
    any rank — parameters, m, u, the lr sums, the schedule — and the next sync goes on alike."""
    torch.manual_seed(5)
    model = torch.nn.Linear(64, 8)
    optimizer = onebit.ZeroOneAdam(model.parameters(), lr=1e-2, var_freeze_step=FREEZE)
    generator = torch.Generator().manual_seed(60 + rank)

    def backward(poisoned):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(4, 64, generator=generator)), torch.zeros(4, 8)).backward()
        if poisoned:
            model.weight.grad[0, 0] = float("nan")

    for _ in range(FREEZE + 1):  # the variance stage: steps 0 .. FREEZE
        backward(False)
        optimizer.step()
    require(optimizer.next_step_kind() == onebit.zero_one_adam.SYNC_STEP, "the next step is not a sync step")
    backward(rank == 1)
    own_part = lambda: next(iter(optimizer.state_dict()["onebit"]["parts"].values()))  # "every" or this rank's
    before, state = flat(model).clone(), own_part()
    try:
        optimizer.step()
        raise CheckFailed("a NaN in one rank's update did not fail the sync step")
    except RuntimeError as error:
        for words in (f"ZeroOneAdam step {FREEZE + 1}", "a sync step of the local-step stage", "NaN or Inf"):
            require(words in str(error), f"the error does not say '{words}': {error}")
    require(torch.equal(flat(model), before), "the failed sync moved the parameters")
    after = own_part()
    for key in ("worker_error", "server_error"):  # no state yet (empty) and zeros are the same error feedback
        if state[key].numel() == 0:
            require(not after[key].any(), f"the failed sync changed the {key} it had not made yet")
            after[key] = state[key]
    same_state(torch, after, state, "the failed sync's state")
    backward(False)
    optimizer.step()
    same_on_every_rank(torch, dist, flat(model), "the parameters after the sync that followed a failed one")


def same_state(torch, got, want, where):
    """Bitwise: every tensor and value of a state_dict part as it was."""
    if isinstance(want, dict):
        require(got.keys() == want.keys(), f"{where}: keys {sorted(got)} != {sorted(want)}")
        for key in want:
            same_state(torch, got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        require(len(got) == len(want), f"{where}: length {len(got)} != {len(want)}")
        for index, (g, w) in enumerate(zip(got, want)):
            same_state(torch, g, w, f"{where}[{index}]")
    elif isinstance(want, torch.Tensor):
        require(torch.equal(got, want), f"{where}: changed")
    else:
        require(got == want, f"{where}: {got!r} != {want!r}")


class stand_in_capture:
    """torch.cuda answering that the current stream is capturing a CUDA graph (no GPU here)."""
    def __init__(self, torch):
        self.cuda = torch.cuda

    def __enter__(self):
        self.saved = self.cuda.is_available, self.cuda.is_current_stream_capturing
        self.cuda.is_available = self.cuda.is_current_stream_capturing = lambda: True

    def __exit__(self, *exc):
        self.cuda.is_available, self.cuda.is_current_stream_capturing = self.saved


def ddp_backward_under_capture(torch, onebit, kind, name, generator):
    """A backward pass through onebit.ddp_comm_hook under capture: refused while the optimizer can
    still change whether the hook averages (every replay would repeat the captured answer), taken
    once the answer is settled; the step after it outside capture proceeds."""
    def run(steps_before):
        torch.manual_seed(9)
        model = torch.nn.Linear(16, 4)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = make_optimizer(onebit, kind, ddp.parameters())
        ddp.register_comm_hook(optimizer, onebit.ddp_comm_hook)
        x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)
        fit(torch, ddp, optimizer, x, y, steps_before)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        return model, ddp, optimizer, loss
    model, ddp, optimizer, loss = run(1)  # in warmup / the variance stage
    try:
        with stand_in_capture(torch):
            loss.backward()
    except RuntimeError as error:
        words = "onebit.ddp_comm_hook: the backward pass is being captured in a CUDA graph while " + name
        require(words in str(error), f"{name}: the hook's refusal does not say '{words}': {error}")
    else:
        raise CheckFailed(f"{name}: a backward pass through the hook was captured while its answer could change")
    optimizer.close()
    del model, ddp, optimizer, loss
    model, ddp, optimizer, loss = run(FREEZE + 1)  # past the freeze (0/1 Adam: past var_freeze_step)
    with stand_in_capture(torch):
        loss.backward()
    optimizer.step()
    if kind == "zero_one":
        optimizer.synchronize()  # the replicas differ between syncs
    optimizer.close()
    return flat(model)


def capture_case(mode, rank, torch, dist, onebit, out):
    """A step under CUDA graph capture would bake the host's step count, stage and learning rates
    into the graph; every optimizer refuses it before touching anything. No GPU here: the capture
    is stood in for by torch.cuda answering that a capture is under way (a GPU run captures for
    real, tools/gpu/nccl_job_check.py)."""
    import copy
    generator = torch.Generator().manual_seed(80 + rank)
    for kind, name in (("adam", "OnebitAdam"), ("lamb", "OnebitLamb"), ("zero_one", "ZeroOneAdam")):
        torch.manual_seed(8)
        model = torch.nn.Linear(16, 4)
        optimizer = make_optimizer(onebit, kind, model.parameters())
        fit(torch, model, optimizer, torch.randn(8, 16, generator=generator), torch.randn(8, 4), FREEZE + 2)
        calls = [("step()", optimizer.step)] + ([("synchronize()", optimizer.synchronize)] if kind == "zero_one" else [])
        for call, method in calls:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(torch.randn(8, 16, generator=generator)), torch.zeros(8, 4)).backward()
            params, state = flat(model).clone(), copy.deepcopy(optimizer.state_dict())
            try:
                with stand_in_capture(torch):
                    method()
            except RuntimeError as error:
                words = f"{name}.{call} was called during CUDA graph capture"
                require(words in str(error) and "nothing was changed" in str(error),
                        f"{name}: the refusal does not say '{words}': {error}")
            else:
                raise CheckFailed(f"{name}.{call} inside a CUDA graph capture was not refused")
            require(torch.equal(flat(model), params), f"{name}: the refused {call} moved the parameters")
            same_state(torch, optimizer.state_dict(), state, f"{name}: after the refused {call}: state_dict")
            method()  # outside capture: goes on as if nothing had happened
        same_on_every_rank(torch, dist, flat(model), f"{name}: after the refused calls and the steps after them")
        optimizer.close()
        same_on_every_rank(torch, dist, ddp_backward_under_capture(torch, onebit, kind, name, generator),
                           f"{name}: after a captured backward pass through the DDP hook")


def resumed_schedule_check(torch, onebit, kind, name, x, y):
    """A checkpoint saved in warmup (ZeroOneAdam: the variance stage), resumed with a later freeze
    step (as the NaN error advises): the run goes on with the new one (before: OnebitAdam silently
    kept the checkpoint's). One saved past its freeze, resumed with another freeze step: refused,
    naming both (before: ZeroOneAdam resumed a local-stage checkpoint into compressed-gradient steps
    or, with an earlier var_freeze_step, synced from parameters never kept). A knob the schedule's
    counters were made under, changed: refused (OnebitAdam's deepspeed_schedule, ZeroOneAdam's
    scalers and clipper)."""
    import copy
    freeze_name = "var_freeze_step" if kind == "zero_one" else "freeze_step"
    moved_freeze = f"was saved with {freeze_name}={FREEZE} (this optimizer: {FREEZE + 3})"
    # The last checkpoint before the freeze: after FREEZE - 1 steps (ZeroOneAdam's variance stage
    # includes var_freeze_step itself: after FREEZE); the next one is past it.
    before = FREEZE if kind == "zero_one" else FREEZE - 1
    cases = [(before, {}, dict(freeze=FREEZE + 3), None), (before + 1, {}, dict(freeze=FREEZE + 3), moved_freeze)]
    if kind == "adam":
        cases.append((FREEZE - 1, dict(deepspeed_schedule=True), {},
                      "was saved with deepspeed_schedule=True, this optimizer has False"))
    if kind == "zero_one":
        cases.append((FREEZE - 1, {}, dict(local_step_clipper=8), "local_step_clipper=4 (this optimizer: 8)"))
        cases.append((FREEZE + 2, dict(corrupt=True), {}, "0/1 Adam schedule state out of range"))
    for steps, saved_with, loaded_with, words in cases:
        torch.manual_seed(6)
        model = torch.nn.Linear(16, 2)
        corrupt = saved_with.pop("corrupt", False)
        optimizer = make_optimizer(onebit, kind, model.parameters(), **saved_with)
        fit(torch, model, optimizer, x, y, steps)
        saved = optimizer.state_dict()
        optimizer.close()
        if corrupt:  # rank 1's file with a schedule state the C core refuses: every rank refuses
            if torch.distributed.get_rank() == 1:
                for part in saved["onebit"]["parts"].values():
                    part["schedule"]["var_interval"] = 0
            else:
                words = "rank 1 refused its checkpoint"
        loader = make_optimizer(onebit, kind, model.parameters(), **loaded_with)
        before = copy.deepcopy(loader.state_dict())
        try:
            loader.load_state_dict(saved)
        except ValueError as error:
            require(words is not None and words in str(error) and "nothing was loaded" in str(error),
                    f"{name}: resuming after {steps} steps saved with {saved_with}, loaded with {loaded_with}: "
                    f"the refusal does not say '{words}': {error}")
            same_state(torch, loader.state_dict(), before, f"{name}: after the refused load")
        else:
            require(words is None, f"{name}: a checkpoint after {steps} steps saved with {saved_with} was resumed "
                                   f"with {loaded_with}")
            went_on_with = loader._schedule_config[0] if kind == "zero_one" else loader.freeze_step
            require(went_on_with == FREEZE + 3, f"{name}: resumed from before the freeze with {freeze_name} "
                                                f"{FREEZE + 3}, goes on with {went_on_with}")
        loader.close()


def small_model_past_freeze(torch, onebit, kind, seed, generator, steps):
    """A 16-32-2 MLP (weights from `seed`) and `kind`'s optimizer, trained `steps` steps on one
    batch drawn from `generator`: (model, optimizer, x, y)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    optimizer = make_optimizer(onebit, kind, model.parameters())
    x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 2, generator=generator)
    fit(torch, model, optimizer, x, y, steps)
    return model, optimizer, x, y


def changed_params_case(mode, rank, torch, dist, onebit, out):
    """The parameters an optimizer was made with, changed under it in the compression stage: one
    frozen (requires_grad False: before, it kept moving at the rate of the parameters that train),
    one appended to a group or a group appended (before: never trained), one removed (before: the
    others shifted onto its moments). Each step is refused naming the change, nothing changed; the
    change undone, training goes on. And a state_dict that is not this optimizer's — torch Adam's,
    another onebit optimizer's, one of another model of the same size — is refused by name."""
    import copy
    generator = torch.Generator().manual_seed(70 + rank)
    extra = torch.nn.Parameter(torch.zeros(3))
    for kind, name in (("adam", "OnebitAdam"), ("lamb", "OnebitLamb"), ("zero_one", "ZeroOneAdam")):
        model, optimizer, x, y = small_model_past_freeze(torch, onebit, kind, 6, generator, FREEZE + 2)
        params = optimizer.param_groups[0]["params"]
        groups = optimizer.param_groups
        first = params[0]
        changes = (("frozen", lambda: first.requires_grad_(False), lambda: first.requires_grad_(True),
                    "step(): parameter 0 of group 0 (shape (32, 16)) no longer requires grad"),
                   ("appended", lambda: params.append(extra), params.pop,
                    "step(): param_groups changed since the optimizer was made (parameters per group: [5], made "
                    "with [4])"),
                   ("removed", lambda: params.pop(0), lambda: params.insert(0, first), "group: [3], made with [4]"),
                   ("group added", lambda: groups.append(dict(groups[0], params=[extra])), groups.pop,
                    "group: [4, 1], made with [4]"))
        for what, change, undo, words in changes:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            before, state = flat(model).clone(), copy.deepcopy(optimizer.state_dict())
            change()
            try:
                optimizer.step()
            except RuntimeError as error:
                require(words in str(error) and "nothing was changed" in str(error),
                        f"{name}, a parameter {what}: the refusal does not say '{words}': {error}")
            else:
                raise CheckFailed(f"{name}: a step with a parameter {what} after construction was not refused")
            undo()
            require(torch.equal(flat(model), before), f"{name}: the refused step ({what}) moved the parameters")
            same_state(torch, optimizer.state_dict(), state, f"{name}: after the refused step ({what})")
            optimizer.step()  # the change undone: goes on
        if kind == "zero_one":
            optimizer.synchronize()
        same_on_every_rank(torch, dist, flat(model), f"{name}: after the refused steps and the steps after them")
        saved = optimizer.state_dict()
        # That checkpoint loaded back into this optimizer, whose compressed calls have run since: its
        # error feedback cannot be taken, which every rank says before anything changes (before:
        # step, m, v and param_groups were overwritten, then the error feedback refused).
        fit(torch, model, optimizer, x, y, 1)
        state, earlier = copy.deepcopy(optimizer.state_dict()), copy.deepcopy(saved)
        earlier["param_groups"][0]["lr"] = 0.5
        try:
            optimizer.load_state_dict(earlier)
        except ValueError as error:
            words = "has already run; its error feedback loads only before its first allreduce"
            require(words in str(error) and "nothing was loaded" in str(error),
                    f"{name}: a checkpoint into an optimizer past its first compressed step: the refusal does not "
                    f"say '{words}': {error}")
        else:
            raise CheckFailed(f"{name}: a checkpoint with error feedback loaded into a tag that has run")
        same_state(torch, optimizer.state_dict(), state, f"{name}: after the refused load")
        if kind == "zero_one":  # a group frozen with lr=0 through a sync interval, on rank 1 alone: no sync
            if rank == 1:
                optimizer.param_groups[0]["lr"] = 0.0
            try:
                fit(torch, model, optimizer, x, y, 16)
            except RuntimeError as error:  # on every rank: rank 0 would otherwise wait in the sync's all_reduce
                words = ("ZeroOneAdam: the learning rate of group 0 was 0 at every step since the last sync" if rank == 1
                         else "ZeroOneAdam: rank 1 refused the sync at schedule step")
                require(words in str(error) and "nothing was changed" in str(error),
                        f"ZeroOneAdam, lr 0 on rank 1: rank {rank}'s refusal does not say '{words}': {error}")
            else:
                raise CheckFailed("ZeroOneAdam: a sync of a group whose lr was 0 since the last sync was not refused")
        optimizer.close()
        resumed_schedule_check(torch, onebit, kind, name, x, y)
        foreign = (("torch.optim.Adam's", torch.optim.Adam(model.parameters()).state_dict(), model.parameters(),
                    "not a onebit optimizer's state_dict (it has no \"onebit\" entry"),
                   ("another kind's", saved, model.parameters(), None),
                   ("another model's", saved, [torch.nn.Parameter(torch.zeros(s)) for s in ((2, 32), (2,), (32, 16), (32,))],
                    "the checkpoint's parameters have other shapes"))
        for what, state_dict, params_, words in foreign:
            other_kind = {"adam": "lamb", "lamb": "zero_one", "zero_one": "adam"}[kind] if words is None else kind
            loader = make_optimizer(onebit, other_kind, params_)
            try:
                loader.load_state_dict(state_dict)
            except ValueError as error:
                words = words or f"the checkpoint is {name}'s, this optimizer is "
                require(words in str(error), f"{name}: loading {what} state_dict: the refusal does not say "
                                             f"'{words}': {error}")
            else:
                raise CheckFailed(f"{name}: {what} state_dict was loaded")
            loader.close()
        # Each rank its own file, rank 1's wrong: every rank refuses, rank 1 saying why (before: rank
        # 0 waited for rank 1 in the load's agreement until the timeout; with an error feedback of
        # another size, rank 1 failed alone after the agreement and rank 0 went on).
        spoiled = copy.deepcopy(saved)
        for part in spoiled["onebit"]["parts"].values():
            part["worker_error"] = part["worker_error"][:-1]
        for what, theirs, words in (("torch Adam's", torch.optim.Adam(model.parameters()).state_dict(),
                                     "not a onebit optimizer's state_dict"),
                                    ("an error feedback of another size", spoiled, "elements; the saved worker error has ")):
            loader = make_optimizer(onebit, kind, model.parameters())
            try:
                loader.load_state_dict(saved if rank == 0 else theirs)
            except ValueError as error:
                words = "rank 1 refused its checkpoint" if rank == 0 else words
                require(words in str(error), f"{name}: rank 1's checkpoint {what}: the refusal does not say "
                                             f"'{words}': {error}")
            else:
                raise CheckFailed(f"{name}: rank 1's checkpoint ({what}) was not refused on rank {rank}")
            loader.close()


def two_optimizers_case(mode, rank, torch, dist, onebit, out):
    """OnebitAdam for a model's body and torch SGD for its head, one DDP with onebit.ddp_comm_hook
    registered with the OnebitAdam: the hook averages the head's gradients in full precision in the
    compression stage too (before: it sent nothing for the whole bucket, and the ranks' heads drifted
    apart). Bitwise the run without DDP whose head gradients are averaged by hand — with the head in
    the body's bucket, in buckets of its own, and with gradient_as_bucket_view."""
    def run(ddp_options):
        torch.manual_seed(7)
        body, head = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh()), torch.nn.Linear(32, 2)
        model = torch.nn.Sequential(body, head)
        wrapped = model if ddp_options is None else torch.nn.parallel.DistributedDataParallel(model, **ddp_options)
        optimizers = (onebit.OnebitAdam(body.parameters(), lr=1e-2, freeze_step=FREEZE),
                      torch.optim.SGD(head.parameters(), lr=0.1))
        if ddp_options is not None:
            wrapped.register_comm_hook(optimizers[0], onebit.ddp_comm_hook)
        generator = torch.Generator().manual_seed(90 + rank)
        for _ in range(FREEZE + 5):
            for optimizer in optimizers:
                optimizer.zero_grad()
            x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 2, generator=generator)
            torch.nn.functional.mse_loss(wrapped(x), y).backward()
            if ddp_options is None:
                joined = torch.cat([p.grad.reshape(-1) for p in head.parameters()])
                dist.all_reduce(joined)
                joined.div_(WORLD)
                offset = 0
                for p in head.parameters():
                    p.grad.copy_(joined[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
            for optimizer in optimizers:
                optimizer.step()
        optimizers[0].close()
        return flat(model)
    by_hand = run(None)
    first_bucket = dist._DEFAULT_FIRST_BUCKET_BYTES
    for what, options in (("one bucket", {}), ("a bucket per parameter", dict(bucket_cap_mb=1e-6)),
                          ("gradient_as_bucket_view", dict(gradient_as_bucket_view=True))):
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 if "bucket_cap_mb" in options else first_bucket  # torch 1.13's first bucket
        try:
            with_ddp = run(options)
        finally:
            dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket
        same_on_every_rank(torch, dist, with_ddp, f"two optimizers, one DDP with the hook ({what})")
        require(torch.equal(with_ddp, by_hand), f"two optimizers ({what}): DDP with the hook differs from averaging the "
                                                f"head's gradients by hand (max |diff| "
                                                f"{(with_ddp - by_hand).abs().max().item():.3g})")
    sparse_other_optimizer(torch, dist, onebit, rank)
    parameters_replaced_between_steps(torch, dist, onebit, rank)


def parameters_replaced_between_steps(torch, dist, onebit, rank):
    """A model whose parameters are replaced between two steps of the compression stage — a copy
    put into param_groups and wrapped in DDP with the hook, as a framework that moves a model does —
    goes on bit for bit as the same model without DDP (the hook gives the local gradients, as the
    optimizer's own step takes them). Before, the hook held the set of parameters taken at the last
    step, called the copies another optimizer's and averaged their gradients in full precision for
    one backward pass."""
    import copy

    def run(replace):
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
        optimizer = onebit.OnebitAdam(model.parameters(), lr=1e-2, freeze_step=FREEZE)
        generator = torch.Generator().manual_seed(95 + rank)
        batches = [(torch.randn(8, 16, generator=generator), torch.randn(8, 2, generator=generator))
                   for _ in range(FREEZE + 5)]
        wrapped = model
        for step, (x, y) in enumerate(batches):
            if replace and step == FREEZE + 2:
                model = copy.deepcopy(model)
                optimizer.param_groups[0]["params"] = list(model.parameters())
                wrapped = torch.nn.parallel.DistributedDataParallel(model)
                wrapped.register_comm_hook(optimizer, onebit.ddp_comm_hook)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(wrapped(x), y).backward()
            optimizer.step()
        optimizer.close()
        return flat(model)
    kept, replaced = run(False), run(True)
    require(torch.equal(kept, replaced), f"parameters replaced between steps, then DDP with the hook: differs from the "
                                         f"model kept (max |diff| {(kept - replaced).abs().max().item():.3g})")
    same_on_every_rank(torch, dist, replaced, "parameters replaced between steps")


def sparse_other_optimizer(torch, dist, onebit, rank):
    """A sparse embedding trained by SGD beside a OnebitAdam body under one DDP with the hook: its
    bucket (a sparse gradient is one of its own) averaged too, so the ranks' embeddings stay equal."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding, self.body = torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2)

        def forward(self, indices):
            return self.body(self.embedding(indices))
    torch.manual_seed(3)
    model = Model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizers = (onebit.OnebitAdam(model.body.parameters(), lr=1e-2, freeze_step=FREEZE),
                  torch.optim.SGD(model.embedding.parameters(), lr=0.1))
    ddp.register_comm_hook(optimizers[0], onebit.ddp_comm_hook)
    generator = torch.Generator().manual_seed(95 + rank)
    for _ in range(FREEZE + 3):
        for optimizer in optimizers:
            optimizer.zero_grad()
        ddp(torch.randint(0, 10, (8,), generator=generator)).sum().backward()
        for optimizer in optimizers:
            optimizer.step()
    optimizers[0].close()
    same_on_every_rank(torch, dist, flat(model), "a sparse embedding of another optimizer beside OnebitAdam")


def compile_case(mode, rank, torch, dist, onebit, out):
    """A compiled training step is the eager one, bit for bit, through every stage: what dynamo
    does to the step (its guards, the graph breaks at the C calls, torch.compiler.is_compiling
    while it traces) changes nothing. The "eager" backend keeps eager's kernels, so that the check
    is of dynamo and onebit, not of inductor's rounding."""
    if not hasattr(torch, "compile"):
        raise Skipped(f"torch {torch.__version__} has no torch.compile")

    def run(kind, compiled):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        optimizer = make_optimizer(onebit, kind, model.parameters())
        generator = torch.Generator().manual_seed(90 + rank)
        batches = [(torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)) for _ in range(9)]

        def train_step(x, y):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            return loss
        step = torch.compile(train_step, backend="eager") if compiled else train_step
        losses = [float(step(x, y)) for x, y in batches]
        stages = optimizer.schedule["step"] if kind == "zero_one" else optimizer.compressing
        optimizer.close()
        return flat(model), losses, stages
    for kind in ("adam", "zero_one"):
        eager, compiled = run(kind, False), run(kind, True)
        require(torch.equal(eager[0], compiled[0]) and eager[1] == compiled[1] and eager[2] == compiled[2],
                f"{kind}: the compiled training step differs from the eager one (losses {eager[1]} vs {compiled[1]})")


def fsdp_case(mode, rank, torch, dist, onebit, out):
    """FSDP's parameters are refused by every optimizer, by name."""
    def fsdp1(model, use_orig_params):
        from torch.distributed.fsdp import FullyShardedDataParallel
        return FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=use_orig_params)

    def fsdp2(model):
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
        return model
    wrappers = {"FSDP": lambda m: fsdp1(m, False), "FSDP use_orig_params": lambda m: fsdp1(m, True), "fully_shard": fsdp2}
    tried = []
    for label, wrap in wrappers.items():
        try:
            model = wrap(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
        except (ImportError, TypeError, ValueError, RuntimeError, AssertionError) as why:  # this torch cannot, on the CPU
            print(f"rank {rank}: {label}: not made here ({type(why).__name__}: {str(why)[:80]})", flush=True)
            continue
        tried.append(label)
        for kind, name in (("adam", "OnebitAdam"), ("lamb", "OnebitLamb"), ("zero_one", "ZeroOneAdam")):
            try:
                make_optimizer(onebit, kind, model.parameters())
            except ValueError as error:
                words = ("is a DTensor" if label == "fully_shard" else "is flattened by FullyShardedDataParallel")
                require(f"{name}: parameter 0 of group 0" in str(error) and words in str(error)
                        and "DistributedDataParallel" in str(error), f"{label}, {name}: unclear refusal: {error}")
            else:
                raise CheckFailed(f"{label}: {name} took parameters FSDP shards across the ranks")
    if not tried:
        raise Skipped(f"torch {torch.__version__} makes no FSDP model on the CPU")


def scaler_case(mode, rank, torch, dist, onebit, out):
    """torch.amp.GradScaler drives the optimizers' steps (fp16 autocast's loss scaling): with no
    overflow, a scaled run is bitwise the unscaled one (a power-of-two scale is exact); a gradient
    that overflows on rank 1 only, in the compression stage, makes every rank skip that step
    (before: rank 1 skipped, rank 0 waited in the compressed all_reduce until the timeout), and the
    ranks stay bitwise equal."""
    GradScaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if GradScaler is None:
        raise Skipped(f"torch {torch.__version__} has no torch.amp.GradScaler for the CPU")

    def run(kind, scaled, overflow_at=None, unscale=False, fail_at=None):
        torch.manual_seed(3)
        model = torch.nn.Linear(16, 4)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = make_optimizer(onebit, kind, ddp.parameters())
        ddp.register_comm_hook(optimizer, onebit.ddp_comm_hook)
        scaler = GradScaler("cpu", init_scale=2.0 ** 10, enabled=scaled)
        generator = torch.Generator().manual_seed(70 + rank)
        skipped = []
        for step in range(FREEZE + 4):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(torch.randn(8, 16, generator=generator)), torch.zeros(8, 4))
            scaler.scale(loss).backward()
            if step == overflow_at and rank == 1:
                model.weight.grad[0, 0] = float("inf")
            if unscale:  # as HF Trainer and Accelerate do, to clip
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
            before = flat(model).clone()
            if step == fail_at:  # the compressed all_reduce fails once (a peer timed out, say); the step is retried
                optimizer._average_tagged = fail_once(optimizer)
                try:
                    scaler.step(optimizer)
                except RuntimeError as error:
                    require("failed once" in str(error), f"not the failure made: {error}")
                else:
                    raise CheckFailed("the failing step did not fail")
            scaler.step(optimizer)
            scaler.update()
            skipped.append(torch.equal(flat(model), before))
        optimizer.close()
        return flat(model), skipped

    def fail_once(optimizer):
        def fail(*args, **kwargs):
            del optimizer._average_tagged  # the class's again
            raise RuntimeError("the compressed all_reduce failed once")
        return fail
    for kind, name in (("adam", "OnebitAdam"), ("lamb", "OnebitLamb")):
        plain, _ = run(kind, False)
        scaled, skipped = run(kind, True)
        require(torch.equal(plain, scaled), f"{name}: GradScaler without overflow differs from the unscaled run")
        require(not any(skipped), f"{name}: a step was skipped without overflow: {skipped}")
        # A compressed step that failed and is retried unscales the gradients once (before: twice,
        # as if by the square of the scale).
        retried, _ = run(kind, True, fail_at=FREEZE + 1)
        require(torch.equal(plain, retried), f"{name}: a retried step under GradScaler differs from the unscaled run")
        for unscale in (False, True):
            overflowed, skipped = run(kind, True, overflow_at=FREEZE + 1, unscale=unscale)
            require(skipped == [i == FREEZE + 1 for i in range(FREEZE + 4)],
                    f"{name}: rank {rank} skipped the steps {skipped}, want only the overflow step {FREEZE + 1}")
            same_on_every_rank(torch, dist, overflowed, f"{name}: after a one-rank overflow in the compression stage"
                                                        f"{' (scaler.unscale_ first)' if unscale else ''}")
    # 0/1 Adam alternates local-gradient (compressed) and averaged (variance) steps until
    # var_freeze_step: after a one-rank overflow in a compressed step the scalers' scales differ,
    # and the next variance step, averaged while scaled, is refused on every rank, naming them, or,
    # where scaler.unscale_ came first and hid them, saying so.
    from onebit import zero_one_adam
    for unscale, said in ((False, "scales differ (rank 0: 1024, rank 1: 512)"),
                          (True, "scales differ (unscaled already by scaler.unscale_")):
        torch.manual_seed(3)
        model = torch.nn.Linear(16, 4)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = onebit.ZeroOneAdam(ddp.parameters(), lr=1e-4, var_freeze_step=12, var_update_scaler=1,
                                       name=f"zero_one/unscale {unscale}")
        ddp.register_comm_hook(optimizer, onebit.ddp_comm_hook)
        scaler = GradScaler("cpu", init_scale=2.0 ** 10)
        generator = torch.Generator().manual_seed(75 + rank)
        overflowed = False
        for step in range(12):
            kind = optimizer.next_step_kind()
            optimizer.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(ddp(torch.randn(8, 16, generator=generator)),
                                                      torch.zeros(8, 4))).backward()
            if kind == zero_one_adam.COMPRESSED_STEP and not overflowed:
                overflowed = True
                if rank == 1:
                    model.weight.grad[0, 0] = float("inf")
            if unscale:
                scaler.unscale_(optimizer)
            try:
                scaler.step(optimizer)
            except RuntimeError as error:
                require(overflowed and kind == zero_one_adam.VARIANCE_STEP, f"ZeroOneAdam step {step}: {error}")
                require(f"ZeroOneAdam: the ranks' GradScaler {said}" in str(error),
                        f"ZeroOneAdam: the refusal does not say '{said}': {error}")
                require(not hasattr(optimizer, "grad_scale"), "the refusal left GradScaler's grad_scale behind")
                break
            scaler.update()
        else:
            raise CheckFailed(f"ZeroOneAdam (scaler.unscale_ first: {unscale}): no variance step after a one-rank "
                              f"overflow was refused (overflowed: {overflowed})")
        optimizer.close()


def deepspeed_case(mode, rank, torch, dist, onebit, out):
    """deepspeed_schedule=True with freeze_step F is the default schedule with F - 1 on the same
    gradients less the first (DeepSpeed's first call moves nothing and drops its gradient) — and so
    is its adam_state_dict(): the steps it counts are the updates made, not the calls (before: one
    high, torch Adam's bias correction then one step off)."""
    def run(deepspeed, freeze, skip_first):
        torch.manual_seed(6)
        model = torch.nn.Linear(16, 4)
        optimizer = onebit.OnebitAdam(model.parameters(), lr=1e-2, freeze_step=freeze, deepspeed_schedule=deepspeed,
                                      name=f"ds{int(deepspeed)}")
        generator = torch.Generator().manual_seed(70 + rank)
        batches = [(torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)) for _ in range(10)]
        stages = []
        for x, y in batches[1:] if skip_first else batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            stages.append(optimizer.compressing)
            optimizer.step()
        exported = optimizer.adam_state_dict()["state"]
        optimizer.close()
        return flat(model), stages, exported
    # DeepSpeed's F makes F - 1 full-precision updates, and at least one: its F <= 2 all compress
    # from the third call.
    for deepspeed_freeze, ours_freeze in ((4, 3), (1, 1)):
        ours, _, ours_exported = run(False, ours_freeze, True)
        theirs, theirs_stages, theirs_exported = run(True, deepspeed_freeze, False)
        warmup = ours_freeze + 1
        require(theirs_stages == [False] * warmup + [True] * (10 - warmup), f"deepspeed_schedule stages: {theirs_stages}")
        require(torch.equal(ours, theirs), f"deepspeed_schedule=True, freeze_step {deepspeed_freeze} differs from "
                                           f"freeze_step {ours_freeze} without the first call")
        for index, (a, b) in enumerate(zip(ours_exported.values(), theirs_exported.values())):
            require(all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq")),
                    f"deepspeed_schedule=True: adam_state_dict() of parameter {index} (step {float(b['step'])}) is "
                    f"not that of the run without the first call (step {float(a['step'])})")
    try:
        onebit.OnebitAdam(torch.nn.Linear(2, 2).parameters(), freeze_step="auto", deepspeed_schedule=True)
    except ValueError as error:
        require("fixed freeze_step" in str(error), f"unclear refusal: {error}")
    else:
        raise CheckFailed("deepspeed_schedule with freeze_step='auto' was accepted")


def adam_names_case(mode, rank, torch, dist, onebit, out):
    """A run finished with torch.optim.Adam from a onebit optimizer mid compression stage:
    adam_state_dict() gives each parameter's exp_avg, exp_avg_sq and step as this rank's m, v (OnebitLamb
    past its freeze: v_fresh, the variance that still tracks the gradients) and steps taken, and torch's Adam loading it takes the step Adam takes from those moments (a onebit
    state_dict() loaded by torch's Adam starts fresh: its m and v are under "onebit" alone). With a
    parameter removed from param_groups it is refused like step(), naming the change."""
    generator = torch.Generator().manual_seed(90 + rank)
    for kind, name in (("adam", "OnebitAdam"), ("lamb", "OnebitLamb"), ("zero_one", "ZeroOneAdam")):
        model, optimizer, x, y = small_model_past_freeze(torch, onebit, kind, 8, generator, FREEZE + 3)
        saved = optimizer.state_dict()
        part = saved["onebit"]["parts"].get(rank, saved["onebit"]["parts"].get("every"))
        steps = part["schedule"]["step"] if kind == "zero_one" else part["step"]
        variance = part["v_fresh"] if kind == "lamb" else part["v"]
        first = optimizer.param_groups[0]["params"].pop(0)
        try:
            optimizer.adam_state_dict()
        except RuntimeError as error:
            words = "adam_state_dict(): param_groups changed since the optimizer was made"
            require(words in str(error), f"{name}: the refusal does not say '{words}': {error}")
        else:
            raise CheckFailed(f"{name}: adam_state_dict() with a parameter removed was not refused")
        optimizer.param_groups[0]["params"].insert(0, first)
        exported = optimizer.adam_state_dict()
        optimizer.close()
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)
        adam.load_state_dict(exported)
        at = 0
        for index, p in enumerate(model.parameters()):
            state, n = adam.state[p], p.numel()
            require(torch.equal(state["exp_avg"], part["m"][at:at + n].view(p.shape)) and
                    torch.equal(state["exp_avg_sq"], variance[at:at + n].view(p.shape)),
                    f"{name} -> torch Adam: parameter {index}'s exp_avg or exp_avg_sq is not this rank's m or "
                    f"{'v_fresh' if kind == 'lamb' else 'v'}")
            require(float(state["step"]) == steps, f"{name} -> torch Adam: parameter {index}'s step is "
                                                    f"{float(state['step'])}, want {steps}")
            at += n
        before = [p.detach().clone() for p in model.parameters()]
        adam.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        group = adam.param_groups[0]  # the exported hyper-parameters, as torch's load takes them
        (beta1, beta2), lr, eps, t = group["betas"], group["lr"], group["eps"], steps + 1
        want = []
        for p, old in zip(model.parameters(), before):  # torch Adam's step from those moments, by hand
            state, g = adam.state[p], p.grad + group["weight_decay"] * old
            m = state["exp_avg"] * beta1 + g * (1 - beta1)
            v = state["exp_avg_sq"] * beta2 + g * g * (1 - beta2)
            want.append(old - lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps))
        adam.step()
        for index, (p, w) in enumerate(zip(model.parameters(), want)):
            require(torch.allclose(p.detach(), w, rtol=1e-5, atol=1e-7),
                    f"{name} -> torch Adam: parameter {index} after one step is off the step from the loaded "
                    f"moments by {(p.detach() - w).abs().max().item():.3g}")
    print(f"rank {rank}: torch Adam goes on from each onebit optimizer's adam_state_dict()", flush=True)


def damaged_file_case(mode, rank, torch, dist, onebit, out):
    """save_file() on every rank past the freeze, then a fresh optimizer's load_file(): rank 1's file
    damaged (one byte changed), or missing: every rank's load fails at once — rank 1 naming its
    file and what is wrong, rank 0 that rank 1 refused — and the fresh optimizer is as it was. Then
    each rank's own undamaged file resumes: the next step equals the saving optimizer's, bitwise."""
    generator = torch.Generator().manual_seed(3)
    for kind in ("adam", "lamb", "zero_one"):
        model, optimizer, x, y = small_model_past_freeze(torch, onebit, kind, 8, generator, FREEZE + 3)
        path = os.path.join(out, f"{kind}-{rank}.ckpt")
        optimizer.save_file(path)
        dist.barrier()
        for spoil in ("damaged", "missing"):
            if rank == 1 and spoil == "damaged":
                with open(path, "r+b") as f:
                    f.seek(40)
                    byte = f.read(1)
                    f.seek(40)
                    f.write(bytes([byte[0] ^ 0x5A]))
            if rank == 1 and spoil == "missing":
                os.remove(path)
            fresh = make_optimizer(onebit, kind, model.parameters(), name=f"fresh-{kind}")
            before = fresh.state_dict()["onebit"]
            try:
                fresh.load_file(path)
            except ValueError as error:
                words = ("its CRC-32 does not match its bytes" if spoil == "damaged" else "cannot read") if rank == 1 \
                    else "rank 1 refused its checkpoint"
                require(words in str(error), f"{kind}, {spoil} file: rank {rank}'s refusal does not say '{words}': "
                                             f"{error}")
            else:
                raise CheckFailed(f"{kind}, {spoil} file: rank {rank}'s load_file() was not refused")
            same_state(torch, fresh.state_dict()["onebit"], before, f"{kind}, {spoil} file: the refused load")
            fresh.close()
            dist.barrier()
            if rank == 1 and spoil == "damaged":
                optimizer.save_file(path)  # whole again, for the missing case's rank 0 and the resume below
        if rank == 1:
            optimizer.save_file(path)
        dist.barrier()
        resumed = make_optimizer(onebit, kind, model.parameters(), name=f"resumed-{kind}")
        resumed.load_file(path)
        require(resumed.state_dict()["onebit"]["parts"].keys() == optimizer.state_dict()["onebit"]["parts"].keys(),
                f"{kind}: the resumed optimizer's parts differ in kind")
        same_state(torch, resumed.state_dict()["onebit"], optimizer.state_dict()["onebit"],
                   f"{kind}: the optimizer resumed from its file")
        resumed.close()
        job_file_resumes(torch, onebit, kind, model, optimizer, rank, out)
        optimizer.close()
    print(f"rank {rank}: a damaged or missing checkpoint file on rank 1 fails every rank's load_file() at once; "
          "each rank's own file resumes the optimizer's state exactly; the job's one file too, and rank 0 unable "
          "to write it fails every rank's save", flush=True)


def job_file_resumes(torch, onebit, kind, model, optimizer, rank, out):
    """The job's one file: where rank 0 cannot write it — no such folder, or its disk full halfway
    (a file-size limit on rank 0) — every rank's save_file(consolidated=True) fails at once (no
    rank left waiting for rank 0, the others' parts still taken), nothing at the path and no
    temporary file; written, a fresh optimizer on every rank resumes from its part of it, exactly."""
    nowhere = os.path.join(out, "no-such-folder", f"{kind}-job.ckpt")
    try:
        optimizer.save_file(nowhere, consolidated=True)
    except onebit.OnebitError as error:
        words = "cannot write " + nowhere if rank == 0 else f"rank 0 could not write {nowhere}"
        require(words in str(error), f"{kind}: rank {rank}'s failed job save does not say '{words}': {error}")
    else:
        raise CheckFailed(f"{kind}: rank {rank}'s save_file(consolidated=True) into a missing folder succeeded")
    path = os.path.join(out, f"{kind}-job.ckpt")
    optimizer.save_file(path, consolidated=True)
    full = os.path.join(out, f"{kind}-full-disk.ckpt")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    if rank == 0:  # the disk full within the shared records (m and v, 40 % of the file and more, come first)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) // 4, limit[1]))
    try:
        optimizer.save_file(pathlib.Path(full), consolidated=True)
    except onebit.OnebitError as error:
        words = f"cannot write {full}: File too large" if rank == 0 else f"rank 0 could not write {full}"
        require(words in str(error), f"{kind}: rank {rank}'s save on a full disk does not say '{words}': {error}")
    else:
        raise CheckFailed(f"{kind}: rank {rank}'s save_file(consolidated=True) on a full disk succeeded")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    left = [name for name in os.listdir(out) if name.startswith(os.path.basename(full))]
    require(not left, f"{kind}: the failed save left {left}")
    # A file whose per-parameter field is short (damaged, hand-made): refused before anything changes.
    from onebit._checkpoint_files import read_part, write_part
    header, part = read_part(optimizer._lib, path, rank)
    field = {"adam": "v", "lamb": "v_fresh", "zero_one": "u"}[kind]
    part[field] = part[field][:-1]
    short = os.path.join(out, f"{kind}-short-{rank}.ckpt")
    write_part(optimizer._lib, short, part, header)
    fresh = make_optimizer(onebit, kind, model.parameters(), name=f"short-{kind}")
    before = fresh.state_dict()["onebit"]
    try:
        fresh.load_file(short)
    except ValueError as error:
        words = f"the checkpoint's {field} {part[field].numel()} floats do not match its {part['m'].numel()} parameters"
        require(words in str(error), f"{kind}: a short {field} is refused without saying '{words}': {error}")
    else:
        raise CheckFailed(f"{kind}: a checkpoint with a short {field} was loaded")
    same_state(torch, fresh.state_dict()["onebit"], before, f"{kind}: the refused load of a short {field}")
    fresh.close()
    resumed = make_optimizer(onebit, kind, model.parameters(), name=f"job-{kind}")
    resumed.load_file(pathlib.Path(path))
    same_state(torch, resumed.state_dict()["onebit"], optimizer.state_dict()["onebit"],
               f"{kind}: the optimizer resumed from its part of the job's file")
    resumed.close()


CASES = {"mlp-adam": mlp_case, "mlp-lamb": mlp_case, "mlp-zero_one": mlp_case, "disagree": disagree_case,
         "disagree-auto": disagree_auto_case, "other-model": other_model_case, "same-name": same_name_case,
         "uncompressed": uncompressed_case, "synchronize": synchronize_case, "foreign-hook": foreign_hook_case, "no-hook": no_hook_case, "no-sync": no_sync_case, "autocast": autocast_case, "none-grads": none_grads_case, "nan": nan_case, "nan-sync": nan_sync_case, "capture": capture_case, "compile": compile_case, "fsdp": fsdp_case, "scaler": scaler_case,
         "deepspeed": deepspeed_case, "changed-params": changed_params_case, "two-optimizers": two_optimizers_case,
         "adam-names": adam_names_case, "damaged-file": damaged_file_case}


def rank_env(mode, rank, env):
    """disagree: ONEBIT_FREEZE_STEP 1 on rank 0 and 3 on rank 1; uncompressed: no preload (the
    package then finds libonebit.so in the build tree for its tags)."""
    if mode == "disagree":
        return dict(env, ONEBIT_FREEZE_STEP=str(1 + 2 * rank))
    if mode == "uncompressed" and "LD_PRELOAD" in env:
        env = dict(env)
        env["ONEBIT_LIBRARY"] = env.pop("LD_PRELOAD").replace("libonebit-preload.so", "libonebit.so")
    return env


def check_logs(mode, outputs):
    """What rank 0 (and only rank 0) says: the freeze line, the DDP warning."""
    err0, err1 = outputs[0][1], outputs[1][1]
    if mode.startswith("mlp"):
        require("elements are dormant (sqrt(v) <= eps" in err0, f"rank 0 did not name the dormant elements:\n{err0}")
        require("variance frozen" not in err1, "rank 1 printed the freeze line too")
    if mode == "no-hook":
        require("arrived already averaged" in err0 and "MB of fp32 gradients" in err0,
                f"DDP without the hook: no warning on rank 0:\n{err0}")
        require(err0.count("arrived already averaged") == 1, "the warning came more than once")
    if mode in ("no-sync", "autocast", "mlp-adam"):
        require("arrived already averaged" not in err0, f"{mode}: a false warning:\n{err0}")
        require("was not compressed" not in err0, f"{mode}: a false warning:\n{err0}")
    if mode == "uncompressed":
        require(err0.count("step 2's all_reduce of the tagged buffer was not compressed") == 1,
                f"no single warning that nothing was compressed:\n{err0}")
        require("was not compressed" not in err1, "rank 1 warned too")


def main():
    return rank_or_driver(__file__, CASES, MODES, WORLD, check=check_logs, rank_env=rank_env, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
