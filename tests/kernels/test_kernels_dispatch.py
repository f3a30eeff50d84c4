"""Backend selection: env var / argument, forced Triton, fallbacks, the trainer's record, lazy import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from kernels import _dispatch
from kernels.testing import cosine_inputs, histogram_inputs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    kernels.reset_backend_record()


def _run_all_ops(backend=None):
    q, k, v, mask, m = cosine_inputs(1, 2, 10, 16, requires_grad=False)
    kernels.cosine_attention(q, k, v, mask, m, backend=backend)
    kernels.causal_linear_attention(q.abs(), k.abs(), v, backend=backend)
    assign, codes, table, values, _ = histogram_inputs(1, 10, 2, 8, 16, requires_grad=False)
    kernels.causal_histogram_attention(assign, codes, table, values, backend=backend)


def test_auto_uses_the_reference_on_cpu_and_records_it():
    cpu = torch.zeros(1)
    assert kernels.resolve_backend(cpu) == "reference"
    assert kernels.resolve_backend(cpu, "auto") == "reference"
    _run_all_ops()
    assert kernels.backend_used() == {
        "cosine_attention": "reference",
        "causal_linear_attention": "reference",
        "causal_histogram_attention": "reference",
    }
    assert kernels.last_backend() == "reference"
    kernels.reset_backend_record()
    assert kernels.backend_used() == {} and kernels.last_backend() is None


def test_env_var_forces_a_path_and_the_argument_wins(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(kernels.ENV_VAR, "triton")
    assert kernels.resolve_backend(torch.zeros(1)) == "triton"
    assert kernels.resolve_backend(torch.zeros(1), backend="reference") == "reference"
    monkeypatch.setenv(kernels.ENV_VAR, "reference")
    assert kernels.resolve_backend(torch.zeros(1)) == "reference"
    monkeypatch.setenv(kernels.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=r"\$SEQREC_KERNELS='fast' is not one of"):
        kernels.resolve_backend(torch.zeros(1))


def test_forced_triton_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(_dispatch, "triton_available", lambda: True)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.resolve_backend(torch.zeros(1), "triton")


def test_forced_triton_without_the_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_dispatch, "triton_available", lambda: False)
    with pytest.raises(RuntimeError, match="triton package is not installed"):
        kernels.resolve_backend(torch.zeros(1), "triton")
    _run_all_ops(backend="auto")  # the reference path needs no triton at all
    assert set(kernels.backend_used().values()) == {"reference"}


def test_unsupported_inputs_fall_back_under_auto_but_raise_when_forced(monkeypatch):
    """A CUDA-resolved call with an input the kernels cannot take runs the reference and records it."""
    monkeypatch.setattr(_dispatch, "resolve_backend", lambda tensor, backend=None: "triton")

    def refuse():
        raise kernels.UnsupportedByTriton("head dim too large")

    assert _dispatch.dispatch("op", torch.zeros(1), None, refuse) == "reference"
    assert kernels.backend_used()["op"] == "reference"
    with pytest.raises(ValueError, match="head dim too large"):
        _dispatch.dispatch("op", torch.zeros(1), "triton", refuse)


def test_bfloat16_is_refused_by_the_interpreter_instead_of_computing_garbage():
    pytest.importorskip("triton")
    if not kernels.interpreter_enabled():
        pytest.skip("only the CPU interpreter lacks bfloat16")
    q, k, v, mask, m = cosine_inputs(1, 1, 8, 16, dtype=torch.bfloat16, requires_grad=False)
    with pytest.raises(ValueError, match="bfloat16 is not supported by the Triton CPU interpreter"):
        kernels.cosine_attention(q, k, v, mask, m, backend="triton")
    out = kernels.cosine_attention(q, k, v, mask, m, backend="reference")
    assert out.dtype == torch.bfloat16


def test_the_triton_path_runs_and_is_recorded():
    pytest.importorskip("triton")
    if not kernels.interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU machine")
    _run_all_ops(backend="triton")
    assert set(kernels.backend_used().values()) == {"triton"}


def test_import_kernels_does_not_import_triton():
    code = "import sys, kernels; kernels.cosine_attention; print('triton' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
