"""The term check: what every registered method logs, how its loss is made of it, and the probe that reads each
loss term's gradient (not collected: no test_ prefix; tests/test_learning.py runs the check on the learning
check's runs, tests/test_loss_terms.py holds its known answers).

A regulariser whose weight is zero, that a refactor no longer adds to the loss, or whose graph was cut (a
``detach`` too many) leaves the learning check passing: the method then trains as FedAvg does. So in round 2 of
the learning check's run (seed 0; the model has trained one round of 15 steps per client, FPL's server has
prototypes and MOON's clients a previous model) the last 4 steps of every client are watched (:class:`Probe`):
every logged value that belongs to the loss (:data:`TERMS`) is differentiated with respect to all the model's
weights where it is logged (or computed: ``captured``), and

    ratio(term) = median over the 12 probed steps of ||w_t grad t|| / ||w_ce grad ce||

must reach the term's floor (:data:`FLOOR` unless ``floors`` says otherwise and why). The logged terms times their
weights must add up to the loss the step returned (a term dropped from the sum or a weight changed fails there);
a method logs nothing the table does not classify; a term said to start late is absent before.

Measured (benchmarks/learning_check.py; seeds 0-2, one torch thread, each method on its learning-check budget:
MOON and PARDON 6 rounds, the others 4; the test reads seed 0):

    method   term            ratio, seeds 0-2        floor min/floor
    fedadg   fedadg_adv_f    0.0884 0.0499 0.0465      0.004      11.6
    fedadg   fedadg_adv_d    0.6 0.428 0.357            0.02      17.9
    fedadg   fedadg_adv_g    0.434 0.438 0.373          0.02      18.7
    fedccrl  fedccrl_ce_views 1.83 1.94 1.75             0.02      87.3
    fedccrl  fedccrl_supcon  0.0385 0.0435 0.0485       0.01       3.9
    fedccrl  fedccrl_js      0.00756 0.00856 0.00594  0.0018       3.3
    fedgca   loss_cp         0.0516 0.0463 0.0446      0.014       3.2
    fedgca   loss_cam        0.00567 0.00646 0.00507  0.0015       3.4
    fedgca   loss_oc         0.0417 0.0423 0.0371       0.01       3.7
    fediir   fediir_penalty  0.0165 0.0147 0.0174     0.0045       3.3
    fedsr    fedsr_l2r       0.429 0.413 0.407          0.02      20.4
    fedsr    fedsr_cmi       0.127 0.131 0.13           0.02       6.4
    fpl      fpl_cpcl        0.516 0.441 0.55           0.02      22.0
    fpl      fpl_upcr        0.202 0.176 0.176          0.02       8.8
    gperxan  gperxan_guide   0.275 0.267 0.293          0.02      13.3
    jigen    jigen_jigsaw    0.216 0.257 0.274          0.02      10.8
    moon     moon_con        0.0832 0.0817 0.0932       0.02       4.1
    pardon   triplet         0.143 0.104 0.166          0.02       5.2
    pardon   reg             0.145 0.119 0.126          0.02       5.7

(seeds 3 and 4 of MOON and PARDON: moon_con 0.0958 0.0845, triplet 0.15 0.117, reg 0.114 0.127.) Measured with
the check's 32-channel ConvNet (tests/learning.py ``WIDTH``); at the Digits-DG width of 64 FediIR's penalty read
0.033-0.041 (its floor was 0.01) and the others within a factor of ~1.5 of these.

Before issue 35's fix FedADG's three terms read 1e-31 to 1e-7 (its discriminator's sigmoid saturated in round 1:
fedstyle/algorithms/fedadg.py, ``adv_lr_scale``), and this check failed it. Methods that log no cross-entropy
(FedAvg's loss and its variants) are checked for what they log only.
"""

from __future__ import annotations

import math
import statistics
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.nn.functional as F

from fedstyle.algorithms import METHODS, fedadg
from fedstyle.algorithms.feddyn import DynamicRegularizer

