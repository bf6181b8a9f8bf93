"""`bench scrub` end to end on the CPU at a tiny size: a backend trains a 4D model from timed views, and every
frame change asks for, and waits for, the frame of its own time."""
from __future__ import annotations

from pathlib import Path

from backend.tools.bench import scrub, serve
from backend.dynamic import DynamicGaussians, gaussians_from_tensors
from backend.policy import resolve_device
from backend.train import load_checkpoint


def test_timeline_steps_one_frame_per_request_and_wraps():
    assert scrub.timeline_time(0) == 0.0 and scrub.timeline_time(scrub.TIMELINE_FRAMES - 1) == 1.0
    assert scrub.timeline_time(scrub.TIMELINE_FRAMES) == 0.0
    assert 0 < scrub.timeline_time(1) < scrub.timeline_time(2) < 1


def test_scrub_gets_each_frame_of_its_time_from_a_4d_model(monkeypatch):
    workdirs = []
    start_backend = serve.start_backend
    monkeypatch.setattr(serve, "start_backend",
                        lambda workdir, device: (workdirs.append(Path(workdir)), start_backend(workdir, device))[1])
    device, rasterizer = resolve_device("cpu")
    bench = serve.LiveBench("scrub", device, rasterizer, gaussians=200, width=32, height=24, seconds=0.3, views=4,
                            out=None)
    with bench.paused_training(dynamic=True) as client:
        measured, idle, training = scrub.measure(client, bench)
        path = client.call("save_checkpoint")["path"]
        model = gaussians_from_tensors(load_checkpoint(workdirs[0] / path)["gaussians"])
    assert isinstance(model, DynamicGaussians)  # the timed views made the session 4D
    assert idle and training and len(measured.ask_ms) == measured.asked
    # one frame per request, in order, each tagged with the time its request asked for
    assert measured.received == [(n, scrub.timeline_time(n)) for n in range(1, measured.asked + 1)]
    frame = measured.stream.frame
    assert (frame.fields["width"], frame.fields["height"]) == (32, 24)
    assert frame.pixels.size == 32 * 24 * 2  # colour and depth packed in two floats a pixel (codecs.layer_pixels)
