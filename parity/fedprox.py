"""Parity fixture for FedProx: five rounds of the authors' local solver, batching, client sampling and averaging.

The authors' code (``litian96/FedProx``, pinned ``COMMIT``) is TensorFlow 1.10. This generator runs its pieces
unchanged, in a scratch environment with TensorFlow 2 (``pip install tensorflow-cpu`` there, never into the project's)
and its TF 1 API, ``tf.compat.v1`` with v2 behaviour off:

- ``flearn/optimizer/pgd.py``'s ``PerturbedGradientDescent``, the FedProx solver: ``w <- w - lr (grad + mu (w - w*))``
  with ``w*`` the round's global model (``_apply_dense``, lines 29-36), set by its ``set_params`` (lines 59-64);
- ``flearn/utils/model_utils.py``'s ``batch_data`` (lines 5-24): each epoch reshuffles the client's arrays in place
  with ``np.random.seed(100)`` and walks them in batches;
- ``flearn/trainers/fedbase.py``'s ``select_clients`` (lines 98-113: ``np.random.seed(round)``, a uniform draw
  without replacement, whatever its docstring says of weights) and ``aggregate`` (lines 115-125: the solutions
  averaged with weights = the clients' sample counts, in float64);
- the round of ``flearn/trainers/fedprox.py``'s ``Server.train`` (lines 49-77) with ``drop_percent = 0``: every
  sampled client gets the global model and ``num_epochs`` epochs of ``solve_inner``.

The model is the code's multinomial logistic regression (``flearn/models/mnist/mclr.py``: one dense layer and
``tf.losses.sparse_softmax_cross_entropy``; its ``l2_regularizer`` never enters the loss it minimises), rebuilt
here in the same TF 1 API on 12 features and 3 classes: the code's ``Model`` class needs ``tf.contrib`` and the
profiler of TF 1. Its weights are :func:`parity.common.seeded_weights` (seed 0) under the names ``dense/kernel``
(12 x 3) and ``dense/bias``. Four clients of 9, 5, 12 and 7 samples; 2 of them sampled per round (the code's draws:
clients 2 and 3 in rounds 1-3, then 3 and 1, then 0 and 1), 5 rounds, 2 local epochs, batch 4 (client 0's last
batch holds one sample), lr 0.1, mu 0.5.

``pgd.py``'s module-level ``tf`` is the TF 1 API here (``tf.compat.v1``): its ``set_params`` calls
``tf.trainable_variables``, which TF 2 keeps there only.

Stored: the data, the initial weights' sums, the clients each round sampled (``selected/r<k>``), each client's
sample order in each epoch (``order/r<k>/client<i>/e<j>``, indices into its data, recovered from the shuffled
arrays), each sampled client's solution (``solution/r<k>/client<i>/<name>``) and the averaged model after every
round (``global/r<k>/<name>``).

Run (a scratch environment with torch, safetensors and tensorflow-cpu, this project on its path):

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install torch==2.13.0 safetensors tensorflow-cpu
    PYTHONPATH=. /tmp/tfenv/bin/python -m parity.fedprox --checkout /tmp/parity/FedProx
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import torch

from parity.common import generate, importable, patched, seeded, seeded_weights, weight_sums

REPOSITORY = "litian96/FedProx"
COMMIT = "d2a4501f319f1594b732d88315c5ca1a72855f50"

SIZES = (9, 5, 12, 7)
SETTINGS = {"sizes": list(SIZES), "features": 12, "classes": 3, "clients_per_round": 2, "rounds": 5, "epochs": 2,
            "batch_size": 4, "lr": 0.1, "mu": 0.5}
#: the code's (TensorFlow) names and shapes; fedstyle's nn.Linear holds the kernel transposed
SHAPES = {"dense/kernel": (SETTINGS["features"], SETTINGS["classes"]), "dense/bias": (SETTINGS["classes"],)}


def initial_weights() -> dict[str, torch.Tensor]:
    return seeded_weights(SHAPES, seed=0)


def client_data(i: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``i``'s features (n, 12), N(i / 4, 1), and labels, as the float32 / int64 arrays the code feeds."""
    n = SIZES[i]
    x = seeded(f"client{i}/x", (n, SETTINGS["features"]), offset=0.25 * i).numpy()
    y = np.random.default_rng(300 + i).integers(0, SETTINGS["classes"], n).astype(np.int64)
    return x, y


