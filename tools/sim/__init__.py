"""Simulated GPU hosts built from scenario files (format version 1)."""

from .sandbox import SimHost, SimTransport
from .scenario import Scenario, builtin_names, load_scenario, parse_scenario

__all__ = ["Scenario", "SimHost", "SimTransport", "builtin_names", "load_scenario", "parse_scenario"]
