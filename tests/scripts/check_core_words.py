"""check_core_words.py SOURCE_DIR: the words the optimizer shims say that the C core writes
(onebit.h, "What the shims say" and "What the shims hold their ranks and checkpoints to"; the
checkpoint refusals of onebit_tag_state_check*; the freeze rule across ranks; OnebitAdam's driver) stand in the C core only — not again in the Python shims (python/onebit) nor in
the C++ shims' headers (include/onebit/*.hpp), where a second copy would drift from the first.
Each phrase must stand in the core, so that the check cannot pass on words nobody writes."""
import pathlib
import sys

PHRASES = (
    "variance frozen from step",
    "no gradient reached them) and take no momentum step",
    "A momentum turned non-finite",
    "its error feedback loads only before its first allreduce",
    "belongs to the chunks of the layout it was made in",
    "the saved worker error has",
    "measures the variance: give every rank's change",
    "every rank must be given the same value",
    "different checkpoints loaded? different models?",
    "every rank loads the checkpoint of the same step",
    "its stage and counters were made under those values",
    "can change on resume only from a checkpoint before the freeze under both",
    "freeze_step='auto' fired after step",
    "the variance moved",
    "takes a fixed freeze_step (DeepSpeed has no 'auto')",
    "runs DeepSpeed's rule, which has no bias correction",
    "the steps would change size on resume",
    "the steps would count from another origin on resume",
    "(it holds a variance snapshot)",
    "the checkpoint's schedule is malformed",
    "was 0 at every step since the last sync",
)
CORE = ("optim", "engine", "plugin/capi")
SHIMS = (("python/onebit", "*.py"), ("include/onebit", "*.hpp"))

root = pathlib.Path(sys.argv[1])
failures = []
for phrase in PHRASES:
    core = [p for folder in CORE for p in (root / folder).rglob("*") if p.is_file() and phrase in p.read_text(errors="ignore")]
    if not core:
        failures.append(f"{phrase!r}: not in the C core ({', '.join(CORE)})")
    for folder, pattern in SHIMS:
        for path in sorted((root / folder).rglob(pattern)):
            if phrase in path.read_text():
                failures.append(f"{path.relative_to(root)}: says {phrase!r}, which the C core writes")
for failure in failures:
    print(f"FAIL: {failure}")
print(f"{len(PHRASES) * (1 + len(SHIMS)) - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
