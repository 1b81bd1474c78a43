"""Decoding rules, one file each: :class:`Greedy`, :class:`Sampling`. A new rule subclasses
:class:`DecodingRule` in a new file here."""

from __future__ import annotations

from .base import DecodingRule
from .greedy import Greedy
from .sampling import Sampling

__all__ = ["DecodingRule", "Greedy", "Sampling"]
