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


def test_the_cuda_graph_recording_replays_the_eager_tokens_and_catches_a_skipped_copy() -> None:
    """Chapter 18's animation: every decode step a replay with the eager engine's tokens; the
    run whose copy_from is left out at one step samples other tokens; new weights are refused."""
    from tools.animations import cuda_graph

    said = [f.narration for f in cuda_graph.record().frames]
    assert 12 <= len(said) <= 24
    assert any("gives the same tokens" in s for s in said)
    stale = next(s for s in said if "replays on the stale rows" in s)
    assert "differ)" in stale and "(0 of" not in stale
    assert "GraphContractError" in said[-1]
