"""verl's own config classes (``verl.base_config.BaseConfig``,
``verl.trainer.config.algorithm.RolloutCorrectionConfig``) from the verl wheel installed
``--no-deps`` (scripts/python-test.sh), loaded from their files: ``import verl`` itself pulls
ray and transformers, which these two files do not use, so their parent packages are empty
stand-ins. Nothing of verl is in this repository."""

import sys

from verl_files import load_file, stub, verl_root


def load():
    """``(BaseConfig, RolloutCorrectionConfig, verl's algorithm YAML path)``; restores
    ``sys.modules`` afterwards."""
    root = verl_root()
    saved = dict(sys.modules)
    try:
        for pkg in ("verl", "verl.trainer", "verl.trainer.config"):
            stub(pkg)
        base = load_file("verl.base_config", root / "base_config.py")
        algo = load_file("verl.trainer.config.algorithm", root / "trainer" / "config" / "algorithm.py")
        return base.BaseConfig, algo.RolloutCorrectionConfig, root / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    finally:
        for k in list(sys.modules):
            if k not in saved:
                del sys.modules[k]
        sys.modules.update(saved)
