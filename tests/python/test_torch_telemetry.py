"""spikeguard.torch: every StepReport field against a computation by hand."""
import math
import os
import struct
import sys

import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "worker", "examples", "torch_gpt"))

from model import GPT, GPTConfig, token_losses  # noqa: E402
from spikeguard.torch import (Telemetry, discover_layers, loss_hash, report_json,  # noqa: E402
                              splitmix64)

torch.set_num_threads(1)


def small_model(**kw):
    cfg = GPTConfig(layers=3, heads=2, width=32, context=16, **kw)
    return GPT(cfg)


def batch(seed=0, rows=4, T=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 128, (rows, T + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def one_step(model, tel, opt, x, y, *, clip=None, domains=None):
    tel.before_step()
    logits = model(x)
    ce, obj = token_losses(logits, y)
    tel.logits(logits)
    tel.losses(ce, domains)
    opt.zero_grad()
    obj.mean().backward()
    gn = tel.after_backward(clip)
    tel.before_optimizer_step()
    opt.step()
    tel.after_optimizer_step()
    return logits.detach(), ce.detach(), gn


def test_layers_are_discovered_with_names_and_global_indices():
    m = small_model()
    names = [n for n, _ in discover_layers(m)]
    assert names == ["blocks.0", "blocks.1", "blocks.2"]
    tel = Telemetry(m, first_layer=8)
    assert tel.layer_names == names and tel.layer_indices == [8, 9, 10]
    # A wrapper (as DDP's .module) is looked through; a user list is kept.
    wrapper = torch.nn.Module()
    wrapper.module = m
    tel2 = Telemetry(wrapper, layers=[m.blocks[2], m.blocks[0]])
    assert tel2.layer_names == ["blocks.2", "blocks.0"] and tel2.layer_indices == [0, 1]
    with pytest.raises(ValueError):
        Telemetry(torch.nn.Linear(3, 3))


def test_report_matches_hand_computation():
    torch.manual_seed(0)
    m = small_model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    tel = Telemetry(m, domain_names=["a", "b"])
    x, y = batch()
    # By hand: scores of each layer and residual stream leaving each block.
    scores, acts = {}, {}
    hooks = []
    for i, b in enumerate(m.blocks):
        hooks.append(b.register_forward_hook(lambda mod, inp, out, i=i: acts.__setitem__(i, out.detach())))
    before = [torch.cat([p.detach().flatten() for p in b.parameters()]).clone() for b in m.blocks]
    # Hand-computed max logits: wrap each observer.
    for i, b in enumerate(m.blocks):
        orig = b.attn.score_observer
        b.attn.score_observer = (lambda s, i=i, orig=orig: (scores.__setitem__(i, s.detach().amax().item()), orig(s)))
    domains = torch.tensor([0, 1, 1, 0])
    logits, ce, gn = one_step(m, tel, opt, x, y, domains=domains)
    for h in hooks:
        h.remove()
    r = tel.report(7, 70, lr=1e-2)
    assert r.step == 7 and r.data_position == 70 and r.lr == 1e-2 and r.tokens == 64
    loss = ce.double().sum().item() / 64
    assert r.loss == pytest.approx(loss, rel=1e-12)
    assert r.loss_hash == loss_hash(r.loss)
    lse = torch.logsumexp(logits.reshape(-1, 256), -1)
    assert r.lse_mean == pytest.approx(lse.double().mean().item(), rel=1e-9)
    assert r.lse_max == pytest.approx(lse.max().item(), rel=1e-6)
    assert r.nonfinite_count == 0 and not r.clipped
    all_g = torch.cat([p.grad.flatten() for p in m.parameters()]).double()
    assert r.grad_norm == pytest.approx(all_g.norm().item(), rel=1e-6) and gn == r.grad_norm
    assert [l.layer for l in r.layers] == [0, 1, 2]
    for i, (b, ls) in enumerate(zip(m.blocks, r.layers)):
        g = torch.cat([p.grad.flatten() for p in b.parameters()]).double()
        w = torch.cat([p.detach().flatten() for p in b.parameters()]).double()
        assert ls.grad_norm == pytest.approx(g.norm().item(), rel=1e-6)
        assert ls.param_norm == pytest.approx(w.norm().item(), rel=1e-6)
        ratio = (w - before[i].double()).norm() / before[i].double().norm()
        assert ls.update_ratio == pytest.approx(ratio.item(), rel=1e-4)
        assert ls.act_rms == pytest.approx(acts[i].double().square().mean().sqrt().item(), rel=1e-6)
        assert ls.max_attn_logit == pytest.approx(scores[i], rel=1e-6)
    d = {dl.domain: dl for dl in r.domain_losses}
    rows = ce.double().sum(1)
    assert d["a"].tokens == 32 and d["b"].tokens == 32
    assert d["a"].loss == pytest.approx(((rows[0] + rows[3]) / 32).item(), rel=1e-12)
    assert d["b"].loss == pytest.approx(((rows[1] + rows[2]) / 32).item(), rel=1e-12)
    assert r.step_time_s > 0 and r.unix_ms > 1.6e12
    j = report_json(r, tel.attention_kind)
    assert j["max_attn_logit_kind"].startswith("exact") and j["layers"][0]["layer"] == 0


def test_clipping_scales_gradients_and_reports_the_pre_clip_norm():
    torch.manual_seed(1)
    m = small_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    tel = Telemetry(m)
    x, y = batch(1)
    _, _, gn = one_step(m, tel, opt, x, y, clip=1e-3)
    after = torch.cat([p.grad.flatten() for p in m.parameters()]).double().norm().item()
    r = tel.report(0, 0, lr=0.0)
    assert r.clipped and gn > 1e-3 and r.grad_norm == gn
    assert after == pytest.approx(1e-3, rel=1e-4)
    # lr 0: no update, the ratio is 0.
    assert all(ls.update_ratio == 0 for ls in r.layers)


def test_parameters_without_gradients_are_left_out_step_by_step():
    """A parameter whose gradient is None (frozen, or unused this step) is
    out of the norms and the clipping; the set may change between steps."""
    torch.manual_seed(2)
    m = small_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    tel = Telemetry(m)
    x, y = batch(2)

    def step(drop_block):
        tel.before_step()
        ce, obj = token_losses(m(x), y)
        tel.losses(ce)
        opt.zero_grad()
        obj.mean().backward()
        if drop_block is not None:
            for p in m.blocks[drop_block].parameters():
                p.grad = None
        want = {i: math.sqrt(sum(p.grad.double().square().sum().item()
                                 for p in b.parameters() if p.grad is not None))
                for i, b in enumerate(m.blocks)}
        total = math.sqrt(sum(p.grad.double().square().sum().item()
                              for p in m.parameters() if p.grad is not None))
        gn = tel.after_backward(clip_norm=total / 2)
        r = tel.report(0, 0, lr=0.0)
        # Per tensor in float32 (as clip_grad_norm_), summed in float64.
        assert gn == pytest.approx(total, rel=1e-6) and r.clipped
        assert [ls.grad_norm for ls in r.layers] == pytest.approx(
            [want[i] for i in range(3)], rel=1e-6)
        if drop_block is not None:
            assert r.layers[drop_block].grad_norm == 0
            assert all(p.grad is None for p in m.blocks[drop_block].parameters())
        clipped = math.sqrt(sum(p.grad.double().square().sum().item()
                                for p in m.parameters() if p.grad is not None))
        assert clipped == pytest.approx(total / 2, rel=1e-5)

    step(None)
    step(1)
    step(None)
    step(0)


def test_nonfinite_values_are_counted():
    torch.manual_seed(2)
    m = small_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    tel = Telemetry(m)
    x, y = batch(2)
    tel.before_step()
    logits = m(x)
    logits = logits.clone()
    logits[0, 0, 0] = float("inf")
    ce, _ = token_losses(logits, y)
    tel.logits(logits)
    tel.losses(ce)
    (ce.mean()).backward()
    gn = tel.after_backward(1.0)
    r = tel.report(0, 0, lr=0.0)
    assert not math.isfinite(gn) and not r.clipped
    assert r.nonfinite_count > 1 and not math.isfinite(r.loss)


def test_fused_attention_helpers_exact_and_bound():
    torch.manual_seed(3)
    q = torch.randn(2, 3, 8, 16) * 3
    k = torch.randn(2, 3, 8, 16)
    s = (q @ k.transpose(-2, -1)) / 4.0
    s = s.masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf"))
    exact = s.amax().item()
    m = small_model()
    t_exact = Telemetry(m, attention="exact")
    t_exact.before_step()
    t_exact.record_qk(0, q, k)
    t_bound = Telemetry(m, attention="bound")
    t_bound.before_step()
    t_bound.record_qk(0, q, k)
    assert "bound" in t_bound.attention_kind and "exact" in t_exact.attention_kind
    re = t_exact.report(0, 0, lr=0.0, loss=1.0)
    rb = t_bound.report(0, 0, lr=0.0, loss=1.0)
    assert re.layers[0].max_attn_logit == pytest.approx(exact, rel=1e-6)
    assert rb.layers[0].max_attn_logit >= exact
    # "exact"/"bound" do not wire the explicit observer.
    assert m.blocks[0].attn.score_observer is None


def test_loss_hash_is_splitmix_of_the_float64_bits():
    bits = struct.unpack("<Q", struct.pack("<d", 2.5))[0]
    assert loss_hash(2.5) == splitmix64(bits)
    assert loss_hash(2.5) != loss_hash(math.nextafter(2.5, 3))
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # SplitMix64's first output from seed 0
    assert 0 <= loss_hash(float("nan")) < 2**64


def test_micro_batches_accumulate_and_hooks_go_on_close():
    torch.manual_seed(4)
    m = small_model()
    tel = Telemetry(m)
    x, y = batch(4, rows=4)
    tel.before_step()
    for part in (slice(0, 2), slice(2, 4)):
        logits = m(x[part])
        ce, _ = token_losses(logits, y[part])
        tel.losses(ce)
        tel.logits(logits)
    r = tel.report(0, 0, lr=0.0)
    full = token_losses(m(x), y)[0]
    assert r.tokens == 64
    assert r.loss == pytest.approx(full.double().mean().item(), rel=1e-6)
    tel.close()
    assert m.blocks[0].attn.score_observer is None
    tel.before_step()
    m(x)
    assert tel._act_norms[0] == []


def test_staged_steps_resolve_to_the_same_reports_in_one_transfer():
    """stage()+resolve() (what the Supervisor does: statistics stay on the
    device, several steps reach the host together) gives the reports that
    report() gives step by step, clipping included."""
    from google.protobuf import json_format

    def run(staged):
        torch.manual_seed(3)
        m = small_model()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        tel = Telemetry(m, domain_names=["a", "b"])
        out, pending = [], []
        for s in range(3):
            x, y = batch(10 + s)
            tel.before_step()
            logits = m(x)
            ce, obj = token_losses(logits, y)
            tel.logits(logits)
            tel.losses(ce, torch.tensor([0, 1, 1, 0]))
            opt.zero_grad()
            obj.mean().backward()
            tel.after_backward(0.05, sync=not staged)
            tel.before_optimizer_step()
            opt.step()
            tel.after_optimizer_step()
            docs = [("a", 100 + s, 0), ("b", 7, 1)]
            if staged:
                pending.append(tel.stage(s, 40 + s, 1e-2, documents=docs))
            else:
                out.append(tel.report(s, 40 + s, 1e-2, documents=docs))
        tel.close()
        return tel.resolve(pending) if staged else out

    def fields(r):
        d = json_format.MessageToDict(r, preserving_proto_field_name=True)
        d.pop("step_time_s", None)
        d.pop("unix_ms", None)
        return d

    plain, staged = run(False), run(True)
    assert len(staged) == 3
    for a, b in zip(plain, staged):
        assert a.clipped and b.clipped
        assert a.loss == b.loss and a.loss_hash == b.loss_hash
        fa, fb = fields(a), fields(b)
        for la, lb in zip(fa.pop("layers"), fb.pop("layers")):
            for k in la:
                assert la[k] == pytest.approx(lb[k], rel=1e-6), k
        assert fa == fb


def test_domain_ids_without_domain_names_are_not_dropped_silently(caplog):
    torch.manual_seed(4)
    m = small_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    tel = Telemetry(m)
    x, y = batch(4)
    with caplog.at_level("WARNING", logger="spikeguard.torch"):
        for _ in range(2):
            one_step(m, tel, opt, x, y, domains=torch.tensor([0, 1, 1, 0]))
    r = tel.report(0, 0, lr=0.0)
    assert len(r.domain_losses) == 0
    warnings = [rec for rec in caplog.records if "domain_names" in rec.getMessage()]
    assert len(warnings) == 1  # once, not at every step
    tel.close()


def test_update_statistics_on_a_cadence_repeat_the_last_measurement():
    """update_every=3: the update-to-weight ratio and the parameter norm are
    measured at steps 0, 3, 6 (the same values as measuring every step) and
    repeated in between; forget_updates() makes the next step measure."""
    from google.protobuf import json_format

    def run(every, forget_at=None):
        torch.manual_seed(3)
        m = small_model()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        tel = Telemetry(m, update_every=every)
        pending, measured = [], []
        for s in range(8):
            if s == forget_at:
                tel.forget_updates()
            x, y = batch(20 + s)
            tel.before_step()
            logits = m(x)
            ce, obj = token_losses(logits, y)
            tel.logits(logits)
            tel.losses(ce)
            opt.zero_grad()
            obj.mean().backward()
            tel.after_backward(None, sync=False)
            measured.append(tel.measures_updates(s))
            tel.before_optimizer_step(s)
            opt.step()
            tel.after_optimizer_step()
            pending.append(tel.stage(s, s, 1e-2))
        tel.close()
        return tel.resolve(pending), measured

    def layers(r, k):
        return [getattr(ls, k) for ls in r.layers]

    every, _ = run(1)
    cadence, measured = run(3)
    assert measured == [True, False, False, True, False, False, True, False]
    for s, (a, b) in enumerate(zip(every, cadence)):
        src = every[s - s % 3]  # the step whose measurement this report holds
        assert layers(b, "update_ratio") == pytest.approx(layers(src, "update_ratio"), rel=1e-9)
        assert layers(b, "param_norm") == pytest.approx(layers(src, "param_norm"), rel=1e-9)
        assert all(v > 0 for v in layers(b, "update_ratio"))
        # Everything else is the same as measuring every step.
        da = json_format.MessageToDict(a, preserving_proto_field_name=True)
        db = json_format.MessageToDict(b, preserving_proto_field_name=True)
        for d in (da, db):
            d.pop("step_time_s", None)
            d.pop("unix_ms", None)
            for ls in d.pop("layers"):
                assert set(ls) >= {"grad_norm", "act_rms", "max_attn_logit"}
        assert da == db
        for k in ("grad_norm", "act_rms", "max_attn_logit"):
            assert layers(a, k) == pytest.approx(layers(b, k), rel=1e-9)
    # After forget_updates (a rewind) the next step measures, then the cadence.
    forgot, measured = run(3, forget_at=4)
    assert measured == [True, False, False, True, True, False, True, False]
    assert layers(forgot[5], "update_ratio") == pytest.approx(layers(every[4], "update_ratio"),
                                                              rel=1e-9)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_each_kind_of_nonfinite_logit_is_counted(bad):
    torch.manual_seed(5)
    m = small_model()
    tel = Telemetry(m)
    x, y = batch(5)
    tel.before_step()
    with torch.no_grad():
        logits = m(x).clone()
    logits[1, 2, 3] = bad
    logits[0, 0, 7] = bad
    tel.logits(logits)
    r = tel.report(0, 0, lr=0.0, loss=1.0)
    assert r.nonfinite_count == 2
    tel.before_step()
    tel.logits(logits.nan_to_num(0.0, 0.0, 0.0))
    assert tel.report(0, 0, lr=0.0, loss=1.0).nonfinite_count == 0


def test_nonfinite_values_are_counted_in_staged_reports_too():
    """The staged path (after_backward(sync=False), stage, resolve) counts
    the non-finite logits and losses as report() does, and the gradient
    tensors holding one; a non-finite norm is not clipped."""
    def run(staged):
        torch.manual_seed(2)
        m = small_model()
        tel = Telemetry(m)
        x, y = batch(2)
        tel.before_step()
        logits = m(x).clone()
        logits[0, 0, 0] = float("inf")
        ce, _ = token_losses(logits, y)
        tel.logits(logits)
        tel.losses(ce)
        ce.mean().backward()
        gn = tel.after_backward(1.0, sync=not staged)
        want = (int((~torch.isfinite(logits)).sum()) + int((~torch.isfinite(ce)).sum()),
                sum(1 for p in m.parameters() if p.grad is not None
                    and not bool(torch.isfinite(p.grad).all())),
                sum(int((~torch.isfinite(p.grad)).sum()) for p in m.parameters()
                    if p.grad is not None))
        if staged:
            return tel.resolve([tel.stage(0, 0, 0.0)])[0], gn, want
        return tel.report(0, 0, lr=0.0), gn, want

    r, _, (fwd, _, grad_entries) = run(False)
    rs, gn, (fwd_s, grad_tensors, _) = run(True)
    assert fwd == fwd_s and fwd >= 2 and grad_tensors >= 1
    assert not math.isfinite(float(gn)) and not rs.clipped and not r.clipped
    assert not math.isfinite(rs.loss) and not math.isfinite(rs.grad_norm)
    assert r.nonfinite_count == fwd + grad_entries
    assert rs.nonfinite_count == fwd + grad_tensors


def test_staged_activation_rms_with_and_without_micro_batches():
    """Steps fed in one call and in micro-batches, staged together, give
    the activation RMS report() gives."""
    def run(staged):
        torch.manual_seed(6)
        m = small_model()
        tel = Telemetry(m)
        out, pending = [], []
        for s, parts in enumerate([[slice(0, 4)], [slice(0, 2), slice(2, 4)], [slice(0, 4)]]):
            x, y = batch(30 + s)
            tel.before_step()
            for part in parts:
                logits = m(x[part])
                tel.losses(token_losses(logits, y[part])[0])
            if staged:
                pending.append(tel.stage(s, s, 0.0))
            else:
                out.append(tel.report(s, s, lr=0.0))
        return tel.resolve(pending) if staged else out

    for a, b in zip(run(False), run(True)):
        assert [l.act_rms for l in a.layers] == pytest.approx([l.act_rms for l in b.layers],
                                                               rel=1e-12)
        assert all(l.act_rms > 0 for l in b.layers) and a.loss == b.loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cross_entropy_is_f_cross_entropy_and_records_the_log_sum_exp(dtype):
    """Telemetry.cross_entropy: bit-identical losses and gradients to
    F.cross_entropy(reduction="none"), and the same log-sum-exp statistics
    as logits() (which makes its own pass), also with ignored targets."""
    torch.manual_seed(7)
    x = (torch.randn(3, 5, 40, dtype=dtype) * 4).requires_grad_()
    y = torch.randint(0, 40, (3, 5))
    y[1, 2] = -100                       # ignored: loss 0, its row's lse still counted
    m = small_model()
    ref_x = x.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_x.flatten(0, 1), y.flatten(), reduction="none").view(3, 5)
    ref.sum().backward()

    tel = Telemetry(m)
    tel.before_step()
    ce = tel.cross_entropy(x, y)
    ce.sum().backward()
    assert ce.shape == y.shape and ce[1, 2] == 0
    assert torch.equal(ce.detach(), ref.detach())
    assert torch.equal(x.grad, ref_x.grad)
    got = tel.report(0, 0, lr=0.0, loss=1.0)

    tel.before_step()
    tel.logits(x.detach())
    want = tel.report(0, 0, lr=0.0, loss=1.0)
    lse = torch.logsumexp(x.detach().double(), dim=-1)
    assert got.lse_mean == pytest.approx(lse.mean().item(), rel=1e-6)
    assert got.lse_max == pytest.approx(lse.max().item(), rel=1e-6)
    assert got.lse_mean == pytest.approx(want.lse_mean, rel=1e-6)
    assert got.nonfinite_count == want.nonfinite_count == 0
    # A padding id as the ignored target: the same statistics.
    pad = y.clone()
    pad[1, 2] = 3
    tel.before_step()
    ce_pad = tel.cross_entropy(x.detach(), pad, ignore_index=3)
    assert torch.equal(ce_pad, F.cross_entropy(x.detach().flatten(0, 1), pad.flatten(),
                                               reduction="none", ignore_index=3).view(3, 5))
    assert tel.report(0, 0, lr=0.0, loss=1.0).lse_mean == pytest.approx(got.lse_mean, rel=1e-6)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_cross_entropy_counts_each_kind_of_nonfinite_logit(bad):
    torch.manual_seed(8)
    tel = Telemetry(small_model())
    x = torch.randn(2, 4, 16)
    x[0, 1, 3] = bad
    x[1, 3, 0] = bad
    y = torch.randint(0, 16, (2, 4))
    tel.before_step()
    tel.cross_entropy(x, y)
    assert tel.report(0, 0, lr=0.0, loss=1.0).nonfinite_count == 2


def test_cross_entropy_of_half_precision_logits_keeps_a_float32_log_sum_exp():
    torch.manual_seed(9)
    tel = Telemetry(small_model())
    x = (torch.randn(4, 8, 64) * 6).bfloat16()
    y = torch.randint(0, 64, (4, 8))
    tel.before_step()
    ce = tel.cross_entropy(x, y)
    assert ce.dtype == torch.bfloat16
    assert torch.equal(ce, F.cross_entropy(x.flatten(0, 1), y.flatten(),
                                           reduction="none").view(4, 8))
    r = tel.report(0, 0, lr=0.0, loss=1.0)
    assert r.lse_mean == pytest.approx(torch.logsumexp(x.float(), -1).mean().item(), rel=1e-6)
