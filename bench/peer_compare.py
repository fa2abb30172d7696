#!/usr/bin/env python3
# ZEST's GPT example against the same model in Python torch (bench/peer:
# DistributedDataParallel and ZeroRedundancyOptimizer on gloo, Debian's
# python3-torch), on 2 ranks of one torch thread each, fp32 AdamW, the same
# corpus, batches and hyper-parameters; parameter counts asserted equal.
#
# Per size, rounds of single runs, each ZEST run followed by a torch run (the
# torch configurations in turn), each run's 1-minute load average read from
# /proc/loadavg before it starts. A run's figure is the median of its step
# times after 3 untimed steps (both programs' "timing ... step_ms_median="
# line); a configuration's is the median of its runs'. Printed per size:
#
#   ZEST stage S over BACKEND / torch DDP   target <= 0.9 (issue 24)
#   the 1->2-rank overhead                  t(2 ranks) / t(1 rank) - 1, the
#                                           same rows per rank (1 rank runs
#                                           half the global batch); target:
#                                           ZEST's <= DDP's
#
# Backends: "threads" (gpt --ranks 2, in-process ranks) and "mpi" (mpirun
# -np 2 gpt --launch); the 1-rank runs are in-process.
#
#   bench/peer_compare.py                          every size, stage, backend
#   bench/peer_compare.py --sizes 25m --stages 2,3 --rounds 3
#   bench/peer_compare.py --sizes 25m --torch-huge-pages   torch's tensors in huge pages too
#   bench/peer_compare.py --check                  a quick equivalence check (ctest)
#
# When /usr/bin/python3 cannot import torch it runs scripts/setup.sh --peer
# (apt-get install python3-torch); --check exits 77 (skipped) instead.
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.path.join(HERE, "peer", "gpt_torch.py")
SKIP = 77

# Sizes by name: gpt flags. 834k is the example's default model.
SIZES = {
    "163k": ["--layers", "12", "--heads", "4", "--d-model", "32"],     # 162,752 parameters
    "834k": ["--layers", "4", "--heads", "4", "--d-model", "128"],     # 834,304
    "25m": ["--layers", "8", "--heads", "8", "--d-model", "512", "--context", "128"],  # 25,416,704
    "tiny": ["--layers", "2", "--heads", "4", "--d-model", "32"],      # 35,712 (--check)
}
DEFAULT_STEPS = {"163k": 30, "834k": 20, "25m": 8, "tiny": 4}
# Open MPI as the MPI tests run it (tests/comm/mpi/CMakeLists.txt says why).
MPI_ENV = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "OMPI_MCA_hwloc_base_binding_policy": "none", "OMPI_MCA_orte_base_help_aggregate": "0"}

# Huge pages for torch's tensors, for a like-for-like comparison with ZEST's
# examples (zest::use_huge_page_host_tensors): glibc's malloc advises them
# (glibc 2.35 on), and PyTorch 2.x's allocator reads THP_MEM_ALLOC_ENABLE.
TORCH_HUGE_PAGES_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "THP_MEM_ALLOC_ENABLE": "1"}

TIMING = re.compile(r"^timing .*step_ms_median=([0-9.]+) timed_steps=(\d+)(.*)$", re.M)
PHASE = re.compile(r"(\w+)_ms=([0-9.]+)")  # on the timing line, after timed_steps
ZEST_PARAMS = re.compile(r"GPT of (\d+) parameters")
PEER_PARAMS = re.compile(r"^parameters=(\d+)", re.M)
ZEST_VAL = re.compile(r"^final validation loss, stage \d+: (\S+)", re.M)
PEER_VAL = re.compile(r"^final validation loss: (\S+)", re.M)


