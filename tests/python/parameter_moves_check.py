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
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from modes import CheckFailed, Skipped, fit, rank_or_driver, require  # noqa: E402

WORLD, STEPS, FREEZE = 2, 10, 3
MODES = ("to-cpu0", "swap", "tied", "cast", "assign")
KINDS = ("adam", "zero_one", "lamb")


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
    losses = fit(torch, ddp, optimizer, x, y, STEPS)
    optimizer.close()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), losses, moved


def moved_case(mode, rank, torch, dist, onebit, out):
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


def tied_case(mode, rank, torch, dist, onebit, out):
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
    path = os.path.join(out, f"tied{rank}.safetensors")
    save_model(model, path)
    again = Tied()
    load_model(again, path)
    require(torch.equal(again.embed.weight, model.embed.weight) and again.head.weight is again.embed.weight,
            "the safetensors round trip lost the tied weight")


def cast_case(mode, rank, torch, dist, onebit, out):
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


def assign_case(mode, rank, torch, dist, onebit, out):
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


def check(mode, outputs):
    """assign: rank 0 warned once (unless the case was skipped)."""
    stdout, stderr = outputs[0]
    if mode == "assign" and "SKIP" not in stdout:
        require(stderr.count("found no gradient on any of its 2 parameters") == 1,
                f"no single warning about the parameters without gradients:\n{stderr}")


def main():
    return rank_or_driver(__file__, CASES, MODES, WORLD, check=check, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
