"""Parity fixture for FedDyn's ``reference_code`` mode: three rounds of the authors' ``train_FedDyn``.

The authors' code (``alpemreacar/FedDyn``, pinned ``COMMIT``) runs unchanged: ``utils_methods.train_FedDyn``
(utils_methods.py:286-449), which calls ``utils_general.train_feddyn_mdl`` (utils_general.py:185-242) for each
sampled client. Three clients of 10, 6 and 14 samples (unequal, so each trains with its own
alpha_i = alpha * mean size / size, utils_methods.py:296-297, 387), ``act_prob`` 0.7 (the code's own sampling,
``np.random.seed(round + rand_seed + retry)``, utils_methods.py:359-369: round 1 samples a subset, so the server's
term also carries clients that did not train), batch 4 (3, 2 and 4 steps of one epoch), lr 0.1, weight decay 1e-3,
alpha 0.1, no learning-rate decay. The inputs are N(0, 4^2), so the gradients' norms pass the code's clipping
threshold of 10 (utils_general.py:8, 224) in some steps and not in others; the fixture records each step's norm.

The model both sides train is a two-layer perceptron (16 -> 8 -> 3, no BatchNorm: the code moves parameters
only, ``get_mdl_params`` / ``set_client_from_params``), its weights :func:`parity.common.seeded_weights` (seed 0).
The data are ``dataset_name='mnist'`` arrays, which the code's ``Dataset`` passes through as float tensors
(utils_dataset.py:539-543). The one random draw inside a client's epoch is the ``DataLoader``'s shuffle: it is
turned off (``shuffle=False`` forced on ``utils_general.data.DataLoader``), so a client's batches are its samples in
order, which the test feeds fedstyle in the same order.

Import stubs: ``utils_libs.py`` imports torchvision, which does not import with this torch; it is a stub module
(``transforms`` is used only by dataset classes this run never builds). The code writes its models and arrays to
``Output/<name>/FedDyn/`` under the working directory: the generator runs in a temporary folder.

Stored: the data (``client<i>/x``, ``client<i>/y``), the initial weights' sums, the clients each round sampled
(``selected/r<k>``), every client's alpha_i (``alpha/client<i>``), each step's gradient norm before clipping
(``grad_norm/client<i>/r<k>``), the server ("cloud") model after every round (``cloud/r<k>/<name>``, whole: the
model is small) and the clients' accumulated drifts ``local_param_list`` after the last round (``drift``).

Run: ``.venv/bin/python -m parity.feddyn --checkout /tmp/parity/FedDyn``.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import types
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from torch import nn

from parity.common import (generate, importable, patched, seeded, seeded_weights, stub_modules, weight_sums)

REPOSITORY = "alpemreacar/FedDyn"
COMMIT = "48a19fac440ef079ce563da8e0c2896f8256fef9"

SIZES = (10, 6, 14)
SETTINGS = {"sizes": list(SIZES), "features": 16, "hidden": 8, "classes": 3, "batch_size": 4, "lr": 0.1,
            "weight_decay": 1e-3, "alpha": 0.1, "act_prob": 0.7, "rounds": 3, "rand_seed": 0, "input_scale": 4.0,
            "max_norm": 10.0}


def build_model() -> nn.Module:
    """The perceptron both sides train (parameter names ``1.weight``, ``1.bias``, ``3.weight``, ``3.bias``)."""
    s = SETTINGS
    return nn.Sequential(nn.Flatten(), nn.Linear(s["features"], s["hidden"]), nn.ReLU(),
                         nn.Linear(s["hidden"], s["classes"]))


def initial_weights() -> dict[str, torch.Tensor]:
    return seeded_weights({k: v.shape for k, v in build_model().state_dict().items()}, seed=0)


def client_data(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``i``'s inputs (n, 1, 4, 4), N(0, input_scale^2), and labels 0..classes-1."""
    n = SIZES[i]
    x = seeded(f"client{i}/x", (n, 1, 4, 4), scale=SETTINGS["input_scale"])
    g = torch.Generator().manual_seed(100 + i)
    y = torch.randint(0, SETTINGS["classes"], (n,), generator=g)
    return x, y


