"""The input-bound job advisor: pure diagnosis functions over per-worker sample series.

Input: for each worker of a running job, a series of :class:`WorkerSample` (GPU utilisation
and memory from the metrics source, CPU use and I/O wait of the worker's process tree), plus
:class:`AdvisorThresholds` (admin-configurable). Output: a list of :class:`Diagnosis`,
each carrying the measurements it was drawn from. No I/O, no clock: tests feed tables.

Codes, checked per worker over the latest ``window`` samples:

- ``input-bound``: the GPUs stay mostly idle while the CPU (all the cores the job may use, or
  one process pegging its core) or I/O wait is saturated: the GPU is starved of data.
- ``stalled``: GPUs idle and CPU idle and no I/O wait: waiting on something else, or stuck.
- ``memory-bound``: GPU memory nearly full with low utilisation (batch size / memory traffic).
- ``straggler``: one worker much slower than the others (step rate when the job reports
  steps, else GPU utilisation).

No diagnosis is drawn from fewer than ``min_samples`` samples of a worker; a measurement that
could not be taken (``None``) never counts as idle or busy.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable

INPUT_BOUND, STALLED, MEMORY_BOUND, STRAGGLER = "input-bound", "stalled", "memory-bound", "straggler"
CODES = (INPUT_BOUND, STALLED, MEMORY_BOUND, STRAGGLER)


@dataclass(frozen=True)
class WorkerSample:
    """One measurement of one worker.

    gpu_util: mean utilisation of the worker's devices, 0-100 (None: no GPU or not measured).
    gpu_mem_used_mb / gpu_mem_total_mb: summed over its devices (None: not measured).
    cpu_percent: CPU use of the worker's process tree since the previous sample, 100 = one core.
    cpu_cores: cores the worker may use (its CPU affinity or limit).
    max_process_cpu_percent: the busiest single process of the tree (a single-threaded loader
    pegs one core while the others idle).
    iowait_fraction: share of the interval the tree spent blocked on I/O, 0-1 (None: unknown).
    read_mb_s: bytes read from storage per second (None: unknown).
    step: the job's latest reported step of this worker (None: it reports none).
    """

    at: float
    gpu_util: float | None = None
    gpu_mem_used_mb: float | None = None
    gpu_mem_total_mb: float | None = None
    cpu_percent: float | None = None
    cpu_cores: float | None = None
    max_process_cpu_percent: float | None = None
    iowait_fraction: float | None = None
    read_mb_s: float | None = None
    step: float | None = None


@dataclass
class Diagnosis:
    code: str
    severity: str  # "warning" | "info"
    message: str
    remedies: list[str] = field(default_factory=list)
    measurements: dict = field(default_factory=dict)
    workers: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class AdvisorThresholds(LoggingConfigurable):
    """When the advisor speaks up. Configure as ``c.AdvisorThresholds.<name>`` in the platform config."""

    min_samples = Integer(
        6, help="No diagnosis from fewer samples than this per worker (6 samples at a 10 s interval = 1 minute). "
        "At least 1.",
    ).tag(config=True)
    window = Integer(
        30, help="Diagnose from the latest N samples of each worker (30 at 10 s = the last 5 minutes).",
    ).tag(config=True)
    gpu_idle_percent = Float(
        30.0, help="Mean GPU utilisation (%) below which a GPU counts as mostly idle (input-bound, stalled). "
        "0 = never idle.",
    ).tag(config=True)
    gpu_low_percent = Float(
        50.0, help="Mean GPU utilisation (%) below which a nearly full GPU memory is reported as memory-bound.",
    ).tag(config=True)
    cpu_saturated_fraction = Float(
        0.8, help="CPU counts as saturated when the worker's processes use at least this share of the cores "
        "they may use (0.8 = 80 %; 1 core of 1, 13 of 16).",
    ).tag(config=True)
    process_busy_percent = Float(
        85.0, help="... or when one process of the worker uses at least this much of one core (%): "
        "a single-threaded data pipeline. 0 = off.",
    ).tag(config=True)
    cpu_idle_percent = Float(
        10.0, help="CPU use (% of one core, whole process tree) below which a worker counts as idle (stalled).",
    ).tag(config=True)
    iowait_fraction = Float(
        0.3, help="Share of time blocked on I/O (0-1) from which I/O counts as saturated (input-bound).",
    ).tag(config=True)
    memory_full_fraction = Float(
        0.9, help="GPU memory use (used/total, 0-1) from which memory counts as nearly full (memory-bound).",
    ).tag(config=True)
    straggler_ratio = Float(
        0.5, help="A worker is a straggler when its rate (steps/s, else GPU utilisation) is below this share of "
        "the median of the other workers (0.5 = half as fast). 0 = off.",
    ).tag(config=True)
    straggler_min_percent = Float(
        20.0, help="Straggler by GPU utilisation only when the other workers' median is at least this (%), "
        "so that idle jobs are not compared.",
    ).tag(config=True)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.trait_names(config=True)}


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _r(v, nd=1):
    return None if v is None else round(float(v), nd)


@dataclass
class WorkerSummary:
    rank: int
    samples: int
    gpu_util: float | None
    mem_fraction: float | None
    gpu_mem_used_mb: float | None
    gpu_mem_total_mb: float | None
    cpu_percent: float | None
    cpu_cores: float | None
    cpu_fraction: float | None
    max_process_cpu_percent: float | None
    iowait_fraction: float | None
    read_mb_s: float | None
    step_rate: float | None

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 3 if k.endswith("fraction") or k == "step_rate" else 1)
        return d


def summarize(rank: int, samples: list[WorkerSample]) -> WorkerSummary:
    """Means over one worker's window (a None measurement is left out of its mean)."""
    used = _mean(s.gpu_mem_used_mb for s in samples)
    total = _mean(s.gpu_mem_total_mb for s in samples)
    fractions = [s.gpu_mem_used_mb / s.gpu_mem_total_mb for s in samples
                 if s.gpu_mem_used_mb is not None and s.gpu_mem_total_mb]
    cpu = _mean(s.cpu_percent for s in samples)
    cores = _mean(s.cpu_cores for s in samples)
    steps = [(s.at, s.step) for s in samples if s.step is not None]
    rate = None
    if len(steps) >= 2 and steps[-1][0] > steps[0][0]:
        rate = max(steps[-1][1] - steps[0][1], 0.0) / (steps[-1][0] - steps[0][0])
    return WorkerSummary(
        rank=rank, samples=len(samples), gpu_util=_mean(s.gpu_util for s in samples),
        mem_fraction=_mean(fractions), gpu_mem_used_mb=used, gpu_mem_total_mb=total,
        cpu_percent=cpu, cpu_cores=cores,
        cpu_fraction=(cpu / (100.0 * cores)) if cpu is not None and cores else None,
        max_process_cpu_percent=_mean(s.max_process_cpu_percent for s in samples),
        iowait_fraction=_mean(s.iowait_fraction for s in samples), read_mb_s=_mean(s.read_mb_s for s in samples),
        step_rate=rate,
    )


