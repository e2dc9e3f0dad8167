"""Loading single files of the installed verl wheel (``pip install --no-deps``) without
``import verl``, which pulls ray and transformers: parent packages and unused imports become
empty stand-ins. Shared by the tests (verl_config.py) and the benches (python/bench/verl_real.py).
Nothing of verl is in this repository."""

import importlib.util
import pathlib
import sys
import types


def stub(name, **attrs):
    """An empty module registered as ``name``, with ``attrs`` set on it; a package, so that
    submodules can be stubbed or loaded under it."""
    m = types.ModuleType(name)
    m.__path__ = []
    for k, v in attrs.items():
        setattr(m, k, v)
    sys.modules[name] = m
    return m


def load_file(name, path):
    """The module ``name`` executed from ``path`` and registered in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def verl_root():
    """The installed verl package's directory, or None."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0])
