"""The sidebar in a real Blender 3.4 window at 1920x1080, the sidebar at its default width and Blender's default UI
scale (tests/blender/scenarios/sidebar_gui.py): no text of the add-on's panels is cut, while idle, capturing and
training, measured with blf in the UI font against its widget's width; the main panel's button, state and progress
bar are within the first screen of the tab; the status bar shows the capture's and the training's progress.
Screenshots go to test-artifacts/."""
from __future__ import annotations

import shutil
import sys

import pytest

import build_addon
from helpers import x_display
from blender.runner import ARTIFACTS, SCENARIOS, run_window_scenario

pytestmark = pytest.mark.blender

SCENARIO = SCENARIOS / "sidebar_gui.py"
WINDOW = (1920, 1080)
STAGES = ("idle", "capture", "training")


@pytest.fixture(scope="module")
def display():
    """An X display of 1920x1080 (the shared one is smaller)."""
    yield from x_display(*WINDOW)


@pytest.fixture(scope="module")
def sidebar(display, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("blender-sidebar")
    addon_zip = build_addon.build(home / "dist")
    result = run_window_scenario(SCENARIO, home, display, WINDOW, "--zip", str(addon_zip), "--python", sys.executable,
                                 options=("--enable-event-simulate",), timeout=600)
    ARTIFACTS.mkdir(exist_ok=True)
    for stage in STAGES:
        shutil.copy(result[stage]["screenshot"], ARTIFACTS / f"sidebar_{stage}.png")
    return result


@pytest.mark.parametrize("stage", STAGES)
def test_no_label_is_cut(sidebar, stage):
    measured = sidebar[stage]["measured"]
    widest = max(measured, key=lambda m: m["text_px"] - m["room_px"])
    print(f"{stage}: {len(measured)} texts in a {sidebar[stage]['region'][0]} px sidebar; the tightest "
          f"{widest['text']!r} {widest['text_px']:.0f} px in {widest['room_px']:.0f} px")
    cut = [m for m in measured if m["text_px"] > m["room_px"]]
    assert not cut, cut


@pytest.mark.parametrize("stage", ("capture", "training"))
def test_the_button_state_and_progress_are_in_the_first_screen(sidebar, stage):
    s = sidebar[stage]
    height = s["region"][1]
    assert s["ends"]["operator"] is not None and s["ends"]["progress"] is not None, s["main_texts"]
    assert s["ends"]["operator"] <= height and s["ends"]["progress"] + 2 * 20 <= height, (s["ends"], height)


def test_the_status_bar_shows_the_progress(sidebar):
    assert any(t.startswith("Capture ") for t in sidebar["capture"]["status_bar"]), sidebar["capture"]["status_bar"]
    # the time left joins it once steps are measured, which a snapshot early in training may precede
    assert any(t.startswith("Training ") for t in sidebar["training"]["status_bar"]), sidebar["training"]["status_bar"]
    assert sidebar["errors"] == ""
