"""Small TensorFlow SavedModels built at test time with fixed seeds (no binaries in the repository).

Each builder writes a SavedModel folder (``tf.saved_model.save`` of a ``tf.Module``, or Keras'
``Model.export``); ``reference`` runs one of its signatures in this process (TF2's eager
``tf.saved_model.load``, not the session path the server takes). Import only where tensorflow is installed,
and never into a process that loads torch's compiler (tests use ``tf_worker``, which runs this in a child).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

F32 = tf.float32


class Linear(tf.Module):
    """``serving_default``: x [batch, 4] → y = x @ W [batch, 3], s = row sums [batch, 1];
    ``scaled``: x [batch, 4], k [batch, 1] int32 → z = x * k."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.w = tf.Variable(tf.random.stateless_normal([4, 3], seed=[seed, 0]))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], F32)])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.matmul(x, self.w), "s": tf.reduce_sum(x, axis=1, keepdims=True)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], F32), tf.TensorSpec([None, 1], tf.int32)])
    def scaled(self, x: tf.Tensor, k: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"z": x * tf.cast(k, F32)}


def save_linear(path: Path, seed: int) -> None:
    module = Linear(seed)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve, "scaled": module.scaled})


def save_keras_classifier(path: Path, seed: int) -> None:
    """A Keras 3 functional model, exported for serving: features [batch, 8] → output_0 [batch, 3] (softmax)."""
    tf.keras.utils.set_random_seed(seed)
    features = tf.keras.Input(shape=(8,), name="features")
    hidden = tf.keras.layers.Dense(16, activation="relu")(features)
    probs = tf.keras.layers.Dense(3, activation="softmax")(hidden)
    tf.keras.Model(features, probs).export(str(path), verbose=False)


#: (signature key of the input, TensorFlow dtype) for every type the backend serves
TYPES = {
    "f16": tf.float16,
    "bf16": tf.bfloat16,
    "f32": F32,
    "f64": tf.float64,
    "i8": tf.int8,
    "i16": tf.int16,
    "i32": tf.int32,
    "i64": tf.int64,
    "u8": tf.uint8,
    "u16": tf.uint16,
    "u32": tf.uint32,
    "u64": tf.uint64,
    "flag": tf.bool,
    "text": tf.string,
}


class Types(tf.Module):
    """One [batch, 3] input per type; ``out_<name>`` gives it back (strings upper-cased, booleans negated,
    FP32 plus one)."""

    @tf.function(input_signature=[tf.TensorSpec([None, 3], dt, name=n) for n, dt in TYPES.items()])
    def serve(self, *tensors: tf.Tensor) -> dict[str, tf.Tensor]:
        out = {}
        for name, value in zip(TYPES, tensors, strict=True):
            if name == "text":
                value = tf.strings.upper(value)
            elif name == "flag":
                value = tf.logical_not(value)
            elif name == "f32":
                value = value + 1
            out[f"out_{name}"] = tf.identity(value)
        return out


def save_types(path: Path) -> None:
    module = Types()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


class Spin(tf.Module):
    """x [48, 48], rounds [1]: ``rounds`` small matrix products in a graph loop; the request picks how long."""

    @tf.function(input_signature=[tf.TensorSpec([48, 48], F32), tf.TensorSpec([1], tf.int64)])
    def serve(self, x: tf.Tensor, rounds: tf.Tensor) -> dict[str, tf.Tensor]:
        y = x
        for _ in tf.range(rounds[0]):
            y = tf.tanh(tf.matmul(y, y) * 0.01 + y)
        return {"y": y}


class Fixed(tf.Module):
    """A fixed shape, no batch dimension: x [2, 4] → doubled [2, 4]."""

    @tf.function(input_signature=[tf.TensorSpec([2, 4], F32)])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"doubled": x * 2}


class PerRow(tf.Module):
    """One value per batch row: v [batch] → tripled [batch] (Triton's dims [1] with an empty reshape)."""

    @tf.function(input_signature=[tf.TensorSpec([None], F32)])
    def serve(self, v: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"tripled": v * 3}


class AnyRank(tf.Module):
    """An input of unknown rank: its dims must come from the config."""

    @tf.function(input_signature=[tf.TensorSpec(None, F32)])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"negated": -x}


def save_module(module: tf.Module, path: Path) -> None:
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def save_named_module(class_name: str, path: Path) -> None:
    """``save_module`` of one of the modules above, named by its class (for ``tf_worker``)."""
    module = {"Spin": Spin, "Fixed": Fixed, "PerRow": PerRow, "AnyRank": AnyRank}[class_name]()
    save_module(module, path)


def reference(path: Path, inputs: dict[str, np.ndarray], signature: str = "serving_default") -> dict[str, np.ndarray]:
    """The signature's outputs computed in this process (eager TF2 loading)."""
    function = tf.saved_model.load(str(path)).signatures[signature]
    result = function(**{n: tf.constant(v) for n, v in inputs.items()})
    return {n: t.numpy() for n, t in result.items()}
