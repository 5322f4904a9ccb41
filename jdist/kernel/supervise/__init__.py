"""Running one cell on the ranks: the supervisor, its fault detectors, the outcome classifier."""

from .outcome import CellStatus, Observations, Outcome, classify
from .report import CellResult, fault_notes, raise_for_result
from .supervisor import CellSupervisor, run_cell

__all__ = ["CellResult", "CellStatus", "CellSupervisor", "Observations", "Outcome", "classify", "fault_notes",
           "raise_for_result", "run_cell"]
