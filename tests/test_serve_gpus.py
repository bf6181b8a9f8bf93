"""`serve --gpus 2 --device cpu`: a session trains in two gloo processes while the server answers renders of the
model they train; pause, resume and stop; a killed training process fails the training saying so, and the session
resumes from its last checkpoint."""
from __future__ import annotations

import os
import re
import signal

from backend.train import load_checkpoint
from helpers import spawned_workers
from server_helpers import add_scene_views, wait_for


def test_a_session_trains_in_two_processes_while_the_server_renders_it(tmp_path, start_server, scene):
    camera = scene[1][0]
    server = start_server(tmp_path / "work", "--gpus", "2")
    with server.client() as client:
        def rendered_step() -> int:
            return client.submit_render(camera).result(30).fields["step"]

        def progress_past(step: int) -> int:
            return wait_for(client, lambda e: e["event"] == "progress" and e["step"] > step)["step"]

        client.call("open_session", name="group")
        add_scene_views(client, scene)
        client.call("start_training", iterations=100_000, checkpoint_every=5, progress_interval=0.05,
                    init_points=200, max_gaussians=400)
        seen = progress_past(0)
        assert rendered_step() >= seen  # the frames follow the processes' model
        seen = progress_past(seen)
        assert rendered_step() >= seen

        paused = client.call("pause")
        assert paused["state"] == "paused" and paused["step"] > seen
        assert rendered_step() == paused["step"] == client.call("status")["step"]  # stays put while paused

        client.call("resume")
        progress_past(paused["step"] + 5)  # past a checkpoint of this run
        os.kill(max(spawned_workers(server.proc.pid)), signal.SIGKILL)
        error = wait_for(client, lambda e: e["event"] == "error")["message"]
        back_to = re.fullmatch(r"at step \d+: process [01] of 2 was killed by SIGKILL, which ended the training\. "
                               r"The model went back to the last checkpoint, step (\d+); resume to retry from there "
                               r"or start with fresh=true\.", error)
        assert back_to, error
        failed = wait_for(client, lambda e: e["event"] == "state")
        assert failed["state"] == "failed" and failed["step"] == int(back_to.group(1)) > paused["step"]
        assert failed["reason"] == error == client.call("status")["reason"]

        client.call("resume")
        progress_past(failed["step"])
        stopped = client.call("stop")
        assert stopped["state"] == "stopped" and stopped["step"] > failed["step"] and stopped["reason"] is None
        assert load_checkpoint(tmp_path / "work" / "group" / "checkpoint.pt")["step"] == stopped["step"]
        assert rendered_step() == stopped["step"]
