"""An RL application over tfreplay's buffers: gymnasium drivers and observers, policies, a DQN agent, training.

Needs the `rl` extra (`pip install ".[rl]"` in a checkout, or `"<wheel>[rl]"`: gymnasium, absl-py,
and tf-keras for the legacy lane). Networks, optimizers and schedules are made with the Keras `tf.keras` is: Keras 3, or
tf-keras when `TF_USE_LEGACY_KERAS=1` (see `tfreplay.keras.keras_module`); a `DqnAgent` takes a
model of either and never mixes the two.
Modules: `drivers` (StepDriver, EpisodeDriver over gymnasium vector envs),
`observers`, `policies`, `agents` (DqnAgent), `learner`, `config` (DqnConfig), `training`
(`train_dqn`), `pipeline` (collect on a thread while learning, the same run), `actor_learner` (several
collectors at their own pace, kept at a ratio), `collectors` (Ray collector actors for `tfreplay.distributed`).
"""
