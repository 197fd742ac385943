"""What is kept on disk: the model directory (`config.json` + `model.safetensors`), a run's
checkpoints and their average, and the run directory's state and refusals. safetensors and
JSON only, never pickle; every write atomic (aiayn.atomic).
"""
