"""tools/challenge.py: a challenge is real only if its solution passes and its starter fails."""

from __future__ import annotations

import shutil
from pathlib import Path

from tools import challenge


def test_the_challenges_are_listed_with_their_chapters() -> None:
    found = {c.id: c for c in challenge.challenges()}
    assert "stop-strings" in found and found["stop-strings"].chapter == 15
    for c in found.values():
        assert c.checker.exists() and (c.folder / "starter.py").exists()
        assert (c.folder / "solution.py").exists() and c.task.strip()


def test_start_copies_the_starter_once_and_never_overwrites(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(challenge, "WORKSPACE", tmp_path)
    monkeypatch.setattr(challenge, "REPO_ROOT", tmp_path.parent)
    challenge.cmd_start("stop-strings")
    mine = tmp_path / "stop-strings" / "stop_matcher.py"
    assert "NotImplementedError" in mine.read_text()
    mine.write_text("# my work\n")
    challenge.cmd_start("stop-strings")
    assert mine.read_text() == "# my work\n"


def test_verify_tells_a_real_checker_from_one_that_cannot_fail(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "lenient"
    shutil.copytree(challenge.FOLDER / "stop-strings", fake)
    (fake / "test_stop_strings.py").write_text("def test_anything(candidate):\n    pass\n")
    shutil.copyfile(challenge.FOLDER / "conftest.py", tmp_path / "conftest.py")
    monkeypatch.setattr(challenge, "FOLDER", tmp_path)
    assert challenge.cmd_verify(["lenient"]) == 1
    assert "NOT REAL" in capsys.readouterr().out


def test_check_judges_the_readers_file(tmp_path) -> None:
    solution = challenge.FOLDER / "stop-strings" / "solution.py"
    assert challenge.cmd_check("stop-strings", solution) == 0
    broken = tmp_path / "mine.py"
    broken.write_text(Path(solution).read_text().replace("return best", "return 0"))
    assert challenge.cmd_check("stop-strings", broken) != 0


def test_a_challenge_may_build_on_a_project(tmp_path, monkeypatch, capsys) -> None:
    from tools.book import PROJECT_BASE

    fake = tmp_path / "on-a-project"
    shutil.copytree(challenge.FOLDER / "stop-strings", fake)
    toml = fake / "challenge.toml"
    toml.write_text(toml.read_text().replace("chapter = 15 ", 'chapter = "P1" '))
    monkeypatch.setattr(challenge, "FOLDER", tmp_path)
    [found] = challenge.challenges()
    assert found.chapter == PROJECT_BASE + 1
    assert challenge.cmd_list() == 0
    assert f"{'on-a-project':24s} after project P1  {found.title}\n" == capsys.readouterr().out