#: a term's weight in the loss: a function of the method's hyperparameters and of the names logged in the step
Weight = Callable[[Mapping[str, Any], set], float]


def hp(name: str) -> Weight:
    """The weight is the hyperparameter ``name``."""
    return lambda params, logged: float(params[name])


def one(params: Mapping[str, Any], logged: set) -> float:
    return 1.0


@dataclass(frozen=True)
class Terms:
    """How a method's loss is made of what it logs.

    ``ce``: the logged cross-entropy and its weight (None: the method logs no loss, e.g. FedAvg);
    ``terms``: the other logged loss terms, name -> weight; the returned loss is the weighted sum of ``ce`` and
    ``terms`` (the term check asserts it);
    ``own``: logged losses of other networks, trained by their own optimisers and not part of the returned loss
    (FedADG's discriminator and generator);
    ``captured``: terms logged without their graph, read instead from the function that computes them
    (name -> (owner, attribute));
    ``other``: logged names that are not loss terms, with what they are;
    ``floors``: a term's own floor (fraction of the cross-entropy's weighted gradient) and why it is lower than
    the default;
    ``starts``: the first round (0-based) a term is computed, and why not before;
    ``dead``: a term measured with no gradient to speak of, and why (the test expects it under its floor and
    fails once it comes alive, so the entry is dropped then).
    """

    ce: tuple[str, Weight] | None = None
    terms: dict[str, Weight] = field(default_factory=dict)
    own: dict[str, Weight] = field(default_factory=dict)
    captured: dict[str, tuple[Any, str]] = field(default_factory=dict)
    other: dict[str, str] = field(default_factory=dict)
    floors: dict[str, tuple[float, str]] = field(default_factory=dict)
    starts: dict[str, tuple[int, str]] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)

    @property
    def probed(self) -> bool:
        """Whether the term check trains the method: it logs its cross-entropy (so at least the sum is checked)."""
        return self.ce is not None

    def names(self) -> set[str]:
        """Every name the method may log."""
        return {*(self.ce[:1] if self.ce else ()), *self.terms, *self.own, *self.other, *COMMON}


#: what any method may log beside its loss (counts of the style exchange's work, the privacy accounting)
COMMON = {"stylized_images": "images the client's lazy stylization made this round",
          "dp_epsilon": "epsilon of one style release", "dp_epsilon_total": "epsilon of the client's releases so far",
          "dp_releases": "the client's style releases so far"}
_FIRED = {"shift_fired": "whether the shift fired (0/1)", "explore_fired": "whether exploration fired (0/1)"}

