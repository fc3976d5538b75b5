"""What frameworks do to parameters after the optimizer is made (issue 28), 2 ranks of real
torch.distributed each, for OnebitAdam, ZeroOneAdam and OnebitLamb:

  to-cpu0   model.to(torch.device("cpu", 0)) after the optimizer and DDP were made — what HF Trainer
            and Accelerate do on CPU ranks, and a copy on pip's torch: training is bitwise the run
            without it (before, the optimizer went on updating a private copy: the model never moved).
  swap      the same under torch.__future__.set_swap_module_params_on_conversion(True), without
            DDP (torch cannot swap a parameter DDP's reducer holds); skipped, saying so, on a torch
            without swap_tensors.
  tied      a model whose output layer shares the embedding's weight: trains, and
            safetensors.torch.save_model / load_model round-trip it (before: "None is covering the
            entire storage"; skipped, saying so, without safetensors).
  cast      model.double() after the optimizer was made: step() refuses, naming the parameter.
  assign    load_state_dict(assign=True) after the optimizer was made (new Parameter objects the
            optimizer does not hold): step() warns once that no parameter has a gradient.

    PYTHON tests/python/parameter_moves_check.py BUILD_DIR [preload|onebit] [MODE ...]
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

WORLD, STEPS, FREEZE = 2, 10, 3
MODES = ("to-cpu0", "swap", "tied", "cast", "assign")
KINDS = ("adam", "zero_one", "lamb")


class CheckFailed(Exception):
    pass


class Skipped(Exception):
    pass


def require(condition, what):
    if not condition:
        raise CheckFailed(what)


def make_optimizer(onebit, kind, params):
    if kind == "adam":
        return onebit.OnebitAdam(params, lr=1e-2, freeze_step=FREEZE, name=f"moves/{kind}")
    if kind == "lamb":
        return onebit.OnebitLamb(params, lr=1e-2, freeze_step=FREEZE, name=f"moves/{kind}")
    return onebit.ZeroOneAdam(params, lr=1e-2, var_freeze_step=FREEZE, local_step_clipper=2, name=f"moves/{kind}")


def train(torch, onebit, rank, kind, move, use_ddp):
    """STEPS steps on a small model (DDP + hook, or the optimizer averaging itself); `move(model)`
    runs after the optimizer is made."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model) if use_ddp else model
    optimizer = make_optimizer(onebit, kind, ddp.parameters())
    if use_ddp:
        ddp.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    before = model[0].weight.data_ptr()
    move(model)
    moved = model[0].weight.data_ptr() != before
    generator = torch.Generator().manual_seed(10 + rank)
    x, y = torch.randn(32, 16, generator=generator), torch.randn(32, 4, generator=generator)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    optimizer.close()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), losses, moved


def moved_case(mode, rank, torch, dist, onebit):
    if mode == "swap":
        future = getattr(torch, "__future__", None)
        if future is None or not hasattr(future, "set_swap_module_params_on_conversion"):
            raise Skipped(f"torch {torch.__version__} has no swap_tensors conversion")
        future.set_swap_module_params_on_conversion(True)
    use_ddp = mode != "swap"  # torch itself cannot swap a parameter DDP's reducer holds ("Couldn't swap")
    for kind in KINDS:
        still, _, _ = train(torch, onebit, rank, kind, lambda model: None, use_ddp)
        moved, losses, copied = train(torch, onebit, rank, kind, lambda model: model.to(torch.device("cpu", 0)),
                                      use_ddp)
        require(torch.equal(moved, still), f"{kind}: training after {mode} differs from training without it "
                                           f"(max |diff| {(moved - still).abs().max().item():.3g}; storage moved: {copied})")
        require(losses[-1] < losses[0], f"{kind}: the loss did not fall: {losses}")
        if rank == 0:
            print(f"{kind}: {mode} (storage {'moved' if copied else 'kept'}) bitwise the unmoved run; loss "
                  f"{losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)


def tied_case(mode, rank, torch, dist, onebit):
    try:
        from safetensors.torch import load_model, save_model
    except ImportError:
        raise Skipped("safetensors is not installed")

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 8)
            self.norm = torch.nn.LayerNorm(8)
            self.head = torch.nn.Linear(8, 32, bias=False)
            self.head.weight = self.embed.weight  # tied, as GPT-2's wte / lm_head

        def forward(self, tokens):
            return self.head(self.norm(self.embed(tokens)))

    torch.manual_seed(1)
    model = Tied()
    optimizer = onebit.OnebitAdam(model.parameters(), lr=1e-2, freeze_step=FREEZE, name="moves/tied")
    generator = torch.Generator().manual_seed(20 + rank)
    tokens = torch.randint(0, 32, (16,), generator=generator)
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(tokens), tokens).backward()
        optimizer.step()
    optimizer.close()
    path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    save_model(model, path)
    again = Tied()
    load_model(again, path)
    require(torch.equal(again.embed.weight, model.embed.weight) and again.head.weight is again.embed.weight,
            "the safetensors round trip lost the tied weight")


