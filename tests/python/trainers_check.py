"""onebit's optimizers inside the trainers people use (issue 28), the way a user runs them: PyPI's
transformers, accelerate and lightning over pip's torch, 2 CPU ranks under torch.distributed.run,
onebit.integrations.init_process_group() first, a GPT-2 from GPT2Config (random init, 2 layers,
no dropout) learning the bytes of docs/usage/pytorch.md, with each framework's integration helper:

  hf-adam      HF Trainer, optimizers=(OnebitAdam(...), None), OnebitTrainerCallback
  hf-cls       HF Trainer, optimizer_cls_and_kwargs=(onebit.OnebitAdam, {...})
  hf-zero-one  HF Trainer, ZeroOneAdam
  hf-lamb      HF Trainer, OnebitLamb
  accelerate   Accelerate, one prepare(model, optimizer, dataloader) call, prepare_accelerator()
  lightning    Lightning, DDPStrategy(process_group_backend="onebit"), OnebitLightningCallback
  accelerate-zero-one, lightning-zero-one: the same with ZeroOneAdam, whose replicas differ between
               syncs: the integration synchronizes them before the save (held: it did, at least once)
  hf-without-callback  HF Trainer and OnebitAdam without the integration: rank 0 warns that DDP
               averages the gradients (naming the MB) and that its state_dict() holds its own error
               feedback only; the resume is refused on rank 1, naming the ranks and the remedy
  compiled     no framework: register_comm_hook() finds the DDP through torch.compile's wrapper,
               compiled outside DDP and inside it, and training through the compiled model keeps
               DDP's fp32 average out of the compression stage (no resume: the step is the same)

Each case trains STEPS steps saving the framework's own checkpoint at step SAVE (from rank 0, as
the framework does), then fresh processes resume from that checkpoint. Held to:
  - the resumed run's parameters are bitwise the uninterrupted run's, on every rank;
  - the ranks' parameters are bitwise equal;
  - compressed all_reduces ran, and in the compression stage less than one fp32 copy of the model
    went through the backend's full-precision all_reduce in all (no DDP gradient average: the hook);
  - the loss falls like torch.optim.Adam's on gloo in the same Trainer (the reference case
    "hf-torch-adam"): the last LAST logged losses' mean at most BAND above Adam's.

A case whose package is missing is skipped, saying so; with none of them the check exits 77.

    PYTHON tests/python/trainers_check.py BUILD_DIR [CASE ...]
"""
import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

WORLD, STEPS, SAVE, FREEZE, BATCH, SEQ, LR = 2, 36, 24, 12, 4, 32, 1e-3
LAMB_LR = 3e-2  # LAMB's layer-wise trust ratio wants a larger lr than Adam's
LAST, BAND = 6, 0.25
CASES = ("hf-torch-adam", "hf-adam", "hf-cls", "hf-zero-one", "hf-lamb", "hf-without-callback", "accelerate",
         "accelerate-zero-one", "lightning", "lightning-zero-one", "compiled")
PACKAGE = {case: "transformers" if case.startswith("hf-") else case.split("-")[0] for case in CASES}
PACKAGE["compiled"] = "torch"


# ---- in a rank ------------------------------------------------------------------------------

def make_model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=SEQ, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


