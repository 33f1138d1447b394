"""docs/guides/keras.md under this process's Keras lane: its python blocks, top to bottom in one namespace.

The docs' own Sybil run covers every page once; this runs the Keras page in the
`keras` lanes too, so its code is checked under Keras 3 and under tf-keras.
"""

import pathlib
import re

import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "keras.md"
BLOCK = re.compile(r"(<!-- skip: next -->\s*)?```python\n(.*?)```", re.S)

pytestmark = pytest.mark.keras


def test_every_python_block_of_the_keras_guide_runs(tmp_path, monkeypatch, capsys):
    blocks = [code for skip, code in BLOCK.findall(GUIDE.read_text()) if not skip]
    assert len(blocks) >= 8
    monkeypatch.chdir(tmp_path)  # the guide writes relative paths
    namespace: dict = {"__name__": "guide"}
    for code in blocks:
        exec(compile(code, str(GUIDE), "exec"), namespace)
    out = capsys.readouterr().out
    assert "fit_dataset: x ('obs') names no field: 'obs' is not one of observation, reward." in out
    assert "500 True" in out and "DqnAgent: optimizer (Adam of tf_keras) must be of the q_network's Keras" in out
