"""`cer eval` shows its sampling's progress: the engine's ``generate`` reports the
samples done to a bar on stderr (HF engine: after each of its batches), and the rows and metrics
are those of a call without the bar (greedy)."""

from __future__ import annotations

import re

from cer.data import MathExample
from cer.evaluate import evaluate_problems
from common.rollout import HFEngine
from common.rollout.engine import SamplingConfig


def test_evaluation_counts_the_samples_on_stderr(char_tokenizer, model_that_writes_12, capsys):
    engine = HFEngine(model_that_writes_12, char_tokenizer, batch_size=2)
    examples = [MathExample(f"p{i}", "5 + 7?", "12") for i in range(3)]
    prompts = [char_tokenizer.encode("5 + 7 = ", add_special_tokens=False)] * 3
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=12)
    metrics, rows = evaluate_problems(
        engine, char_tokenizer, examples, prompts, greedy, desc="cer eval tiny"
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    # 3 samples in HF batches of 2: the bar ends at 3 of 3
    assert re.search(r"cer eval tiny: 100%.*3/3 \[.*(sample/s|s/sample)", captured.err)
    assert engine.progress is None  # the bar is the call's only
    quiet_metrics, quiet_rows = evaluate_problems(engine, char_tokenizer, examples, prompts, greedy)
    assert capsys.readouterr().err == ""
    assert (metrics, rows) == (quiet_metrics, quiet_rows)
