"""onebit.ddp_comm_hook: the DistributedDataParallel communication hook of onebit's optimizers."""
import torch
import torch.distributed as dist

from ._flat_optimizer import _FlatOptimizer, _capturing
from ._logging import logger

__all__ = ["ddp_comm_hook"]


# Annotations evaluated, not postponed (no `from __future__ import annotations` here): DDP's
# register_comm_hook compares them with dist.GradBucket and torch.futures.Future[torch.Tensor]
# and refuses a hook whose annotations are strings.
def ddp_comm_hook(state: _FlatOptimizer, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook for onebit's optimizers: register with
    ``model.register_comm_hook(optimizer, onebit.ddp_comm_hook)``.

    Steps that take averaged gradients (OnebitAdam's and OnebitLamb's warmup, ZeroOneAdam's
    variance steps): averages the bucket's gradients over ranks in full precision (as DDP's
    default). Every other step: no gradient allreduce here — the optimizer communicates what its
    rule says (momentum, a compressed gradient, u, or nothing) in its step — so the bucket keeps
    this rank's local gradient; the gradients of parameters the optimizer does not hold (another
    optimizer's, e.g. a head trained by SGD) are averaged in full precision, as DDP's own hook
    would.

    Register it before the first backward pass, with the optimizer that holds the wrapped model's
    parameters (one hook per DDP); onebit.integrations.register_comm_hook does it through the
    wrappers of HF Trainer, Accelerate and Lightning. Without it the optimizer averages the
    gradients itself, and DDP goes on averaging fp32 gradients in every step of the compression
    stage (rank 0 warns). docs/usage/optimizers.md, "OnebitAdam".

    Args:
        state: the onebit optimizer (OnebitAdam, ZeroOneAdam or OnebitLamb) — DDP passes the
            ``state`` given to register_comm_hook.
        bucket: DDP's bucket of gradients.

    Returns:
        A future of the bucket's gradients: averaged over the optimizer's process group, or this
        rank's own, unchanged but for other optimizers' parameters' (averaged).

    A backward pass through the hook may be captured in a CUDA graph only once its answer can no
    longer change (OnebitAdam and OnebitLamb: in the compression stage; ZeroOneAdam: past
    var_freeze_step); before, every replay would repeat the captured step's answer. (Then the hook
    sends nothing for the optimizer's parameters; another optimizer's it averages, an all_reduce
    captured as any other.)

    Raises:
        TypeError: ``state`` is not a onebit optimizer.
        RuntimeError: the backward pass is being captured in a CUDA graph while the answer can
            still change.
    """
    optimizer = state
    if not isinstance(optimizer, _FlatOptimizer):
        raise TypeError("onebit.ddp_comm_hook: register it with the optimizer (OnebitAdam, ZeroOneAdam or OnebitLamb) "
                        "as its state")
    if _capturing(optimizer._device) and not optimizer._averaging_settled:
        raise RuntimeError(f"onebit.ddp_comm_hook: the backward pass is being captured in a CUDA graph while "
                           f"{type(optimizer).__name__} can still change whether the gradients are averaged "
                           "(OnebitAdam and OnebitLamb: until the compression stage; ZeroOneAdam: until "
                           "var_freeze_step has passed), so every replay would repeat this step's choice. Capture "
                           "the backward pass from then on, when the hook sends nothing (docs/usage/optimizers.md, "
                           "\"What the optimizers check\")")
    optimizer._gradients_averaged_by_hook = True
    buffer = bucket.buffer()
    if optimizer._wants_averaged_gradients:
        return _averaged(buffer, optimizer)
    parameters = bucket.parameters()
    others = _not_held(optimizer, parameters)
    if not others:
        future = torch.futures.Future()
        future.set_result(buffer)
        return future
    # Parameters of another optimizer (a head trained by SGD beside a OnebitAdam body): averaged in
    # full precision as DDP's own hook would, or their replicas would drift apart.
    _say_others_once(optimizer, parameters[others[0]])
    if len(others) == len(parameters):  # a sparse gradient's bucket holds it alone: here, or not at all
        return _averaged(buffer, optimizer)
    gradients = bucket.gradients()  # views of the buffer, in the order of parameters()
    theirs = [gradients[i] for i in others]

    def scatter(averaged):
        offset = 0
        for g in theirs:
            g.copy_(averaged[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        return buffer

    return _averaged(torch.cat([g.reshape(-1) for g in theirs]), optimizer, then=scatter)


def _not_held(optimizer, parameters):
    """The indices of the bucket's `parameters` that `optimizer` does not hold. Its set of held
    parameters is taken at each step; one put into param_groups since (a framework that moved the
    model and the optimizer's parameters with it, between two steps) is looked up afresh — at most
    once between two steps — before it is taken for another optimizer's and averaged."""
    others = [i for i, p in enumerate(parameters) if id(p) not in optimizer._owned]
    if others and not optimizer._held_looked_up:
        optimizer._note_held_parameters()
        optimizer._held_looked_up = True  # until the next step takes the set anew
        others = [i for i in others if id(parameters[i]) not in optimizer._owned]
    return others


def _averaged(tensor, optimizer, then=None):
    """A future of `tensor` averaged over the optimizer's group in full precision (in place), passed
    through `then` if given."""
    world = dist.get_world_size(optimizer._group)
    work = dist.all_reduce(tensor, group=optimizer._group, async_op=True)

    def average(future):
        averaged = future.value()[0].div_(world)
        return averaged if then is None else then(averaged)

    return work.get_future().then(average)


def _say_others_once(optimizer, example):
    """Rank 0 says once that the DDP model has parameters `optimizer` does not hold."""
    if optimizer._said_others:
        return
    optimizer._said_others = True
    if optimizer._rank == 0:
        logger.info(f"{optimizer._who}: onebit.ddp_comm_hook: the DDP model has parameters this optimizer does not "
                    f"hold (another optimizer's; one of shape {tuple(example.shape)}): their gradients are averaged "
                    "in full precision at every step, as DDP's own hook would")
