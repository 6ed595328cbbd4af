"""The main job: online RL on a small multi-turn tool task, through every tokentrail component."""
