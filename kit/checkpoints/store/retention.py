"""What a publish keeps: the newest ``keep_checkpoints`` checkpoints that verify.

Only verified checkpoints count. Junk folders in a store (a ``checkpoint-N`` without a manifest,
one with a corrupt file) must never push a valid checkpoint out: counted, three of them would
leave a store holding one good checkpoint and two it cannot resume from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kit.errors import UsageError

if TYPE_CHECKING:
    from kit.checkpoints.store.base import Verdict


def steps_to_delete(existing: list[int], step: int, keep: int) -> list[int]:
    """Kit checkpoints beyond the newest ``keep`` once ``step`` is in (``existing``: the verified ones)."""
    if keep < 1:
        raise UsageError(f"keep_checkpoints must be at least 1, got {keep}")
    ordered = sorted(set(existing) | {step}, reverse=True)
    return [s for s in ordered[keep:] if s != step]


def prune(verdicts: list[Verdict], step: int, keep: int) -> list[int]:
    """What a publish of ``step`` removes: verified checkpoints beyond the newest ``keep`` (``step``
    counted), and checkpoints that do not verify and are older than every one kept.

    Only verified checkpoints count towards ``keep``: junk folders (no manifest, a corrupt file)
    must never push a valid checkpoint out. A non-verifying folder newer than the oldest kept one
    is left alone (it costs nothing to keep and someone may want to look at it).
    """
    kit = [v for v in verdicts if v.cand.kind == "kit"]
    valid = [v.step for v in kit if v.ok]
    doomed = steps_to_delete(valid, step, keep)
    kept = sorted(set(valid) | {step}, reverse=True)[:keep]
    junk = [v.step for v in kit if not v.ok and v.step < min(kept) and v.step != step]
    return sorted(set(doomed) | set(junk))
