"""Makes init_process_group("ringzero") work in processes that never import ringzero (workers started by
Ray Train or another launcher): torch calls register() at the end of `import torch`, through its
backend autoload entry point (the "torch.backends" group, declared in pyproject.toml;
TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns every such entry point off).

It runs inside `import torch`, so it must be cheap and must never raise (torch would fail to import):
it registers a creator that imports ringzero only when a "ringzero" group is made, and checks for the
built extension by its file name alone. A missing build warns once here, and the group creation
raises the real import error. This module is top-level, apart from the ringzero package, because
loading `ringzero.<anything>` would run ringzero/__init__.py (the extension, the optimizers, the
parallel layers) inside every `import torch`.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import warnings

BACKEND_NAME = "ringzero"


def _create_backend(dist_opts, backend_options=None):
    """torch's creator for a "ringzero" group: hands over to ringzero's own creator (a later
    `import ringzero` finds the name taken and leaves this registration in place)."""
    from ringzero.comm.backend import _create_backend as create

    return create(dist_opts, backend_options)


def _extension_built() -> bool:
    """Whether the ringzero package has a built ringzero._C beside it (found without importing ringzero)."""
    spec = importlib.util.find_spec("ringzero")
    if spec is None or not spec.submodule_search_locations:
        return False
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if os.path.exists(os.path.join(folder, "_C" + suffix)):
                return True
    return False


def register() -> None:
    """The entry point: registers the "ringzero" backend with torch.distributed unless it is there
    already. Never raises; a problem becomes one warning."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
            return
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])
        if not _extension_built():
            warnings.warn("ringzero is installed but its extension ringzero._C is not built, so "
                          "init_process_group('ringzero') will fail; rebuild with "
                          "`pip install --no-build-isolation .` (or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to skip "
                          "ringzero and torch's other autoloaded backends)", RuntimeWarning, stacklevel=2)
    except Exception as error:  # noqa: BLE001 - anything here would break `import torch`
        warnings.warn(f"ringzero: registering the torch.distributed backend at `import torch` failed ({error!r}); "
                      "`import ringzero` registers it explicitly", RuntimeWarning, stacklevel=2)
