"""One registry for the zoo: ``build("sasrec", num_items=..., **hparams)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from models.base import ModelConfig, SeqRecModel

_MODELS: dict[str, type[SeqRecModel]] = {}
ModelT = TypeVar("ModelT", bound=type[SeqRecModel])


class ConfigError(ValueError):
    """Invalid hyperparameters; ``errors`` lists every ``(key, message)`` so all can be reported at once."""

    def __init__(self, errors: list[tuple[str, str]], context: str = ""):
        self.errors = errors
        prefix = f"{context}: " if context else ""
        super().__init__("; ".join(f"{prefix}{key}: {message}" for key, message in errors))


def register(name: str) -> Callable[[ModelT], ModelT]:
    def decorator(cls: ModelT) -> ModelT:
        if name in _MODELS:
            raise RuntimeError(f"model {name!r} registered twice")
        _MODELS[name] = cls
        cls.name = name
        return cls
    return decorator


def available() -> list[str]:
    return sorted(_MODELS)


def model_class(name: str) -> type[SeqRecModel]:
    try:
        return _MODELS[name]
    except KeyError:
        raise ConfigError([("model", f"unknown model {name!r}; known: {', '.join(available())}")]) from None


def config_fields(name: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(model_class(name).config_class)}


def make_config(name: str, **hparams: Any) -> ModelConfig:
    """Build and validate a model config; unknown keys and violated constraints raise ConfigError."""
    cls = model_class(name).config_class
    known = config_fields(name)
    unknown = [(key, f"not a hyperparameter of {name}") for key in hparams if key not in known]
    if unknown:
        raise ConfigError(unknown, name)
    config = cls(**hparams)
    errors = config.constraint_errors()
    if errors:
        raise ConfigError(errors, name)
    return config


def build(name: str, **hparams: Any) -> SeqRecModel:
    """Instantiate a registered model from keyword hyperparameters (``num_items`` is required)."""
    return model_class(name)(make_config(name, **hparams))
