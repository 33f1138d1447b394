"""An RL application over tfreplay's buffers: gymnasium drivers and observers, policies, a DQN agent, training.

Needs the `rl` extra (`pip install "tfreplay[rl]"`: gymnasium, tf-keras, absl-py).
Modules: `drivers` (StepDriver, EpisodeDriver over gymnasium vector envs),
`observers`, `policies`, `agents` (DqnAgent), `learner`, `training`
(`train_dqn`), `collectors` (Ray collector actors for `tfreplay.distributed`).
"""
