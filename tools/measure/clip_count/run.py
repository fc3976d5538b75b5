"""How often Adam's step bound clips in the convergence demo's 1-bit Adam run (docs/benchmarks/demo.md,
"Steps under a frozen variance"): the demo's "onebit" run (4 ranks, 600 steps, freeze at 90, the
preload), each rank counting through sitecustomize.py beside this file.

    /usr/bin/python3 tools/measure/clip_count/run.py [OUT_DIR]    # prints rank 0's counts
"""
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "clip-count"))
    os.makedirs(out, exist_ok=True)
    os.environ["CLIP_COUNT_OUT"] = os.path.join(out, "counts")
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")])
    spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "tools", "demo", "onebit-demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    config = dict(backend="preload", steps=600, freeze=90, lr=2e-3, width=64, layers=2, context=64, batch=8, seed=1,
                  eval_every=50, val_batches=8, lamb_lr=2e-2, optimizer="onebit")
    logs = demo.launch(config, 4, out, os.path.join(ROOT, "build", "release", "libonebit-preload.so"))
    with open(os.environ["CLIP_COUNT_OUT"] + "-0.json") as f:
        print(f"validation loss {logs[0]['val'][-1][1]:.4f}; rank 0: {json.load(f)}")


if __name__ == "__main__":
    main()
