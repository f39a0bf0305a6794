"""Shutdown: ringzero must not keep a process group alive after the user destroys it.

A gloo group that outlives destroy_process_group (because ringzero's per-group cache still held it)
kept its worker threads into interpreter exit, where one releasing its last Work aborted the process
("terminate called without an active exception"), now and then: `ringzero bench` died that way.
"""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_destroy_releases_the_process_group_in_either_order(tmp_path):
    # Own processes: the harness destroys the group itself after the test's function returns.
    script = tmp_path / "release.py"
    script.write_text(textwrap.dedent(f"""
        import gc, os, sys, weakref
        sys.path.insert(0, {os.path.join(ROOT, "python")!r})
        import torch, torch.distributed as dist
        import torch.multiprocessing as mp

        def rank_main(rank, world, order, port):
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
            dist.init_process_group("gloo")
            import ringzero
            ref = weakref.ref(dist.group.WORLD)
            out = torch.empty(world)
            ringzero.all_gather_single(out, torch.full((1,), float(rank)))
            assert out.tolist() == [float(q) for q in range(world)], out
            dist.all_reduce(torch.ones(1))
            if order == "torch-first":
                dist.destroy_process_group(); ringzero.destroy_communicators()
            else:
                ringzero.destroy_communicators(); dist.destroy_process_group()
            assert ref() is None, f"rank {{rank}}: the process group is still referenced after destroy ({{order}})"

        if __name__ == "__main__":
            import socket
            for order in ("torch-first", "ringzero-first"):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
                mp.start_processes(rank_main, args=(3, order, port), nprocs=3, start_method="spawn")
            print("released")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "released" in out.stdout


def test_only_destroy_process_group_then_exit_is_clean(tmp_path):
    """The user calls dist.destroy_process_group() alone (torch's convention); ringzero drops its
    references at exit. Mixed ringzero and gloo calls to the end, as in `ringzero bench`, five times."""
    script = tmp_path / "exit.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.join(ROOT, "python")!r})
        import torch, torch.distributed as dist
        import torch.multiprocessing as mp

        def rank_main(rank, world, port):
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
            dist.init_process_group("gloo")
            import ringzero
            out = torch.empty(world)
            for _ in range(200):
                ringzero.all_gather_single(out, torch.full((1,), float(rank)))
                dist.all_reduce(torch.ones(1))
            assert out.tolist() == [float(q) for q in range(world)], out
            dist.destroy_process_group()

        if __name__ == "__main__":
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
            mp.start_processes(rank_main, args=(2, port), nprocs=2, start_method="spawn")
            print("clean")
    """))
    for attempt in range(5):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "clean" in out.stdout, f"attempt {attempt}: {out.stderr[-3000:]}"
