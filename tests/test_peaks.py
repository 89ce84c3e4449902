"""Device peaks: the table by device name and dtype, env overrides, MFU's dtype."""

from __future__ import annotations

import pytest
import torch

import fxflops
from fxflops.report.peaks import DEVICES, current_peak, match_device


@pytest.mark.parametrize("name,expected", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"), ("AMD Instinct MI300X", "MI300X")])
def test_device_table_matches_names(name, expected):
    assert match_device(name).name == expected


def test_peak_per_dtype_and_env_overrides(monkeypatch):
    monkeypatch.delenv("FXFLOPS_PEAK_TFLOPS", raising=False)
    monkeypatch.delenv("FXFLOPS_PEAK_GBPS", raising=False)
    h200 = current_peak("NVIDIA H200", "bf16")
    assert h200 == {"tflops": 989.4, "gbps": 4800.0, "source": "table:H200:bf16"}
    assert current_peak("NVIDIA H200", "fp8")["tflops"] == 1978.9
    assert current_peak("NVIDIA H200", "fp32")["tflops"] < h200["tflops"]
    assert current_peak(None)["tflops"] is None  # a CPU: nothing unless told
    monkeypatch.setenv("FXFLOPS_PEAK_TFLOPS", "123")
    assert current_peak("NVIDIA H200", "bf16")["tflops"] == 123.0
    assert all(p.gbps > 0 and p.tflops["bf16"] > 0 for p in DEVICES.values())


def test_mfu_dtype_is_the_matmuls_dtype():
    model = torch.nn.Linear(16, 16).to(torch.bfloat16)
    compiled = torch.compile(model, backend=fxflops.backend(inner="eager"))
    compiled(torch.randn(4, 16, dtype=torch.bfloat16))
    assert fxflops.recorder().graphs[0].cost.matmul_dtype == "torch.bfloat16"
    assert fxflops.recorder().info["dtype"] == "bf16"
