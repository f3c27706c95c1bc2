"""tools/animations and the player markup: every animation is registered with its sources,
and a page gets its frames inlined safely."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import animations, book_hooks
from tools.book import BookError

ROOT = Path(__file__).resolve().parents[1]


def test_every_animation_names_its_recorder_and_sources() -> None:
    found = animations._recorders()
    assert "radix-cache" in found
    for name, recorder in found.items():
        assert callable(recorder.record)
        assert all((ROOT / s).exists() for s in recorder.sources), name


def test_the_player_inlines_the_frames_and_no_frame_can_end_the_script(tmp_path, monkeypatch):
    svg = '<svg viewBox="0 0 600 100"><text font-size="10">a</text></svg>'
    frames = [{"svg": svg, "narration": "one </script> two"}, {"svg": svg, "narration": "b"}]
    folder = tmp_path / "docs" / "animations"
    folder.mkdir(parents=True)
    (folder / "demo.json").write_text(json.dumps({"title": "Demo", "frames": frames}))
    monkeypatch.setattr(book_hooks, "ROOT", tmp_path)
    html = book_hooks.render_animation("demo")
    payload = html.split('<script type="application/json">')[1].split("</script>")[0]
    assert json.loads(payload)["frames"][0]["narration"] == "one </script> two"
    assert 'data-animation="demo"' in html and "--book-figure-min: 720px" in html
    for act in ("first", "prev", "play", "next", "last"):
        assert f'data-act="{act}"' in html
    (folder / "short.json").write_text(json.dumps({"title": "x", "frames": frames[:1]}))
    with pytest.raises(BookError, match="1 frame"):
        book_hooks.render_animation("short")
    with pytest.raises(BookError, match="missing"):
        book_hooks.render_animation("absent")
