"""Which evaluator each recognised method's runs go to and which metrics are reported for it:
shared by ``experiments.evaluate_all`` (the table) and ``experiments.evaluate_plots`` (the bars),
so neither imports the other."""

from __future__ import annotations

# evaluator kind of each method, the metrics its paper reports (in the table's order) and the
# ones paired against the baseline
KIND = {
    "grpo": "search",
    "warmup": "search",
    "eviback": "eviback",
    "search_r1": "eviback",
    "cer": "cer",
    "cer_warmup": "cer",
    "arco": "arco",
    "arco_outcome_only": "arco",
    "arco_prm": "arco",
}
COLUMNS = {
    "search": ("em", "f1", "valid_answer_rate", "mean_searches", "forced_termination_rate"),
    "eviback": (
        "f1",
        "em",
        "valid_answer_rate",
        "mean_searches",
        "duplicate_query_rate",
        "forced_termination_rate",
    ),
    "arco": ("em", "f1"),
    # the containment and F1 columns: short free-form answers only (SCALE=smol's HotpotQA)
    "cer": ("greedy", "avg@k", "greedy_containment", "greedy_f1"),
}
PAIRED = {
    "search": ("em", "f1"),
    "eviback": ("f1", "em"),
    "arco": ("em", "f1"),
    "cer": ("greedy", "avg@k", "greedy_containment", "greedy_f1"),
}