def diagnose(series: dict[int, list[WorkerSample]], t: AdvisorThresholds) -> tuple[list[Diagnosis], list[WorkerSummary]]:
    """Diagnoses of one job from its workers' sample series ({rank: samples, oldest first}).

    Returns (diagnoses, per-worker summaries of the windows they were drawn from). Workers with
    fewer than ``t.min_samples`` samples are summarised but not diagnosed.
    """
    window = max(int(t.window), 1)
    summaries = [summarize(rank, list(s)[-window:]) for rank, s in sorted(series.items())]
    ready = [w for w in summaries if w.samples >= max(int(t.min_samples), 1)]
    found: dict[str, list[tuple[WorkerSummary, dict]]] = {}
    for w in ready:
        for code, detail in _worker_findings(w, t):
            found.setdefault(code, []).append((w, detail))
    out = []
    if INPUT_BOUND in found:
        out.append(_input_bound(found[INPUT_BOUND], t))
    if STALLED in found:
        out.append(_stalled(found[STALLED], len(summaries), t))
    if MEMORY_BOUND in found:
        out.append(_memory_bound(found[MEMORY_BOUND], t))
    straggler = _straggler(ready, t) if len(ready) >= 2 and len(ready) == len(summaries) else None
    if straggler is not None:
        out.append(straggler)
    return out, summaries


def _gpu_idle(w: WorkerSummary, t: AdvisorThresholds) -> bool:
    return w.gpu_util is not None and w.gpu_util < t.gpu_idle_percent


