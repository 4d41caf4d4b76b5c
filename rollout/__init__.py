"""Rollout: InferenceController, RolloutExecutor, eval fleet and replay data (Loop issue).

The rollout manager's lifecycle is :data:`lifecycle.machines.ROLLOUT`.
"""