class Failure(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="peer_compare.py",
        description="ZEST's gpt example against the same GPT in Python torch (DDP and ZeroRedundancyOptimizer on "
        "gloo), 2 ranks of one thread: median step times, ZEST / DDP and the 1->2-rank overheads per size, stage "
        "and backend, each run's load average beside it (targets: <= 0.9x DDP; overhead <= DDP's).")
    p.add_argument("--gpt", default=os.path.join(ROOT, "build", "examples", "gpt", "gpt"),
                   help="the gpt example (default: build/examples/gpt/gpt)")
    p.add_argument("--python", default=os.environ.get("ZEST_PEER_PYTHON") or "/usr/bin/python3",
                   help="the Python with Debian's torch (default: $ZEST_PEER_PYTHON, else /usr/bin/python3)")
    p.add_argument("--mpirun", default="mpirun", help="Open MPI's launcher, for the mpi backend")
    p.add_argument("--sizes", default="163k,834k,25m", help=f"of {', '.join(SIZES)}")
    p.add_argument("--stages", default="0,1,2,3", help="ZEST's ZeRO stages, e.g. 2,3")
    p.add_argument("--backends", default="threads,mpi",
                   help="threads: gpt --ranks 2 (in-process); mpi: mpirun -np 2 gpt --launch")
    p.add_argument("--peers", default="ddp,zero1", help="torch configurations on 2 ranks (ddp, zero1)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each ZEST configuration")
    p.add_argument("--steps", type=int, default=0, help="per run; 0: per size (163k 30, 834k 20, 25m 8)")
    p.add_argument("--batch", type=int, default=16, help="global rows of a context's bytes on 2 ranks")
    p.add_argument("--timeout", type=int, default=1800, help="seconds a run may take")
    p.add_argument("--max-load", type=float, default=0.0,
                   help="before each run wait (up to 2 minutes) for the 1-minute load to fall to this; 0: no wait")
    p.add_argument("--torch-huge-pages", action="store_true",
                   help="run torch with glibc advising huge pages for its tensors (GLIBC_TUNABLES=glibc.malloc."
                   "hugetlb=1; THP_MEM_ALLOC_ENABLE=1 for PyTorch 2.x), as ZEST's examples keep libtorch's large "
                   "tensors (ZEST_HOST_TENSOR_CACHE=0 turns that off)")
    p.add_argument("--check", action="store_true",
                   help="run the tiny model for 4 steps in both and compare parameters and validation loss")
    a = p.parse_args(argv)
    try:
        a.sizes = [s.strip().lower() for s in a.sizes.split(",") if s.strip()]
        a.stages = [int(s) for s in a.stages.split(",")]
        a.backends = [b.strip() for b in a.backends.split(",")]
        a.peers = [m.strip() for m in a.peers.split(",")]
    except ValueError:
        p.error(f"--stages {a.stages}: expected stage numbers separated by commas, e.g. 0,1,2,3")
    for s in a.sizes:
        if s not in SIZES:
            p.error(f"--sizes: unknown size '{s}' (known: {', '.join(SIZES)})")
    if not a.stages or any(s not in (0, 1, 2, 3) for s in a.stages):
        p.error(f"--stages {a.stages}: each must be 0, 1, 2 or 3")
    if not a.backends or any(b not in ("threads", "mpi") for b in a.backends):
        p.error(f"--backends {a.backends}: each must be threads or mpi")
    if not a.peers or any(m not in ("ddp", "zero1") for m in a.peers):
        p.error(f"--peers {a.peers}: each must be ddp or zero1")
    if a.rounds < 1 or a.steps < 0 or a.batch < 2 or a.batch % 2 or a.timeout < 1:
        p.error("--rounds and --timeout must be at least 1, --steps at least 0, --batch even and at least 2")
    # The runs start in the peer's directory: a relative path is the caller's.
    a.gpt = os.path.abspath(a.gpt)
    if not os.access(a.gpt, os.X_OK):
        p.error(f"--gpt {a.gpt} is not an executable: build it (cmake --build build --target gpt, "
                "with -DZEST_TORCH=ON) or pass its path")
    return a


