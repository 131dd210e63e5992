"""FedGCA (Federated Global Consistent Augmentation, arXiv:2409.14671, 2024): single-source FedDG with
style-complement augmentation, global guided semantic consistency and FedDyn's class-consistency regulariser.

Every client of a single-source federation (one domain, labels skewed by Dirichlet(0.3)) trains on
X+ = {x, x'_1, ..., x'_J} (Eq. 1), J augmented views of each image from the style-complement module
(``augment=complement``: RandConv, AugMix and multi-scale texture corruption; see
``fedstyle.data.augment``; J = ``augment_views``, default 3 = one view per generator), with

    L = L_CE + alpha * L_OC + beta * L_GC,   L_GC = L_CP + L_CAM                  (Eq. 6, Eq. 4)

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/fedgca.md.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.consistency import cam_consistency, cam_distribution, prediction_consistency
from fedstyle.algorithms.feddyn import DynamicRegularizer
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.errors import ConfigError, FedstyleError

_ANCHOR = "fedgca/anchor"


def check_cam_support(model: nn.Module) -> None:
    """Fail now, with a one-line error, if L_CAM cannot be computed on this model: one probe image through
    the backbone (eval mode, no gradients) and ``class_activation_maps`` on its last maps."""
    if not hasattr(model, "class_activation_maps") or not hasattr(model, "backbone"):
        raise ConfigError(f"fedgca's L_CAM needs a fedstyle Classifier (backbone, neck, head), got "
                          f"{type(model).__name__}; pass use_cam=false to train without it")
    size = int(getattr(model.backbone, "input_size", 32))
    param = next(model.parameters())
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            maps = model.backbone.forward_maps(torch.zeros(1, 3, size, size, device=param.device, dtype=param.dtype))
            if maps.dim() != 4:
                raise ConfigError(f"fedgca's L_CAM needs (B, C, h, w) maps from the last stage, got "
                                  f"{tuple(maps.shape)}")
            model.class_activation_maps(maps, torch.zeros(1, dtype=torch.long, device=param.device))
    except ConfigError as err:
        raise ConfigError(f"fedgca's L_CAM cannot use this model: {err}; pass use_cam=false to train without it"
                          ) from None
    finally:
        model.train(was_training)


@register_method
class FedGCA(Algorithm):
    name = "fedgca"
    label = "FedGCA"
    summary = ("single-source FedDG: style-complement views, local/global prediction and CAM consistency, "
               "FedDyn's class-consistency regulariser")
    paper = "FedGCA: Federated Global Consistent Augmentation for single-source FedDG, arXiv:2409.14671, 2024"
    HPARAMS = (
        HParam("alpha", 0.1, "weight of L_OC (Eq. 6) = FedDyn's alpha (paper: 0.1 Digits, 10 PACS)", low=1e-12),
        HParam("beta", 0.1, "weight of L_GC = L_CP + L_CAM (Eq. 6; paper: 0.1 Digits, 8 PACS)", low=0.0),
        HParam("use_cp", True, "prediction consistency L_CP (Eq. 2)"),
        HParam("use_cam", True, "class-activation-map consistency L_CAM (Eq. 3)"),
        HParam("use_oc", True, "class consistency L_OC, FedDyn's regulariser and server state (Eq. 5)"),
        HParam("cp_global", True, "include the global model's predictions P^G in p̄ (Table 3)"),
        HParam("cam_global", True, "include the global model's CAMs M^G in M̄ (Table 3)"),
        HParam("cp_form", "bkl", "L_CP form: bkl (Eq. 2 minus the local entropy: zero when predictions agree), "
               "ce (Eq. 2 as printed), js (RandConv/AugMix Jensen-Shannon)", choices=("bkl", "ce", "js")),
        HParam("view_reduction", "sum", "combine the V views in L_CP and L_CAM by sum (Eq. 2, 3) or mean",
               choices=("sum", "mean")),
        HParam("ce_views", "all", "cross-entropy on all views X+ (Eq. 1) or on the clean images only",
               choices=("all", "clean")),
        HParam("cam_temperature", 1.0, "temperature of the softmax over h x w that normalises each CAM", low=1e-6),
        HParam("detach_mean", False, "stop gradients through the means p̄ and M̄"),
    )
    DEFAULTS = {"augment": "complement", "augment_views": 3}

    def __init__(self, hparams: Mapping[str, Any] | None = None, *, num_classes: int, num_clients: int):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        if self.hp["augment"] != "none" and self.hp["augment_views"] < 1:
            raise ConfigError("fedgca needs J = augment_views >= 1 augmented views (X+ = {x, x'_1..x'_J}, Eq. 1); "
                              "use augment_views=3 (the default), or augment=none to ablate the augmentation")
        self.regularizer = DynamicRegularizer(self.hp["alpha"]) if self.hp["use_oc"] else None

    @classmethod
    def display_name(cls, hp: Mapping[str, Any]) -> str:
        name = super().display_name(hp)
        without = [term for term, key in (("L_CP", "use_cp"), ("L_CAM", "use_cam"), ("L_OC", "use_oc"),
                                          ("P^G", "cp_global"), ("M^G", "cam_global")) if not hp[key]]
        if name.endswith(" + no augmentation"):
            name = name[: -len(" + no augmentation")]
            without.append("augmentation")
        if hp["cp_form"] != "bkl":
            name += f" (L_CP {hp['cp_form']})"
        return name + (" w/o " + ", ".join(without) if without else "")

    def num_views(self) -> int:
        """V = J + 1 views per image in a training batch (1 without augmentation)."""
        return 1 + (self.hp["augment_views"] if self.hp["augment"] != "none" else 0)

    def configure_model(self, model: nn.Module) -> None:
        super().configure_model(model)
        if self.hp["use_cam"]:
            check_cam_support(model)

    # -- FedDyn's state (L_OC) ------------------------------------------------------------
    def init_client_state(self, ctx, model):
        if self.regularizer is not None:
            self.regularizer.init_client(ctx, model)

    def local_train(self, ctx, model, payload):
        if self.regularizer is not None:
            ctx.scratch[_ANCHOR] = self.regularizer.anchor(ctx, model)
        return super().local_train(ctx, model, payload)

    def after_local_train(self, ctx, model):
        if self.regularizer is not None:
            self.regularizer.update_client(ctx, model, ctx.scratch[_ANCHOR])

    def aggregate(self, server, updates):
        if self.regularizer is None:
            return super().aggregate(server, updates)
        return self.regularizer.aggregate(server, updates, self.param_keys, self.hp["aggregation"] == "uniform")

    # -- the local objective (Eq. 6) ----------------------------------------------------------
    def training_loss(self, ctx, model, x, y, payload):
        hp = self.hp
        views = self.num_views()
        if x.shape[0] % views:
            raise FedstyleError(f"fedgca expects {views} stacked views per batch (augment_batch), "
                                f"got {x.shape[0]} rows")
        batch = x.shape[0] // views
        maps = model.backbone.forward_maps(x)
        logits = model.head(model.neck(maps))
        if hp["ce_views"] == "all":
            loss = F.cross_entropy(logits, y)
        else:
            loss = F.cross_entropy(logits[:batch], y[:batch])
        ctx.log("loss_ce", loss)

        use_cp, use_cam = hp["use_cp"], hp["use_cam"]
        maps_g = logits_g = None
        if (use_cp and hp["cp_global"]) or (use_cam and hp["cam_global"]):
            global_model = ctx.global_model()
            with ctx.timed("global_forward"), torch.no_grad():
                maps_g = global_model.backbone.forward_maps(x)
                logits_g = global_model.head(global_model.neck(maps_g))
        gc = None
        if use_cp:
            p = torch.softmax(logits, dim=1).view(views, batch, -1)
            pg = torch.softmax(logits_g, dim=1).view(views, batch, -1) if hp["cp_global"] else None
            cp = prediction_consistency(p, pg, hp["cp_form"], hp["view_reduction"], hp["detach_mean"])
            ctx.log("loss_cp", cp)
            gc = cp
        if use_cam:
            temperature = hp["cam_temperature"]
            m = cam_distribution(model.class_activation_maps(maps, y), temperature).view(views, batch, -1)
            mg = None
            if hp["cam_global"]:
                cams_g = ctx.global_model().class_activation_maps(maps_g, y)
                mg = cam_distribution(cams_g, temperature).view(views, batch, -1)
            cam = cam_consistency(m, mg, hp["view_reduction"], hp["detach_mean"])
            ctx.log("loss_cam", cam)
            gc = cam if gc is None else gc + cam
        if gc is not None:
            ctx.log("loss_gc", gc)
            loss = loss + hp["beta"] * gc
        if self.regularizer is not None:
            penalty = self.regularizer.penalty(ctx, model, ctx.scratch[_ANCHOR])  # alpha * L_OC
            ctx.log("loss_oc", penalty.detach() / hp["alpha"])
            loss = loss + penalty
        return loss
