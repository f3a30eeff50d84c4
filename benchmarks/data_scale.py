"""Preparation time and peak memory of the pandas and the Ray engine as the dataset grows.

    python -m benchmarks.data_scale [--sizes 1M,10M] [--engines pandas,ray] [--length 50] [--max-gb 8] [--epochs]

For each size, the synthetic generator writes that many interactions (about: lengths are random) as Parquet shards
(:func:`study.data.synthetic.write_shards`, not timed), and each engine prepares them with the ``parquet``
recipe in a fresh process (``python -m study.data prepare parquet --source SHARDS --engine E --force``) and its own
data cache. The table gives the wall time of that process and its peak memory, sampled every 0.2 s over the
whole process tree (the command and, for Ray, the Ray processes it starts):

* **PSS**: proportional set size summed over the tree; shared pages (Ray's object store, the libraries every
  Ray worker maps) are counted once in total, so this is the memory the preparation occupies;
* **RSS**: resident set size summed over the tree; counts shared pages once per process (an upper bound).

A first row, ``ray idle``, measures a Ray that starts and waits 5 s: the floor under the Ray engine's figures.

A run whose tree's PSS goes over ``--max-gb`` is stopped and shown as such: the largest size an engine reaches
within that budget. Both engines' meta.json statistics are compared where both finish (they must agree).

``--epochs`` also reads one epoch of training batches (128 windows of 50 items, no model) from the last engine's
prepared dataset in a fresh process, as a trial would: ``memory`` loads every window (the trial's
:class:`~study.train.trainer.TrialData`) and shuffles them in place, ``stream`` keeps the evaluation windows and a
1,024-window sample, and draws the training windows from the Parquet through Ray Data (a sweep's
``dataset: {stream: true}``, on a 2-CPU Ray). It reports windows per second and the process tree's peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from study.data import synthetic  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def parse_size(text: str) -> int:
    """``1M`` -> 1_000_000, ``500k`` -> 500_000, ``2e6`` -> 2_000_000."""
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _tree(root: int) -> list[int]:
    """``root`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _memory(pids: list[int]) -> tuple[int, int]:
    """Summed (PSS, RSS) in bytes of ``pids`` (processes that ended meanwhile count 0)."""
    pss = rss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return pss, rss


def run_measured(command: list[str], env: dict[str, str], limit_bytes: int) -> dict:
    """Run ``command``; its wall time, peak tree PSS and RSS, and whether it finished under the memory limit."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_pss = peak_rss = 0
    over = False
    while process.poll() is None:
        pids = _tree(process.pid)
        pss, rss = _memory(pids)
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        if pss > limit_bytes:
            over = True
            for pid in reversed(pids):  # only the processes this run started
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.2)
    out, err = process.communicate()
    return {"seconds": time.perf_counter() - started, "pss": peak_pss, "rss": peak_rss, "over": over,
            "rc": process.returncode, "stdout": out, "stderr": err}


def run_retried(command: list[str], env: dict[str, str], limit_bytes: int, tries: int = 4) -> dict:
    """:func:`run_measured`, again when Ray did not start: it gives its raylet 30 s, which a loaded machine misses."""
    for _ in range(tries):
        result = run_measured(command, env, limit_bytes)
        if result["rc"] == 0 or "timed out during startup" not in result["stderr"]:
            break
    return result


def epoch_of(prepared: Path, mode: str, batch_size: int = 128, max_len: int = 50) -> dict:
    """One epoch of a trial's training batches from ``prepared``, without a model: windows, load and read seconds."""
    import numpy as np

    from study.train.trainer import TrialData, user_batches

    began = time.perf_counter()
    if mode == "memory":
        data = TrialData.from_prepared(prepared, max_len)
        loaded = time.perf_counter()
        batches = user_batches(data.train, batch_size, np.random.default_rng(0))
    else:
        import ray

        from study.search.trial import ray_data_batches
        from study.search.windows import STREAM_SAMPLE_ROWS, STREAM_SHUFFLE_ROWS, streamed_dataset, training_windows

        data = TrialData.from_prepared(prepared, max_len, train_rows=STREAM_SAMPLE_ROWS)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        loaded = time.perf_counter()
        dataset = streamed_dataset(training_windows(prepared, True))
        batches = ray_data_batches(dataset, batch_size, 0, max_len, STREAM_SHUFFLE_ROWS)(1)
    windows = sum(len(batch) for batch, _ in batches)
    return {"windows": windows, "load_s": loaded - began, "epoch_s": time.perf_counter() - loaded}


def _stats(cache: Path) -> dict:
    (folder,) = [p for p in (cache / "prepared").iterdir() if not p.name.startswith(".")]
    meta = json.loads((folder / "meta.json").read_text())
    for key in ("created",):
        meta.pop(key)
    return meta


def _time_epochs(size: int, cache: Path, env: dict[str, str], max_gb: float) -> list[tuple]:
    """One epoch read in memory and streamed from the dataset prepared in ``cache``, each in a fresh process."""
    (prepared,) = [p for p in (cache / "prepared").iterdir() if not p.name.startswith(".")]
    found = []
    for mode in ("memory", "stream"):
        command = [sys.executable, "-m", "benchmarks.data_scale", "--epoch-of", str(prepared), mode]
        result = run_retried(command, env, int(max_gb * 2**30))
        figures = json.loads(result["stdout"].strip().splitlines()[-1]) if result["rc"] == 0 else None
        status = "ok" if figures else ("stopped" if result["over"] else
                                       f"failed: {result['stderr'].strip().splitlines()[-1:]}")
        found.append((size, mode, result, figures, status))
        if figures:
            print(f"{size:>12,} epoch {mode:<7} {figures['windows']:,} windows in {figures['epoch_s']:.1f} s "
                  f"(load {figures['load_s']:.1f} s), PSS {result['pss'] / 2**30:.2f} GB", file=sys.stderr, flush=True)
    return found


def print_tables(rows: list[tuple], epochs: list[tuple]) -> None:
    """The preparation table (one row per size and engine), then the epoch table when epochs were timed."""
    print(f"{'target':>8} {'interactions':>13} {'engine':<8} {'prepare s':>9} {'peak PSS GB':>11} "
          f"{'peak RSS GB':>11} {'gen s':>6}  status")
    for size, interactions, engine, result, generated, status in rows:
        count = f"{interactions:,}" if interactions else "-"
        target = f"{size / 1e6:g}M" if size else "-"
        print(f"{target:>8} {count:>13} {engine:<8} {result['seconds']:>9.1f} {result['pss'] / 2**30:>11.2f} "
              f"{result['rss'] / 2**30:>11.2f} {generated:>6.1f}  {status}")
    if epochs:
        print(f"\n{'target':>8} {'epoch':<7} {'windows':>10} {'load s':>7} {'epoch s':>8} {'windows/s':>10} "
              f"{'peak PSS GB':>11}  status")
        for size, mode, result, figures, status in epochs:
            if figures:
                print(f"{size / 1e6:>7g}M {mode:<7} {figures['windows']:>10,} {figures['load_s']:>7.1f} "
                      f"{figures['epoch_s']:>8.1f} {figures['windows'] / figures['epoch_s']:>10,.0f} "
                      f"{result['pss'] / 2**30:>11.2f}  {status}")
            else:
                print(f"{size / 1e6:>7g}M {mode:<7} {'-':>10} {'-':>7} {'-':>8} {'-':>10} "
                      f"{result['pss'] / 2**30:>11.2f}  {status}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1M,10M", help="interactions per dataset, comma-separated (1M,10M,50M)")
    parser.add_argument("--engines", default="pandas,ray", help="engines to measure (pandas,ray)")
    parser.add_argument("--length", type=int, default=50, help="mean sequence length (users = size / length)")
    parser.add_argument("--items-per", type=int, default=200, help="interactions per item (items = size / this)")
    parser.add_argument("--max-gb", type=float, default=8.0, help="stop a run whose process tree's PSS exceeds this")
    parser.add_argument("--workdir", type=Path, help="where shards and caches go (default: a temporary folder)")
    parser.add_argument("--epochs", action="store_true", help="also time one epoch in memory and streamed")
    parser.add_argument("--epoch-of", nargs=2, metavar=("PREPARED", "MODE"), help=argparse.SUPPRESS)  # a child run
    args = parser.parse_args(argv)
    if args.epoch_of:
        print(json.dumps(epoch_of(Path(args.epoch_of[0]), args.epoch_of[1])))
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    engines = [e.strip() for e in args.engines.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="data-scale-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    rows, epochs = [], []
    if "ray" in engines:
        # What a started Ray occupies before any data: the floor under the Ray engine's figures
        idle = [sys.executable, "-c", "import time, ray; ray.init(include_dashboard=False); time.sleep(5)"]
        result = run_retried(idle, env, int(args.max_gb * 2**30))
        status = "ok" if result["rc"] == 0 else f"failed: {result['stderr'].strip().splitlines()[-1:]}"
        rows.append((0, None, "ray idle", result, 0.0, status))
    try:
        for size in sizes:
            shards = workdir / f"shards-{size}"
            params = synthetic.resolve_params({"users": max(1, size // args.length), "length": args.length,
                                               "items": max(2000, size // args.items_per), "seed": 0})
            began = time.perf_counter()
            synthetic.write_shards(params, shards)
            generated = time.perf_counter() - began
            metas = {}
            for engine in engines:
                cache = workdir / f"cache-{size}-{engine}"
                command = [sys.executable, "-m", "study.data", "prepare", "parquet", "--source", str(shards),
                           "--engine", engine, "--force", "--quiet", "--max-len", "50"]
                result = run_retried(command, {**env, "SEQREC_DATA": str(cache)}, int(args.max_gb * 2**30))
                if result["over"]:
                    status = f"stopped over {args.max_gb:g} GB"
                elif result["rc"] != 0:
                    status = f"failed: {result['stderr'].strip().splitlines()[-1:]}"
                else:
                    metas[engine] = _stats(cache)
                    status = "ok"
                interactions = metas.get(engine, {}).get("raw", {}).get("interactions")
                rows.append((size, interactions, engine, result, generated, status))
                if args.epochs and status == "ok" and engine == engines[-1]:
                    epochs.extend(_time_epochs(size, cache, env, args.max_gb))
                shutil.rmtree(cache, ignore_errors=True)
                print(f"{size:>12,} {engine:<7} {result['seconds']:8.1f} s  PSS {result['pss'] / 2**30:6.2f} GB  "
                      f"RSS {result['rss'] / 2**30:6.2f} GB  {status}", file=sys.stderr, flush=True)
            if len(metas) == 2:
                first, second = metas.values()
                agree = first == second
                print(f"{size:>12,} engines agree on meta.json: {agree}", file=sys.stderr, flush=True)
                if not agree:
                    return 1
            shutil.rmtree(shards, ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print_tables(rows, epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
