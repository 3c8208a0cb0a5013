"""What ``tailsight explain`` finds: its settings, each jump with its attribution, the incidents
that group them and the report over a recording range. Data only: the pipeline builds it, the
text and HTML presenters word and draw it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from tailsight.analysis.attribution import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_LEVEL,
    Displacement,
    StackShift,
    TailDecomposition,
    Windows,
)
from tailsight.analysis.causes import Cause
from tailsight.analysis.jumps import JumpConfig
from tailsight.intervals import LabelKey

PLOT_QUANTILES: Final = (0.5, 0.99, 0.999)
"""The quantiles kept per interval of every jump's series, for its plot."""


@dataclass(frozen=True)
class ExplainConfig:
    """What to test and how to attribute (see :mod:`tailsight.analysis.explain.pipeline`)."""

    quantiles: tuple[float, ...] = (0.99,)
    fdr: float = 0.05
    window_intervals: int = 30
    aggregates: bool = True
    n_boot: int = DEFAULT_BOOTSTRAP
    seed: int = 0
    level: float = DEFAULT_LEVEL
    top: int = 3
    falls: bool = False
    """Also report tails that got faster (without causes: a fall has no excess to attribute)."""
    incident_window: int = 3
    """Jumps whose changes lie at most this many intervals apart may form one incident."""
    jump: JumpConfig = field(default_factory=JumpConfig)


@dataclass(frozen=True)
class JumpExplanation:
    """One jump (when, which series, quantile before/after) and its ranked causes."""

    series: LabelKey
    aggregate: bool
    quantile: float
    direction: str
    change_index: int
    change_start_ns: int
    before_ns: float
    after_ns: float
    p_value: float
    threshold_ns: float
    decomposition: TailDecomposition
    displacement: Displacement | None
    stacks: list[StackShift]
    starts_ns: list[int]
    interval_quantiles_ns: list[list[float]]
    """Per interval, the :data:`PLOT_QUANTILES` of this series (nan where empty)."""

    @property
    def windows(self) -> Windows:
        return self.decomposition.windows

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.series)

    @property
    def ratio(self) -> float:
        """After over before; 1 where either side is empty (no finite factor)."""
        if self.before_ns > 0 and self.after_ns > 0:
            return self.after_ns / self.before_ns
        return 1.0


@dataclass(frozen=True)
class Incident:
    """Jumps that started together in related cgroups: one headline, its causes, the detail."""

    jumps: list[JumpExplanation]
    """The series shown, headline first."""
    folded: list[JumpExplanation]
    """Aggregates that rose too but are explained by one cgroup of ``jumps`` (not shown)."""
    causes: list[Cause]
    """Discovered causes, most likely first."""
    tested_causes: int
    cgroups: list[str]
    dated_ns: int | None = None
    """Where the symptom rose mostly with its cause, later than its change point (a smaller,
    earlier step): the incident is dated by the cause."""

    @property
    def headline(self) -> JumpExplanation:
        return self.jumps[0]

    @property
    def start_ns(self) -> int:
        if self.dated_ns is not None:
            return self.dated_ns
        return min(j.change_start_ns for j in self.jumps)


@dataclass(frozen=True)
class Report:
    """Everything ``tailsight explain`` says about one range of a recording."""

    start_ns: int | None
    end_ns: int | None
    intervals: int
    selector: Mapping[str, str]
    tested: int
    jumps: list[JumpExplanation]
    config: ExplainConfig
    incidents: list[Incident] = field(default_factory=list)
    falls_hidden: int = 0
    """Confirmed falls left out (``ExplainConfig.falls`` off)."""
