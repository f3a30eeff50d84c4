"""Micro-benchmark of the mixers: Triton path vs torch reference vs SDPA (flash and math) as the quadratic
baseline.  ``python -m benchmarks.kernels [--quick]``; see ``--help``.

For each sequence length N it reports forward and forward+backward time (warm-up runs, then the median of
``--repeats`` runs) and peak memory.  Peak memory is the CUDA allocator peak during the call minus what was
allocated before it (inputs excluded), so it is the op's own working memory; on CPU it is not measured.

Shapes follow the papers (batch is ours, the same for every op):

* cosine  -- Cotten4Rec/BERT4Rec: hidden 64 in 2 heads -> H=2, d=32, bidirectional, left padding;
* linear  -- RecGRELA: D=64 in 4 heads -> H=4, d=16, ELU+1 features, normalised, RoPE;
* lisa    -- LISA-256 (Mini): C=8 codebooks x W=32 codewords, D=128, decay exp(-0.1);
* sdpa    -- softmax attention, H=2, d=32; bidirectional next to cosine, causal next to linear/lisa,
  with the flash backend and with the math backend (which materialises N×N).

Each row names its path and forces it (``backend="triton"`` raises rather than falls back to the reference).
Without CUDA only the reference (and SDPA) figures are measured: the Triton interpreter's timings are
meaningless, so the Triton rows then say that they need a GPU.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels
from kernels.testing import cosine_inputs, feature_map, histogram_inputs, linear_inputs

FULL_LENGTHS = [256, 512, 1024, 2048, 4096]
QUICK_LENGTHS = [128, 256, 512]
LISA_DECAY = math.exp(-0.1)
# CPU guard: skip a quadratic run whose N×N score tensors (fwd+bwd keep ~3 copies) would exceed this.
CPU_QUADRATIC_BUDGET_GIB = 3.0


# builds one case's inputs and returns (fn, the inputs whose gradients the backward computes)
CaseFactory = Callable[[], tuple[Callable[[], torch.Tensor], tuple[torch.Tensor, ...]]]


@dataclass
class Case:
    op: str
    path: str
    shape: str
    make: CaseFactory


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(fn: Callable[[], torch.Tensor], grads: tuple, device: torch.device, warmup: int, repeats: int):
    """(fwd ms, fwd+bwd ms, fwd peak MiB, fwd+bwd peak MiB); peaks are None on CPU."""

    def fwd():
        with torch.no_grad():
            return fn()

    def fwd_bwd():
        out = fn()
        out.backward(torch.ones_like(out))
        for t in grads:
            t.grad = None

    results = []
    for step in (fwd, fwd_bwd):
        for _ in range(warmup):
            step()
        _sync(device)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            _sync(device)
            times.append((time.perf_counter() - start) * 1e3)
        peak = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            step()
            _sync(device)
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        results.append((statistics.median(times), peak))
    return results[0][0], results[1][0], results[0][1], results[1][1]


def _cases(N: int, B: int, device: torch.device, dtype: torch.dtype, triton_ok: bool) -> list[Case]:
    n_pad = [N // 4 if b % 2 else 0 for b in range(B)]
    cases: list[Case] = []

    def cosine(path: str) -> CaseFactory:
        def make():
            q, k, v, mask, m = cosine_inputs(B, 2, N, 32, dtype=dtype, device=device, n_pad=n_pad)
            return (lambda: kernels.cosine_attention(q, k, v, mask, m, backend=path)), (q, k, v, m)

        return make

    def linear(path: str) -> CaseFactory:
        def make():
            raw = linear_inputs(B, 4, N, 16, dtype=dtype, device=device, n_pad=n_pad)

            def fn():
                fq, fk, fv = feature_map(*raw)
                return kernels.causal_linear_attention(fq, fk, fv, rope=True, backend=path)

            return fn, raw[:3]

        return make

    def lisa(path: str) -> CaseFactory:
        def make():
            assign, codes, table, values, _ = histogram_inputs(
                B, N, 8, 32, 128, dtype=dtype, device=device, n_pad=n_pad
            )

            def fn():
                return kernels.causal_histogram_attention(
                    assign, codes, table, values, decay=LISA_DECAY, backend=path
                )

            return fn, (assign, table, values)

        return make

    def sdpa(backend: str, causal: bool) -> CaseFactory:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        which = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[backend]

        def make():
            q, k, v = (
                torch.randn(B, 2, N, 32, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
            )

            def fn():
                with sdpa_kernel(which):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            return fn, (q, k, v)

        return make

    for op, shape, factory in [
        ("cosine", f"B={B} H=2 N={N} d=32", cosine),
        ("linear", f"B={B} H=4 N={N} d=16 rope", linear),
        ("lisa", f"B={B} N={N} C=8 W=32 D=128 γ=e^-0.1", lisa),
    ]:
        if triton_ok:
            cases.append(Case(op, "triton", shape, factory("triton")))
        cases.append(Case(op, "reference", shape, factory("reference")))
    for causal in (False, True):
        for backend in ("flash", "math"):
            name = "sdpa-causal" if causal else "sdpa-bidir"
            cases.append(Case(name, backend, f"B={B} H=2 N={N} d=32", sdpa(backend, causal)))
    return cases


def _quadratic_gib(B: int, N: int, dtype: torch.dtype) -> float:
    return 3 * B * 2 * N * N * torch.finfo(dtype).bits / 8 / 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"smoke run: N in {QUICK_LENGTHS}, batch 4")
    parser.add_argument("--lengths", type=int, nargs="+", help=f"sequence lengths (default {FULL_LENGTHS})")
    parser.add_argument("--batch", type=int, help="batch size (default 32 on GPU, 8 on CPU, 4 with --quick)")
    parser.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], help="default fp16 on GPU, fp32 on CPU")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--ops", nargs="+", default=["cosine", "linear", "lisa", "sdpa"],
                        choices=["cosine", "linear", "lisa", "sdpa"])
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
        args.dtype or ("fp16" if on_gpu else "fp32")
    ]
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else FULL_LENGTHS)
    batch = args.batch or (4 if args.quick else (32 if on_gpu else 8))
    warmup = args.warmup if args.warmup is not None else (5 if on_gpu else 2)
    repeats = args.repeats if args.repeats is not None else (20 if on_gpu else 3)
    triton_ok = on_gpu and kernels.triton_available()
    torch.manual_seed(0)

    name = torch.cuda.get_device_name(device) if on_gpu else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {name} | dtype: {str(dtype).replace('torch.', '')} | batch {batch} | "
          f"warm-up {warmup}, median of {repeats} | torch {torch.__version__}")
    if not on_gpu:
        print("NOTE: no CUDA device: Triton figures need a GPU and are not measured here (the Triton CPU "
              "interpreter is for correctness only); peak memory is not measured on CPU.")
    elif not triton_ok:
        print("NOTE: triton is not installed: Triton rows are skipped.")
    header = (
        f"{'op':<12} {'path':<10} {'shape':<34} {'fwd ms':>9} {'fwd+bwd ms':>11} "
        f"{'fwd MiB':>9} {'f+b MiB':>9}"
    )
    print(header)
    print("-" * len(header))
    wanted = set(args.ops)
    for N in lengths:
        for case in _cases(N, batch, device, dtype, triton_ok):
            family = case.op.split("-")[0]
            if family not in wanted:
                continue
            gib = _quadratic_gib(batch, N, dtype)
            if not on_gpu and case.path == "math" and gib > CPU_QUADRATIC_BUDGET_GIB:
                print(f"{case.op:<12} {case.path:<10} {case.shape:<34} skipped: N×N scores ≈ {gib:.1f} GiB "
                      "> CPU budget", flush=True)
                continue
            try:
                fn, grads = case.make()
                fwd, fwd_bwd, mem_f, mem_fb = _measure(fn, grads, device, warmup, repeats)
            except (RuntimeError, ValueError) as err:  # e.g. an SDPA backend that does not take this input
                first = str(err).strip().splitlines()[0][:60]
                print(f"{case.op:<12} {case.path:<10} {case.shape:<34} unavailable: {first}", flush=True)
                if on_gpu:
                    torch.cuda.empty_cache()
                continue
            mf = f"{mem_f:9.1f}" if mem_f is not None else f"{'n/a':>9}"
            mfb = f"{mem_fb:9.1f}" if mem_fb is not None else f"{'n/a':>9}"
            row = f"{case.op:<12} {case.path:<10} {case.shape:<34} {fwd:9.2f} {fwd_bwd:11.2f} {mf} {mfb}"
            print(row, flush=True)
            del fn, grads
        if not on_gpu:
            print(f"{'(triton)':<12} {'':<10} {f'N={N}':<34} {'needs a GPU':>21}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
