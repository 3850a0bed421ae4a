# Without PyTorch/LeRobot: the LeRobot tools and flowedge.lerobot end in one friendly line with the install advice
# of python/LEROBOT.md, never a raw ModuleNotFoundError traceback. Runs in a subprocess whose import system hides
# torch and lerobot, so it checks the same path whether or not they are installed here.
import subprocess
import sys
import textwrap

import pytest

HIDE = textwrap.dedent("""
    import importlib.abc, sys
    class _Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "lerobot"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    for m in [m for m in sys.modules if m.split(".")[0] in ("torch", "lerobot")]:
        del sys.modules[m]
    sys.meta_path.insert(0, _Hide())
""")

ADVICE = "pip install '.[lerobot]' in the flowedge source folder"


def run_hidden(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE + textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module, tool", [("replay", "lerobot-replay"), ("rollout", "lerobot-rollout")])
def test_tools_without_torch_exit_with_install_advice(module, tool):
    args = "['some/pretrained_model']" if module == "replay" else "['--steps', '2']"
    r = run_hidden(f"""
        from flowedge import {module}
        {module}.main({args})
    """)
    assert r.returncode == 1, r.stderr  # SystemExit with a message: status 1, the message on stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert f"flowedge: {tool}: needs LeRobot" in r.stderr and "PyTorch" in r.stderr
    assert ADVICE in r.stderr


@pytest.mark.parametrize("module", ["replay", "rollout"])
def test_tools_help_works_without_torch(module):
    r = run_hidden(f"""
        from flowedge import {module}
        {module}.main(['--help'])
    """)
    assert r.returncode == 0, r.stderr
    assert "usage: flowedge-lerobot-" in r.stdout


def test_flowedge_lerobot_import_names_the_same_advice():
    r = run_hidden("""
        try:
            import flowedge.lerobot
        except ImportError as e:
            print("IMPORT ERROR:", e)
    """)
    assert r.returncode == 0, r.stderr
    assert "IMPORT ERROR: flowedge: lerobot: needs LeRobot" in r.stdout
    assert ADVICE in r.stdout
    # the core package stays importable without them
    r = run_hidden("import flowedge; print(flowedge.__version__)")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