#: every registered method's logged names; a method missing here fails both checks
TERMS: dict[str, Terms] = {
    "fedavg": Terms(), "fedbn": Terms(), "fedprox": Terms(), "feddyn": Terms(), "dsgd": Terms(), "dsu": Terms(),
    "mixstyle": Terms(), "ccst": Terms(), "feddg_fft": Terms(), "feddg_ga": Terms(), "fedgma": Terms(),
    "fedsam": Terms(other={"sam_perturbed_loss": "the loss at the perturbed weights w + eps (the SAM objective "
                                                 "itself, not a term added to it)"}),
    "fedsr": Terms(("fedsr_ce", one), {"fedsr_l2r": hp("alpha_l2r"), "fedsr_cmi": hp("alpha_cmi")}),
    "moon": Terms(("moon_ce", one), {"moon_con": hp("mu")},
                  other={"moon_first_participation": "whether the client had no previous model (0/1)"},
                  starts={"moon_con": (1, "l_con needs the client's previous model: from its second round")}),
    "pardon": Terms(("ce", one), {"triplet": hp("gamma1"), "reg": hp("gamma2")}),
    "fpl": Terms(("fpl_ce", one), {"fpl_cpcl": hp("lambda_cpcl"), "fpl_upcr": hp("lambda_upcr")},
                 starts={"fpl_cpcl": (1, "the server has no prototypes before round 2"),
                         "fpl_upcr": (1, "the server has no prototypes before round 2")}),
    "fedgca": Terms(("loss_ce", one), {"loss_cp": hp("beta"), "loss_cam": hp("beta"), "loss_oc": one},
                    captured={"loss_oc": (DynamicRegularizer, "penalty")},
                    other={"loss_gc": "L_CP + L_CAM (Eq. 4), the two terms checked on their own"},
                    floors={"loss_cp": (0.014, "beta = 0.1 times the style-complement term: 0.045-0.052 of the "
                                               "cross-entropy's gradient on seeds 0-2, under 3x the default floor "
                                               "0.02 in round 2 of the 4-round budget"),
                            "loss_cam": (0.0015, "beta = 0.1 (the paper's Digits value) times a KL divergence between "
                                                 "class-activation maps softmax-normalised over the ConvNet's 2 x 2 "
                                                 "positions, which differ little between views and models: "
                                                 "0.0051-0.0065 of the cross-entropy's gradient on seeds 0-2; a map "
                                                 "cut from the graph still reads 0"),
                            "loss_oc": (0.01, "FedDyn's term alpha (-lambda^T w / alpha + ||w - w^t||^2 / 2) with "
                                              "alpha = 0.1: its gradient, -lambda + alpha (w - w^t), grows with the "
                                              "distance the client travelled; 0.037-0.042 of the cross-entropy's "
                                              "in round 2 on seeds 0-2")}),
    "fediir": Terms(("fediir_ce", one), {"fediir_penalty": hp("penalty")},
                    floors={"fediir_penalty": (0.0045, "gamma = 1e-3 (the code's PACS value) times the squared distance "
                                                       "of the classifier's gradient from the clients' moving mean: "
                                                       "0.015-0.017 of the cross-entropy's gradient on seeds 0-2")}),
    "fedccrl": Terms(("fedccrl_ce", one), {"fedccrl_ce_views": one, "fedccrl_supcon": hp("lambda1"),
                                           "fedccrl_js": hp("lambda2")},
                     other={"fedccrl_transferred": "the fraction of views restyled towards the pool",
                            "fedccrl_pool": "rows of other clients' statistics the client holds"},
                     floors={"fedccrl_supcon": (0.01, "lambda1 = 0.1: 0.038-0.049 of the cross-"
                                                      "entropy's gradient on seeds 0-2"),
                             "fedccrl_js": (0.0018, "lambda2 = 0.1 times a Jensen-Shannon divergence between the "
                                                    "image's and its 2 views' predictions, which mostly agree: "
                                                    "0.0059-0.0086 of the cross-entropy's gradient on seeds 0-2")}),
    "gperxan": Terms(("gperxan_ce", one), {"gperxan_guide": hp("guide")}),
    "fedomg": Terms(),  # FedAvg's clients: its step is the server's (logged as the server's omg_* metrics)
    "jigen": Terms(("jigen_ce", one), {"jigen_jigsaw": hp("jig_weight")},
                   other={"jigen_ordered": "the fraction of ordered images in the batch"}),
    # every FedADG term is logged after its optimiser stepped (the graph is gone, the weights moved): read where
    # each is computed, before its backward
    "fedadg": Terms(("fedadg_ce", lambda p, logged: 1.0 - p["lambda_adv"] if "fedadg_adv_f" in logged else 1.0),
                    {"fedadg_adv_f": hp("lambda_adv")}, own={"fedadg_adv_d": one, "fedadg_adv_g": one},
                    floors={"fedadg_adv_f": (0.004, "lambda_adv = 0.15 against L_err's 0.85, through a discriminator "
                                                    "that tells features from references with moderate confidence: "
                                                    "0.047-0.088 of the cross-entropy's gradient on seeds 0-2 (it "
                                                    "was ~1e-24 while D's sigmoid saturated, issue 35)")},
                    captured={"fedadg_ce": (F, "cross_entropy"), "fedadg_adv_d": (fedadg, "discriminator_loss"),
                              "fedadg_adv_f": (fedadg, "extractor_loss"), "fedadg_adv_g": (fedadg, "generator_loss")}),
    "rsc": Terms(("rsc_ce", one), other={"rsc_muted": "the fraction of muted samples",
                                         "rsc_spatial": "whether the step muted positions (1) or channels (0)"}),
    "stablefdg": Terms(("ce", one), other=_FIRED),
    "styleddg": Terms(("loss_ce", one), other={"style_fired": "the fraction of stages that fired",
                                               "style_shifted": "the fraction of stages that shifted"}),
}


