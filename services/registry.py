"""The one plug-in convention shared by score-release steps, parameter-release steps and attacks.

A plug-in is a class registered under a name, written once, in the registration call::

    SCORE_STEPS = Registry("score release step")

    @SCORE_STEPS.register("rounding")
    class Rounding(Plugin):
        families = ANY_SCORES

        def __init__(self, decimals: int) -> None: ...

    ATTACKS.register("ls_clamped", Esa, clamp=True)  # a variant: its presets are defaults a spec may override

* Its parameters are its constructor's, as scikit-learn's ``get_params`` derives them: each one is stored on
  the instance under its own name, so :meth:`Plugin.get_params` lists them and ``type(p)(**p.get_params())``
  rebuilds the plug-in.
* A spec ``"name:key=value,..."`` (:func:`parse_spec`) builds one; every value is parsed by
  :func:`parse_value`, typed by the constructor's annotation (bool, int, float, str, a ``Literal`` choice,
  ``X | None``, a ``;``-separated tuple). Constructors receive typed values and check only their ranges.
* It declares ``families``, the model families it supports (``"lr"``; :data:`ANY_SCORES` for a plug-in that
  only reads released scores). A registry asked to build for a family refuses an unsupported plug-in.

Every mistake (an unknown name, an unknown, missing or malformed parameter, an unsupported family) raises
:class:`PluginError`, a ``ValueError`` naming the plug-in and its accepted parameters.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar, Union, get_args, get_origin

__all__ = ["ANY_SCORES", "Plugin", "PluginError", "Registry", "parse_spec", "parse_value"]

ANY_SCORES = frozenset({"*"})
"""``families`` of a plug-in that only reads released scores: every family that releases scores."""

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class PluginError(ValueError):
    """A plug-in spec names an unknown plug-in, carries an invalid parameter, or does not fit the model family."""


class Plugin:
    """Base of every plug-in: a registered name, the model families it supports, and ``get_params``."""

    name: ClassVar[str] = ""  # the registered name; a variant's instances carry their own
    families: ClassVar[frozenset[str]]

    @classmethod
    def param_names(cls) -> tuple[str, ...]:
        """The constructor's parameters, in signature order."""
        return tuple(_constructor_params(cls))

    def get_params(self) -> dict[str, Any]:
        """Every constructor parameter with its value on this instance (scikit-learn's ``get_params``)."""
        return {name: getattr(self, name) for name in self.param_names()}

    @classmethod
    def supports(cls, family: str) -> bool:
        return family in cls.families or cls.families >= ANY_SCORES


T = TypeVar("T", bound=Plugin)


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered name: a plug-in class and the defaults its variant presets (a spec may override them)."""

    name: str
    cls: type[T]
    preset: Mapping[str, Any] = field(default_factory=dict)

    def parameters(self) -> dict[str, inspect.Parameter]:
        """The parameters a spec may set, with the variant's presets as their defaults."""
        params = _constructor_params(self.cls)
        return {k: p.replace(default=self.preset[k]) if k in self.preset else p for k, p in params.items()}


class Registry(Generic[T]):
    """Named plug-ins of one kind (``kind`` names them in errors, e.g. ``"score release step"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, cls: type[T] | None = None, /, **preset: Any) -> Any:
        """Register ``cls`` under ``name``: as a class decorator, or as a call (``preset`` makes a variant)."""

        def add(target: type[T]) -> type[T]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if not getattr(target, "families", None):
                raise TypeError(f"{self.kind} {name!r}: {target.__name__} must declare the families it supports")
            unknown = set(preset) - set(_constructor_params(target))
            if unknown:
                raise TypeError(f"{self.kind} {name!r}: {target.__name__} has no parameter(s) {sorted(unknown)}")
            if not preset and "name" not in vars(target):
                target.name = name  # its first plain registration names the class
            self._entries[name] = Entry(name, target, dict(preset))
            return target

        return add if cls is None else add(cls)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self, family: str | None = None) -> list[str]:
        """Registered names, sorted; with ``family``, only those that support it."""
        return sorted(n for n, e in self._entries.items() if family is None or e.cls.supports(family))

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise PluginError(f"unknown {self.kind} {name!r} (known: {known})") from None

    def check_family(self, name: str, family: str) -> None:
        """PluginError unless the plug-in ``name`` supports the model family ``family``."""
        cls = self.entry(name).cls
        if not cls.supports(family):
            supported = "any family that releases scores" if cls.families == ANY_SCORES else sorted(cls.families)
            raise PluginError(
                f"{self.kind} {name!r} does not support the {family!r} model family (it supports {supported})"
            )

    def build(self, name: str, params: Mapping[str, Any] | None = None, *, family: str | None = None) -> T:
        """The plug-in ``name`` with ``params`` (strings are parsed by :func:`parse_value`)."""
        entry = self.entry(name)
        if family is not None:
            self.check_family(name, family)
        accepted = entry.parameters()
        params = dict(params or {})
        where = f"{self.kind} {name!r}"
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise PluginError(f"{where} has no parameter(s) {unknown} (accepted: {_listing(accepted)})")
        missing = [k for k, p in accepted.items() if p.default is inspect.Parameter.empty and k not in params]
        if missing:
            raise PluginError(f"{where} needs parameter(s) {missing} (accepted: {_listing(accepted)})")
        hints = _hints(entry.cls)
        try:
            values = {k: parse_value(k, v, hints.get(k, Any)) for k, v in params.items()}
            plugin = entry.cls(**{**entry.preset, **values})
        except (TypeError, ValueError) as exc:
            raise PluginError(f"{where}: {exc}") from exc
        plugin.name = name  # a variant shares its class; the registered name is what reports show
        return plugin

    def parse(self, spec: str, *, family: str | None = None) -> T:
        """The plug-in a spec such as ``"privee:epsilon=0.1,basis=householder"`` describes."""
        name, params = parse_spec(spec)
        return self.build(name, params, family=family)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"privee:epsilon=0.1,basis=householder"`` -> ``("privee", {"epsilon": "0.1", ...})``."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise PluginError(f"empty plug-in name in {spec!r}")
    params: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PluginError(f"{name!r}: expected key=value, got {item!r}")
        params[key.strip()] = value.strip()
    return name, params


def parse_value(name: str, value: Any, annotation: Any) -> Any:
    """A spec value converted to its annotated type; a non-string value is already typed and passes.

    ValueError names the parameter and what it must be.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    options = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        if type(None) in options and text.lower() == "none":
            return None
        rest = [option for option in options if option is not type(None)]
        return parse_value(name, text, rest[0] if len(rest) == 1 else Any)
    if get_origin(annotation) is Literal:
        choices = {str(option).lower(): option for option in options}
        if text.lower() not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
        return choices[text.lower()]
    if get_origin(annotation) in (tuple, list, Sequence):
        item = options[0] if options else Any
        return tuple(parse_value(name, part, item) for part in text.split(";") if part.strip())
    if annotation is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if annotation is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if annotation is float:
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"{name} must be finite, got {value!r}")
        return number
    return text  # str, or a parameter without a usable annotation


def _constructor_params(cls: type) -> dict[str, inspect.Parameter]:
    """Keyword-passable constructor parameters (``self``, ``*args`` and ``**kwargs`` excluded)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    signature = inspect.signature(cls.__init__)
    return {k: p for k, p in list(signature.parameters.items())[1:] if p.kind in kinds}


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__)
    except (NameError, TypeError):  # an annotation that cannot be evaluated: its values stay strings
        return {}


def _listing(params: Mapping[str, inspect.Parameter]) -> str:
    return ", ".join(params) or "none"
