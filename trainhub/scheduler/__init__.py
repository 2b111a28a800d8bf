"""GPU job scheduling for trainhub: pure policies plus a trace-driven simulator (``.sim``).

See docs/scheduler.md. The policies are pure functions of their inputs (see
:class:`Scheduler`); the service loop that feeds them cluster state lives elsewhere.
"""

from .model import WAIT_CODES, Allocation, JobRequest, Placement, Plan, Quotas, Start, WaitReason
from .policy import FifoGangScheduler, Scheduler, TrainhubScheduler
from .queue import PendingQueue

__all__ = [
    "WAIT_CODES",
    "Allocation",
    "FifoGangScheduler",
    "JobRequest",
    "PendingQueue",
    "Placement",
    "Plan",
    "Quotas",
    "Scheduler",
    "Start",
    "TrainhubScheduler",
    "WaitReason",
]
