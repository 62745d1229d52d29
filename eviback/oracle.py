"""The evidence oracle: an exact teacher for data whose supporting documents are known.

The evidence is sufficient (S, answer = the first gold answer) exactly when every supporting
document was among the top-m documents of some search round, else insufficient (I). Supporting
documents are matched by id (``metadata["supporting_ids"]``, the tiny world) or by title
(``metadata["supporting_titles"]``, HotpotQA / 2Wiki / MuSiQue; compared case-insensitively).
It never says A: with known supporting facts there is one answer. It serves the tiny runs as the
teacher and labels the E2E-APE benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.data import title_key
from eviback.teacher import Judgement, TeacherItem, TeacherStats, Verdict, format_verdict


@dataclass(frozen=True)
class EvidenceOracle:
    top_m: int = 5

    def __post_init__(self) -> None:
        if self.top_m < 1:
            raise ValueError(f"top_m must be at least 1, got {self.top_m}")

    def label(self, item: TeacherItem) -> Verdict:
        """S with the first gold answer when all supporting documents were retrieved, else I."""
        where = f"question {item.question[:60]!r}"
        if not item.references:
            raise ValueError(f"{where}: no gold answers for the oracle to give")
        docs = [d for _, round_docs in item.rounds for d in round_docs[: self.top_m]]
        if item.metadata.get("supporting_ids"):
            needed = [str(x) for x in item.metadata["supporting_ids"]]
            found = {str(getattr(d, "id", "")) for d in docs}
            missing = [x for x in needed if x not in found]
        elif item.metadata.get("supporting_titles"):
            needed = [str(t) for t in item.metadata["supporting_titles"]]
            found = {title_key(d.title) for d in docs}
            missing = [t for t in needed if title_key(t) not in found]
        else:
            raise ValueError(
                f"{where}: metadata has no 'supporting_ids' or 'supporting_titles'; the evidence "
                "oracle needs the supporting documents (use a model teacher for this data)"
            )
        if missing:
            return Verdict(True, "I", "", f"missing supporting documents: {', '.join(missing)}")
        reason = f"all {len(needed)} supporting documents were retrieved"
        return Verdict(True, "S", item.references[0], reason)

    def label_text(self, item: TeacherItem) -> str:
        """The verdict in the teacher's output contract (what a model teacher would write)."""
        return format_verdict(self.label(item))

    def judge(self, items: Sequence[TeacherItem]) -> tuple[list[Judgement], TeacherStats]:
        """The teacher interface; the oracle makes no calls."""
        verdicts = [self.label(item) for item in items]
        stats = TeacherStats(items=len(items))
        stats.count_final(verdicts)
        return [Judgement(v, v) for v in verdicts], stats
