"""Tests of the prediction-error measurement (pipelab.prediction_error) against direct computation."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from pipelab.prediction_error import WeightRing, measure_prediction_error
from pipelab.studies.data import DataError
from pipelab.studies.prediction_error import (
    PredictionErrorConfig,
    in_pipeline_rows,
    layer_text,
    left_chance_at,
    prediction_optimizer,
    result_csv,
    run_prediction_error,
    summary_text,
    window_ratio,
)

DT = torch.float64


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).to(DT)


def _batches(n, seed=1, fixed=False):
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(8, 4, generator=gen, dtype=DT)
    out = []
    for _ in range(n):
        x = x0 if fixed else torch.randn(8, 4, generator=gen, dtype=DT)
        out.append((x, torch.randint(0, 3, (8,), generator=gen)))
    return out


def test_weight_ring_keeps_last_versions():
    w = [torch.zeros(2)]
    ring = WeightRing(w, 3)
    for t in range(5):
        ring.push(t, [torch.full((2,), float(t))])
    assert ring.get(4)[0][0] == 4 and ring.get(2)[0][0] == 2
    with pytest.raises(KeyError, match="version 1"):
        ring.get(1)
    with pytest.raises(ValueError, match="capacity"):
        WeightRing(w, 0)


def test_rmse_and_cosine_match_direct_computation():
    """Replay the same training by hand, keep the whole trajectory, and recompute the metrics."""
    model, batches, S, lr, mu = _model(), _batches(12), 3, 0.1, 0.9
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=mu)
    res = measure_prediction_error(model, opt, batches, ["stale", "spectrain", "linear"], max_s=S, measure_every=2)
    assert res.layers == ["0", "2"] and res.predictors == ["stale", "spectrain", "linear"]
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=mu)
    params = list(ref.parameters())
    traj, bufs = [[p.detach().clone() for p in params]], [None]
    for x, y in batches:
        ref_opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        traj.append([p.detach().clone() for p in params])
        bufs.append([ref_opt.state[p]["momentum_buffer"].clone() for p in params])
    layer_of = [0, 0, 1, 1]
    for ti, t in enumerate(res.origins):
        for s in range(1, S + 1):
            if t + s > len(batches):
                assert np.isnan(res.rmse[:, s - 1, ti]).all()
                continue
            true, base = traj[t + s], traj[t]
            preds = {"stale": base, "spectrain": [w - s * lr * b for w, b in zip(base, bufs[t])],
                     "linear": [w + s * (w - w0) for w, w0 in zip(base, traj[t - 1])]}
            for pi, name in enumerate(res.predictors):
                for li in range(3):
                    sel = [i for i in range(4) if li == 2 or layer_of[i] == li]
                    err = torch.cat([(preds[name][i] - true[i]).flatten() for i in sel])
                    d_pred = torch.cat([(preds[name][i] - base[i]).flatten() for i in sel])
                    d_true = torch.cat([(true[i] - base[i]).flatten() for i in sel])
                    assert res.rmse[pi, s - 1, ti, li] == pytest.approx(err.square().mean().sqrt().item(), rel=1e-10)
                    assert res.stale[s - 1, ti, li] == pytest.approx(d_true.square().mean().sqrt().item(), rel=1e-10)
                    if name != "stale":
                        cos = torch.nn.functional.cosine_similarity(d_pred, d_true, dim=0).item()
                        assert res.cosine[pi, s - 1, ti, li] == pytest.approx(cos, rel=1e-9)
    # spectrain and linear coincide for undamped SGDM with a constant lr
    np.testing.assert_allclose(res.rmse[1], res.rmse[2], rtol=1e-9)


def test_repeat_is_exact_under_constant_gradient():
    """A loss linear in the outputs, on a linear model with a fixed batch, has a constant gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).to(DT)
    opt = prediction_optimizer("adamw", model.parameters())
    res = measure_prediction_error(model, opt, _batches(10, fixed=True), ["stale", "repeat", "pipeoptim"], max_s=3,
                                   loss_fn=lambda out, y: out.sum())
    ratio = res.ratio()[:, :, :, -1]
    assert np.nanmax(ratio[1]) < 1e-12            # repeat: exact
    assert np.nanmax(ratio[2]) > 1e-6             # pipeoptim: not exact (moments still changing)
    np.testing.assert_allclose(res.cosine[1, :, :-3, -1], 1.0, rtol=1e-9)
    assert np.isnan(res.cosine[0]).all()
    s = res.summary_ratio()
    assert s.shape == (3, 3) and np.allclose(s[0], 1.0)
    per_layer = res.summary_ratio(per_layer=True)
    assert per_layer.shape == (3, 3, 2) and np.allclose(per_layer[..., -1], s)
    assert "repeat" in layer_text(res, 2) and "ratio s=3" in summary_text(res)
    with pytest.raises(ValueError, match="s must be"):
        layer_text(res, 4)


