"""`ringzero estimate` for ZeRO-3 with ZeRO++'s options (--zeropp, --ranks-per-host): the bytes each host sends
to the others per step, against counts written out here from the algorithms (per step, each host's ranks send
(H-1)/H of every hierarchical all-gather's or reduce-scatter's buffer, and (world-1)/world of one under 2 MiB,
which takes the flat ring; qw's int8 gather and qg's all-to-all send (H-1)/H of the parameters at 1 + 4/256 and
bits/8 + 4/256 bytes each), and the memory of hpz's secondary shard. ZeRO-3's units are the blocks, each
gathered for the forward and again for the backward, and the root group (embedding and head), gathered once per
forward and kept through the backward, without an hpz secondary. benchmarks/hostlab_zeropp.py and
tests/lab/test_hostlab_training.py compare the same counts with the host lab's links."""
import pytest

from ringzero.estimate import Plan, estimate, main
from ringzero.estimate.communication import cross_host_bytes
from ringzero.models import GPTConfig

CFG = GPTConfig(vocab_size=256, seq_len=64, n_layer=4, n_head=5, d_model=320)  # blocks 4.7 MiB, root 0.7 MiB
SMALL = GPTConfig(vocab_size=256, seq_len=32, n_layer=3, n_head=4, d_model=128)  # blocks 0.8 MiB: all flat


def units(cfg):
    """(parameters of all blocks, of the root group), counted here from the model itself."""
    from ringzero.models import GPT

    model = GPT(cfg)
    blocks = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
    return blocks, sum(p.numel() for p in model.parameters()) - blocks