def unclassified(terms: Terms, logged: set[str]) -> set[str]:
    """The names in ``logged`` that ``terms`` does not declare (timings, ``*_seconds``, aside)."""
    return {name for name in logged if not name.endswith("_seconds")} - terms.names()


def _norm(grads) -> float:
    return math.sqrt(sum(float(g.detach().double().square().sum()) for g in grads if g is not None))


class Probe:
    """Watches a method's training: the names each round logs and, for the last ``steps`` local steps of every
    client in round ``probe_round`` (0-based), each loss term's value and the norm of its gradient with respect
    to all the model's weights, taken where the term is logged (or, for ``captured`` terms, computed), and the
    loss the step returned.

    It only reads: ``torch.autograd.grad`` with ``retain_graph`` leaves the weights, their ``.grad`` and the
    random streams alone, so a probed run trains exactly as an unprobed one (tests/test_loss_terms.py checks it).
    """

    def __init__(self, method: str, probe_round: int = 1, steps: int = 4):
        self.method, self.terms = method, TERMS[method]
        self.probe_round, self.steps_per_client = probe_round, steps
        self.names: dict[int, set[str]] = {}          # round -> the names logged in it
        self.steps: list[dict[str, Any]] = []         # the probed steps: grad norms, values, hp, returned loss
        self._seen: dict[tuple[int, int], int] = {}   # (round, client) -> steps so far

    def _record(self, model, step: dict | None, name: str, value) -> None:
        if step is None:
            return
        wanted = {*(self.terms.ce[:1] if self.terms.ce else ()), *self.terms.terms, *self.terms.own}
        if name in wanted and isinstance(value, torch.Tensor) and value.requires_grad:
            if name not in step["grad"]:
                weights = [w for w in model.parameters() if w.requires_grad]  # FedADG freezes D in F's step
                grads = torch.autograd.grad(value, weights, retain_graph=True, allow_unused=True)
                step["grad"][name], step["value"][name] = _norm(grads), float(value.detach())
        elif name not in step["grad"]:  # a detached value (or a number): no gradient to read
            step["value"].setdefault(name, float(value.detach() if isinstance(value, torch.Tensor) else value))

    @contextmanager
    def watching(self) -> Iterator["Probe"]:
        """Wrap the method's outermost per-step hook (its own ``training_step``, else ``training_loss``, which
        the peer-to-peer simulator calls directly) for the duration of the block."""
        cls = METHODS.get(self.method)
        hook = "training_step" if cls.training_step is not METHODS.get("fedavg").training_step else "training_loss"
        original, probe = getattr(cls, hook), self
        inside = []

        def probed(algorithm, ctx, model, *args):
            if inside:  # training_loss inside a wrapped training_step
                return original(algorithm, ctx, model, *args)
            names = probe.names.setdefault(ctx.round, set())
            key = (ctx.round, ctx.client_id)
            probe._seen[key] = probe._seen.get(key, 0) + 1
            step = None
            # the client's last steps of the round: FedADG's first 30 % train on L_err alone (its warm-up)
            last = ctx.train.steps_for(ctx.data) if ctx.train is not None else probe.steps_per_client
            if ctx.round == probe.probe_round and probe._seen[key] > last - probe.steps_per_client:
                step = {"grad": {}, "value": {}, "hp": dict(algorithm.hp)}
                probe.steps.append(step)
            log = ctx.log

            def logged(name, value):
                names.add(name)
                probe._record(model, step, name, value)
                log(name, value)

            with ExitStack() as stack:
                for name, (owner, attr) in probe.terms.captured.items():
                    function = getattr(owner, attr)

                    def capture(*a, __f=function, __name=name, **k):
                        out = __f(*a, **k)
                        names.add(__name)
                        probe._record(model, step, __name, out)
                        return out

                    setattr(owner, attr, capture)
                    stack.callback(setattr, owner, attr, function)
                ctx.log = logged
                stack.callback(delattr, ctx, "log")  # back to the class's method
                inside.append(True)
                stack.callback(inside.pop)
                out = original(algorithm, ctx, model, *args)
            if step is not None:
                step["loss"] = float(out.detach())
            return out

        setattr(cls, hook, probed)
        try:
            yield self
        finally:
            setattr(cls, hook, original)

    def ratios(self) -> dict[str, list[float]]:
        """Per loss term (``terms`` and ``own``), over the probed steps: its weighted gradient norm over the
        weighted cross-entropy's, ``|w_t| ||grad t|| / (|w_ce| ||grad ce||)``."""
        ce_name, ce_weight = self.terms.ce
        out: dict[str, list[float]] = {}
        for step in self.steps:
            logged = set(step["value"])
            if ce_name not in step["grad"]:
                continue
            ce = abs(ce_weight(step["hp"], logged)) * step["grad"][ce_name]
            for name, weight in {**self.terms.terms, **self.terms.own}.items():
                if name in step["grad"]:
                    out.setdefault(name, []).append(abs(weight(step["hp"], logged)) * step["grad"][name] / ce)
        return out

    def median_ratios(self) -> dict[str, float]:
        return {name: statistics.median(values) for name, values in self.ratios().items()}


