# DiffusionPolicy.set_realtime and the rollout tool's real-time flags (docs/realtime.md): each bad value raises
# FlowEdgeValueError, each refusal of the system FlowEdgeError naming the limit and the fix, the options keep the
# actions identical, and the rollout JSON reports what was applied, the tail percentiles and the tick counters.
# Everything that pins or prioritises runs on a thread of its own or in a subprocess, so pytest's thread is untouched.
import ctypes
import json
import os
import platform
import resource
import subprocess
import sys
import threading

import numpy as np
import pytest

import flowedge
from conftest import FIXTURES

DP_SMALL = str(FIXTURES / "dp_small")
CAP_SYS_NICE = 23
SYS_CAPGET, SYS_CAPSET = {"x86_64": (125, 126), "aarch64": (90, 91)}.get(platform.machine(), (None, None))


def on_thread(fn):
    """fn() on a new thread; returns its result or re-raises its exception here."""
    box = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (handed back to the test thread)
            box["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def drop_capability(cap: int) -> None:
    """Clears `cap` from the calling thread's effective set (capget/capset, version 3)."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()  # two (effective, permitted, inheritable) triples
    assert libc.syscall(SYS_CAPGET, header, data) == 0, os.strerror(ctypes.get_errno())
    data[3 * (cap // 32)] &= ~(1 << (cap % 32))
    assert libc.syscall(SYS_CAPSET, header, data) == 0, os.strerror(ctypes.get_errno())


def episode(p, n=12):
    p.reset(5)
    out = []
    for t in range(n):
        obs = {p.state_key: np.array([100 + 37 * t, 111 + 37 * t], np.float32),
               p.env_key: np.array([0.1 * t - 0.2 * i for i in range(4)], np.float32)}
        out.append(p.select_action(obs))
    return np.stack(out)


def test_bad_cpus_and_priorities_raise_value_errors_naming_them():
    p = flowedge.DiffusionPolicy(DP_SMALL)
    with pytest.raises(flowedge.FlowEdgeValueError, match="CPU 4096 does not exist"):
        p.set_realtime(cpus=[4096])
    with pytest.raises(flowedge.FlowEdgeValueError, match="bad CPU list '2,x'"):
        p.set_realtime(cpus="2,x")
    with pytest.raises(TypeError, match="cpus must be None, a list of ints or a string"):
        p.set_realtime(cpus=[1.5])
    with pytest.raises(flowedge.FlowEdgeValueError, match=r"priority out of range \(expected 1..99, got 100\)"):
        p.set_realtime(rt_priority=100)
    with pytest.raises(flowedge.FlowEdgeValueError, match="isolate_cpus needs loop CPUs"):
        p.set_realtime(isolate_cpus=True)


@pytest.mark.skipif(SYS_CAPSET is None, reason="capset syscall number unknown on this architecture")
def test_priority_without_capability_or_limit_names_rlimit_rtprio_and_the_fix():
    p = flowedge.DiffusionPolicy(DP_SMALL)
    soft, hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, hard))
    try:
        def refused():
            drop_capability(CAP_SYS_NICE)
            with pytest.raises(flowedge.FlowEdgeError) as e:
                p.set_realtime(rt_priority=80)
            return e.value, os.sched_getscheduler(0)
        err, policy = on_thread(refused)
    finally:
        resource.setrlimit(resource.RLIMIT_RTPRIO, (soft, hard))
    assert "RLIMIT_RTPRIO is 0 and the thread lacks CAP_SYS_NICE" in str(err)
    assert "ulimit -r 80" in str(err)
    assert not isinstance(err, ValueError)  # the system refused: FlowEdgeError, not FlowEdgeValueError
    assert policy == os.SCHED_OTHER


def test_pinned_and_prefaulted_policy_gives_the_same_actions():
    p = flowedge.DiffusionPolicy(DP_SMALL)
    before = episode(p)
    cpus = sorted(os.sched_getaffinity(0))

    def hardened():
        report = p.set_realtime(prefault=True, cpus=cpus, high_priority_stream=True, pinned_staging=True)
        return report, os.sched_getaffinity(0), episode(p)
    report, mask, after = on_thread(hardened)
    assert report["prefaulted"] and not report["memory_locked"] and report["prefaulted_bytes"] > 0
    assert report["threads_placed"] >= 1 and report["cpus"] == cpus
    assert report["high_priority_stream"] is False and report["pinned_staging"] is False  # CPU policy: ignored
    assert mask == {cpus[0]}  # the calling thread is OpenMP thread 0
    np.testing.assert_array_equal(after, before)


def test_rollout_applies_the_flags_and_reports_tail_and_counters(tmp_path):
    cpu = sorted(os.sched_getaffinity(0))[-1]
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-c", "import sys; from flowedge import rollout; sys.exit(rollout.main(sys.argv[1:]))",
                        "--backend", "flowedge-policy", "--policy", DP_SMALL, "--env", "synthetic", "--steps", "30",
                        "--period-ms", "0", "--prefault", "--cpus", str(cpu), "--output", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["realtime"]["prefaulted"] is True and res["realtime"]["cpus"] == [cpu]
    assert 0 < res["p50_ms"] <= res["p99_ms"] <= res["p99_9_ms"] <= res["p99_99_ms"] <= res["max_ms"]
    counters = res["tick_counters"]
    assert set(counters) == {"minor_page_faults", "major_page_faults", "voluntary_context_switches",
                             "involuntary_context_switches"}
    assert all(isinstance(v, int) and v >= 0 for v in counters.values())
    assert "page faults" in r.stderr


def test_rollout_refuses_realtime_flags_for_the_torch_backends():
    r = subprocess.run([sys.executable, "-c", "import sys; from flowedge import rollout; sys.exit(rollout.main(sys.argv[1:]))",
                        "--backend", "flowedge", "--lock-memory"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "options of --backend flowedge-policy" in r.stderr
