#!/usr/bin/env python3
# The GPT example's peer in Python torch: examples/gpt's model, corpus,
# batches and optimizer (AdamW, betas 0.9 and 0.95, eps 1e-8, weight decay
# 0.1 but none for the 1-D parameters, gradient clipping at 1, linear warmup
# then cosine decay to a tenth) trained by torch's own data parallelism on
# gloo, one process and one torch thread per rank:
#
#   --mode ddp     DistributedDataParallel, torch.optim.AdamW on every rank
#   --mode zero1   DistributedDataParallel with ZeroRedundancyOptimizer
#                  (each rank steps its shard of AdamW's state, then
#                  broadcasts its parameters): torch's ZeRO stage 1
#
#   python3 bench/peer/gpt_torch.py --ranks 2 --mode ddp --steps 20
#
# The flags that the gpt example shares have its defaults and meanings.
# Rank 0 prints "parameters=N", then a line for scripts
#   timing mode=ddp ranks=2 step_ms_median=12.345 timed_steps=17 forward_ms=...
# (the median of rank 0's step times, batch to optimizer step, leaving out
# the first 3 steps when there are more, as examples/gpt/main.cpp times
# its; then the medians of the step's phases: batch and forward, backward
# with DDP's all-reduce, gradient clipping, optimizer step), then, with --val-windows, the validation loss after the last step
# as the example computes it ("final validation loss: X", all digits).
# Run it as a script (not with the repository root as the working
# directory and `python3 -c`: the root's torch/ would shadow the package).
import argparse
import math
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its pool; --threads sets it per rank too

SKIP = 77  # the exit status ctest reads as "skipped"
UNTIMED_STEPS = 3

# This directory (corpus.py, model.py) stays; the repository root, whose
# torch/ would shadow the installed package, and the working directory go.
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
sys.path = [_HERE] + [p for p in sys.path if p not in ("", _HERE) and os.path.abspath(p) != _ROOT]
try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
except ImportError as e:
    print(f"gpt_torch.py: {sys.executable} cannot import torch ({e}): install Debian's python3-torch "
          "(scripts/setup.sh --peer) and run this with /usr/bin/python3", file=sys.stderr)
    sys.exit(SKIP)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from corpus import Corpus, CorpusError  # noqa: E402 (after the torch check)
from model import Config, Gpt, lm_loss  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(prog="gpt_torch.py", description="examples/gpt's GPT in torch DDP / ZeRO-1 (gloo)")
    p.add_argument("--mode", choices=("ddp", "zero1"), default="ddp")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="global rows of --context bytes per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--schedule-steps", type=int, default=0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--untied", action="store_true")
    p.add_argument("--data", default="/usr/share/games/fortunes")
    p.add_argument("--val-windows", type=int, default=0, help="0: no validation loss")
    p.add_argument("--print-every", type=int, default=0, help="0: no per-step lines")
    a = p.parse_args(argv)
    for name in ("ranks", "steps", "batch", "threads", "layers", "heads", "d_model", "context"):
        if getattr(a, name) < (0 if name == "steps" else 1):
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)} is too small")
    if a.vocab < 256:
        p.error(f"--vocab {a.vocab} is below 256, the byte values the corpus holds")
    if a.d_model % a.heads != 0:
        p.error(f"--d-model {a.d_model} does not divide into --heads {a.heads}")
    if a.batch % a.ranks != 0:
        p.error(f"--batch {a.batch} does not divide into {a.ranks} ranks")
    if a.val_windows and a.val_windows < a.ranks:
        p.error(f"--val-windows {a.val_windows} is fewer than the {a.ranks} ranks")
    return a


def lr_for_step(a, applied):
    """zest::lr_for_step for WarmupCosineLR as examples/gpt configures it."""
    it = applied - 1
    warmup = max(2, a.warmup)
    total = max(a.schedule_steps if a.schedule_steps > 0 else a.steps, warmup + 1)
    if it < 0:
        return 0.0
    if it < warmup:
        return a.lr * (it / warmup)
    progress = min(1.0, (it - warmup + 1) / max(1, total - warmup))
    return a.lr * max(0.0, 0.1 + 0.9 * (1.0 + math.cos(math.pi * progress)) / 2.0)


