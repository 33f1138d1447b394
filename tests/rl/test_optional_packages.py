"""train_dqn with only the `rl` extra: without tqdm, TensorBoard or matplotlib it trains, checkpoints, and says
once, in one line each, what it leaves out."""

import importlib.util
import re
import sys
import types

import pytest

from tfreplay.rl import _optional
from tfreplay.rl.training import train_dqn

OPTIONAL = ("tqdm", "tensorboard", "matplotlib")
SMALL = dict(
    num_env_steps=300,
    initial_collect_steps=200,
    num_envs=4,
    train_steps_per_env_step=0.25,
    buffer_size=400,
    batch_size=16,
    fc_layer_params=(16,),
    num_eval_episodes=2,
    eval_interval=0,
    log_interval=100,
)


@pytest.fixture
def without(monkeypatch):
    """`without(*names)`: those packages look uninstalled to tfreplay.rl (and nothing was told yet)."""
    find_spec = importlib.util.find_spec

    def hide(*names):
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name in names else find_spec(name, *a)
        )

    monkeypatch.setattr(_optional, "_told", set())
    return hide


@pytest.mark.slow
def test_a_run_without_the_optional_packages_trains_checkpoints_and_says_what_it_leaves_out(without, tmp_path, capsys):
    without(*OPTIONAL)
    result = train_dqn(**SMALL, output_dir=str(tmp_path), progress=True)
    assert result.num_env_steps == 300
    out, err = capsys.readouterr()
    assert [line for line in err.splitlines() if line.startswith("tfreplay:")] == [  # in the order of use
        "tfreplay: tensorboard is not installed: no TensorBoard summaries are written (pip install tensorboard).",
        "tfreplay: tqdm is not installed: progress is printed as plain lines (pip install tqdm).",
        "tfreplay: matplotlib is not installed: no learning_curve.png is drawn (pip install matplotlib).",
    ]
    assert "300/300 steps (100%)" in out
    assert list((tmp_path / "checkpoints").glob("ckpt-300.index")) and (tmp_path / "history.json").exists()
    assert not (tmp_path / "learning_curve.png").exists() and not (tmp_path / "tensorboard").exists()
    train_dqn(**SMALL, output_dir=str(tmp_path / "again"), progress=False)
    assert "tfreplay:" not in capsys.readouterr().err  # told once per process


def test_plain_progress_prints_a_line_per_tenth_with_the_latest_figures(without, capsys):
    without("tqdm")
    with _optional.progress_bar(total=1000, initial=200, enabled=True) as bar:
        for _ in range(8):
            bar.set_postfix(loss="0.5")
            bar.update(100)
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{n:,}/1,000 steps ({n // 10}%), loss=0.5" for n in range(300, 1001, 100)]


def test_no_progress_prints_nothing_and_tells_nothing(without, capsys):
    without("tqdm")
    with _optional.progress_bar(total=10, initial=0, enabled=False) as bar:
        bar.update(10)
    assert capsys.readouterr() == ("", "")


def test_in_a_notebook_without_widgets_progress_is_a_line_per_tenth_not_a_text_bar(without, monkeypatch, capsys):
    # tqdm's text bar in a notebook kernel leaves one output per refresh in the saved notebook.
    without("ipywidgets")
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    with _optional.progress_bar(total=1000, initial=0, enabled=True) as bar:
        for _ in range(10):
            bar.update(100)
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{n:,}/1,000 steps ({n // 10}%)" for n in range(100, 1001, 100)]
    assert err == ""


@pytest.mark.slow
def test_progress_shows_no_loss_before_the_first_train_step(without, capsys):
    without("tqdm")  # plain lines: each shows the latest figures
    config = dict(SMALL, num_env_steps=160, initial_collect_steps=80, log_interval=24, num_eval_episodes=1)
    train_dqn(**config, progress=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if " steps (" in line]
    before = [line for line in lines if int(line.split("/")[0].replace(",", "")) <= 80]
    after = [line for line in lines if line not in before]
    assert before and after, lines
    assert not [line for line in before if "loss=" in line]  # no train step yet: no loss to show
    assert re.search(r"loss=\d+\.\d{3}", after[-1]), lines
    assert "nan" not in "\n".join(lines)  # nor an average return before an episode has ended
