"""JSON values ↔ the dataclasses of `rackscale.types`, by their annotations (standard library only).

Decoding is lenient where a newer gateway may say more than this client knows: fields it doesn't know are
ignored, an enum value it doesn't know stays a plain string. It is strict where the answer can't be a view at
all (a required field missing, an object where a list belongs): `ValueError`, naming the path.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")
_MISSING = dataclasses.MISSING


def decode(tp: type[T], value: Any) -> T:
    """`value` (parsed JSON) as `tp`: a dataclass, NamedTuple, StrEnum, list[...], dict[str, ...], union, ..."""
    return typing.cast(T, _decode(tp, value, "$"))


def encode(value: Any, *, omit_defaults: bool = True) -> Any:
    """A dataclass (a JobBody) as JSON-ready values. `omit_defaults`: a field left at its default is left out (the
    server's default is the same, and an older gateway need not know a field nobody set)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if omit_defaults and _is_default(f, v):
                continue
            out[f.metadata.get("json", f.name)] = encode(v, omit_defaults=omit_defaults)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode(v, omit_defaults=omit_defaults) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v, omit_defaults=omit_defaults) for k, v in value.items()}
    return value


def _is_default(f: dataclasses.Field[Any], value: Any) -> bool:
    if f.default is not _MISSING:
        return _same(value, f.default)
    return f.default_factory is not _MISSING and _same(value, f.default_factory())


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def _decode(tp: Any, value: Any, path: str) -> Any:
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        arm = next((a for a in get_args(tp) if _accepts(a, value)), None)
        if arm is None:
            raise ValueError(f"{path}: {value!r} is none of {tp}")
        return _decode(arm, value, path)
    if origin is Literal:
        return value  # a value a newer gateway added is still worth showing
    if origin is list:
        (item,) = get_args(tp) or (Any,)
        _expect(list, value, path)
        return [_decode(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        _expect(list, value, path)
        return tuple(_decode(t, v, f"{path}[{i}]") for i, (t, v) in enumerate(zip(get_args(tp), value, strict=False)))
    if origin is dict:
        _, item = get_args(tp) or (str, Any)
        _expect(dict, value, path)
        return {k: _decode(item, v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            return _dataclass(tp, value, path)
        if issubclass(tp, tuple) and hasattr(tp, "_fields"):  # a NamedTuple: a JSON array
            _expect(list, value, path)
            if len(value) < len(tp._fields):
                raise ValueError(f"{path}: {tp.__name__} is an array of {len(tp._fields)}, got {value!r}")
            hints = _hints(tp)
            pairs = zip(tp._fields, value, strict=False)  # items a newer gateway appends are left out
            return tp(*(_decode(hints[n], v, f"{path}[{i}]") for i, (n, v) in enumerate(pairs)))
        if issubclass(tp, enum.Enum):
            try:
                return tp(value)
            except ValueError:
                return value
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if tp is type(None) and value is None:
            return None
        if tp in (str, int, float, bool):
            if not _accepts(tp, value):
                raise ValueError(f"{path}: expected {tp.__name__}, got {value!r}")
            return value
    raise ValueError(f"{path}: no way to read {value!r} as {tp}")


def _dataclass(cls: type, value: Any, path: str) -> Any:
    _expect(dict, value, path)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = f.metadata.get("json", f.name)
        if key in value:
            kwargs[f.name] = _decode(hints[f.name], value[key], f"{path}.{key}")
        elif f.default is _MISSING and f.default_factory is _MISSING:
            raise ValueError(f"{path}: {cls.__name__} lacks its field {key!r}")
    return cls(**kwargs)


def _expect(kind: type, value: Any, path: str) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{path}: expected a JSON {'array' if kind is list else 'object'}, got {value!r}")


def _accepts(tp: Any, value: Any) -> bool:
    """Whether `value`'s JSON kind fits `tp` (how a union's arm is chosen)."""
    if tp is Any:
        return True
    origin = get_origin(tp) or tp
    if value is None:
        return tp is type(None)
    if isinstance(value, bool):
        return origin is bool
    if isinstance(value, int):
        return origin in (int, float)
    if isinstance(value, float):
        return origin is float
    if isinstance(value, str):
        return origin is str or origin is Literal or (isinstance(origin, type) and issubclass(origin, enum.Enum))
    if isinstance(value, list):
        return origin in (list, tuple) or (isinstance(origin, type) and issubclass(origin, tuple))
    if isinstance(value, dict):
        return origin is dict or dataclasses.is_dataclass(origin)
    return False
