# pytest suite for the flowedge Python package: every class vs the PyTorch/LeRobot fixture references,
# batching, dtype/layout conversion, errors, the GIL released during inference and the CUDA fallback contract.
import os
import math
import threading
import time

import numpy as np
import pytest

import flowedge

SOLVERS = ["euler", "heun", "rk4"]


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / (1.0 + np.abs(np.asarray(b)))))


def test_module_attributes():
    assert isinstance(flowedge.cuda, bool)
    assert flowedge.__version__.count(".") == 2
    assert issubclass(flowedge.FlowEdgeError, RuntimeError)
    assert issubclass(flowedge.FlowEdgeValueError, flowedge.FlowEdgeError)
    assert issubclass(flowedge.FlowEdgeValueError, ValueError)


# ---- Mamba ----

def test_mamba_prefill_matches_transformers(mamba_path, mamba_ref):
    m = flowedge.Mamba(mamba_path, max_tokens=64)
    assert (m.d_model, m.n_layers, m.vocab_size) == (128, 2, 256)
    for n in (4, 37):
        tokens = mamba_ref(f"tokens{n}.npy")
        h = m.prefill(tokens)
        assert h.shape == (n, m.d_model) and h.dtype == np.float32
        assert rel(h, mamba_ref(f"prefill{n}_hidden.npy")) < 1e-4


def test_mamba_step_matches_decode_reference(mamba_path, mamba_ref):
    m = flowedge.Mamba(mamba_path, max_tokens=64)
    tokens = mamba_ref("tokens37.npy")
    ref = mamba_ref("decode37_hidden.npy")
    m.reset()
    rows = np.stack([m.step(int(t)) for t in tokens])
    assert rows.shape == ref.shape
    assert rel(rows, ref) < 1e-4


def test_mamba_state_round_trip(mamba_path):
    m = flowedge.Mamba(mamba_path)
    m.prefill([5, 6, 7])
    state = m.export_state()
    assert isinstance(state, bytes) and len(state) == m.state_size
    a = m.step(8)
    m.import_state(state)
    b = m.step(8)
    np.testing.assert_array_equal(a, b)
    bad = bytearray(state)
    bad[-1] ^= 0xFF
    with pytest.raises(flowedge.FlowEdgeError, match="checksum"):
        m.import_state(bytes(bad))
    with pytest.raises(flowedge.FlowEdgeError):
        m.import_state(state[:-4])
    m.reset()
    c = m.step(8)
    assert not np.array_equal(a, c)


def test_mamba_token_errors(mamba_path):
    m = flowedge.Mamba(mamba_path, max_tokens=8)
    with pytest.raises(ValueError, match="out of range"):
        m.step(m.vocab_size)
    with pytest.raises(ValueError):
        m.step(-1)
    with pytest.raises(ValueError, match="int32"):
        m.step(2**40)
    with pytest.raises(ValueError, match="int32"):
        m.prefill(np.array([1, 2**33], dtype=np.int64))
    with pytest.raises(ValueError):
        m.prefill(np.arange(9))  # longer than max_tokens
    with pytest.raises(TypeError):
        m.prefill([1.5, 2.0])
    with pytest.raises(TypeError):
        m.prefill(["a", "b"])
    with pytest.raises(ValueError):
        m.prefill([])


# ---- FlowHead / MambaFlowPolicy ----

@pytest.mark.parametrize("solver", SOLVERS)
def test_flow_head_matches_reference(mamba_path, mamba_ref, solver):
    head = flowedge.FlowHead(mamba_path, max_batch=3)
    assert (head.action_dim, head.cond_dim) == (8, 128)
    cond3, noise3 = mamba_ref("flow_cond3.npy"), mamba_ref("flow_noise3.npy")
    for steps in (3, 10):
        out = head.sample(cond3, noise3, solver=solver, steps=steps)
        assert out.shape == (3, 8)
        assert rel(out, mamba_ref(f"flow3_{solver}_n{steps}.npy")) < 2e-3
    # one row, unbatched shapes
    one = head.sample(mamba_ref("flow_cond1.npy")[0], mamba_ref("flow_noise1.npy")[0], solver=solver, steps=10)
    assert one.shape == (8,)
    assert rel(one, mamba_ref(f"flow1_{solver}_n10.npy")[0]) < 2e-3


