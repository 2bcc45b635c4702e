"""The read-only checks a shadow experiment makes before its first copy starts: which ports something listens on,
and each GPU's memory with what each process holds there. No snapshot fields, no facts: only tools."""

from __future__ import annotations

from .. import shadow
from .base import Probe, Tool

PROBE = Probe(
    "shadow",
    tools=(Tool("listening_ports", shadow.ListeningPorts, lambda i, r: shadow.parse_ports(r.stdout)),
           Tool("gpu_memory", shadow.GpuMemory, lambda i, r: shadow.parse_gpu_memory(r.stdout))),
)
