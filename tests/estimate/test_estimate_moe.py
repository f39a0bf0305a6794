"""Mixture-of-experts and expert parallelism in ringzero.estimate, against published figures and hand
computations.

- Parameter counts of the presets against the published totals: Mixtral 8x7B (Jiang et al. 2024, 'Mixtral of
  Experts': 46.7B total, 12.9B active) within 1% (the shape is the paper's exactly; the figures are rounded to
  three digits); DeepSeek-V3 (DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report': 671B total, 37B active) within
  3%: the published figures are rounded to whole billions (37B stands for 36.5-37.5B, 1.4%), MLA's weights
  are counted from the report's dimensions, and the router's per-expert bias (256 per block) is left out.
- Expert parameters per rank against E / ep experts x MoE blocks x one expert's weights: they scale as 1/ep,
  the replicated rest does not, and ZeRO-3 shards the experts over dp / ep ranks and the rest over dp.
- The all-to-all's alpha-beta cost against the formulas computed by hand for a 2 x 2 cluster with one NIC per
  node and for one node of 4 (numbers written out, not calls into ringzero.estimate.network).
- The dispatch/combine bytes per step against 4 x tokens x top_k x d_model x bytes per MoE block.
- Bad layouts: one-line ValueErrors naming the rule, and usage errors (exit status 2) from the command line.
"""
import pytest

from ringzero.estimate import Cluster, GroupShape, Link, Plan, Precision, collective_times, estimate, main
from ringzero.estimate.moe import active_params, expert_params
from ringzero.estimate.presets import deepseek_v3, known_model, mixtral_8x7b

PUBLISHED = [  # (preset, total, active, relative tolerance: see the module docstring)
    (mixtral_8x7b, 46.7e9, 12.9e9, 0.01),
    (deepseek_v3, 671e9, 37e9, 0.03),
]


@pytest.mark.parametrize("make,total,active,tol", PUBLISHED, ids=lambda x: getattr(x, "__name__", ""))
def test_preset_parameter_counts_match_the_published_ones(make, total, active, tol):
    shape = make()
    print(f"{make.__name__}: {shape.n_params() / 1e9:.2f}B total, {active_params(shape) / 1e9:.2f}B active")
    assert shape.n_params() == pytest.approx(total, rel=tol)
    assert active_params(shape) == pytest.approx(active, rel=tol)