@pytest.mark.parametrize("solver", SOLVERS)
def test_policy_act_matches_reference(mamba_path, mamba_ref, solver):
    p = flowedge.MambaFlowPolicy(mamba_path, max_batch=2)
    assert p.has_backbone and p.has_head and p.action_dim == 8 and p.d_model == 128
    tokens, noise = mamba_ref("tokens4.npy"), mamba_ref("flow_noise1.npy")
    a = p.act(tokens, noise[0], solver=solver, steps=10)
    assert rel(a, mamba_ref(f"flow1_{solver}_n10.npy")[0]) < 2e-3
    both = p.act(tokens, np.stack([noise[0], -noise[0]]), solver=solver, steps=10)
    assert both.shape == (2, 8)
    np.testing.assert_allclose(both[0], a, rtol=1e-5, atol=1e-6)
    assert not np.allclose(both[1], a)


def test_split_files(mamba_path):
    d = os.path.dirname(mamba_path)
    head_only = os.path.join(d, "mamba_flow_head_only.safetensors")
    backbone_only = os.path.join(d, "mamba_flow_backbone_only.safetensors")
    if not (os.path.exists(head_only) and os.path.exists(backbone_only)):
        pytest.skip("split fixtures not present")
    p = flowedge.MambaFlowPolicy(head_only)
    assert p.has_head and not p.has_backbone
    with pytest.raises(flowedge.FlowEdgeError, match="no backbone"):
        p.act([1, 2], np.zeros(8, np.float32))
    with pytest.raises(flowedge.FlowEdgeError):
        flowedge.FlowHead(backbone_only)
    m = flowedge.Mamba(backbone_only)
    np.testing.assert_array_equal(m.prefill([1, 2, 3]), flowedge.Mamba(mamba_path).prefill([1, 2, 3]))


def test_input_conversion(mamba_path, mamba_ref):
    head = flowedge.FlowHead(mamba_path)
    cond, noise = mamba_ref("flow_cond1.npy")[0], mamba_ref("flow_noise1.npy")[0]
    ref = head.sample(cond, noise)
    # float64, lists and non-contiguous views are converted; the result is the same
    np.testing.assert_array_equal(head.sample(cond.astype(np.float64), noise.tolist()), ref)
    wide = np.zeros((2 * cond.size,), np.float32)
    wide[::2] = cond
    np.testing.assert_array_equal(head.sample(wide[::2], noise), ref)
    with pytest.raises(TypeError):
        head.sample(["x"] * 128, noise)
    with pytest.raises(TypeError):
        head.sample(cond, None)


def test_flow_errors(mamba_path):
    head = flowedge.FlowHead(mamba_path, max_batch=2)
    cond, noise = np.zeros(128, np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="cond"):
        head.sample(np.zeros(127, np.float32), noise)
    with pytest.raises(ValueError):
        head.sample(np.zeros((3, 128), np.float32), np.zeros((3, 8), np.float32))  # > max_batch
    with pytest.raises(ValueError, match="solver"):
        head.sample(cond, noise, solver="midpoint")
    with pytest.raises(ValueError, match="steps"):
        head.sample(cond, noise, steps=0)
    bad = noise.copy()
    bad[3] = np.nan
    with pytest.raises(flowedge.FlowEdgeError, match="not finite"):
        head.sample(cond, bad)
    with pytest.raises(flowedge.FlowEdgeError, match="cannot open"):
        flowedge.FlowHead("/nonexistent/model.safetensors")
    with pytest.raises(ValueError, match="device"):
        flowedge.FlowHead(mamba_path, device="tpu")


# ---- DiffusionHead ----

