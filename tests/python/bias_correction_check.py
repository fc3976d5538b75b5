"""OnebitAdam(bias_correction=True), one rank (no all_reduce: the momentum is exact), the same
gradients fed to it and to the references:

  - warmup: every step matches torch.optim.Adam's (relative 1e-5: float32, other operation order);
    the default (False: the paper's and DeepSpeed's rule) does not;
  - compression stage: every step matches a float64 reference of the corrected frozen-variance
    rule, p -= lr * clip(m̂ / (sqrt(v̂_F) + eps)), v̂_F = v_F / (1 - beta2^F), m̂ = m / (1 - beta1^t),
    with weight decay lr * wd * p, the clip at Adam's largest step in the corrected scale;
  - bias_correction=True with deepspeed_schedule=True is refused, saying why.

    PYTHON tests/python/bias_correction_check.py BUILD_DIR
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

FREEZE, STEPS, LR, WD, BETAS, EPS = 10, 25, 1e-2, 0.01, (0.9, 0.999), 1e-8


def gradients(torch, n):
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(n, generator=generator) * (1 + step % 3) for step in range(STEPS)]


def run_onebit(torch, onebit, start, grads, **options):
    p = torch.nn.Parameter(start.clone())
    optimizer = onebit.OnebitAdam([p], lr=LR, betas=BETAS, eps=EPS, freeze_step=FREEZE, name=f"bc/{len(options)}",
                                  **options)
    trajectory = []
    for g in grads:
        p.grad = g.clone()
        optimizer.step()
        trajectory.append(p.detach().clone())
    optimizer.close()
    return trajectory


def reference(torch, bound, start, grads):
    """float64: torch Adam's corrected rule (decay as onebit's: added to the direction) in warmup,
    then the frozen-variance rule in corrected terms, the clip at `bound` (Adam's largest step)."""
    b1, b2 = BETAS
    p = start.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    trajectory = []
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = b1 * m + (1 - b1) * g
        c1 = 1 - b1 ** t
        if t <= FREEZE:
            v = b2 * v + (1 - b2) * g * g
            direction = (m / c1) / ((v / (1 - b2 ** t)).sqrt() + EPS)
        else:
            c2 = 1 - b2 ** FREEZE
            vhat = (v / c2).sqrt()
            m = torch.where(vhat <= EPS, torch.zeros_like(m), m)  # dormant: no momentum step
            limit = bound * c2 ** 0.5 / c1
            direction = ((m / c1) / (vhat + EPS)).clamp(-limit, limit)
        p = p - LR * (direction + WD * p)
        trajectory.append(p)
    return trajectory


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    os.environ.setdefault("ONEBIT_LIBRARY", os.path.join(os.path.abspath(sys.argv[1]), "libonebit.so"))
    os.environ.pop("ONEBIT_FREEZE_STEP", None)
    import ctypes
    import torch
    import torch.distributed as dist
    import onebit
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        lib = onebit._library()
        torch.manual_seed(0)
        start = torch.randn(64)
        grads = gradients(torch, start.numel())
        corrected = run_onebit(torch, onebit, start, grads, bias_correction=True, weight_decay=WD)
        plain = run_onebit(torch, onebit, start, grads)
        p = torch.nn.Parameter(start.clone())
        adam = torch.optim.Adam([p], lr=LR, betas=BETAS, eps=EPS)
        failures = []
        for step, g in enumerate(grads[:FREEZE]):
            p.grad = g.clone()
            adam.step()
            if step == 0:
                continue
            ours = run_onebit(torch, onebit, start, grads[:step + 1], bias_correction=True)[-1]
            if not torch.allclose(ours, p.detach(), rtol=1e-5, atol=1e-7):
                failures.append(f"warmup step {step}: bias_correction=True differs from torch.optim.Adam by "
                                f"{(ours - p.detach()).abs().max().item():.3g}")
        if torch.allclose(plain[FREEZE - 1], p.detach(), rtol=1e-3, atol=0):
            failures.append("bias_correction=False matches torch.optim.Adam: the option changes nothing")
        expected = reference(torch, lib.onebit_adam_step_bound(ctypes.c_float(BETAS[0]), ctypes.c_float(BETAS[1])),
                             start, grads)
        for step, (ours, want) in enumerate(zip(corrected, expected)):
            if not torch.allclose(ours.double(), want, rtol=1e-5, atol=1e-7):
                stage = "warmup" if step < FREEZE else "compression stage"
                failures.append(f"step {step} ({stage}): differs from the float64 reference by "
                                f"{(ours.double() - want).abs().max().item():.3g}")
        try:
            onebit.OnebitAdam([torch.nn.Parameter(start.clone())], freeze_step=3, deepspeed_schedule=True,
                              bias_correction=True)
            failures.append("deepspeed_schedule=True with bias_correction=True was accepted")
        except ValueError as error:
            if "no bias correction" not in str(error):
                failures.append(f"the refusal does not say why: {error}")
        dist.destroy_process_group()
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        return 1
    print(f"OK: bias_correction=True matches torch.optim.Adam over {FREEZE} warmup steps and the float64 corrected "
          f"frozen-variance rule over {STEPS - FREEZE} compression steps; the default does not match Adam")
    return 0


if __name__ == "__main__":
    sys.exit(main())
