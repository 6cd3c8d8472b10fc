"""What a CPU can prove about the GPU paths: every Triton kernel builds to a cubin for sm_80 and sm_90 at every block
size and dtype the dispatch launches with; float8 training is refused off capable GPUs before any compute, and its
conversion picks the right linears; kernels/ ships inside the package."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

from ablate.config import ConfigError
from ablate.setup.experiment import load_experiment
from ablate.setup.overrides import apply_overrides
from conftest import REPO, TINY


@pytest.mark.slow
def test_every_kernel_builds_for_sm80_and_sm90():
    # A process of its own: the kernels must be real JIT functions, not the interpreter's (see tests/test_kernels.py)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the default; set to quiet Triton 3.9's notice about it
    result = subprocess.run(
        [sys.executable, "-m", "ablate.kernels.aot", "--json"], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for row in rows:  # pytest -s shows the table
        print(
            f"{row['kernel']:28} {row['target']} {row['dtype']:5} {row['block']:16} regs {row.get('registers')} "
            f"spill {row.get('spill_bytes')} B"
        )
    assert all(row["cubin_bytes"] > 0 and row.get("registers", 0) > 0 for row in rows)
    built = {(row["kernel"], row["target"], row["dtype"]) for row in rows}
    kernels = {
        "rms_norm_fwd_kernel",
        "rms_norm_bwd_kernel",
        "swiglu_fwd_kernel",
        "swiglu_bwd_kernel",
        "rope_kernel",
        "cross_entropy_chunk_kernel",
    }
    assert built == {(k, t, d) for k in kernels for t in ("sm_80", "sm_90") for d in ("fp32", "bf16")}
    # every RMSNorm block size the dispatch can pick was among the builds
    from ablate.kernels.rmsnorm_triton import BLOCK_SIZES, MAX_WIDTH, launch_config

    picked = {f"{c['BLOCK_ROWS']}x{c['BLOCK_D']}" for c in map(launch_config, range(1, MAX_WIDTH + 1))}
    assert picked == {row["block"] for row in rows if row["kernel"] == "rms_norm_fwd_kernel"}
    assert len(picked) == len(BLOCK_SIZES)


def test_float8_is_refused_off_capable_gpus(tmp_path):
    run = apply_overrides(load_experiment(TINY, only=["mha"])[0], {"train.float8": True, "train.device": "cpu"})
    from ablate.training.run import train

    with pytest.raises(ConfigError, match=r"train\.float8: .*compute capability >= 8\.9.*on cpu"):
        train(run, tmp_path)
    assert not any(tmp_path.iterdir())  # refused before any run folder, data or model existed


def test_float8_conversion_takes_the_block_linears():
    """The conversion itself runs on CPU too (torchao's float8 emulation), so its wiring is checked here."""
    pytest.importorskip("torchao.float8")
    from ablate.config import ModelConfig
    from ablate.model import Transformer
    from ablate.training.parallel import apply_float8

    model = Transformer(ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, ffn_hidden=40), 16)
    model.init_weights(torch.Generator().manual_seed(0))
    apply_float8(model)
    converted = {name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert converted == {f"layers.{i}.attn.{p}" for i in range(2) for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    assert type(model.lm_head) is torch.nn.Linear  # the output projection stays: the chunked loss uses its weight
    tokens = torch.randint(0, 97, (2, 16))
    loss, _ = model.loss(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert torch.isfinite(model.layers[0].attn.q_proj.weight.grad).all()


@pytest.mark.slow
def test_kernels_ship_in_the_wheel(tmp_path):
    """kernels/ is mapped to ablate.kernels (pyproject package-dir), so an installed package has it too."""
    source = tmp_path / "source"  # a copy: building in the checkout would write build/ into it
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "runs", "*.egg-info", "__pycache__", ".pytest_cache"),
    )
    # with build isolation, as `pip install .` does (a fresh venv's own setuptools may be too old to build wheels)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("ablate-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "__init__",
        "reference",
        "rmsnorm_triton",
        "swiglu_triton",
        "rope_triton",
        "cross_entropy_triton",
        "aot",
    ):
        assert f"ablate/kernels/{module}.py" in names
