"""Slice gangs: one worker per host of a multi-host slice, joined by jax.distributed. Who the
hosts are (membership.py), and the gang as the driver's worker slot, on host 0 and on the
others (slice_gang.py). The channel the gang's worker processes talk over is the workers'
(workers/gang_channel.py)."""
from .membership import Membership, MembershipError

__all__ = ["Membership", "MembershipError"]
