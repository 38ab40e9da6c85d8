"""Ops that index: gathers and scatters by index tensors, sorting and selection."""
from __future__ import annotations