def test_divergence_is_recorded_not_raised():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).to(DT)
    opt = torch.optim.SGD(model.parameters(), lr=1e10)
    res = measure_prediction_error(model, opt, _batches(60), ["stale", "pipeoptim"], max_s=2,
                                   loss_fn=lambda out, y: out.square().mean())
    assert res.diverged_at is not None and res.diverged_at <= 60
    assert not np.isfinite(res.loss[res.diverged_at - 1]) and np.isnan(res.loss[res.diverged_at:]).all()


def test_bad_arguments():
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(ValueError, match="max_s"):
        measure_prediction_error(model, opt, _batches(3), ["stale"], max_s=0)
    with pytest.raises(ValueError, match="SGD"):
        measure_prediction_error(model, opt, _batches(3), ["spectrain"])
    with pytest.raises(ValueError, match="unknown optimizer"):
        prediction_optimizer("lion", model.parameters())


def test_run_prediction_error_on_fashion_mnist_subset():
    cfg = PredictionErrorConfig(optimizer="adam", steps=12, batch_size=16, train_subset=500, measure_every=3,
                                model_options=(("depth", 3), ("width", 16)),
                                predictors=("stale", "spectrain", "repeat"))
    try:
        res = run_prediction_error(cfg)
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    assert res.predictors == ["stale", "repeat"] and res.meta["skipped"] == ["spectrain"]
    assert res.rmse.shape == (2, 3, 3, 4) and np.isfinite(res.rmse[:, 0]).all()
    assert "predictor,s,origin" in result_csv(res)


def test_left_chance_at_matches_a_direct_scan():
    rng = np.random.default_rng(0)
    loss = np.concatenate([np.log(10) + 0.01 * rng.standard_normal(30), np.full(20, 0.5)])
    res = measure_prediction_error(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), _batches(3), ["stale"])
    res.loss = loss
    want = next(t for t in range(10, len(loss) + 1) if loss[t - 10:t].mean() < 0.9 * np.log(10))
    assert left_chance_at(res) == want == 32  # 2 of the 10 steps after the plateau pull the mean below
    res.loss = np.full(50, np.log(10))
    assert left_chance_at(res) is None
    with pytest.raises(ValueError, match="fraction"):
        left_chance_at(res, fraction=1.5)


def test_config_init_is_checked():
    with pytest.raises(ValueError, match="init must be one of"):
        PredictionErrorConfig(init="xavier")


def test_sgdm_run_of_the_figures_leaves_chance_early():
    """The SGDM figure's quick run (8x128 ReLU MLP, batch 128, lr 0.05): He init (the default) leaves chance
    level within a few dozen steps; PyTorch's default init sits at ln 10 for ~100 steps, the plateau behind
    the jump near step 110 the old figure showed."""
    from pipelab.studies.figures.prediction import PRESET_CONFIGS

    base = dataclasses.replace(PRESET_CONFIGS["quick"].base, optimizer="sgdm", steps=60, predictors=("stale",))
    try:
        he = run_prediction_error(base)
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    torch_init = run_prediction_error(dataclasses.replace(base, init="torch"))
    assert base.init == "he" and he.meta["init"] == "he" and he.meta["lr"] == 0.05
    left = left_chance_at(he)
    assert left is not None and left <= 30
    assert np.mean(he.loss[40:60]) < 0.6 * np.log(10)
    assert left_chance_at(torch_init) is None  # still on the plateau after 60 steps
    assert np.mean(torch_init.loss[40:60]) == pytest.approx(np.log(10), abs=0.02)


