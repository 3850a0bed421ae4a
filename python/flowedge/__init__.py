"""flowedge: robot policy inference (Mamba backbone, flow-matching head, LeRobot Diffusion Policy head and the whole
LeRobot Diffusion Policy with its RGB encoders, normalisation and queues: ``DiffusionPolicy``).

numpy in, numpy out (float32). Every model loads once and allocates all its buffers at load; calls release
the GIL, and calls on one object from several threads are serialised. ``device="cuda"`` uploads the model and
raises ``FlowEdgeError`` when it cannot (no CUDA build, no GPU, not enough memory), as the programs' ``--device cuda``
does; ``device="auto"`` uploads when it can, otherwise runs on the CPU with ``cuda_resident`` False and the reason in
``fallback_reason``. ``FLOWEDGE_CUDA_REQUIRED=1`` turns that fallback into an error, ``FLOWEDGE_CUDA_FORCE_HOST=1``
skips the upload.
"""
from ._flowedge import (  # noqa: F401
    DiffusionHead,
    DiffusionPolicy,
    FlowEdgeError,
    FlowEdgeValueError,
    FlowHead,
    Mamba,
    MambaFlowPolicy,
    __version__,
    cuda,
    diffusion_compact_name,
)

__all__ = [
    "DiffusionHead",
    "DiffusionPolicy",
    "FlowEdgeError",
    "FlowEdgeValueError",
    "FlowHead",
    "Mamba",
    "MambaFlowPolicy",
    "__version__",
    "cuda",
    "diffusion_compact_name",
]