def _worker_findings(w: WorkerSummary, t: AdvisorThresholds):
    cpu_saturated = w.cpu_fraction is not None and w.cpu_fraction >= t.cpu_saturated_fraction
    process_pegged = (t.process_busy_percent > 0 and w.max_process_cpu_percent is not None
                      and w.max_process_cpu_percent >= t.process_busy_percent)
    io_saturated = w.iowait_fraction is not None and w.iowait_fraction >= t.iowait_fraction
    input_bound = False
    if _gpu_idle(w, t) and (cpu_saturated or process_pegged or io_saturated):
        input_bound = True
        yield INPUT_BOUND, {"cpu_saturated": cpu_saturated, "process_pegged": process_pegged and not cpu_saturated,
                            "io_saturated": io_saturated}
    cpu_idle = w.cpu_percent is not None and w.cpu_percent < t.cpu_idle_percent
    io_idle = w.iowait_fraction is None or w.iowait_fraction < t.iowait_fraction
    if _gpu_idle(w, t) and cpu_idle and io_idle:
        yield STALLED, {}
    if (not input_bound and w.mem_fraction is not None and w.mem_fraction >= t.memory_full_fraction
            and w.gpu_util is not None and w.gpu_util < t.gpu_low_percent):
        yield MEMORY_BOUND, {}


def _pct(v):
    return "?" if v is None else f"{v:.0f}%"


def _measures(w: WorkerSummary) -> dict:
    return {f"worker_{w.rank}": w.to_dict()}


def _input_bound(items, t: AdvisorThresholds) -> Diagnosis:
    why, remedies = [], []
    measurements: dict = {}
    cpu_sat = any(d["cpu_saturated"] for _, d in items)
    pegged = any(d["process_pegged"] for _, d in items)
    io_sat = any(d["io_saturated"] for _, d in items)
    for w, d in items:
        measurements.update(_measures(w))
        parts = [f"GPU {_pct(w.gpu_util)} busy"]
        if d["cpu_saturated"]:
            parts.append(f"CPU {w.cpu_percent:.0f}% of {w.cpu_cores:g} core(s) ({w.cpu_fraction * 100:.0f}% of what it may use)")
        elif d["process_pegged"]:
            parts.append(f"one process at {w.max_process_cpu_percent:.0f}% of a core")
        if d["io_saturated"]:
            parts.append(f"{w.iowait_fraction * 100:.0f}% of the time waiting on I/O"
                         + (f" (reading {w.read_mb_s:.1f} MB/s)" if w.read_mb_s is not None else ""))
        why.append(f"worker {w.rank}: " + ", ".join(parts))
    if cpu_sat:
        remedies.append("Request more CPU cores for the job (a profile with more CPUs): every core it may use is busy "
                        "while the GPU waits.")
    if pegged or cpu_sat:
        remedies.append("Load data in parallel: raise DataLoader(num_workers=...) (and use pin_memory=True, "
                        "persistent_workers=True) so that decoding runs on several cores instead of one.")
        remedies.append("Pre-convert text or other parsed formats (CSV, JSON, JPEG decoding) to a binary format "
                        "(NumPy/tensor shards) once, instead of parsing on every epoch.")
    if io_sat:
        remedies.append("Pack many small files into large shards with `trainhub.data` (`trainhub data pack`) and read "
                        "them sequentially: per-file opens and small reads leave the GPU waiting.")
        remedies.append("Copy the data set to local disk or cache it in memory when it fits.")
    workers = [w.rank for w, _ in items]
    what = " and ".join(x for x, on in (("CPU", cpu_sat or pegged), ("I/O", io_sat)) if on)
    return Diagnosis(
        code=INPUT_BOUND, severity="warning",
        message=(f"input-bound: the GPU{'s' if len(items) > 1 else ''} of worker{'s' if len(items) > 1 else ''} "
                 f"{', '.join(map(str, workers))} stay mostly idle (below {t.gpu_idle_percent:g}%) while {what} is saturated "
                 f"— the job waits on its input pipeline. " + "; ".join(why)),
        remedies=remedies, measurements=measurements, workers=workers,
    )