def test_prediction_figures_name_lr_init_and_preset():
    from pipelab.studies import figures

    try:
        out = figures.make("prediction_rmse_sgdm", "tiny")
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    title = out.figure.get_suptitle()
    assert "lr 0.05" in title and "He init" in title and "tiny preset" in title
    assert out.notes["lr"] == 0.05 and out.notes["init"] == "he" and out.notes["left_chance_at"] is not None
    summary = figures.make("prediction_ratio_summary", "tiny")
    assert "tiny preset" in summary.figure.get_suptitle()
    ticks = [t.get_text() for t in summary.figure.axes[0].get_xticklabels()]
    assert any("lr 0.05" in t for t in ticks) and any("lr 0.001" in t for t in ticks)  # SGDM and Adam


# --- inside the pipeline: each stage's weights at its real staleness during pipelined training ------------------

def _linear_stages(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 4), nn.Linear(4, 3)).to(DT)


def _recorded_run(model, batches, policy, D, lr):
    """An independent record of the same pipelined run: every stage's version W^(v), read after each optimizer
    step by the test's own optimizer (no pipelab measurement code), and the jobs' weight specs."""
    from pipelab.emulator import Emulator
    from pipelab.schedules import pipedream

    traj: dict[int, list[list[torch.Tensor]]] = {}

    def factory(params):
        params = list(params)
        opt = torch.optim.SGD(params, lr=lr)
        k = len(traj)
        traj[k] = [[p.detach().clone() for p in params]]
        opt.register_step_post_hook(lambda o, a, kw: traj[k].append([p.detach().clone() for p in params]))
        return opt

    emu = Emulator(model, D=D, schedule=pipedream(D, 1, len(batches)), policy=policy, optimizer=factory)
    emu.run(batches)
    return traj, emu.specs


def _rmse(a, b):
    return float(torch.sqrt(torch.cat([(x - y).flatten() for x, y in zip(a, b)]).square().mean()))


def test_in_pipeline_error_pins_on_hand_computed_pipeoptim_sgd():
    """PipeOptim with plain SGD predicts Ŵ = W^(b) − s·η·g_b = W^(b) + s·(W^(b) − W^(b−1)) (the last update
    repeated s times, g_0 = 0); the errors of Ŵ and of W^(b) against W^(b+s) are recomputed from an
    independent record of the same pipelined run, layer by layer (one Linear per stage)."""
    from pipelab.optim import optimizer_factory
    from pipelab.policies import Predicted
    from pipelab.prediction_error import measure_in_pipeline

    D, lr, batches = 3, 0.2, _batches(10)
    model = _linear_stages()
    ref_model = copy.deepcopy(model)
    res = measure_in_pipeline(model, batches, policy="pipeoptim", optimizer=optimizer_factory("sgd", lr=lr), D=D)
    traj, specs = _recorded_run(ref_model, batches, "pipeoptim", D, lr)
    assert res.layers == ["0", "1", "2"] and res.layer_stage == [0, 1, 2]
    assert res.stage_s() == [2, 1, 0]  # PipeOptim's s = D − k − 1 in steady state
    checked = 0
    for i in range(len(res.op)):
        k, t, s = int(res.stage[i]), int(res.step[i]), int(res.s[i])
        assert res.op[i] == "F"
        spec = specs[(k, t, 0)][0]
        base = spec.base if isinstance(spec, Predicted) else spec.version
        assert s == (spec.s if isinstance(spec, Predicted) else 0)
        W = traj[k]
        if base + s >= len(W):
            continue
        prev = W[max(base - 1, 0)]
        w_hat = [w + s * (w - w0) for w, w0 in zip(W[base], prev)]
        assert res.pred[i, k] == pytest.approx(_rmse(w_hat, W[base + s]), rel=1e-9, abs=1e-13)
        assert res.stale[i, k] == pytest.approx(_rmse(W[base], W[base + s]), rel=1e-9, abs=1e-13)
        assert np.isnan(np.delete(res.pred[i], k)).all()
        checked += s > 0 and res.stale[i, k] > 0
    assert checked >= 10  # the steady state, where the stale weights are really off
    ratio = window_ratio(res, 2)
    assert np.isnan(ratio[2]).all() and np.isfinite(ratio[:2]).all()  # the last stage predicts nothing