def test_diffusion_matches_lerobot(dp_path, dp_ref):
    d = flowedge.DiffusionHead(dp_path, max_batch=2)
    assert (d.action_dim, d.horizon, d.global_cond_dim) == (2, 16, 12)
    assert (d.n_obs_steps, d.n_action_steps, d.num_train_timesteps) == (2, 8, 100)
    assert d.n_parameters == 289970
    cond, noise = dp_ref("cond.npy"), dp_ref("noise.npy")
    for t in (0, 50, 99):
        eps = d.denoise(cond, noise, t)
        assert eps.shape == noise.shape
        assert np.max(np.abs(eps - dp_ref(f"eps_t{t}.npy"))) < 3e-4
    ddim = d.sample(cond, noise, steps=10, scheduler="ddim", normalized=True)
    assert np.max(np.abs(ddim - dp_ref("ddim10_norm.npy"))) < 6e-4
    act = d.sample(cond, noise, steps=10, scheduler="ddim")
    half = (np.asarray(d.action_max) - np.asarray(d.action_min)) / 2
    assert np.all(np.abs(act - dp_ref("ddim10_action.npy")) <= 6e-4 * half + 1e-3)
    for steps in (10, 100):
        ddpm = d.sample(cond, noise, steps=steps, scheduler="ddpm", seed=7, normalized=True)
        assert np.max(np.abs(ddpm - dp_ref(f"ddpm{steps}_norm.npy"))) < 8e-4


def test_diffusion_batch_and_broadcast(dp_path, dp_ref):
    d = flowedge.DiffusionHead(dp_path, max_batch=2)
    cond, noise = dp_ref("cond.npy"), dp_ref("noise.npy")
    both = d.sample(cond, noise, scheduler="ddpm", seed=3)
    one = d.sample(cond[1], noise[1], scheduler="ddpm", seed=4)  # row b uses seed + b
    assert one.shape == (16, 2)
    np.testing.assert_allclose(both[1], one, rtol=1e-5, atol=1e-4)
    shared = d.sample(cond[0], noise)  # one condition for every row
    np.testing.assert_allclose(shared[0], d.sample(cond[0], noise[0]), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="max_batch"):
        d.sample(np.zeros((3, 12)), np.zeros((3, 16, 2)))


def test_batch_rows_match_batch_one_to_rounding(dp_path):
    """Rows of one call are bit-identical for identical inputs; batch 1 and batch >= 2 may differ in the last bits
    (python/README.md, "Batches": the CPU linear kernels sum a dot product in another order for one column)."""
    d = flowedge.DiffusionHead(dp_path, max_batch=4)
    rng = np.random.default_rng(0)
    cond = rng.standard_normal((4, 12)).astype(np.float32)
    noise = rng.standard_normal((4, 16, 2)).astype(np.float32)
    same = d.sample(np.repeat(cond[:1], 4, 0), np.repeat(noise[:1], 4, 0), normalized=True)
    assert all(np.array_equal(same[0], same[b]) for b in range(4))
    four = d.sample(cond, noise, normalized=True)
    for b in range(4):
        one = d.sample(cond[b], noise[b], normalized=True)
        assert np.max(np.abs(four[b] - one)) < 1e-5  # normalised units; measured 1.4e-6


def test_diffusion_errors(dp_path):
    d = flowedge.DiffusionHead(dp_path)
    cond, noise = np.zeros(12, np.float32), np.zeros((16, 2), np.float32)
    with pytest.raises(ValueError, match="noise"):
        d.sample(cond, np.zeros((15, 2), np.float32))
    with pytest.raises(ValueError, match="steps"):
        d.sample(cond, noise, steps=101)
    with pytest.raises(ValueError, match="scheduler"):
        d.sample(cond, noise, scheduler="euler")
    with pytest.raises(ValueError, match="timestep"):
        d.denoise(cond, noise, 100)
    bad = cond.copy()
    bad[0] = np.inf
    with pytest.raises(flowedge.FlowEdgeError, match="non-finite"):
        d.sample(bad, noise)
    with pytest.raises(ValueError, match="dtype"):
        flowedge.DiffusionHead(dp_path, dtype="int8")


