"""flowedge: robot policy inference (Mamba backbone, flow-matching head, LeRobot Diffusion Policy head and the whole
LeRobot policies with their encoders, normalisation and queues: ``DiffusionPolicy``, ``ActPolicy``, and
``load_policy(folder)`` choosing between them by config.json's ``type``).

numpy in, numpy out (float32). Every model loads once and allocates all its buffers at load; calls release
the GIL, and calls on one object from several threads are serialised. ``device="cuda"`` uploads the model and
raises ``FlowEdgeError`` when it cannot (no CUDA build, no GPU, not enough memory), as the programs' ``--device cuda``
does; ``device="auto"`` uploads when it can, otherwise runs on the CPU with ``cuda_resident`` False and the reason in
``fallback_reason``. ``FLOWEDGE_CUDA_REQUIRED=1`` turns that fallback into an error, ``FLOWEDGE_CUDA_FORCE_HOST=1``
skips the upload. ``ActPolicy`` follows the same rules.
"""
import os
from typing import Union

from ._flowedge import (  # noqa: F401
    ActPolicy,
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
    policy_type,
)


def load_policy(folder: Union[str, os.PathLike], device: str = "cpu", **options) -> Union[ActPolicy, DiffusionPolicy]:
    """The whole LeRobot policy of a pretrained_model folder, the class chosen by config.json's ``type``
    (:func:`policy_type`): :class:`ActPolicy` for "act", :class:`DiffusionPolicy` otherwise. ``options`` go to that
    class (DiffusionPolicy: dtype, steps, scheduler, seed, batch, quantize; ActPolicy: dtype, temporal_ensemble_coeff, n_action_steps);
    one the class does not take raises FlowEdgeValueError naming it."""
    cls = ActPolicy if policy_type(folder) == "act" else DiffusionPolicy
    allowed = _OPTIONS[cls]
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise FlowEdgeValueError(f"flowedge: python: load_policy: {folder} holds a{'n ACT' if cls is ActPolicy else ' Diffusion'} "
                                 f"policy, which takes no option {', '.join(repr(k) for k in unknown)} "
                                 f"(expected some of {sorted(allowed)})")
    return cls(folder, device=device, **options)


_OPTIONS = {ActPolicy: {"dtype", "temporal_ensemble_coeff", "n_action_steps"},
            DiffusionPolicy: {"dtype", "steps", "scheduler", "seed", "batch", "quantize"}}


def _load_diffusion_policy(folder: Union[str, os.PathLike], device: str = "cpu", **options) -> DiffusionPolicy:
    """``DiffusionPolicy(folder, device=device, **options)``: dtype, steps, scheduler, seed, ``batch`` (the number of
    environments :meth:`DiffusionPolicy.select_action_batch` serves) and ``quantize`` (CPU opt-in "int8" / "w8a8")."""
    return DiffusionPolicy(folder, device=device, **options)


DiffusionPolicy.load = staticmethod(_load_diffusion_policy)

__all__ = [
    "ActPolicy",
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
    "load_policy",
    "policy_type",
]
