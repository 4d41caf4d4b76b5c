"""Trainer: the trainer group, torch policy and the RL loop that embeds the lifecycle (Loop issue).

The trainer group's lifecycle is :data:`lifecycle.machines.TRAINER`.
"""