def test_in_pipeline_stale_baseline_of_pipemare_backward_matches_record():
    """PipeMare predicts in the backward, back to the forward's version (s < 0); its stale baseline is
    ‖W^(cur(B)) − W^(cur(F))‖, read from the independent record."""
    from pipelab.optim import optimizer_factory
    from pipelab.policies import PipeMarePolicy, Predicted
    from pipelab.prediction_error import measure_in_pipeline

    D, lr, batches = 3, 0.2, _batches(10)
    model = _linear_stages(1)
    ref_model = copy.deepcopy(model)
    res = measure_in_pipeline(model, batches, policy=PipeMarePolicy(anneal_steps=0),
                              optimizer=optimizer_factory("sgd", lr=lr), D=D)
    traj, specs = _recorded_run(ref_model, batches, PipeMarePolicy(anneal_steps=0), D, lr)
    assert res.predicted_op == "B" and res.stage_s() == [-2, -1, 0]
    back = np.flatnonzero(res.op == "B")
    assert back.size > 10
    for i in back:
        k, t = int(res.stage[i]), int(res.step[i])
        spec = specs[(k, t, 0)][1]
        assert isinstance(spec, Predicted) and spec.s == res.s[i] < 0
        W = traj[k]
        assert res.stale[i, k] == pytest.approx(_rmse(W[spec.base], W[spec.base + spec.s]), rel=1e-9, abs=1e-13)
        assert np.isfinite(res.pred[i, k])


def test_in_pipeline_without_staleness_has_zero_stale_error():
    """D = 1: every forward runs at the current version, so stale and used weights are the true ones."""
    from pipelab.optim import optimizer_factory
    from pipelab.prediction_error import measure_in_pipeline

    res = measure_in_pipeline(_linear_stages(), _batches(6), policy="spectrain",
                              optimizer=optimizer_factory("sgdm", lr=0.1), D=1)
    assert len(res.op) == 6 and (res.s == 0).all() and res.stage_s() == [0]
    assert np.array_equal(res.stale, np.zeros((6, 3))) and np.array_equal(res.pred, np.zeros((6, 3)))
    assert np.isnan(window_ratio(res, 3)).all()  # nothing predicted: no ratio
    rows = in_pipeline_rows(res, 3)
    assert len(rows) == 3 * 4 and all(r["jobs"] == 0 and r["s"] == 0 for r in rows)


def test_in_pipeline_rows_and_csv_agree_with_the_events():
    """Window means in the rows are plain means of the events' RMSEs; the CSV carries the same numbers."""
    import csv
    import io

    from pipelab.optim import optimizer_factory
    from pipelab.prediction_error import measure_in_pipeline
    from pipelab.studies.prediction_error import rows_to_csv

    res = measure_in_pipeline(_linear_stages(), _batches(12), policy="pipeoptim",
                              optimizer=optimizer_factory("adam", lr=1e-2), D=3)
    rows = in_pipeline_rows(res, phases=3)
    parsed = list(csv.DictReader(io.StringIO(rows_to_csv(in_pipeline_rows(res, phases=3)))))
    assert len(parsed) == len(rows) == 3 * 4
    for r, p in zip(rows, parsed):
        li = res.layers.index(r["layer"])
        sel = (res.op == "F") & (res.s != 0) & (res.step >= r["step_from"]) & (res.step < r["step_to"])
        sel &= np.isfinite(res.pred[:, li])
        assert r["jobs"] == sel.sum()
        if sel.any():
            want = res.pred[sel, li].mean() / res.stale[sel, li].mean()
            assert r["ratio"] == pytest.approx(want, rel=1e-12)
            assert float(p["ratio"]) == pytest.approx(want, rel=1e-5)
        else:
            assert p["ratio"] == ""