def cast_case(mode, rank, torch, dist, onebit):
    model = torch.nn.Linear(4, 2)
    optimizer = onebit.OnebitAdam(model.parameters(), freeze_step=FREEZE, name="moves/cast")
    model.double()
    model(torch.ones(1, 4, dtype=torch.float64)).sum().backward()
    try:
        optimizer.step()
    except RuntimeError as error:
        require("parameter 0 is now torch.float64" in str(error) and "make the optimizer after" in str(error),
                f"unclear error: {error}")
        return
    raise CheckFailed("a parameter cast to float64 after the optimizer was made was accepted")


def assign_case(mode, rank, torch, dist, onebit):
    model = torch.nn.Linear(4, 2)
    optimizer = onebit.OnebitAdam(model.parameters(), freeze_step=FREEZE, name="moves/assign")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        model.load_state_dict(state, assign=True)
    except TypeError:
        raise Skipped(f"torch {torch.__version__} has no load_state_dict(assign=True)")
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()


CASES = {"to-cpu0": moved_case, "swap": moved_case, "tied": tied_case, "cast": cast_case, "assign": assign_case}


def rank_main(mode, door, rank, store):
    import torch
    import torch.distributed as dist
    import onebit
    if door == "onebit":
        onebit.register_backend()
    dist.init_process_group("onebit" if door == "onebit" else "gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD)
    try:
        CASES[mode](mode, rank, torch, dist, onebit)
    except CheckFailed as failure:
        print(f"rank {rank}: FAIL: {mode}: {failure}", file=sys.stderr, flush=True)
        sys.exit(4)
    except Skipped as why:
        print(f"SKIP: {why}", flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "rank":
        rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return 0
    if len(sys.argv) < 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    door = sys.argv[2] if len(sys.argv) > 2 else "preload"
    modes = sys.argv[3:] or MODES
    import torch
    if door == "onebit" and not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} has no c10d Backend class (the onebit backend needs torch >= 2.0)")
        return 77
    env = dict(os.environ, MASTER_ADDR="127.0.0.1")
    env.pop("ONEBIT_FREEZE_STEP", None)
    if door == "preload":
        env["LD_PRELOAD"] = os.path.join(build, "libonebit-preload.so")
    else:
        env["ONEBIT_LIBRARY"] = os.path.join(build, "libonebit.so")
    print(f"torch {torch.__version__}, door {door}", flush=True)
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            store = os.path.join(tmp, f"store-{mode}")
            procs = [subprocess.Popen([sys.executable, __file__, "rank", mode, door, str(r), store], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
            outputs = [p.communicate(timeout=600) for p in procs]
            codes = [p.returncode for p in procs]
            err0 = outputs[0][1]
            problem = None
            if any(codes):
                problem = f"exit codes {codes}"
            elif (mode == "assign" and "SKIP" not in outputs[0][0]
                  and err0.count("found no gradient on any of its 2 parameters") != 1):
                problem = f"no single warning about the parameters without gradients:\n{err0}"
            if problem:
                failed.append(mode)
                print(f"FAIL: {mode}: {problem}")
                for rank, (stdout, stderr) in enumerate(outputs):
                    print(f"--- rank {rank}\n{stdout[-2000:]}{stderr[-3000:]}")
                continue
            print(f"ok: {mode}\n{outputs[0][0].rstrip()}", flush=True)
    print(f"{len(modes) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
