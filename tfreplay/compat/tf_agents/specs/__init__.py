"""`tf_agents.specs` as replay-buffer code uses it: NumPy array specs, and conversions to and from `tf.TensorSpec`.

    # from tf_agents import specs
    # from tf_agents.specs import tensor_spec
    from tfreplay.compat.tf_agents import specs
    from tfreplay.compat.tf_agents.specs import tensor_spec

    py_spec = tensor_spec.to_nest_array_spec(tf_spec)  # a NumPy buffer's data_spec

`array_spec.ArraySpec` (also `specs.ArraySpec`) is the shape and dtype of a NumPy array; `tensor_spec` turns
nests of `tf.TensorSpec` into nests of them and back. `specs.TensorSpec` is `tf.TensorSpec`.
"""

from __future__ import annotations

import tensorflow as tf

from tfreplay.compat.tf_agents.specs import array_spec, tensor_spec
from tfreplay.compat.tf_agents.specs.array_spec import ArraySpec

TensorSpec = tf.TensorSpec

__all__ = ["ArraySpec", "TensorSpec", "array_spec", "tensor_spec"]
