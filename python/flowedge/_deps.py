"""The optional LeRobot + PyTorch dependency of flowedge.lerobot and the replay/rollout tools, checked in one place
so a missing install reads the same everywhere, with install advice that matches python/LEROBOT.md."""
from __future__ import annotations

#: How to get the optional dependencies (the package is installed from the flowedge source tree).
LEROBOT_INSTALL = "pip install '.[lerobot]' in the flowedge source folder (= lerobot==0.4.4, torch, tqdm)"


def missing_lerobot_message(who: str, err: BaseException) -> str:
    """One line naming what is missing and how to install it, e.g. for ``who`` = "lerobot-replay"."""
    return (f"flowedge: {who}: needs LeRobot (tested with lerobot==0.4.4) and PyTorch, which did not import "
            f"({err}); install them with: {LEROBOT_INSTALL}")


def require_lerobot(who: str) -> None:
    """Exits (status 1, the message on stderr, no traceback) when torch or LeRobot does not import."""
    try:
        import torch  # noqa: F401
        from lerobot.policies.diffusion import modeling_diffusion  # noqa: F401
    except ImportError as e:
        raise SystemExit(missing_lerobot_message(who, e)) from None