def run(checkout: Path) -> dict[str, torch.Tensor]:
    s = SETTINGS
    data = [client_data(i) for i in range(len(SIZES))]
    init = initial_weights()
    tensors: dict[str, torch.Tensor] = {}
    for i, (x, y) in enumerate(data):
        tensors[f"client{i}/x"], tensors[f"client{i}/y"] = x, y
    tensors.update(weight_sums(init))

    alphas: list[float] = []  # train_feddyn_mdl's alpha_coef per call, in call order
    norms: list[list[float]] = []  # per call: each step's gradient norm before clipping
    sizes_seen: list[int] = []

    # utils_general.py sets CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES at import: patch.dict puts them back after
    with tempfile.TemporaryDirectory() as work, importable(checkout), stub_modules(["torchvision"]), \
            mock.patch.dict(os.environ):
        old_cwd = os.getcwd()
        os.chdir(work)
        try:
            import utils_general
            import utils_methods

            real_loader = utils_general.data.DataLoader
            real_clip = torch.nn.utils.clip_grad_norm_
            real_train = utils_methods.train_feddyn_mdl

            def loader(*args, **kwargs):
                kwargs["shuffle"] = False  # the epoch's one random draw: batches in the samples' order
                return real_loader(*args, **kwargs)

            def clip(parameters, max_norm, *args, **kwargs):
                total = real_clip(parameters, max_norm, *args, **kwargs)
                norms[-1].append(float(total))
                return total

            def train(model, model_func, alpha_coef, *args, **kwargs):
                alphas.append(float(alpha_coef))
                norms.append([])
                sizes_seen.append(int(args[2].shape[0]))  # trn_x
                return real_train(model, model_func, alpha_coef, *args, **kwargs)

            def model_func():
                return build_model()

            init_model = build_model()
            init_model.load_state_dict(init)
            data_obj = types.SimpleNamespace(
                n_client=len(SIZES), name="parity", dataset="mnist",
                clnt_x=[x.numpy() for x, _ in data], clnt_y=[y.numpy().reshape(-1, 1) for _, y in data],
                tst_x=np.concatenate([x.numpy() for x, _ in data]),
                tst_y=np.concatenate([y.numpy().reshape(-1, 1) for _, y in data]))
            os.makedirs("Output/parity", exist_ok=True)
            with patched(utils_general.data, DataLoader=loader), patched(torch.nn.utils, clip_grad_norm_=clip), \
                    patched(utils_methods, train_feddyn_mdl=train), contextlib.redirect_stdout(io.StringIO()) as out:
                result = utils_methods.train_FedDyn(
                    data_obj=data_obj, act_prob=s["act_prob"], learning_rate=s["lr"], batch_size=s["batch_size"],
                    epoch=1, com_amount=s["rounds"], print_per=10**6, weight_decay=s["weight_decay"],
                    model_func=model_func, init_model=init_model, alpha_coef=s["alpha"], save_period=1,
                    lr_decay_per_round=1.0, rand_seed=s["rand_seed"])
            drift = np.load(f"Output/parity/FedDyn/{s['rounds']}_local_param_list.npy")
        finally:
            os.chdir(old_cwd)

    # which clients each round trained: the code prints them; the calls' sizes name them (sizes are distinct)
    selected = [[int(c) for c in line.split(":")[1].split(",")]
                for line in out.getvalue().splitlines() if line.startswith("Selected Clients")]
    assert len(selected) == s["rounds"], out.getvalue()[-2000:]
    assert sizes_seen == [SIZES[c] for r in selected for c in r], (sizes_seen, selected)
    for r, clients in enumerate(selected):
        tensors[f"selected/r{r}"] = torch.tensor(clients)
    calls = iter(range(len(alphas)))
    for r, clients in enumerate(selected):
        for c in clients:
            k = next(calls)
            tensors[f"alpha/client{c}"] = torch.tensor([alphas[k]], dtype=torch.float64)
            tensors[f"grad_norm/client{c}/r{r}"] = torch.tensor(norms[k], dtype=torch.float64)
    cloud_models = result[6]
    for r, model in enumerate(cloud_models):
        for name, param in model.named_parameters():
            tensors[f"cloud/r{r}/{name}"] = param.detach().clone().cpu()
    tensors["drift"] = torch.from_numpy(drift)
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("feddyn", __doc__ or "", REPOSITORY, COMMIT, run, threads=1,
                    description="train_FedDyn (utils_methods.py:286) for 3 rounds on 3 clients of unequal size, "
                                "with train_feddyn_mdl (utils_general.py:185): every round's cloud model, the "
                                "clients' alpha_i, sampled clients, gradient norms and accumulated drifts",
                    settings=SETTINGS, argv=argv)


if __name__ == "__main__":
    main()