@pytest.mark.parametrize("hosts,local", [(2, 2), (3, 2), (2, 4), (4, 1)])
def test_cross_host_bytes_follow_the_algorithms(hosts, local):
    world = hosts * local
    share, flat = (hosts - 1) / hosts, (world - 1) / world
    B, R = units(CFG)
    P = B + R
    assert 4 * B / CFG.n_layer > 2 << 20 and 4 * R < 2 << 20
    plain = estimate(CFG, batch=24, plan=Plan("zero3", world=world, ranks_per_host=local))
    assert plain.n_params == P
    root = 2 * flat * 4 * R  # the root's all-gather and reduce-scatter, on the flat ring
    assert cross_host_bytes(plain) == pytest.approx(3 * share * 4 * B + root)
    q8, q4 = 1 + 4 / 256, 0.5 + 4 / 256
    for zeropp, want in [
        ("hpz", 2 * share * 4 * B + root),                                 # the blocks' backward gather stays in the host
        ("qw", share * (2 * B + R) * q8 + share * 4 * B + flat * 4 * R),   # every gather int8, gradients float32
        ("hpz,qw", share * P * q8 + share * 4 * B + flat * 4 * R),
        ("qg8", 2 * share * 4 * B + flat * 4 * R + share * P * q8),
        ("hpz,qw,qg", share * P * q8 + share * P * q4),
    ]:
        e = estimate(CFG, batch=24, plan=Plan("zero3", world=world, zeropp=zeropp, ranks_per_host=local))
        assert cross_host_bytes(e) == pytest.approx(want), zeropp
    if local > 1:
        e = estimate(CFG, batch=24, plan=Plan("zero3", world=world, zeropp="hpz", ranks_per_host=local))
        terms = e.peak.transient_terms
        secondary = [v for k, v in terms.items() if "hpz secondary" in k]
        assert secondary == [-(-plain.n_params // local) * 4]


def test_units_under_2_mib_take_the_flat_ring():
    """Blocks of 0.8 MiB: every float32 all-gather and reduce-scatter of the world group takes the flat ring
    ((world-1)/world of the buffer over each host's link: 3/4 at 2 x 2, where the hierarchical form sends 1/2);
    qw's and qg's subgroup collectives are the same at any size."""
    B, R = units(SMALL)
    assert 4 * B / SMALL.n_layer < 2**20
    for hosts, local in ((2, 2), (3, 2), (2, 4)):
        world = hosts * local
        share, flat = (hosts - 1) / hosts, (world - 1) / world
        plain = estimate(SMALL, batch=24, plan=Plan("zero3", world=world, ranks_per_host=local))
        assert cross_host_bytes(plain) == pytest.approx(flat * 4 * (3 * B + 2 * R))
        e = estimate(SMALL, batch=24, plan=Plan("zero3", world=world, zeropp="hpz,qw,qg", ranks_per_host=local))
        assert cross_host_bytes(e) == pytest.approx(share * (B + R) * (1 + 4 / 256 + 0.5 + 4 / 256))
    # The rule is the transport's own: a buffer of 2 MiB is cut in two segments, one byte less is not.
    from ringzero.comm.transports import block_segment_numel

    assert block_segment_numel(2 << 20, 1, 4) and not block_segment_numel((2 << 20) - 1, 1, 4)


def test_one_host_is_plain_zero3_and_bad_plans_raise():
    plain = estimate(CFG, batch=8, plan=Plan("zero3", world=4))
    one_host = estimate(CFG, batch=8, plan=Plan("zero3", world=4, zeropp="hpz,qg", ranks_per_host=4))
    assert [c.nbytes for c in one_host.collectives] == [c.nbytes for c in plain.collectives]
    assert cross_host_bytes(one_host) == 0
    with pytest.raises(ValueError, match="applies to zero3"):
        Plan("zero2", world=4, zeropp="hpz", ranks_per_host=2)
    with pytest.raises(ValueError, match="ranks_per_host"):
        Plan("zero3", world=4, zeropp="hpz")
    with pytest.raises(ValueError, match="ranks_per_host"):
        Plan("zero3", world=6, zeropp="hpz", ranks_per_host=4)
    with pytest.raises(ValueError, match="unknown option"):
        Plan("zero3", world=4, zeropp="fast", ranks_per_host=2)


def test_cli_prints_the_bytes_each_host_sends(capsys):
    main(["--ringzero-gpt", "--world", "4", "--strategy", "zero3", "--zeropp", "hpz,qw,qg", "--ranks-per-host", "2",
          "--batch", "8"])
    out = capsys.readouterr().out
    assert "sent by each host to the others per step (2 ranks per host)" in out
    assert "all-to-all, int4 (qg), across hosts" in out
    with pytest.raises(SystemExit):
        main(["--ringzero-gpt", "--world", "4", "--strategy", "zero2", "--zeropp", "hpz", "--ranks-per-host", "2"])


@pytest.mark.parametrize("local,nics", [(2, 1), (4, 1), (4, 2), (2, 2)])
def test_cross_host_groups_share_the_hosts_nics(local, nics):
    """The L cross-host groups of a host (one per local rank) gather and exchange at the same time: each gets
    nics / L of the host's link (all of it where there are as many NICs as ranks). The times written out here:
    a ring all-gather of H ranks, (H-1) steps of latency + buffer / H over the shared rate; the all-to-all the
    same steps (the pairwise exchange)."""
    from ringzero.estimate.network import custom_cluster

    hosts, gbps, lat_us = 2, 1.0, 100.0
    cluster = custom_cluster(40.0, gbps, lat_us, gpus_per_node=local, nics_per_node=nics)
    e = estimate(CFG, batch=8, plan=Plan("zero3", world=hosts * local, zeropp="hpz,qw,qg", ranks_per_host=local),
                 cluster=cluster)
    rate = gbps / 8 * 1e9 * min(1.0, nics / local)
    cross = [c for c in e.collectives if c.group == "dp-cross"]
    assert {c.op for c in cross} == {"all_gather", "all_to_all"}
    for c in cross:
        per_call = c.nbytes / c.calls
        want = c.calls * (hosts - 1) * (lat_us * 1e-6 + per_call / hosts / rate)
        assert c.times_s["ring"] == pytest.approx(want), c.what