class Bytes:
    """docs/usage/pytorch.md's bytes as SEQ-byte sequences: one epoch is SAVE / 2 steps of BATCH per rank."""

    def __init__(self):
        import torch
        with open(os.path.join(ROOT, "docs", "usage", "pytorch.md"), "rb") as f:
            data = torch.tensor(list(f.read()), dtype=torch.long)
        count = SAVE // 2 * BATCH * WORLD
        self.items = [data[i * SEQ:(i + 1) * SEQ] for i in range(count)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


def make_optimizer(case, params):
    import torch
    import onebit
    if case == "hf-torch-adam":
        return torch.optim.Adam(params, lr=LR)
    if case.endswith("zero-one"):
        # Its compression stage (local steps and syncs) follows step var_freeze_step; syncs come
        # after steps 10, 11, 15, 31 (from 0; the interval doubles up to 16) — so the replicas
        # differ at the save (after 24 steps) and at the end.
        return onebit.ZeroOneAdam(params, lr=LR, var_freeze_step=FREEZE - 3, local_step_scaler=1,
                                  local_step_clipper=16)
    if case == "hf-lamb":
        return onebit.OnebitLamb(params, lr=LAMB_LR, freeze_step=FREEZE)
    return onebit.OnebitAdam(params, lr=LR, freeze_step=FREEZE)


def flat_parameters(model):
    import torch
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


class Recorder:
    """The backend's full-precision bytes when the compression stage starts and at the end."""

    def __init__(self):
        self.at_freeze = None

    def step(self, step):
        if step == FREEZE:
            self.at_freeze = self.forwarded()

    @staticmethod
    def forwarded():
        from onebit.backend import backend_stats
        return backend_stats()["forwarded_bytes"]

    def result(self, model, losses, resumed, wrapped):
        import torch
        import torch.distributed as dist
        import onebit
        stats = onebit.stats() if dist.get_backend() == "onebit" else {"compressed_calls": 0}
        at_freeze = 0 if resumed else self.at_freeze
        return dict(params=flat_parameters(model).numpy().view("uint32").tolist(), losses=losses,
                    compressed_calls=stats["compressed_calls"],
                    forwarded_in_compression=None if at_freeze is None else self.forwarded() - at_freeze,
                    model_bytes=4 * sum(p.numel() for p in model.parameters()),
                    ddp=isinstance(wrapped, torch.nn.parallel.DistributedDataParallel))


def hf_case(case, phase, out):
    from transformers import Trainer, TrainerCallback, TrainingArguments
    import onebit
    import onebit.integrations as integrations
    if case == "hf-torch-adam":
        import torch.distributed as dist
        dist.init_process_group("gloo")
    else:
        integrations.init_process_group()
    model = make_model()
    recorder = Recorder()

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            recorder.step(state.global_step)

    args = TrainingArguments(output_dir=os.path.join(out, case), per_device_train_batch_size=BATCH, max_steps=STEPS,
                             save_strategy="steps", save_steps=SAVE, logging_steps=1, report_to="none",
                             use_cpu=True, lr_scheduler_type="constant", seed=0, disable_tqdm=True,
                             dataloader_num_workers=0, learning_rate=LR)
    callbacks = [Record()] if case == "hf-without-callback" else [integrations.OnebitTrainerCallback(), Record()]
    if case == "hf-cls":
        trainer = Trainer(model=model, args=args, train_dataset=Bytes(), callbacks=callbacks,
                          optimizer_cls_and_kwargs=(onebit.OnebitAdam, dict(lr=LR, freeze_step=FREEZE)))
    else:
        trainer = Trainer(model=model, args=args, train_dataset=Bytes(), callbacks=callbacks,
                          optimizers=(make_optimizer(case, model.parameters()), None))
    resume = os.path.join(out, case, f"checkpoint-{SAVE}") if phase == "resume" else None
    trainer.train(resume_from_checkpoint=resume)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return recorder.result(model, losses, phase == "resume", trainer.model_wrapped)


def accelerate_case(case, phase, out):
    import torch
    from accelerate import Accelerator
    import onebit.integrations as integrations
    integrations.init_process_group()
    accelerator = Accelerator(cpu=True)
    model = make_model()
    optimizer = make_optimizer(case, model.parameters())
    loader = torch.utils.data.DataLoader(Bytes(), batch_size=BATCH, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    integrations.prepare_accelerator(accelerator)
    recorder, losses, step = Recorder(), [], 0
    where = os.path.join(out, case, f"state-{SAVE}")
    if phase == "resume":
        accelerator.load_state(where)
        step = SAVE
    while step < STEPS:
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            losses.append(accelerator.gather(loss.detach()).mean().item())
            recorder.step(step)
            if step == SAVE and phase == "full":
                accelerator.save_state(where)
            if step == STEPS:
                break
    integrations.synchronize(optimizer)  # a loop of one's own ends on equal replicas by this call
    return recorder.result(accelerator.unwrap_model(model), losses, phase == "resume", model)


def lightning_case(case, phase, out):
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy
    import onebit.integrations as integrations
    integrations.init_process_group()
    recorder, losses, wrapped = Recorder(), [], []

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = make_model()

        def training_step(self, batch, index):
            return self.model(**batch).loss

        def on_train_batch_end(self, outputs, batch, index):
            wrapped.append(self.trainer.strategy.model)  # Lightning unwraps the model when fit ends
            losses.append(self.all_gather(outputs["loss"].detach()).mean().item())
            recorder.step(self.trainer.global_step)

        def configure_optimizers(self):
            return make_optimizer(case, self.parameters())

    module = Module()
    where = os.path.join(out, case)
    # Saved at the end of a batch that ends an epoch: what Lightning resumes exactly with a plain
    # DataLoader (from an epoch-end save it replays a batch; from mid-epoch it restarts the epoch).
    checkpoints = ModelCheckpoint(dirpath=where, every_n_train_steps=SAVE, save_top_k=-1, filename="{epoch}-{step}")
    trainer = pl.Trainer(accelerator="cpu", devices=WORLD, strategy=DDPStrategy(process_group_backend="onebit"),
                         max_steps=STEPS, callbacks=[integrations.OnebitLightningCallback(), checkpoints],
                         enable_progress_bar=False, logger=False, enable_model_summary=False,
                         num_sanity_val_steps=0, deterministic=True)
    loader = torch.utils.data.DataLoader(Bytes(), batch_size=BATCH, shuffle=False)
    resume = os.path.join(where, f"epoch=1-step={SAVE}.ckpt") if phase == "resume" else None
    trainer.fit(module, loader, ckpt_path=resume)
    return recorder.result(module.model, losses, phase == "resume", wrapped[0])


def compiled_case(case, phase, out):
    import torch
    import onebit
    import onebit.integrations as integrations
    integrations.init_process_group()
    DDP = torch.nn.parallel.DistributedDataParallel
    torch.manual_seed(0)
    outside = DDP(torch.nn.Linear(64, 64))
    probe = onebit.OnebitAdam(outside.parameters(), freeze_step=FREEZE, name="compiled/outside")
    if integrations.register_comm_hook(torch.compile(outside, backend="eager"), probe) is not outside:
        raise SystemExit("register_comm_hook(torch.compile(DDP(model))) did not find the DDP")
    probe.close()
    model = make_model()
    compiled = torch.compile(model, backend="eager")
    ddp = DDP(compiled)
    optimizer = onebit.OnebitAdam(model.parameters(), lr=LR, freeze_step=FREEZE)
    if integrations.register_comm_hook(model, optimizer) is not ddp:
        raise SystemExit("register_comm_hook(model) did not find DDP(torch.compile(model))")
    loader = torch.utils.data.DataLoader(Bytes(), batch_size=BATCH, shuffle=False,
                                         sampler=torch.utils.data.distributed.DistributedSampler(Bytes(), shuffle=False))
    recorder, losses, step = Recorder(), [], 0
    while step < STEPS:
        for batch in loader:
            optimizer.zero_grad()
            loss = ddp(**batch).loss
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
            recorder.step(step)
            if step == STEPS:
                break
    return recorder.result(model, losses, False, ddp)


def worker(case, phase, out):
    import onebit.integrations as integrations
    synchronize, synchronized = integrations.synchronize, []
    integrations.synchronize = lambda *optimizers: synchronized.append(synchronize(*optimizers)) or synchronized[-1]
    run = (hf_case if case.startswith("hf-") else accelerate_case if case.startswith("accelerate") else
           compiled_case if case == "compiled" else lightning_case)
    result = run(case, phase, out)
    result["synchronized"] = sum(synchronized)
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"{case}-{phase}-{rank}.json"), "w") as f:
        json.dump(result, f)


