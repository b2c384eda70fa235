"""Is the user's next message dissatisfied? A small lexicon classifier, vectorised with Arrow's RE2 kernels.

A language model judge would be better and far slower; a follow-up like "still broken" or "revert that"
carries its meaning in a handful of phrases, so three regexes over the lower-cased text do most of the
work at millions of rows per second. Strong cues ("wrong", "revert", "still fails") decide alone; weaker
cues ("error", "no") count only when no thanks/works cue is present. Measured on tests/data/followups.jsonl
(`evaluate`, printed by bench/harvest_rewards.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

STRONG = "|".join([
    r"\bwrong\b", r"\bworse\b", r"\buseless\b", r"\bgarbage\b", r"\bterrible\b", r"\bfrustrat",
    r"\brevert\b", r"\bundo\b", r"roll (that|it|this) back", r"\bbroke\b", r"\bbroken\b",
    r"\bstill\b.*\b(fail|broken|error|hang|throw|slow|complain|return|doesn|don't|not|seeing|getting|same)",
    r"\b(doesn't|does not|didn't|did not|won't|isn't|don't) (work|help|fix|compile|pass|apply|address|handle|type)",
    r"not what i", r"makes no sense", r"hallucinat", r"made up", r"\bseriously\b", r"come on",
    r"same (error|answer|bug|traceback|keyerror|thing)", r"nothing changed", r"thanks a lot",
    r"\byou (keep|ignored|deleted|removed|broke|changed the wrong|misunderstood|didn't|just made|made up)",
    r"\bi (told|said|asked for|already tried|meant)\b", r"are you even", r"why (did|would) you",
    r"(doesn't|does not|isn't) (exist|a thing|valid)", r"not (helpful|right|even|how|valid)",
    r"^\s*(no+|nope|stop|ugh|meh)\b[\s.!,]*(no|that|this|i|$)", r"^\s*no\b[.!]*\s*$", r"\bincorrect\b",
    r"failed to apply", r"\bnot really\b", r"opposite of what", r"(build|ci) is red",
    r"waste of (my |your )?time", r"\bdo it myself\b", r"\bgive up\b", r"\bgiving up\b",
])
WEAK = "|".join([
    r"\berror\b", r"exception", r"traceback", r"\bfails?\b", r"\bfailed\b", r"\bfailing\b", r"\bcrash",
    r"\bhangs?\b", r"infinite loop", r"\w+error\b", r"\bbug\b", r"^\s*no\b", r"\bdoesn't\b", r"\bdon't\b",
    r"\bwhy is it\b", r"\bleaks?\b", r"\bnow nothing\b", r"\bforget it\b", r"\bnever ?mind\b",
])
POSITIVE = "|".join([
    r"\bthanks?\b", r"thank you", r"\bworks?\b", r"\bworking\b", r"\bfixed\b", r"\bperfect\b", r"\bgreat\b",
    r"\blgtm\b", r"\bpass(es)?\b", r"\bgreen\b", r"no problem", r"no worries", r"\bis gone\b", r"\bseparate\b",
    r"\bnext\b", r"another module",
])


def dissatisfied(texts: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Boolean per follow-up text; null text (no follow-up) -> False."""
    low = pc.utf8_lower(texts)
    strong = pc.match_substring_regex(low, STRONG)
    weak = pc.and_(pc.match_substring_regex(low, WEAK), pc.invert(pc.match_substring_regex(low, POSITIVE)))
    return pc.fill_null(pc.or_(strong, weak), False)


@dataclass
class ClassifierReport:
    n: int
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def table(self) -> str:
        return ("| labelled follow-ups | precision | recall | F1 | TP | FP | FN | TN |\n"
                "|---:|---:|---:|---:|---:|---:|---:|---:|\n"
                f"| {self.n} | {self.precision:.3f} | {self.recall:.3f} | {self.f1:.3f} | "
                f"{self.tp} | {self.fp} | {self.fn} | {self.tn} |")


def evaluate(rows: list[dict]) -> ClassifierReport:
    """Precision/recall of `dissatisfied` on rows {"text": str, "dissatisfied": bool}."""
    pred = dissatisfied(pa.array([r["text"] for r in rows], pa.string())).to_pylist()
    gold = [bool(r["dissatisfied"]) for r in rows]
    tp = sum(p and g for p, g in zip(pred, gold, strict=True))
    fp = sum(p and not g for p, g in zip(pred, gold, strict=True))
    fn = sum(g and not p for p, g in zip(pred, gold, strict=True))
    return ClassifierReport(n=len(rows), tp=tp, fp=fp, fn=fn, tn=len(rows) - tp - fp - fn)
