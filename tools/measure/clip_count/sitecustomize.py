"""Loaded by every Python process started with this folder on PYTHONPATH (run.py's demo ranks):
counts, after each compression-stage step of OnebitAdam, the elements whose |m|/(sqrt(v)+eps)
exceeds Adam's step bound among those not dormant — the elements the bound clipped in that step —
and writes rank R's totals to $CLIP_COUNT_OUT-R.json at exit."""
import atexit
import json
import os

if os.environ.get("CLIP_COUNT_OUT"):
    import ctypes
    import onebit.onebit_adam as onebit_adam
    from onebit._flat_optimizer import _UNDECIDED

    counts = {"steps": 0, "steps_with_clips": 0, "clipped_elements": 0, "largest_ratio": 0.0}
    plain_step = onebit_adam.OnebitAdam._flat_step

    def counted_step(self):
        plain_step(self)
        if self._freeze_step == _UNDECIDED or self._step - 1 < self._freeze_step:
            return
        group = self.param_groups[0]
        bound = self._lib.onebit_adam_step_bound(ctypes.c_float(group["betas"][0]), ctypes.c_float(group["betas"][1]))
        root = self._v.sqrt()
        ratio = (self._m / (root + group["eps"])).abs()
        live = root > group["eps"]
        clipped = int(((ratio > bound) & live).sum())
        counts["rank"] = self._rank
        counts["steps"] += 1
        counts["steps_with_clips"] += clipped > 0
        counts["clipped_elements"] += clipped
        counts["largest_ratio"] = max(counts["largest_ratio"], float(ratio[live].max()))

    onebit_adam.OnebitAdam._flat_step = counted_step

    @atexit.register
    def _write():
        if "rank" in counts:  # a rank that took compression steps (the group is gone by exit)
            with open(f"{os.environ['CLIP_COUNT_OUT']}-{counts['rank']}.json", "w") as f:
                json.dump(counts, f)
