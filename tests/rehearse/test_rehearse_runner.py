"""The rehearsal runner: its stage runner, its overrides, the stand-in's scripts, and a rehearsal
whose stage fails (exit 1, the stage named in the output and the report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from experiments.rehearse import scripts
from experiments.rehearse.__main__ import arco_variants, main
from experiments.rehearse.runner import (
    PAPER_CONFIGS,
    ROOT,
    RehearsalError,
    check_standin,
    family,
    loaded_config,
)
from experiments.rehearse.stages import Stage, StageFailed, last_error_line, overrides, run_stage


def test_overrides_are_read_back_by_yaml_as_the_values():
    import yaml

    values = {"a": 3, "b.c": True, "d": {"nq": 4, "2wiki": 4}, "e": "x y", "f": 0.5, "g": [1, 2]}
    args = overrides(values)
    assert args[0] == "a=3" and args[1] == "b.c=true" and args[3] == "e=x y"
    back = {k: yaml.safe_load(v) if k != "e" else v for k, v in (a.split("=", 1) for a in args)}
    assert back == values


def test_a_stage_is_timed_its_memory_read_and_its_check_runs(tmp_path):
    seen = []
    ok = Stage("ok", "json.tool", ["--help"], check=lambda: seen.append(1) or {"n": 1})
    result = run_stage(ok, tmp_path / "ok.log", ROOT, {"PATH": "/usr/bin:/bin"})
    assert result.ok and result.counts == {"n": 1} and seen == [1]
    assert result.peak_rss_mib > 1 and result.seconds > 0
    assert (tmp_path / "ok.log").read_text().startswith("$ python -m json.tool --help")

    def refuse() -> dict:
        raise StageFailed("the teacher backoff never ran")

    bad = Stage("quiet", "json.tool", ["--help"], check=refuse)
    result = run_stage(bad, tmp_path / "quiet.log", ROOT, {})
    assert not result.ok and result.error == "the teacher backoff never ran"


def test_a_failing_command_reports_its_exit_status_and_error_line(tmp_path):
    stage = Stage("boom", "json.tool", [str(tmp_path / "missing.json")])
    result = run_stage(stage, tmp_path / "boom.log", ROOT, {})
    assert not result.ok and result.returncode == 2  # json.tool: a file it cannot open
    assert "exit status 2" in result.error and "missing.json" in result.error


def test_a_stage_past_its_timeout_is_killed(tmp_path):
    stage = Stage("slow", "http.server", ["0", "--bind", "127.0.0.1"], timeout_s=1.0)
    result = run_stage(stage, tmp_path / "slow.log", ROOT, {})
    assert not result.ok and result.error == "timed out after 1 s" and result.seconds < 10


def test_last_error_line_prefers_the_error(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("loading\ncer train: error: assets.train: no such file\nbye\n")
    assert last_error_line(log) == "cer train: error: assets.train: no such file"
    # through make: the command's line, not make's own after it
    log.write_text("cer train: error: steps: not an integer\nmake: *** [Makefile:106: x] Error 2\n")
    assert last_error_line(log) == "cer train: error: steps: not an integer"


def test_every_paper_config_and_variant_is_known():
    on_disk = sorted(
        str(p.relative_to(ROOT))
        for pkg in ("eviback", "cer", "arco")
        for p in (ROOT / pkg / "configs").glob("*.yaml")
        # the tiny and smol settings and their comparison specs are not paper configs
        if not p.stem.startswith(("tiny", "compare", "smol")) and p.stem != "search_r1_values"
    )
    assert sorted(PAPER_CONFIGS) == on_disk and len(PAPER_CONFIGS) == 13
    assert {family(c) for c in PAPER_CONFIGS} == {"eviback", "cer", "arco"}
    assert {"prm", "outcome_only", "k1", "wo_rubric"} <= set(arco_variants())


def test_scripts_start_where_the_model_continues(qwen3_tokenizer):
    """The scripted paths start at the last token of the generation prompt and of each inserted
    observation's tail; a text ending in a stop string gets no end of sequence, others do."""
    starts = scripts.start_tokens(qwen3_tokenizer, "search_r1")
    prompt = qwen3_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Q"}], add_generation_prompt=True, tokenize=True
    )
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    tail = qwen3_tokenizer.encode("</information>\n\n", add_special_tokens=False)
    assert prompt[-1] in starts["prompt"] and tail[-1] in starts["observation"]
    script = [(" <answer>Paris</answer>", 2.0, "prompt"), (" I do not know.", 1.0, "prompt")]
    paths = scripts.script_paths(qwen3_tokenizer, script, "search_r1")
    assert len(paths) == 2 * len(starts["prompt"])
    (first, w1), (second, w2) = paths[0], paths[len(starts["prompt"])]
    assert (w1, w2) == (2.0, 1.0) and first[0] in starts["prompt"]
    assert qwen3_tokenizer.decode(first[1:]) == " <answer>Paris</answer>"  # stops: no eos
    assert second[-1] == qwen3_tokenizer.eos_token_id


