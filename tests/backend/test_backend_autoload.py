"""torch's backend autoload entry point (python/ringzero_autoload.py, declared in pyproject.toml).

Fresh interpreters that run only `import torch`, never `import ringzero`: at 2 ranks they make a
"ringzero" process group and all_reduce, and must get the exact integer sum (the reference is the
arithmetic); ringzero itself must stay unimported until the group is made (so `import torch` pays
for one small module). With TORCH_DEVICE_BACKEND_AUTOLOAD=0 the name is unknown to torch. A ringzero
without its built extension makes `import torch` warn once and still succeed. The entry point needs
the installed metadata to carry it: tools/setup.sh's `pip install -e .` does that; an install made
before the entry point existed fails the first test with the command that fixes it.
"""
import os
import pathlib
import shutil
import subprocess
import sys

import ringzero_autoload

ROOT = pathlib.Path(__file__).resolve().parents[2]
GROUP = "torch.backends"

WORKER = """
import sys
import torch
import torch.distributed as dist
assert "ringzero" not in sys.modules, "import torch imported all of ringzero"
rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("ringzero", init_method="file://" + store, rank=rank, world_size=world)
t = torch.full((1000,), rank + 1, dtype=torch.int64)
dist.all_reduce(t)
assert t.tolist() == [world * (world + 1) // 2] * 1000, t[:4]
assert dist.get_backend() == "ringzero"
assert type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__ == "RingzeroBackend"
dist.destroy_process_group()
print("ok")
"""


def run_ranks_fresh(world, tmp_path, env=None, timeout_s=240):
    """Runs WORKER in `world` fresh interpreters; returns [(returncode, stdout + stderr)] by rank."""
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(world), store], env={**os.environ, **(env or {})},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"a rank did not finish within {timeout_s} s")
        results.append((p.returncode, out))
    return results


def test_the_installed_metadata_declares_the_entry_point():
    from importlib.metadata import entry_points

    assert '[project.entry-points."torch.backends"]\nringzero = "ringzero_autoload:register"' in \
        (ROOT / "pyproject.toml").read_text(), "pyproject.toml no longer declares the entry point as this test expects"
    installed = {e.name: e.value for e in entry_points(group=GROUP)}
    assert installed.get("ringzero") == "ringzero_autoload:register", (
        f"the installed ringzero has no '{GROUP}' entry point ({installed}); its metadata predates it: reinstall "
        "with `pip install --no-build-isolation -e .` (tools/setup.sh)")


def test_import_torch_alone_makes_ringzero_groups(tmp_path):
    for rank, (code, out) in enumerate(run_ranks_fresh(2, tmp_path)):
        assert code == 0 and out.strip().endswith("ok"), f"rank {rank}:\n{out}"


def test_autoload_switched_off_leaves_the_name_unknown(tmp_path):
    results = run_ranks_fresh(2, tmp_path, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout_s=120)
    for rank, (code, out) in enumerate(results):
        assert code != 0 and "Unknown backend type ringzero" in out, f"rank {rank}:\n{out}"


def test_missing_build_warns_once_and_torch_imports(tmp_path):
    """A ringzero package without _C, found first on the path with its own metadata."""
    site = tmp_path / "site"
    (site / "ringzero").mkdir(parents=True)
    (site / "ringzero" / "__init__.py").write_text("")
    shutil.copy(ringzero_autoload.__file__, site / "ringzero_autoload.py")
    info = site / "ringzero-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ringzero\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\nringzero = ringzero_autoload:register\n")
    probe = ("import torch, torch.distributed as dist; "
             "print('registered' if 'RINGZERO' in dist.Backend._plugins else 'absent')")
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONWARNINGS": "always"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "registered", done.stdout
    assert done.stderr.count("ringzero._C is not built") == 1, done.stderr
