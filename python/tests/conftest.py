# Shared pytest fixtures: paths of the committed checkpoints and PyTorch/LeRobot reference arrays.
import os
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "test" / "fixtures"
MAMBA_DIR = FIXTURES / "mamba_flow"
DP_DIR = FIXTURES / "dp_small"
DP_REF = FIXTURES / "dp_small_ref"


def _need(path):
    if not path.exists():
        pytest.skip(f"fixture {path} not present")
    return path


@pytest.fixture
def mamba_path():
    return str(_need(MAMBA_DIR / "mamba_flow.safetensors"))


@pytest.fixture
def mamba_ref():
    d = _need(MAMBA_DIR / "refs.json").parent
    return lambda name: np.load(d / name)


@pytest.fixture
def dp_path():
    return str(_need(DP_DIR / "config.json").parent)


@pytest.fixture
def dp_ref():
    d = _need(DP_REF / "refs.json").parent
    return lambda name: np.load(d / name)


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("FLOWEDGE_CUDA_REQUIRED", raising=False)
    monkeypatch.delenv("FLOWEDGE_CUDA_FORCE_HOST", raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def act_folder(tmp_path_factory):
    """The two-camera ACT fixture folder, its model.safetensors rebuilt from the committed manifest."""
    from lerobot_fixture import rebuild
    src = FIXTURES / "act_cam2"
    if not (src / "manifest.json").is_file():
        pytest.skip(f"fixture {src} not present")
    return rebuild(src, tmp_path_factory.mktemp("act_cam2"))