# ---- the driver ------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(case, phase, out, env, fails=False):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), __file__, "worker", case, phase, out]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if fails:
        if done.returncode == 0:
            raise AssertionError(f"the {phase} run exited 0")
        return None, done.stdout
    if done.returncode != 0:
        raise AssertionError(f"{phase} run exited {done.returncode}:\n{done.stdout[-6000:]}")
    results = []
    for rank in range(WORLD):
        with open(os.path.join(out, f"{case}-{phase}-{rank}.json")) as f:
            results.append(json.load(f))
    return results, done.stdout


def check_case(case, out, env, reference):
    """(one line saying what held, the case's mean last losses); AssertionError naming what did not."""
    full, log = launch(case, "full", out, env)
    if case == "hf-without-callback":
        return check_without_callback(case, out, env, log)
    if case != "hf-torch-adam" and "onebit: WARNING" in log:
        raise AssertionError(f"onebit warned in a run with the integration:\n{log[-4000:]}")
    if full[0]["params"] != full[1]["params"]:
        raise AssertionError("the ranks' parameters differ")
    losses = full[0]["losses"]
    last = sum(losses[-LAST:]) / LAST
    if case == "hf-torch-adam":
        return f"torch Adam on gloo: loss {losses[0]:.3f} -> {last:.3f} (mean of the last {LAST})", last
    if not full[0]["ddp"]:
        raise AssertionError("the framework did not wrap the model in DistributedDataParallel: the hook is untested")
    if full[0]["compressed_calls"] <= 0:
        raise AssertionError("no compressed all_reduce ran")
    fp32 = full[0]["forwarded_in_compression"]
    if fp32 is None or fp32 >= full[0]["model_bytes"]:
        raise AssertionError(f"{fp32} bytes went through full-precision all_reduces in the compression stage "
                             f"(the model is {full[0]['model_bytes']} bytes in fp32): DDP still averages gradients")
    if reference is not None and last > reference + BAND:
        raise AssertionError(f"the loss fell to {last:.3f}, more than {BAND} above torch Adam's {reference:.3f}: "
                             f"{losses}")
    if case == "compiled":
        return (f"the DDP found through torch.compile outside and inside; loss {losses[0]:.3f} -> {last:.3f}, "
                f"{fp32} B full-precision in the compression stage"), last
    if case.endswith("zero-one") and not full[0]["synchronized"]:
        raise AssertionError("the replicas never differed when the integration synchronized: the case tests nothing")
    resumed, _ = launch(case, "resume", out, env)
    for rank in range(WORLD):
        if resumed[rank]["params"] != full[rank]["params"]:
            differ = sum(a != b for a, b in zip(resumed[rank]["params"], full[rank]["params"]))
            raise AssertionError(f"rank {rank}: resumed from the step-{SAVE} checkpoint, {differ} parameters differ "
                                 "from the uninterrupted run's")
    return (f"loss {losses[0]:.3f} -> {last:.3f}, {full[0]['compressed_calls']} compressed calls, {fp32} B "
            f"full-precision in the compression stage (model {full[0]['model_bytes']} B); resumed from step {SAVE} "
            "bitwise the uninterrupted run, ranks equal"
            + (f"; {full[0]['synchronized']} synchronizations" if case.endswith("zero-one") else "")), last