def test_seed_is_a_non_negative_int(dp_path):
    d = flowedge.DiffusionHead(dp_path)
    cond, noise = np.zeros(12, np.float32), np.zeros((16, 2), np.float32)
    with pytest.raises(flowedge.FlowEdgeValueError, match=r"seed must be >= 0 \(got -1\)"):
        d.sample(cond, noise, scheduler="ddpm", seed=-1)
    with pytest.raises(ValueError, match="seed must be below 2\\*\\*64"):
        d.sample(cond, noise, scheduler="ddpm", seed=2**64)
    big = d.sample(cond, noise, steps=2, scheduler="ddpm", seed=2**64 - 1)
    assert np.all(np.isfinite(big))
    # the scheduler name is case-insensitive, like the programs' --scheduler
    np.testing.assert_array_equal(d.sample(cond, noise, scheduler="DDIM"), d.sample(cond, noise, scheduler="ddim"))


def test_signatures_name_the_allowed_values():
    doc = flowedge.DiffusionHead.__init__.__doc__
    assert "typing.Literal['cpu', 'cuda', 'auto']" in doc
    assert "typing.Literal['float32', 'bfloat16', 'float16'] | numpy.dtype | None" in doc
    assert "seed: int = 0" in flowedge.DiffusionHead.sample.__doc__


def test_diffusion_reduced_precision_weights(dp_path, dp_ref):
    cond, noise = dp_ref("cond.npy")[0], dp_ref("noise.npy")[0]
    ref = flowedge.DiffusionHead(dp_path).sample(cond, noise, normalized=True)
    for dt in ("bfloat16", np.float16):
        out = flowedge.DiffusionHead(dp_path, dtype=dt).sample(cond, noise, normalized=True)
        assert np.max(np.abs(out - ref)) < 5e-2  # BF16/F16 weights: their own, looser bound


# ---- GIL and threads ----

def test_gil_released_during_inference(dp_path):
    """Two threads on two models overlap only if the GIL is released while C++ runs."""
    heads = [flowedge.DiffusionHead(dp_path, max_batch=8) for _ in range(2)]
    cond, noise = np.zeros(12, np.float32), np.ones((16, 2), np.float32)
    t = time.perf_counter()
    heads[0].sample(cond, noise, steps=100)
    one = time.perf_counter() - t
    if one < 0.02:  # a fast machine: batch 8 makes each call long enough that a held GIL would starve the ticker
        cond, noise = np.zeros((8, 12), np.float32), np.ones((8, 16, 2), np.float32)
        t = time.perf_counter()
        heads[0].sample(cond, noise, steps=100)
        one = time.perf_counter() - t
    ref = heads[0].sample(cond, noise, steps=100)
    reps = max(3, math.ceil(0.2 / one))  # each worker runs for >= ~0.2 s
    ticks = []
    stop = threading.Event()

    def ticker():  # pure-Python loop: runs only while the other threads do not hold the GIL
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    results = [None, None]

    def work(i):
        for _ in range(reps):
            results[i] = heads[i].sample(cond, noise, steps=100)

    t0 = time.perf_counter()
    tick = threading.Thread(target=ticker)
    tick.start()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    stop.set()
    tick.join()
    for r in results:
        np.testing.assert_array_equal(r, ref)
    # With the GIL held for a whole call the ticker gets at most a tick or two between calls (<= ~2 per call);
    # with it released the ticker runs throughout (~1 tick per ms of the >= 0.2 s run).
    n_calls = 2 * reps
    assert one >= 0.005, f"calls too fast to tell ({one * 1e3:.2f} ms)"
    assert len(ticks) >= max(3 * n_calls, 50), (len(ticks), n_calls, elapsed)


def test_one_model_from_two_threads(mamba_path):
    """Calls on one object from two threads are serialised: every result equals the single-threaded one."""
    p = flowedge.MambaFlowPolicy(mamba_path)
    noise = np.sin(0.3 * np.arange(8)).astype(np.float32)
    ref = {s: p.act([1, 2, 3, 4], noise, solver=s) for s in SOLVERS}
    errors = []

    def work(s):
        for _ in range(50):
            if not np.array_equal(p.act([1, 2, 3, 4], noise, solver=s), ref[s]):
                errors.append(s)

    ts = [threading.Thread(target=work, args=(s,)) for s in SOLVERS]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