def test_in_pipeline_bad_arguments():
    from pipelab.optim import optimizer_factory
    from pipelab.prediction_error import measure_in_pipeline
    from pipelab.studies.prediction_error import InPipelineConfig

    with pytest.raises(ValueError, match="policy must predict"):
        measure_in_pipeline(_linear_stages(), _batches(3), policy="stashing", optimizer=optimizer_factory("sgd"), D=2)
    with pytest.raises(TypeError, match="nn.Sequential"):
        measure_in_pipeline([nn.Linear(4, 3)], _batches(3), policy="pipeoptim", optimizer=optimizer_factory("sgd"),
                            D=1)
    with pytest.raises(ValueError, match="policy must be one of"):
        InPipelineConfig(policy="vanilla")
    with pytest.raises(ValueError, match="D must be"):
        InPipelineConfig(D=0)


def test_prediction_in_pipeline_figure_csv_and_markdown():
    """The figure names preset, D and each panel's lr; its CSV is its rows; the notebook's per-layer sentences
    quote exactly the CSV's whole-run ratios."""
    import csv
    import io
    import re

    from pipelab.studies import figures
    from pipelab.studies.figures.prediction import in_pipeline_markdown
    from pipelab.studies.prediction_error import read_rows_csv

    try:
        out = figures.make("prediction_in_pipeline", "tiny")
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    title = out.figure.get_suptitle()
    assert "tiny preset" in title and "D = 4" in title and "He init" in title
    panel_titles = [ax.get_title() for ax in out.figure.axes if ax.get_title()]
    assert any("SGDM, lr 0.01" in t for t in panel_titles) and any("Adam, lr 0.001" in t for t in panel_titles)
    parsed = list(csv.DictReader(io.StringIO(out.tables["csv"])))
    assert len(parsed) == len(out.data) > 0
    assert {(r["policy"], r["optimizer"]) for r in parsed} == {("pipeoptim", "sgdm"), ("spectrain", "sgdm"),
                                                                ("pipemare", "sgdm"), ("pipeoptim", "adam"),
                                                                ("pipemare", "adam"), ("pipeoptim", "nadam"),
                                                                ("pipeoptim", "muon")}
    whole = [r for r in out.data if r["phase"] == "all"]
    # PipeOptim's last stage (s = 0) predicts nothing: empty ratio cells, not zeros
    assert all(r["ratio"] != r["ratio"] for r in whole if r["policy"] == "pipeoptim" and r["s"] == 0)
    text = in_pipeline_markdown(out.data)
    bullets = "\n".join(line for line in text.splitlines() if line.startswith("- **"))
    quoted = set(re.findall(r"\b\d\.\d\d\b", bullets))
    allowed = {f"{r['ratio']:.2f}" for r in whole if r["ratio"] == r["ratio"]}
    for pol, opt in {(r["policy"], r["optimizer"]) for r in out.data}:  # first- and last-window means
        for phase in ("0", "1"):
            vals = [r["ratio"] for r in out.data if (r["policy"], r["optimizer"], r["phase"]) == (pol, opt, phase)
                    and r["ratio"] == r["ratio"]]
            allowed.add(f"{np.mean(vals):.2f}")
    assert quoted and quoted <= allowed, quoted - allowed
    groups = _by_panel_stage(whole).values()
    if any(len(v) > 1 for v in groups):
        assert f"differ by at most {max(max(v) - min(v) for v in groups):.2f}" in text
    else:  # tiny: one block per stage
        assert "Each stage holds one layer" in text
    for back, row in zip(read_rows_csv(out.tables["csv"]), out.data):  # the CSV reads back to the rows
        for f, v in row.items():
            assert back[f] == (v if isinstance(v, str | int) else pytest.approx(v, rel=1e-5, nan_ok=True)), f
    pipeoptim_sgdm = next(line for line in text.splitlines() if "PipeOptim · SGDM" in line)
    best = min((r for r in whole if r["policy"] == "pipeoptim" and r["optimizer"] == "sgdm"
                and r["ratio"] == r["ratio"]), key=lambda r: r["ratio"])
    assert f"`L{best['layer']}` ({best['ratio']:.2f})" in pipeoptim_sgdm