def torch_importable(python):
    """Whether `python` imports torch; run from / so that the repository's torch/ cannot shadow it."""
    try:
        r = subprocess.run([python, "-c", "import torch"], cwd="/", capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def ensure_torch(python):
    if torch_importable(python):
        return
    print(f"peer_compare.py: {python} cannot import torch; installing Debian's python3-torch (scripts/setup.sh --peer)",
          flush=True)
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh"), "--peer"], check=False)
    if not torch_importable(python):
        raise Failure(f"{python} still cannot import torch: install python3-torch (Debian) or pass --python")


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def settled_load(limit):
    """The 1-minute load, after waiting up to 2 minutes for it to reach `limit` (when positive)."""
    deadline = time.monotonic() + 120
    while limit > 0 and load1() > limit and time.monotonic() < deadline:
        time.sleep(5)
    return load1()


def run(cmd, timeout, env=None):
    """Runs cmd; its output, or Failure naming the command and the end of its output."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    try:
        r = subprocess.run(cmd, cwd=os.path.dirname(PEER), env=full_env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"{' '.join(cmd)} ran past {timeout} s (--timeout)") from e
    out = r.stdout + r.stderr
    if r.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited with {r.returncode}:\n{out[-3000:]}")
    return out


def find(regex, out, what, cmd):
    m = regex.search(out)
    if not m:
        raise Failure(f"no {what} in the output of {' '.join(cmd)}:\n{out[-3000:]}")
    return m.group(1)


class Config:
    """One thing to time: ZEST (stage, backend) or a torch peer (mode), on 1 or 2 ranks."""

    def __init__(self, kind, ranks, stage=None, backend="threads", mode=None):
        self.kind, self.ranks, self.stage, self.backend, self.mode = kind, ranks, stage, backend, mode
        self.ms, self.loads, self.phases = [], [], []

    @property
    def name(self):
        ranks = "2 ranks" if self.ranks == 2 else "1 rank"
        if self.kind == "zest":
            return f"ZEST stage {self.stage} {self.backend + ' ' if self.ranks == 2 else ''}{ranks}"
        return f"torch {'DDP' if self.mode == 'ddp' else 'ZeRO-1'} gloo {ranks}"

    def command(self, a, size, steps, extra=()):
        common = SIZES[size] + ["--steps", str(steps), "--batch", str(a.batch // 2 * self.ranks)] + list(extra)
        if self.kind == "torch":
            return [a.python, PEER, "--mode", self.mode, "--ranks", str(self.ranks)] + common, \
                (TORCH_HUGE_PAGES_ENV if a.torch_huge_pages else None)
        flags = ["--stage", str(self.stage), "--eval-every", "1000000", "--print-every", "1000000",
                 "--sample-bytes", "0"] + common
        if "--val-windows" not in extra:
            flags += ["--val-windows", str(self.ranks)]
        if self.backend == "mpi":
            return [a.mpirun, "-np", str(self.ranks), "--allow-run-as-root", a.gpt, "--launch"] + flags, MPI_ENV
        return [a.gpt, "--ranks", str(self.ranks)] + flags, None

    def measure(self, a, size, steps):
        cmd, env = self.command(a, size, steps)
        load = settled_load(a.max_load)
        out = run(cmd, a.timeout, env)
        ms = float(find(TIMING, out, "timing line", cmd))
        self.phases.append({k: float(v) for k, v in PHASE.findall(TIMING.search(out).group(3))})
        params = int(find(ZEST_PARAMS if self.kind == "zest" else PEER_PARAMS, out, "parameter count", cmd))
        self.ms.append(ms)
        self.loads.append(load)
        print(f"  {self.name:<34} {ms:10.2f} ms  (load {load:.2f})", flush=True)
        return params

    def median(self):
        return statistics.median(self.ms)


def fmt_ratio(x):
    return f"{x:.2f}x"


def report(size, params, steps, configs, a):
    by = {(c.kind, c.ranks, c.stage, c.backend, c.mode): c for c in configs}
    ddp2, ddp1 = by.get(("torch", 2, None, "threads", "ddp")), by.get(("torch", 1, None, "threads", "ddp"))
    zero2 = by.get(("torch", 2, None, "threads", "zero1"))
    context = SIZES[size][SIZES[size].index("--context") + 1] if "--context" in SIZES[size] else "64"
    print(f"\n== {size}: {params} parameters ({' '.join(SIZES[size])}), global batch {a.batch} x {context} bytes, "
          f"{steps} steps a run (median after 3), {a.rounds} rounds ==")
    print(f"{'configuration':<34} {'median ms':>10} {'runs':>5} {'load 1-min':>12} {'/ DDP':>7} {'/ ZeRO-1':>9}"
          f" {'1->2 ranks':>11}")
    ddp_over = ddp2.median() / ddp1.median() - 1 if ddp2 and ddp1 else None
    verdicts = []
    for c in configs:
        loads = f"{min(c.loads):.2f}-{max(c.loads):.2f}"
        vs_ddp = fmt_ratio(c.median() / ddp2.median()) if ddp2 and c.ranks == 2 and c is not ddp2 else ""
        vs_zero = fmt_ratio(c.median() / zero2.median()) if zero2 and c.ranks == 2 and c.kind == "zest" else ""
        over = ""
        one = by.get(("zest", 1, c.stage, "threads", None)) if c.kind == "zest" else (ddp1 if c is ddp2 else None)
        if c.ranks == 2 and one:
            over = f"{(c.median() / one.median() - 1) * 100:+.0f}%"
        print(f"{c.name:<34} {c.median():10.2f} {len(c.ms):>5} {loads:>12} {vs_ddp:>7} {vs_zero:>9} {over:>11}")
        if c.kind == "zest" and c.ranks == 2 and ddp2:
            ratio = c.median() / ddp2.median()
            verdicts.append(f"{size} stage {c.stage} {c.backend}: {ratio:.2f}x DDP "
                            f"{'met' if ratio <= 0.9 else 'MISSED'} (<= 0.9x)")
            if one and ddp_over is not None:
                z_over = c.median() / one.median() - 1
                verdicts.append(f"{size} stage {c.stage} {c.backend}: 1->2 overhead {z_over * 100:+.0f}% against DDP's "
                                f"{ddp_over * 100:+.0f}% {'met' if z_over <= ddp_over else 'MISSED'}")
    print("targets:\n  " + "\n  ".join(verdicts))
    print("phases, ms (medians over the runs of each run's medians; ZEST: the engine's StepTimes, the rest is "
          "batch, forward and backward; torch: forward with the batch, backward with DDP's all-reduce):")
    for c in configs:
        names = list(c.phases[0]) if c.phases else []
        print(f"  {c.name:<34} " + "  ".join(f"{n} {statistics.median(p[n] for p in c.phases):.2f}" for n in names))


def compare_size(a, size):
    steps = a.steps or DEFAULT_STEPS[size]
    zest = [Config("zest", 2, s, b) for b in a.backends for s in a.stages]
    zest += [Config("zest", 1, s) for s in a.stages]
    peers = [Config("torch", 2, mode=m) for m in a.peers] + [Config("torch", 1, mode="ddp")]
    print(f"\n{size}: {len(zest) + len(zest)} runs a round", flush=True)
    counts = set()
    for r in range(a.rounds):
        print(f"round {r + 1} of {a.rounds}", flush=True)
        for i, z in enumerate(zest):
            counts.add(("ZEST", z.measure(a, size, steps)))
            p = peers[(i + r) % len(peers)]
            counts.add(("torch", p.measure(a, size, steps)))
            if len({n for _, n in counts}) != 1:
                raise Failure(f"{size}: the parameter counts differ: {sorted(counts)}; the models are not the same")
    report(size, counts.pop()[1], steps, peers + zest, a)


def check(a):
    """The tiny model, 4 steps (2 at lr 0, 2 learning), on 2 ranks in both: equal parameter counts and
    final validation losses (the same init, batches, forward and AdamW) within 1e-6."""
    extra = ["--warmup", "2", "--val-windows", "8"]
    z = Config("zest", 2, 0).command(a, "tiny", 4, extra)[0]
    t = Config("torch", 2, mode="ddp").command(a, "tiny", 4, extra)[0]
    zo, to = run(z, a.timeout), run(t, a.timeout)
    zp, tp = int(find(ZEST_PARAMS, zo, "parameter count", z)), int(find(PEER_PARAMS, to, "parameter count", t))
    zv, tv = float(find(ZEST_VAL, zo, "final validation loss", z)), float(find(PEER_VAL, to, "final validation loss", t))
    for cmd, out in ((z, zo), (t, to)):
        find(TIMING, out, "timing line", cmd)
    print(f"parameters: ZEST {zp}, torch {tp}\nfinal validation loss: ZEST {zv!r}, torch {tv!r}")
    if zp != tp:
        raise Failure(f"the parameter counts differ: ZEST {zp}, torch {tp}")
    if abs(zv - tv) > 1e-6:
        raise Failure(f"the validation losses after 4 steps differ by {abs(zv - tv):.3g} (> 1e-6)")
    print("peer check ok: the same model, batches and optimizer")


def main(argv):
    a = parse_args(argv)
    try:
        if a.check:
            if not torch_importable(a.python):
                print(f"SKIPPED: {a.python} cannot import torch; install Debian's python3-torch "
                      "(scripts/setup.sh --peer) to run the peer check")
                return SKIP
            check(a)
            return 0
        ensure_torch(a.python)
        print(f"peer comparison, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, gpt {a.gpt}")
        cache = os.environ.get("ZEST_HOST_TENSOR_CACHE", "")
        print(f"libtorch's tensors of 2 MiB and more: ZEST {'in malloc' if cache == '0' else 'in its huge page cache'} "
              f"(ZEST_HOST_TENSOR_CACHE={cache or 'unset'}), torch "
              f"{'with huge pages advised (--torch-huge-pages)' if a.torch_huge_pages else 'in malloc'}")
        for size in a.sizes:
            compare_size(a, size)
    except Failure as e:
        print(f"peer_compare.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