#: the default floor: a term's weighted gradient norm is at least this fraction of the cross-entropy's
FLOOR = 0.02


def term_failures(probe: Probe, rounds: int) -> list[str]:
    """Why the run ``probe`` watched (``rounds`` rounds) fails the term check (empty: it passes)."""
    method, terms = probe.method, probe.terms
    out = []
    for r, names in sorted(probe.names.items()):
        extra = unclassified(terms, names)
        if extra:
            out.append(f"{method} logs {sorted(extra)} in round {r + 1}, which tests/loss_terms.py TERMS does not "
                       "declare (a loss term with its weight, or another value with what it is)")
        for name, (start, why) in terms.starts.items():
            if (name in names) != (r >= start):
                out.append(f"{method}: {name} {'not ' * (r >= start)}logged in round {r + 1} ({why})")
    if len(probe.names) < rounds:
        out.append(f"{method}: the probe saw {len(probe.names)} of {rounds} rounds (its hook was not called)")
    if not terms.probed:
        return out
    if not probe.steps:
        return out + [f"{method}: no step was probed in round {probe.probe_round + 1}"]
    for step in probe.steps:  # the logged terms, weighted, are the loss the step returned
        logged = set(step["value"])
        total = sum(w(step["hp"], logged) * step["value"][n] for n, w in [terms.ce, *terms.terms.items()]
                    if n in step["value"])
        if not math.isclose(total, step["loss"], rel_tol=1e-5, abs_tol=1e-6):
            out.append(f"{method}: the weighted terms sum to {total:.6g} but the step's loss is {step['loss']:.6g} "
                       f"({step['value']}): a term is missing from TERMS or its weight is wrong")
            break
    measured = probe.median_ratios()
    for name in [*terms.terms, *terms.own]:
        floor, why = terms.floors.get(name, (FLOOR, "the default floor"))
        if name not in measured:
            out.append(f"{method}: {name} never had a gradient in the probed steps (detached, or not computed)")
        elif name in terms.dead:
            if measured[name] >= floor:
                out.append(f"{method}: {name} is alive now ({measured[name]:.3g} of the cross-entropy's gradient, "
                           f"floor {floor}): drop it from TERMS' dead terms")
        elif not measured[name] >= floor:
            out.append(f"{method}: {name}'s weighted gradient is {measured[name]:.3g} of the cross-entropy's, under "
                       f"{floor} ({why}); all: { {k: float(f'{v:.3g}') for k, v in measured.items()} }")
    return out