def _by_panel_stage(rows):
    out = {}
    for r in rows:
        if r["ratio"] == r["ratio"]:
            out.setdefault((r["policy"], r["optimizer"], r["stage"]), []).append(r["ratio"])
    return out



def test_notebook_02_per_layer_prose_is_generated_or_marked_plain():
    """No typed per-layer number in notebook 02's Markdown: per-layer statements come from code cells built on
    the in-pipeline CSV rows (``in_pipeline_markdown``), and the notebook uses that helper."""
    import json
    import re
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "02_prediction_error.ipynb").read_text())
    layer_number = re.compile(r"(\bL\d\b|\blayers?\b|classifier head)[^.\n]{0,60}?\b\d\.\d\d", re.IGNORECASE)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"])
            assert not layer_number.search(src), layer_number.search(src)
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "in_pipeline_markdown" in code and "prediction_in_pipeline" in code


@pytest.mark.parametrize("name", ["error_feedback", "dc_asgd"])
def test_gradient_correction_in_pipeline_pins_on_a_hand_computed_run(name):
    """Stage 0 holds the only weights (stage 1 is a Tanh), so its gradient at step t is exactly ∇f_t(W^(used))
    with used = max(t − 1, 0) on both schedules (2BW; stashing on asynchronous 1F1B), the reference is
    ∇f_t(W^(t)), and the run is SGD on the corrected gradient: replayed here step by step."""
    from pipelab.policies import make_policy
    from pipelab.prediction_error import measure_in_pipeline

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 2, bias=False), nn.Tanh()).to(DT)
    W0 = model[0].weight.detach().clone()
    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 3, generator=gen, dtype=DT), torch.randn(4, 2, generator=gen, dtype=DT))
               for _ in range(6)]
    lr, lam = 0.3, 2.0
    policy = make_policy(name, **({"lam": lam} if name == "dc_asgd" else {}))
    mse = nn.functional.mse_loss
    res = measure_in_pipeline(model, batches, policy=policy, optimizer=lambda p: torch.optim.SGD(p, lr=lr), D=2,
                              loss_fn=mse)
    assert "correct_gradient" not in vars(policy)  # the observer is removed after the run

    def grad(W, t):
        W = W.clone().requires_grad_(True)
        x, y = batches[t]
        return torch.autograd.grad(mse(torch.tanh(x @ W.T), y), W)[0]

    W, prev = [W0], None
    want_pred, want_stale, want_s = [], [], []
    for t in range(6):
        used = max(t - 1, 0)
        g = grad(W[used], t)
        s = t - used
        if name == "error_feedback":
            corrected = g if prev is None or s == 0 else g + s * (g - prev)
            prev = g
        else:
            corrected = g + lam * g * g * (W[t] - W[used])
        ref = grad(W[t], t)
        want_pred.append(float((corrected - ref).square().mean().sqrt()))
        want_stale.append(float((g - ref).square().mean().sqrt()))
        want_s.append(s)
        W.append(W[t] - lr * corrected)
    assert res.predicted_op == "G" and list(res.op) == ["G"] * 6 and list(res.stage) == [0] * 6
    assert list(res.step) == list(range(6)) and list(res.s) == want_s
    assert res.pred[:, 0] == pytest.approx(want_pred, rel=1e-9, abs=1e-15)
    assert res.stale[:, 0] == pytest.approx(want_stale, rel=1e-9, abs=1e-15)
    assert res.stale[0, 0] < 1e-15 and res.pred[1, 0] != res.stale[1, 0]  # step 0 is fresh; later ones corrected
    assert torch.allclose(model[0].weight.detach(), W[-1], rtol=0, atol=1e-12)
    rows = in_pipeline_rows(res, phases=2)
    assert {r["op"] for r in rows} == {"G"} and rows[-1]["jobs"] == 5  # the five delayed updates


