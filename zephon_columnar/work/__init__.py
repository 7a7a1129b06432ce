"""What to train on: work sources hand out chunks of sample pointers, per lane. No I/O here.

Example:
    >>> from zephon_columnar.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation, WorkChunk, WorkSource
"""

from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.chunk import WorkChunk
from zephon_columnar.work.mixture import MixtureSpec
from zephon_columnar.work.positions import SamplePositions
from zephon_columnar.work.static import StaticMixtureWorkSource
from zephon_columnar.work.tokens import TokenEstimation

__all__ = ["MixtureSpec", "SamplePositions", "StaticMixtureWorkSource", "TokenEstimation", "WorkChunk", "WorkSource"]
