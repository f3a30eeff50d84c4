"""The model zoo. Importing this package registers every model; ``build(name, **hparams)`` makes one.

Every module in this package other than the shared ones is a model file that registers itself with
``@register(name)``, so adding a model is adding one file.
"""

import importlib
import pkgutil

from models.base import OBJECTIVES, ModelConfig, SeqRecModel
from models.registry import ConfigError, available, build, config_fields, make_config, model_class

_SHARED_MODULES = {"base", "blocks", "registry", "mixers"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _SHARED_MODULES and not _module.name.startswith("_"):
        importlib.import_module(f"models.{_module.name}")

__all__ = [
    "OBJECTIVES", "ConfigError", "ModelConfig", "SeqRecModel",
    "available", "build", "config_fields", "make_config", "model_class",
]
