"""`ringzero estimate` for ZeRO-3 with ZeRO++'s options (--zeropp, --ranks-per-host): the bytes each host sends
to the others per step, against counts written out here from the algorithms (each host's ranks send, per
step, (H-1)/H of every hierarchical all-gather's or reduce-scatter's buffer; qw's int8 gather and qg's
all-to-all send (H-1)/H of the parameters at 1 + 4/256 and bits/8 + 4/256 bytes each), and the memory of
hpz's secondary shard. benchmarks/hostlab_zeropp.py compares the same counts with the host lab's links."""
import pytest

from ringzero.estimate import Plan, estimate, main
from ringzero.estimate.core import cross_host_bytes
from ringzero.models import GPTConfig

CFG = GPTConfig(vocab_size=256, seq_len=64, n_layer=4, n_head=5, d_model=320)


@pytest.mark.parametrize("hosts,local", [(2, 2), (3, 2), (2, 4), (4, 1)])
def test_cross_host_bytes_follow_the_algorithms(hosts, local):
    world = hosts * local
    share = (hosts - 1) / hosts
    plain = estimate(CFG, batch=24, plan=Plan("zero3", world=world, ranks_per_host=local))
    P = plain.n_params
    assert cross_host_bytes(plain) == pytest.approx(3 * share * 4 * P)
    for zeropp, want in [
        ("hpz", 2 * share * 4 * P),                                       # backward's gather stays in the host
        ("qw", 2 * share * P * (1 + 4 / 256) + share * 4 * P),            # both gathers int8, gradients float32
        ("hpz,qw", share * P * (1 + 4 / 256) + share * 4 * P),
        ("qg8", 2 * share * 4 * P + share * P * (1 + 4 / 256)),
        ("hpz,qw,qg", share * P * (1 + 4 / 256) + share * P * (0.5 + 4 / 256)),
    ]:
        e = estimate(CFG, batch=24, plan=Plan("zero3", world=world, zeropp=zeropp, ranks_per_host=local))
        assert cross_host_bytes(e) == pytest.approx(want), zeropp
    if local > 1:
        e = estimate(CFG, batch=24, plan=Plan("zero3", world=world, zeropp="hpz", ranks_per_host=local))
        terms = e.peak.transient_terms
        secondary = [v for k, v in terms.items() if "hpz secondary" in k]
        assert secondary == [-(-P // local) * 4]


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
