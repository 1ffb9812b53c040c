"""Why the planner chose what it chose, as data: a code and the numbers behind it.

    Reason("precision_no_bf16", {"gpu": "Tesla T4", "arch": "sm_75", "fp16_vs_bf16": 0.97})

Every decision function of `kit.planning` returns its value with the Reason(s) for it; the planner
collects them into `Plan.reasons`, and the settling functions (`kit.planning.settle`) return their
notes the same way. Words are made from them in one place, `kit.report.reasons.words`, for
`kit plan`, bootstrap and the script's notes; `kit plan --json` gives the code, the figures and the
words. Figures are plain JSON scalars (str, int, float, bool, None), so a Reason written into
train_ddp.py's PLAN (`to_dict`) reads back equal (`from_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Reason:
    code: str
    figures: dict = field(default_factory=dict)

    def __post_init__(self):
        bad = [k for k, v in self.figures.items() if not isinstance(v, SCALARS)]
        if bad:
            raise TypeError(f"reason {self.code}: figure(s) {', '.join(bad)} are not plain numbers or text")

    def __getitem__(self, name: str):
        return self.figures[name]

    def to_dict(self) -> dict:
        return {"code": self.code, "figures": dict(self.figures)}

    @classmethod
    def from_dict(cls, d) -> "Reason":
        """A Reason from `to_dict`'s dict (a `words` key beside them, as `kit plan --json` prints, is
        left out); a plain sentence, as a script rendered by an older kit holds, becomes code "said"."""
        if isinstance(d, Reason):
            return d
        if isinstance(d, str):
            return cls("said", {"words": d})
        return cls(d["code"], dict(d.get("figures") or {}))


def why(code: str, **figures) -> Reason:
    """`why("batching_configured", batching="grouped")`: a Reason, its figures as keywords."""
    return Reason(code, figures)


def codes(reasons) -> list[str]:
    return [r.code for r in reasons]


def find(reasons, code: str) -> Reason | None:
    """The first reason of `code` among `reasons`, or None."""
    return next((r for r in reasons if r.code == code), None)
