"""A user-given name (a benchmark, an arm) becomes a path component only after
``common.config.path_name`` (``../../../x`` wrote outside the run folder)."""

import json

import pytest
import yaml

from common.config import ConfigError, path_name


@pytest.mark.parametrize("name", ["math500", "MMLU-Pro", "2wiki_dev", "hotpot qa.v2", "é" * 100])
def test_a_plain_name_is_kept_as_it_is(name):
    assert path_name(name, "assets.eval") == name


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("../../../x", "it holds a path separator"),
        ("/etc/x", "it holds a path separator"),
        ("a\\b", "it holds a path separator"),
        ("..", "it names a folder, not a file in it"),
        (".", "it names a folder, not a file in it"),
        ("", "it is empty"),
        ("  ", "it is empty"),
        ("a\x00b", "it holds a control character"),
        ("a\nb", "it holds a control character"),
        ("é" * 101, "over 200 bytes"),
        (3, "a name is text, not int"),
    ],
)
def test_a_name_that_is_not_one_path_component_is_refused_naming_the_key(value, why):
    with pytest.raises(ConfigError) as err:
        path_name(value, "assets.eval")
    message = str(err.value)
    assert message.startswith(f"assets.eval: {value!r:.80} cannot be a file or folder name ({why})")
    assert message.endswith("name it with letters, digits, '.', '_' and '-'")
    assert "\n" not in message


def test_cer_eval_refuses_a_benchmark_name_that_leaves_the_run_folder_before_a_model_loads(
    tmp_path, capsys
):
    """``cer eval`` wrote ``<out>/../../../x.json``: now one line and exit 2, nothing written."""
    from cer.cli import main

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # not a model: the check comes before any load
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    config = tmp_path / "c.yaml"
    run_dir = tmp_path / "a" / "b" / "run"
    config.write_text(
        yaml.safe_dump(
            {
                "run_dir": str(run_dir),
                "assets": {"model": str(model), "eval": {"../../../x": str(questions)}},
            }
        )
    )
    before = sorted(tmp_path.rglob("*"))
    assert main(["eval", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        "error: assets.eval: '../../../x' cannot be a file or folder name (it holds a path "
        "separator); name it with letters, digits, '.', '_' and '-'\n"
    )
    assert sorted(tmp_path.rglob("*")) == before