def _greedy_actions(tokenizer, script, protocol):
    from common.rollout.protocols import get_protocol
    from experiments.rehearse.standin import chain_from_paths

    chain = chain_from_paths(scripts.script_paths(tokenizer, script, protocol))
    starts = scripts.start_tokens(tokenizer, protocol)
    parse = get_protocol(protocol).parse
    walk = lambda s: tokenizer.decode(  # noqa: E731
        scripts.greedy_walk(chain, s, tokenizer.eos_token_id, 40)
    )
    prompt = {parse(walk(s)).kind for s in starts["prompt"]}
    after = {parse(walk(s)) for s in starts["observation"] if s not in starts["prompt"]}
    return prompt, after


def test_the_greedy_stand_in_searches_first_and_answers_after_an_observation(qwen3_tokenizer):
    """Dev evaluation is greedy: the stand-in's greedy turns are valid actions, a search from
    the prompt and the data's first answer after an observation (Search-R1 and ReAct)."""
    from experiments.rehearse.tokenizers import build_llama32_tokenizer

    prompt, after = _greedy_actions(
        qwen3_tokenizer, scripts.search_r1_script(["Paris"]), "search_r1"
    )
    assert prompt == {"search"} and {(a.kind, a.answer) for a in after} == {("answer", "Paris")}
    for tok in (qwen3_tokenizer, build_llama32_tokenizer()):
        prompt, after = _greedy_actions(tok, scripts.react_script(["Paris", "1912"], 3), "react")
        assert prompt == {"search"} and {(a.kind, a.answer) for a in after} == {("answer", "Paris")}


@pytest.mark.slow
def test_a_rehearsal_whose_stage_fails_exits_1_and_names_the_stage(tmp_path, capsys):
    out = tmp_path / "r"
    code = main(
        ["--config", "cer/configs/qwen3_4b_base_math.yaml", "--out", str(out),
         "--stage", "train", "--set", "train:steps=many"]
    )  # fmt: skip
    assert code == 1
    assert "FAILED at train" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is False and [s["name"] for s in report["stages"]] == ["train"]
    assert "steps" in report["stages"][0]["error"]
    assert "FAILED: train" in (out / "report.md").read_text()
    assert Path(report["stages"][0]["log"]).is_file()


def test_a_stage_not_in_the_plan_is_refused(capsys):
    code = main(["--config", "cer/configs/qwen3_4b_base_math.yaml", "--stage", "warmup"])
    assert code == 2 and "unknown stage" in capsys.readouterr().err


def test_a_variant_on_a_non_arco_config_is_refused(capsys):
    code = main(["--config", "cer/configs/qwen3_4b_base_math.yaml", "--variant", "prm"])
    assert code == 2 and "ARCO configs only" in capsys.readouterr().err
    assert sys.executable  # the stages run under this interpreter


def test_a_config_that_is_not_there_is_one_error_line(capsys, tmp_path):
    missing = "arco/configs/qwen3_4b_instruct_2wiki.yaml"
    assert main(["--config", missing, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rehearse: error: cannot read config file")


def test_a_smol_config_is_refused_as_a_local_model_with_nothing_to_rehearse(capsys):
    assert main(["--config", "eviback/configs/smol.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rehearse: error: eviback/configs/smol.yaml: ")
    assert "no stand-in for model 'runs/warmup/smol/model'" in err[0]
    assert "local model folder" in err[0] and "SCALE=smol" in err[0]


def test_a_hub_model_without_a_stand_in_gets_no_local_folder_hint():
    raw = {"assets": {"model": "Qwen/Qwen2.5-7B"}}
    with pytest.raises(RehearsalError, match="assets.model: no stand-in") as e:
        check_standin("cer/configs/x.yaml", raw)
    assert "local model folder" not in str(e.value)
    for config in PAPER_CONFIGS:  # every paper config's model has its stand-in
        check_standin(config, loaded_config(Path(config), None))
