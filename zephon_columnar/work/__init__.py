"""What to train on: work sources hand out chunks of sample pointers, per lane. No I/O here.

Example:
    >>> from zephon_columnar.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation, WorkChunk, WorkSource
"""

from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.chunk import WorkChunk
from zephon_columnar.work.mixture import MixtureSpec
from zephon_columnar.work.positions import SamplePositions
from zephon_columnar.work.read_order import ComponentOrder, MixtureReadConfig, MixtureReadMode
from zephon_columnar.work.schedule import MixtureChange, MixtureSchedule, SchedulePoint
from zephon_columnar.work.scheduled_mixture import ScheduledMixtureWorkSource
from zephon_columnar.work.static_mixture import StaticMixtureWorkSource
from zephon_columnar.work.token_estimation import TokenEstimation

__all__ = [
    "ComponentOrder",
    "MixtureChange",
    "MixtureReadConfig",
    "MixtureReadMode",
    "MixtureSchedule",
    "MixtureSpec",
    "SamplePositions",
    "SchedulePoint",
    "ScheduledMixtureWorkSource",
    "StaticMixtureWorkSource",
    "TokenEstimation",
    "WorkChunk",
    "WorkSource",
]