def check_without_callback(case, out, env, log):
    """What a user sees who leaves the integration out: warnings while the run can still be fixed,
    and a resume refused with the reason, not a silent mis-resume."""
    for words in ("the gradients arrived already averaged over the ranks", "MB of fp32 gradients per rank and step",
                  "this state_dict() holds rank 0's error feedback only", "consolidate_state_dict()"):
        if words not in log:
            raise AssertionError(f"the run without the integration did not warn '{words}':\n{log[-4000:]}")
    _, refused = launch(case, "resume", out, env, fails=True)
    for words in ("holds the part of rank 0 of 2, not that of rank 1", "consolidate_state_dict()"):
        if words not in refused:
            raise AssertionError(f"the resume's refusal does not say '{words}':\n{refused[-4000:]}")
    return "without the integration: warned of DDP's fp32 average and a rank-0-only state; resume refused, naming " \
        "the ranks", None


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "worker":
        worker(*sys.argv[2:])
        return 0
    if len(sys.argv) < 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    cases = sys.argv[2:] or CASES
    import importlib.util
    missing = {p for p in set(PACKAGE.values()) if importlib.util.find_spec(p) is None}
    if missing == set(PACKAGE.values()):
        print(f"SKIP: none of {sorted(missing)} is installed in {sys.prefix} (tools/pip-torch.sh installs them)")
        return 77
    env = dict(os.environ, ONEBIT_LIBRARY=os.path.join(os.path.abspath(sys.argv[1]), "libonebit.so"),
               PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    failed, reference = [], None
    with tempfile.TemporaryDirectory() as out:
        for case in cases:
            if PACKAGE[case] in missing:
                print(f"SKIP: {case}: {PACKAGE[case]} is not installed")
                continue
            try:
                line, last = check_case(case, out, env, reference)
            except (AssertionError, subprocess.TimeoutExpired) as failure:
                failed.append(case)
                print(f"FAIL: {case}: {failure}", flush=True)
                continue
            if case == "hf-torch-adam":
                reference = last
            print(f"ok: {case}: {line}", flush=True)
    print(f"{len(cases) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
