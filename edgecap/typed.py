"""Config values read from TOML, JSON or a checkpoint, checked against the type of the field's
default: the one rule the training config and the model config share.

Integers are accepted where a number is expected (and become floats); a number must be
finite (TOML has `nan` and `inf`, and a `nan` learning rate trains nothing); a list becomes a
tuple of the default's element type, of the default's length unless `any_length`.
"""

from __future__ import annotations

import math
import numbers

from edgecap.errors import EdgecapError


def typed(value, default, where: str, any_length: bool = False):
    """`value` as the type of `default`, or a one-line error naming `where` and the value."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise EdgecapError(f"{where} = {value!r}: expected true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise EdgecapError(f"{where} = {value!r}: expected an integer")
        return int(value)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise EdgecapError(f"{where} = {value!r}: expected a number")
        if not math.isfinite(value):
            raise EdgecapError(f"{where} = {value!r}: expected a finite number")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise EdgecapError(f"{where} = {value!r}: expected a string")
        return value
    if isinstance(default, tuple) and default:
        if not isinstance(value, (list, tuple)) or (not any_length and len(value) != len(default)):
            size = "" if any_length else f"{len(default)} "
            kind = "integers" if isinstance(default[0], int) else "numbers"
            raise EdgecapError(f"{where} = {value!r}: expected a list of {size}{kind}")
        elements = [default[0]] * len(value) if any_length else default
        return tuple(typed(v, d, where) for v, d in zip(value, elements, strict=True))
    return value
