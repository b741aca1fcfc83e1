"""``cerebras.appliance.utils.units``: cerebrax's minimal stand-in for the unit utilities of
Cerebras' appliance package, present only under the cstorch alias.

Byte units: ``B``; decimal ``KB``, ``MB``, ``GB``, ``TB``, ``PB``, ``EB`` (powers of 1000);
binary ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB``, ``EiB`` (powers of 1024). Names are
matched without regard to case (``"10gb"`` is 10 GB).
"""

from __future__ import annotations

from fractions import Fraction

__all__ = ["bytes_to_human", "convert_byte_unit"]

_PREFIXES = ["K", "M", "G", "T", "P", "E"]
_UNITS = {"B": 1,
          **{f"{p}B": 1000 ** (i + 1) for i, p in enumerate(_PREFIXES)},
          **{f"{p}iB": 1024 ** (i + 1) for i, p in enumerate(_PREFIXES)}}
_BY_UPPER = {name.upper(): name for name in _UNITS}


def _bytes_per(unit: str) -> int:
    name = _BY_UPPER.get(unit.strip().upper()) if isinstance(unit, str) else None
    if name is None:
        raise ValueError(f"Unknown byte unit {unit!r}: expected one of "
                         f"{', '.join(_UNITS)}.")
    return _UNITS[name]


def convert_byte_unit(value: float, target_unit: str, src_unit: str = "B") -> int | float:
    """``value`` in ``src_unit`` expressed in ``target_unit``: an int where the result is
    whole (``convert_byte_unit(10, "B", src_unit="GiB") == 10737418240``), a float
    otherwise (``convert_byte_unit(1536, "KiB") == 1.5``).

    Raises:
      ValueError: an unknown unit.
    """
    exact = Fraction(value) * _bytes_per(src_unit) / _bytes_per(target_unit)
    return int(exact) if exact.denominator == 1 else float(exact)


def bytes_to_human(size: float) -> str:
    """A number of bytes in the largest binary unit that keeps it at least 1: ``"512 B"``,
    ``"1.50 KiB"``, ``"10.00 GiB"`` (two decimals beyond bytes)."""
    if abs(size) < 1024:
        return f"{size:g} B" if isinstance(size, float) else f"{size} B"
    value, unit = float(size), "B"
    for prefix in _PREFIXES:
        value, unit = value / 1024, f"{prefix}iB"
        if round(abs(value), 2) < 1024:
            break
    return f"{value:.2f} {unit}"