def test_deepseek_v3_blocks():
    """3 dense blocks first, then 58 MoE blocks of 256 routed experts of 3 x 7168 x 2048 each."""
    shape = deepseek_v3()
    assert [shape.moe.is_moe(i) for i in range(5)] == [False, False, False, True, True]
    assert shape.moe.count(0, shape.n_layer) == 58
    assert expert_params(shape) == 3 * 7168 * 2048


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_expert_params_per_rank_scale_as_one_over_ep(ep):
    shape, prec = mixtral_8x7b(), Precision.for_dtype("bfloat16")
    e = estimate(shape, plan=Plan("ddp", world=8, ep=ep), precision=prec)
    st = e.peak
    assert st.expert_params == 32 * (8 // ep) * 3 * 4096 * 14336
    assert st.params - st.expert_params == shape.n_params() - 32 * 8 * 3 * 4096 * 14336  # replicated: whole
    z3 = estimate(shape, plan=Plan("zero3", world=8, ep=ep), precision=prec).peak
    edp = 8 // ep
    replicated = st.params - st.expert_params
    assert z3.param_bytes == (-(-replicated // 8) + -(-st.expert_params // edp)) * 2


def test_all_to_all_costs_by_hand_on_two_nodes_of_two():
    """4 ranks, 2 per node, one NIC per node (both local ranks share it), M = 8 MB per rank."""
    intra, inter = Link(bytes_per_s=100e9, latency_s=1e-6), Link(bytes_per_s=10e9, latency_s=5e-6)
    cluster = Cluster("t", 2, intra, inter, nics_per_node=1)
    t = collective_times("all_to_all", 8e6, GroupShape(4, 2, 2), cluster)
    # pairwise: 3 blocks of 2 MB, each 5 us + 2e6 / (10e9 / 2 ranks on the NIC) = 5 us + 400 us
    assert t["ring"] == pytest.approx(3 * (5e-6 + 400e-6), rel=1e-12)
    # hierarchical: the 2 blocks for the other node's ranks, 2 x 5 us + 4e6 / 5e9 (the shared NIC) = 810 us,
    # while the in-node one-shot moves the node's own 4e6: 1 us + (2 - 1) / 2 x 4e6 / 100e9 = 21 us
    assert t["hierarchical"] == pytest.approx(max(810e-6, 21e-6), rel=1e-12)
    one_node = collective_times("all_to_all", 8e6, GroupShape(4, 1, 4), Cluster("t", 4, intra, inter))
    assert one_node["ring"] == pytest.approx(3 * (1e-6 + 2e6 / 100e9), rel=1e-12)  # 63 us
    assert one_node["one-shot"] == pytest.approx(1e-6 + 6e6 / 100e9, rel=1e-12)  # 61 us
    assert collective_times("all_to_all", 8e6, GroupShape(1, 1, 1), cluster) == {"ring": 0.0, "one-shot": 0.0}


def test_dispatch_and_combine_bytes_and_times_per_step():
    shape, prec = mixtral_8x7b(seq_len=1024), Precision.for_dtype("bfloat16")
    cluster = Cluster("t", 8, Link(450e9, 2e-6), Link(50e9, 5e-6))
    e = estimate(shape, batch=32, precision=prec, plan=Plan("zero1", world=16, ep=8, microbatches=2), cluster=cluster)
    per_call = 1 * 1024 * 2 * 4096 * 2  # 1 sequence per micro-batch x top-2 x d_model x bf16
    rows = {c.what: c for c in e.collectives}
    for what in ("MoE dispatch all-to-all (and its gradient)", "MoE combine all-to-all (and its gradient)"):
        c = rows[what]
        assert (c.group, c.group_size, c.calls) == ("ep", 8, 32 * 2 * 2)  # blocks x micro-batches x (fwd + bwd)
        assert c.nbytes == c.calls * per_call
        assert c.sent_per_rank == pytest.approx(7 / 8 * c.nbytes)
        # the ep group is 8 neighbours: one node, so the in-node algorithms
        one = collective_times("all_to_all", per_call, GroupShape(8, 1, 8), cluster)
        assert c.times_s == pytest.approx({k: c.calls * v for k, v in one.items()})
    assert rows["expert gradients reduce-scatter"].group_size == 2  # dp 16 / ep 8
    assert sum(c.nbytes for c in e.collectives if c.group == "ep" and "counts" not in c.what) == \
        4 * 32 * 2 * per_call


@pytest.mark.parametrize("plan,model,says", [
    (dict(strategy="ddp", world=6, ep=3), mixtral_8x7b, "experts (8) not divisible by ep (3)"),
    (dict(strategy="ddp", world=8, ep=8, tp=2), mixtral_8x7b, "ep (8) does not divide the data-parallel degree dp (4)"),
    (dict(strategy="ddp", world=8, ep=2), lambda: 10**9, "ep=2 needs a mixture-of-experts model"),
    (dict(strategy="ddp", world=8, ep=2, tp=2), mixtral_8x7b, "tp=2 with a mixture-of-experts model"),
])
def test_bad_layouts_name_the_rule(plan, model, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        estimate(model(), plan=Plan(**plan))


def test_command_line_moe(capsys):
    main(["--model", "mixtral-8x7b", "--seq", "1024", "--dtype", "bfloat16", "--batch", "16", "--world", "16",
          "--strategy", "zero1", "--ep", "8", "--cluster", "16xH100"])
    out = capsys.readouterr().out
    assert "(12.9 B active)" in out and "of which experts (1 of 8 x 32 MoE blocks)" in out
    # bytes, time, and the step time's breakdown
    assert out.count("MoE dispatch all-to-all") == 3 and out.count("MoE combine all-to-all") == 3
    for argv, says in ((["--model", "mixtral-8x7b", "--world", "6", "--ep", "3"], "experts (8) not divisible by ep (3)"),
                       (["--model", "gpt-9"], "--model 'gpt-9': use one of"),
                       (["--model", "deepseek-v3", "--layers", "4"], "--model takes the published shape")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and says in capsys.readouterr().err
    assert known_model("DeepSeek-V3", 2048).seq_len == 2048
