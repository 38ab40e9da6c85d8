"""Control flow: ops whose bodies are subgraphs."""
from __future__ import annotations
