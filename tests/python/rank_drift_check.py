"""Ranks that drift apart in the compression stage are stopped, not trained on (issue 50), 2 ranks:

  scheduler     In the compression stage, rank 1's learning-rate scheduler steps alone (its lr is
                halved, rank 0's is not) — or a GradScaler idiom skips it on one rank. For each
                optimizer (OnebitAdam, OnebitLamb, ZeroOneAdam) the next compressed step fails on
                every rank, naming rank 1 and, on each rank, its own lr, with parameters and state
                unchanged; with the lr set back, training goes on and the replicas are bitwise
                equal. Before, the step ran and the replicas parted (max difference 0.0055 after a
                few steps), with no error.

    PYTHON tests/python/rank_drift_check.py BUILD_DIR [preload|onebit] [MODE ...]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
from modes import CheckFailed, rank_or_driver, require  # noqa: E402

WORLD, FREEZE = 2, 2


def flat(torch, model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def one_step(torch, model, optimizer, generator):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(torch.randn(4, 32, generator=generator)), torch.zeros(4, 8)).backward()
    optimizer.step()


def scheduler_case(mode, rank, torch, dist, onebit, tmp):
    for make in (lambda p: onebit.OnebitAdam(p, lr=1e-2, freeze_step=FREEZE, name="drift-adam"),
                 lambda p: onebit.OnebitLamb(p, lr=1e-2, freeze_step=FREEZE, name="drift-lamb"),
                 lambda p: onebit.ZeroOneAdam(p, lr=1e-2, var_freeze_step=FREEZE, local_step_clipper=1,
                                              name="drift-zero-one")):
        torch.manual_seed(3)
        model = torch.nn.Linear(32, 8)
        optimizer = make(model.parameters())
        who = type(optimizer).__name__
        generator = torch.Generator().manual_seed(10 + rank)
        for _ in range(FREEZE + 2):  # into the compression stage
            one_step(torch, model, optimizer, generator)
        lr = optimizer.param_groups[0]["lr"]
        if rank == 1:
            optimizer.param_groups[0]["lr"] = lr / 2  # what a scheduler stepped on this rank alone does
        before, state = flat(torch, model).clone(), optimizer.adam_state_dict()["state"][0]["exp_avg"].clone()
        try:
            one_step(torch, model, optimizer, generator)
            raise CheckFailed(f"{who}: a step with rank 1's lr halved ran")
        except RuntimeError as error:
            text = str(error)
        mine = lr / 2 if rank == 1 else lr
        for words in ("rank 1's settings for this call differ from rank 0's", f"group 0 lr {mine!r}",
                      "scheduler stepped on some ranks only", "No buffer or error state changed on any rank"):
            require(words in text, f"{who}: the error does not say '{words}': {text}")
        require(torch.equal(flat(torch, model), before), f"{who}: the refused step moved the parameters")
        require(torch.equal(optimizer.adam_state_dict()["state"][0]["exp_avg"], state), f"{who}: it changed m")
        optimizer.param_groups[0]["lr"] = lr
        for _ in range(2):
            one_step(torch, model, optimizer, generator)
        theirs = flat(torch, model)
        dist.broadcast(theirs, 0)
        require(torch.equal(theirs, flat(torch, model)), f"{who}: the replicas differ after the lr was set back")
        optimizer.close()
        print(f"rank {rank}: {who}: refused: {text}" if who == "OnebitAdam" else f"rank {rank}: {who}: refused", flush=True)


CASES = {"scheduler": scheduler_case}

if __name__ == "__main__":
    sys.exit(rank_or_driver(__file__, CASES, list(CASES), WORLD, doc=__doc__))
