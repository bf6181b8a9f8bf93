"""The Blender test harness: the tests that need real Blender run a scenario script in it and check what the
script reports.

- runner.py: the pytest side; runs a scenario in the bpy module (4.5, 5.2, 5.3) or in Debian's Blender in a window.
- kit.py: the in-Blender helper library of the scenarios that run in the bpy module (a stand-in event loop,
  operators, reports, drawing, a small scene, the result line).
- blocking_calls.py: notes each call that may block Blender's main thread while a watched call runs there.
- splat_scene.py: the scene the splat scenarios share, in the bpy module and in a window.
- batch_setup.py: prepares the .blend files of the command-line render (`blender -b`).
- scenarios/: one script per scenario; each imports the harness only, never another scenario.
"""
