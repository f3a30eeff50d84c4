"""``environment.json``'s description of the machine: the CPU kernels torch runs are recorded as torch reports them,
including when ``ATEN_CPU_CAPABILITY`` holds them below what the CPU offers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from study.environment import collect, cpu_text

REPO = Path(__file__).resolve().parents[2]


def test_the_environment_records_the_cpu_kernels_torch_runs() -> None:
    environment = collect()
    kernels = environment["hardware"]["cpu_kernels"]
    assert kernels == torch.backends.cpu.get_cpu_capability() and kernels
    assert cpu_text().endswith(f"torch CPU kernels {kernels}")
    assert json.loads(json.dumps(environment)) == environment  # what the sweep writes as JSON


def test_kernels_held_below_the_cpus_are_recorded_with_the_setting_that_held_them() -> None:
    # torch fixes its kernels when it is imported, so the setting takes a process of its own
    script = "import json; from study.environment import collect; e = collect(); " \
             "print(json.dumps([e['hardware']['cpu_kernels'], e['env'].get('ATEN_CPU_CAPABILITY')]))"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["DEFAULT", "default"]