def _stalled(items, n_workers: int, t: AdvisorThresholds) -> Diagnosis:
    measurements: dict = {}
    why = []
    for w, _ in items:
        measurements.update(_measures(w))
        why.append(f"worker {w.rank}: GPU {_pct(w.gpu_util)}, CPU {w.cpu_percent:.0f}% of a core")
    workers = [w.rank for w, _ in items]
    remedies = ["Look at the job's last log lines (`trainhub jobs logs ID --tail 20`): is it waiting for a download, "
                "a lock, user input or another service?",
                "See where it is stuck: `py-spy dump --pid PID` on the worker, or faulthandler.dump_traceback_later().",]
    if n_workers > 1:
        remedies.append("With several workers, one waiting in a collective (all-reduce, barrier) usually means "
                        "another worker crashed or is stuck: check every worker's log (`--worker N`).")
    remedies.append("If it cannot make progress, cancel it so that its GPUs go back to the pool.")
    return Diagnosis(
        code=STALLED, severity="warning",
        message=(f"stalled: GPU and CPU both idle on worker{'s' if len(items) > 1 else ''} {', '.join(map(str, workers))} "
                 f"— the job is waiting on something else or stuck. " + "; ".join(why)),
        remedies=remedies, measurements=measurements, workers=workers,
    )


def _memory_bound(items, t: AdvisorThresholds) -> Diagnosis:
    measurements: dict = {}
    why = []
    for w, _ in items:
        measurements.update(_measures(w))
        why.append(f"worker {w.rank}: memory {w.mem_fraction * 100:.0f}% full, GPU {_pct(w.gpu_util)} busy")
    workers = [w.rank for w, _ in items]
    return Diagnosis(
        code=MEMORY_BOUND, severity="info",
        message=(f"memory-bound: GPU memory nearly full (≥ {t.memory_full_fraction * 100:.0f}%) with low utilisation "
                 f"(< {t.gpu_low_percent:g}%) — the batch size or memory traffic limits it. " + "; ".join(why)),
        remedies=[
            "Use mixed precision (bf16/fp16 autocast): half the activation memory and faster kernels.",
            "If the allocator is thrashing near the limit (torch.cuda.memory_stats()['num_alloc_retries'] grows), "
            "lower the batch size a little and keep the effective batch with gradient accumulation.",
            "Trade memory for compute with activation (gradient) checkpointing, then raise the batch size.",
            "Profile the step (torch.profiler): memory-bandwidth-bound kernels gain from fused ops or torch.compile.",
        ],
        measurements=measurements, workers=workers,
    )


def _straggler(ready: list[WorkerSummary], t: AdvisorThresholds) -> Diagnosis | None:
    if t.straggler_ratio <= 0:
        return None
    by_steps = all(w.step_rate is not None for w in ready)
    if by_steps:
        rate = {w.rank: w.step_rate for w in ready}
        unit, floor = "steps/s", 0.0
    elif all(w.gpu_util is not None for w in ready):
        rate = {w.rank: w.gpu_util for w in ready}
        unit, floor = "% GPU", t.straggler_min_percent
    else:
        return None
    slow = []
    for rank, r in rate.items():
        others = statistics.median(v for k, v in rate.items() if k != rank)
        if others > floor and others > 0 and r < t.straggler_ratio * others:
            slow.append((rank, r, others))
    if not slow or len(slow) * 2 > len(rate):  # half the workers slow: that is the job's speed, not a straggler
        return None
    measurements = {f"worker_{w.rank}": w.to_dict() for w in ready}
    measurements["compared_by"] = "step_rate" if by_steps else "gpu_util"
    why = [f"worker {rank}: {r:.3g} {unit} vs {o:.3g} median of the others" for rank, r, o in slow]
    return Diagnosis(
        code=STRAGGLER, severity="warning",
        message=(f"straggler: worker{'s' if len(slow) > 1 else ''} {', '.join(str(s[0]) for s in slow)} much slower "
                 f"than the others (below {t.straggler_ratio:g}× their median) — in synchronous training everyone waits "
                 f"for it. " + "; ".join(why)),
        remedies=["Compare the slow worker's log with the others: uneven data shards (one worker gets more or "
                  "bigger samples) are the usual cause; shard by size, or drop_last=True.",
                  "Check its input pipeline (CPU and I/O figures above) and whether its GPU is shared or throttled.",],
        measurements=measurements, workers=[s[0] for s in slow],
    )