def run(checkout: Path) -> dict[str, torch.Tensor]:
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_v2_behavior()
    s = SETTINGS
    init = initial_weights()
    tensors: dict[str, torch.Tensor] = weight_sums(init)
    originals = [client_data(i) for i in range(len(SIZES))]
    for i, (x, y) in enumerate(originals):
        tensors[f"client{i}/x"], tensors[f"client{i}/y"] = torch.from_numpy(x), torch.from_numpy(y)
    data = [{"x": x.copy(), "y": y.copy()} for x, y in originals]  # the code shuffles these in place

    with importable(checkout):
        from flearn.optimizer import pgd
        from flearn.trainers.fedbase import BaseFedarated
        from flearn.utils.model_utils import batch_data

        with patched(pgd, tf=tf1):
            graph = tf1.Graph()
            with graph.as_default():
                features = tf1.placeholder(tf1.float32, shape=[None, s["features"]])
                labels = tf1.placeholder(tf1.int64, shape=[None])
                kernel = tf1.get_variable("dense/kernel", shape=SHAPES["dense/kernel"])
                bias = tf1.get_variable("dense/bias", shape=SHAPES["dense/bias"])
                logits = tf1.matmul(features, kernel) + bias
                loss = tf1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
                optimizer = pgd.PerturbedGradientDescent(s["lr"], s["mu"])
                train_op = optimizer.apply_gradients(optimizer.compute_gradients(loss))  # as mclr.py does
                session = tf1.Session(graph=graph)
                session.run(tf1.global_variables_initializer())
                variables = tf1.trainable_variables()
            assert [v.op.name for v in variables] == list(SHAPES)
            model = types.SimpleNamespace(graph=graph, sess=session)

            def set_params(values):  # mclr.py's Model.set_params (lines 53-58)
                with graph.as_default():
                    for variable, value in zip(variables, values):
                        variable.load(value, session)

            def get_params():  # mclr.py's Model.get_params (lines 60-63)
                with graph.as_default():
                    return session.run(variables)

            latest = [init[name].numpy() for name in SHAPES]
            server = types.SimpleNamespace(clients=list(range(len(SIZES))))
            for r in range(s["rounds"]):
                indices, selected = BaseFedarated.select_clients(server, r, num_clients=s["clients_per_round"])
                tensors[f"selected/r{r}"] = torch.tensor([int(c) for c in selected])
                optimizer.set_params(latest, model)  # w* = the round's global model (fedprox.py:55)
                solutions = []
                for c in [int(c) for c in selected]:
                    set_params(latest)
                    for epoch in range(s["epochs"]):  # mclr.py's solve_inner (lines 77-86)
                        for X, Y in batch_data(data[c], s["batch_size"]):
                            with graph.as_default():
                                session.run(train_op, feed_dict={features: X, labels: Y})
                        tensors[f"order/r{r}/client{c}/e{epoch}"] = torch.tensor(
                            [int(np.flatnonzero((originals[c][0] == row).all(1))[0]) for row in data[c]["x"]])
                    solution = get_params()
                    for name, value in zip(SHAPES, solution):
                        tensors[f"solution/r{r}/client{c}/{name}"] = torch.from_numpy(np.array(value))
                    solutions.append((len(data[c]["y"]), solution))
                latest = BaseFedarated.aggregate(None, solutions)
                for name, value in zip(SHAPES, latest):
                    tensors[f"global/r{r}/{name}"] = torch.from_numpy(np.asarray(value))
            session.close()
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("fedprox", __doc__ or "", REPOSITORY, COMMIT, run, threads=1,
                    description="PerturbedGradientDescent (flearn/optimizer/pgd.py), batch_data, select_clients and "
                                "aggregate for 5 rounds of FedProx on 4 clients, a logistic regression in the TF 1 "
                                "API: each sampled client's solution and the averaged model",
                    settings=SETTINGS, argv=argv)


if __name__ == "__main__":
    main()