def test_muon_runs_on_the_bias_free_mlp_in_every_prediction_figure():
    from pipelab.studies import figures
    from pipelab.studies.figures.prediction import IN_PIPELINE_CONFIGS, PRESET_CONFIGS, model_for

    assert model_for("adam", "deep_mlp", (("depth", 4),)) == ("deep_mlp", (("depth", 4),))
    assert model_for("muon", "deep_mlp", (("depth", 4), ("bias", True))) == ("deep_mlp", (("depth", 4),
                                                                                          ("bias", False)))
    assert model_for("muon", "small_cnn", ()) is None
    run = IN_PIPELINE_CONFIGS["tiny"].run_config("pipeoptim", "muon")
    assert dict(run.model_options)["bias"] is False and run.lr == 0.02
    assert "bias" not in dict(IN_PIPELINE_CONFIGS["tiny"].run_config("pipeoptim", "nadam").model_options)
    assert {"nadam", "muon"} <= set(PRESET_CONFIGS["tiny"].optimizers) <= set(PRESET_CONFIGS["quick"].optimizers)
    try:
        out = figures.make("prediction_rmse_muon", "tiny")
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    assert "Muon, lr 0.02" in out.figure.get_suptitle() and "without biases" in out.figure.get_suptitle()
    assert "spectrain" not in out.data.predictors and "pipeoptim" in out.data.predictors  # SpecTrain needs SGDM
    assert np.isfinite(out.notes["ratio/pipeoptim/s=1"])


def test_gradient_correction_figure_csv_and_markdown():
    """The figure's CSV is its rows (op G, each correcting policy at its schedule's staleness: 2BW's s = 1 on every
    stage, stashing's D − k − 1); the notebook's sentences quote exactly the CSV's stage means."""
    import re

    from pipelab.studies import figures
    from pipelab.studies.figures.prediction import correction_markdown
    from pipelab.studies.prediction_error import read_rows_csv

    try:
        out = figures.make("gradient_correction_in_pipeline", "tiny")
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    rows = read_rows_csv(out.tables["csv"])
    assert len(rows) == len(out.data) > 0 and {r["op"] for r in rows} == {"G"}
    assert {(r["policy"], r["optimizer"]) for r in rows} == {("error_feedback", "sgdm"), ("error_feedback", "adamw"),
                                                             ("error_feedback", "muon"), ("dc_asgd", "sgdm"),
                                                             ("dc_asgd", "adamw")}
    assert {r["s"] for r in rows if r["policy"] == "error_feedback"} == {1}
    assert {(r["stage"], r["s"]) for r in rows if r["policy"] == "dc_asgd"} == {(0, 3), (1, 2), (2, 1), (3, 0)}
    whole = [r for r in rows if r["phase"] == "all"]
    assert all(r["ratio"] != r["ratio"] for r in whole if r["s"] == 0)  # no delayed update, no ratio
    text = correction_markdown(rows)
    allowed = set()
    for key in {(r["policy"], r["optimizer"], r["stage"]) for r in whole}:
        vals = [r["ratio"] for r in whole
                if (r["policy"], r["optimizer"], r["stage"]) == key and r["ratio"] == r["ratio"]]
        if vals:
            allowed.add(f"{np.mean(vals):.2f}")
    quoted = set(re.findall(r"\) (\d+\.\d\d)", text))
    assert quoted and quoted <= allowed, quoted - allowed
    assert "RMSE corrected / uncorrected gradient" in out.figure.axes[-1].get_ylabel()
