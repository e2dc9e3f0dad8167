"""verl's own config classes (``verl.base_config.BaseConfig``,
``verl.trainer.config.algorithm.RolloutCorrectionConfig``) from the verl wheel installed
``--no-deps`` (scripts/python-test.sh), loaded from their files: ``import verl`` itself pulls
ray and transformers, which these two files do not use, so their parent packages are empty
stand-ins. Nothing of verl is in this repository."""

import importlib.util
import pathlib
import sys
import types


def _stub(name):
    m = types.ModuleType(name)
    m.__path__ = []
    sys.modules[name] = m
    return m


def _load(name, path):
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


def load():
    """``(BaseConfig, RolloutCorrectionConfig, verl's algorithm YAML path)``; restores
    ``sys.modules`` afterwards."""
    root = verl_root()
    saved = dict(sys.modules)
    try:
        for pkg in ("verl", "verl.trainer", "verl.trainer.config"):
            _stub(pkg)
        base = _load("verl.base_config", root / "base_config.py")
        algo = _load("verl.trainer.config.algorithm", root / "trainer" / "config" / "algorithm.py")
        return base.BaseConfig, algo.RolloutCorrectionConfig, root / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    finally:
        for k in list(sys.modules):
            if k not in saved:
                del sys.modules[k]
        sys.modules.update(saved)