# ---- device contract (docs/contracts.md): "cuda" is a promise, "auto" may fall back and says why ----

def test_explicit_cuda_without_a_usable_gpu_raises(mamba_path, dp_path, clean_env):
    """device="cuda" fails unless the model ends up resident on the GPU, as the programs' --device cuda does."""
    for make in (lambda: flowedge.DiffusionHead(dp_path, device="cuda"), lambda: flowedge.Mamba(mamba_path, device="cuda"),
                 lambda: flowedge.FlowHead(mamba_path, device="cuda"),
                 lambda: flowedge.MambaFlowPolicy(mamba_path, device="cuda")):
        try:
            m = make()
        except flowedge.FlowEdgeError as e:
            assert not isinstance(e, ValueError)  # a device problem, not a bad argument
            assert "device='cuda' requested" in str(e) and "device='auto'" in str(e)
            if not flowedge.cuda:
                assert "no CUDA backend" in str(e)
        else:  # only a CUDA build with a usable GPU gets here
            assert flowedge.cuda and m.cuda_resident and m.backend == "cuda" and m.fallback_reason == ""
    # FORCE_HOST makes residency impossible on any machine: "cuda" must raise, never run on the CPU.
    clean_env.setenv("FLOWEDGE_CUDA_FORCE_HOST", "1")
    with pytest.raises(flowedge.FlowEdgeError, match="device='cuda' requested") as err:
        flowedge.Mamba(mamba_path, device="cuda")
    if flowedge.cuda:
        assert "not resident on the GPU" in str(err.value) and "FORCE_HOST" in str(err.value)


def test_auto_falls_back_and_reports_why(mamba_path, clean_env):
    m = flowedge.MambaFlowPolicy(mamba_path, device="auto")
    if not flowedge.cuda:
        assert m.cuda_resident is False and m.backend == "cpu"
        assert "no CUDA backend" in m.fallback_reason
    else:
        assert m.backend == ("cuda" if m.cuda_resident else "cpu")
        assert (m.fallback_reason == "") == m.cuda_resident
    noise = np.sin(0.3 * np.arange(8)).astype(np.float32)
    cpu = flowedge.MambaFlowPolicy(mamba_path).act([1, 2, 3, 4], noise)
    assert rel(m.act([1, 2, 3, 4], noise), cpu) < 2e-3
    assert flowedge.Mamba(mamba_path, device="cpu").fallback_reason == ""
    with pytest.raises(ValueError, match="expected 'cpu', 'cuda' or 'auto'"):
        flowedge.Mamba(mamba_path, device="gpu")


def test_cuda_required_and_force_host(mamba_path, dp_path, clean_env):
    clean_env.setenv("FLOWEDGE_CUDA_FORCE_HOST", "1")
    m = flowedge.Mamba(mamba_path, device="auto")
    assert m.cuda_resident is False and "FORCE_HOST" in m.fallback_reason
    clean_env.setenv("FLOWEDGE_CUDA_REQUIRED", "1")
    with pytest.raises(flowedge.FlowEdgeError, match="FLOWEDGE_CUDA_REQUIRED"):
        flowedge.DiffusionHead(dp_path, device="auto")
    clean_env.delenv("FLOWEDGE_CUDA_FORCE_HOST")
    if not flowedge.cuda:
        for cls in (flowedge.Mamba, flowedge.FlowHead, flowedge.MambaFlowPolicy):
            with pytest.raises(flowedge.FlowEdgeError, match="FLOWEDGE_CUDA_REQUIRED"):
                cls(mamba_path, device="auto")
    # only exactly "1" counts, and a cpu request ignores the flag
    assert flowedge.Mamba(mamba_path, device="cpu").cuda_resident is False
    clean_env.setenv("FLOWEDGE_CUDA_REQUIRED", "yes")
    flowedge.Mamba(mamba_path, device="auto")