def validation_loss(model, corpus, a, world):
    """examples::validation_loss: each rank's share in chunks of 16, summed in that order."""
    windows = min(a.val_windows, corpus.validation_window_count(a.context, a.val_windows)) // world * world
    if windows < world:
        raise CorpusError(f"the validation split has fewer than {world} windows of {a.context} bytes")
    share, total = windows // world, 0.0
    with torch.no_grad():
        for r in range(world):
            for w in range(share * r, share * (r + 1), 16):
                inputs, targets = corpus.validation_windows(w, min(16, share * (r + 1) - w), a.context)
                logits = model(inputs)
                total += float(torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum").double())
    return total / (windows * a.context)


def run_rank(rank, a, init_method, corpus):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=a.ranks)
    config = Config(a.vocab, a.context, a.layers, a.heads, a.d_model, not a.untied)
    model = Gpt(config, a.seed)
    count = sum(p.numel() for p in model.parameters())
    if count != config.parameters():
        raise AssertionError(f"the module holds {count} parameters, Config.parameters() says {config.parameters()}")
    ddp = DistributedDataParallel(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    hyper = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    if a.mode == "ddp":
        opt = torch.optim.AdamW(groups, **hyper)
    else:
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **hyper)
    if rank == 0:
        print(f"parameters={count} ({config}), {a.mode} on {a.ranks} ranks, fp32 AdamW", flush=True)
    rows = a.batch // a.ranks
    phases = {"step_ms": [], "forward_ms": [], "backward_ms": [], "clip_ms": [], "optimizer_ms": []}
    for step in range(a.steps):
        t = [time.perf_counter()]
        inputs, targets = corpus.train_batch(step, rank * rows, rows, a.context, a.seed)
        loss = lm_loss(ddp(inputs), targets)
        t.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        value = loss.item()
        t.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t.append(time.perf_counter())
        for g in opt.param_groups:
            g["lr"] = lr_for_step(a, step)
        opt.step()
        t.append(time.perf_counter())
        phases["step_ms"].append((t[-1] - t[0]) * 1e3)
        for i, name in enumerate(("forward_ms", "backward_ms", "clip_ms", "optimizer_ms")):
            phases[name].append((t[i + 1] - t[i]) * 1e3)
        if a.print_every and (step % a.print_every == 0 or step == a.steps - 1):  # every rank: collective
            mean = torch.tensor([value])
            dist.all_reduce(mean)
            if rank == 0:
                print(f"step {step:5d}  loss {mean.item() / a.ranks:.4f}  lr {lr_for_step(a, step):.2e}  "
                      f"{phases['step_ms'][-1]:7.1f} ms", flush=True)
    skip = UNTIMED_STEPS if a.steps > UNTIMED_STEPS else 0
    medians = {k: statistics.median(v[skip:]) if v[skip:] else 0.0 for k, v in phases.items()}
    if rank == 0:
        rest = " ".join(f"{k}={v:.3f}" for k, v in medians.items() if k != "step_ms")
        print(f"timing mode={a.mode} ranks={a.ranks} step_ms_median={medians['step_ms']:.3f} "
              f"timed_steps={a.steps - skip} {rest}", flush=True)
        if a.val_windows:
            print(f"final validation loss: {validation_loss(model, corpus, a, a.ranks):.17g}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    a = parse_args(argv)
    try:
        corpus = Corpus.load(a.data)
    except CorpusError as e:
        print(f"gpt_torch.py: {e}", file=sys.stderr)
        return 1
    init_method = f"tcp://127.0.0.1:{free_port()}"
    try:
        mp.spawn(run_rank, args=(a, init_method, corpus), nprocs=a.ranks, join=True)
    except mp.ProcessRaisedException as e:
        print(f"gpt_torch.py: a rank failed:\n{e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
