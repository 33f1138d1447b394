"""`DqnConfig`, the settings of a DQN training run (`tfreplay.rl.training.train_dqn`).

Apart from the training code so that it loads without TensorFlow: the demo's command line takes its flags'
defaults from it and answers `--help` before TensorFlow starts.
"""

from __future__ import annotations

import dataclasses

__all__ = ["DqnConfig"]


@dataclasses.dataclass
class DqnConfig:
    """Hyper-parameters and run options of `train_dqn` (defaults solve CartPole-v1)."""

    env_id: str = "CartPole-v1"
    num_env_steps: int = 100_000  # transitions collected, summed over sub-environments
    seed: int = 0
    num_envs: int = 16  # more environments per vector step: the policy and add_batch calls cost per step
    buffer_size: int = 50_000
    batch_size: int = 64
    learning_rate: float = 1e-3
    end_learning_rate: float | None = None  # decay linearly to this over the run (None: constant)
    gradient_clipping: float | None = 10.0
    gamma: float = 0.99
    fc_layer_params: tuple = (64, 64)  # enough for CartPole; with batch 64, a third of 256x256's step at 128
    initial_collect_steps: int = 1_000  # random actions before learning starts
    train_steps_per_env_step: float = 1.0
    target_update_period: int = 500
    target_update_tau: float = 1.0
    epsilon_start: float = 1.0
    epsilon_end: float = 0.02
    epsilon_decay_steps: int = 10_000
    num_eval_episodes: int = 20
    eval_interval: int = 2_500  # env steps between greedy evaluations during training (0: none)
    num_interval_eval_episodes: int = 20
    keep_best: bool = True  # end with the weights of the best evaluation so far
    stop_at_return: float | None = None  # stop early once an evaluation reaches this
    log_interval: int = 1_000
    checkpoint_interval: int = 10_000
    output_dir: str | None = None
    resume: bool = False
    progress: bool = True
    prioritized: bool = False  # TFPrioritizedReplayBuffer, priorities |TD error| + priority_eps
    alpha: float = 0.6  # how much priorities count (0: uniform)
    beta: float = 0.4  # importance-weight exponent when learning starts, annealed linearly to 1 at the end
    priority_eps: float = 1e-6  # keeps every item drawable
    n_step: int = 1  # > 1: learn from n-step returns (NStepReturns)
    train_steps_per_call: int = 1  # > 1: that many train steps per graph call, sampled inside it (TrainLoop)
    concurrent: bool = False  # collect on a thread while learning (tfreplay.rl.pipeline): the same run, faster
    pull_every: int = 100  # env steps between the collector's pulls of the learner's weights (one pull old)

    def __post_init__(self) -> None:
        from tfreplay._src import specs  # here, not above: the class loads without TensorFlow (the demo's flags)

        specs.check_positive_int("DqnConfig", "n_step", self.n_step)
        specs.check_positive_int("DqnConfig", "train_steps_per_call", self.train_steps_per_call)
        specs.check_positive_int("DqnConfig", "pull_every", self.pull_every)
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"DqnConfig: beta ({self.beta!r}) must be in [0, 1].")
        if not self.priority_eps > 0.0:
            raise ValueError(
                f"DqnConfig: priority_eps ({self.priority_eps!r}) must be positive, so every item can be drawn."
            )
