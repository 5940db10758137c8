"""A profile's `method` is the tasks' default: `plan` runs it when --method is not given, and
--method (or a .cake file's own) still wins."""

from __future__ import annotations

import yaml

from cake_cli.tasks.planning import plan
from cake_cli.tasks.request import TaskRequest


def _profile_dir(tiny_profile_dir, tmp_path, method):
    data = yaml.safe_load((tiny_profile_dir / "tiny-test.yaml").read_text())
    data.update(name="tiny-chunk", method=method)
    out = tmp_path / "profiles"
    out.mkdir()
    (out / "tiny-chunk.yaml").write_text(yaml.safe_dump(data))
    (out / "tiny-test.yaml").write_text((tiny_profile_dir / "tiny-test.yaml").read_text())
    return out


def test_the_profile_method_runs_unless_method_is_given(cli_env, tiny_profile_dir, monkeypatch):
    monkeypatch.setenv("CAKE_PROFILES_DIR", str(_profile_dir(tiny_profile_dir, cli_env, "cake-chunk")))
    doc = cli_env / "notes.txt"
    doc.write_text("The gull rock lighthouse was lit in 1871 by the keeper. " * 40, encoding="utf-8")
    ask = dict(task="qa", document=str(doc), fields={"question": "When was it lit?"}, model="tiny-chunk", budget=64)

    chosen = plan(TaskRequest(**ask))
    assert (chosen.config.allocation, chosen.config.indicator, chosen.request.method) == ("cake", "chunk", "cake-chunk")
    given = plan(TaskRequest(**ask, method="snapkv"))
    assert (given.config.allocation, given.config.indicator, given.request.method) == ("uniform", "snapkv", "snapkv")
    plain = plan(TaskRequest(**{**ask, "model": "tiny-test"}))  # no `method:` in its profile: the paper's CAKE
    assert (plain.config.indicator, plain.request.method) == ("cake", "cake")
