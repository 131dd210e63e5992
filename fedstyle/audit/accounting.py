"""What the receiver gets, in (eps, delta) and in clipping: every release it sees, not one.

- :func:`releases_per_sender`: how many defended releases each sender made (StableFDG: one each round it
  was sampled; CCST: one at setup), from the checkpoint's per-client counters, else metrics.jsonl.
- :func:`receiver_epsilon`: the headline eps over all of the worst-off sender's releases (the accountant of
  :meth:`fedstyle.style.privacy.StylePrivacy.total_epsilon`: RDP, Mironov CSF'17, or exact Gaussian
  composition, Dong, Roth & Su JRSS-B'22, whichever is smaller), with eps per release beside it.
- :func:`public_clip_scores`: the C that public data would give (:func:`fedstyle.style.privacy.clip_from_public`)
  and the share of public contributions the run's C clips.
"""

from __future__ import annotations

from typing import Any

import torch

from fedstyle.audit.surfaces import Surface
from fedstyle.style.privacy import StylePrivacy, clip_from_public, release_count


def releases_per_sender(exp, records: list[dict[str, Any]]) -> tuple[dict[int, int], str]:
    """Defended releases per client id and where the counts come from.

    1. The checkpoint's client states (``style_privacy/releases``, restored into ``exp.simulator``): exact.
    2. Else the rounds of metrics.jsonl that logged ``dp_releases``: each client releases at most once a
       round, so this bounds every client's count from above (eps from it is conservative).
    3. Else one release per client (a style sent once, at setup: CCST).
    """
    clients = range(len(exp.simulator.clients))
    states = getattr(exp.simulator, "client_states", None)
    counts = {cid: release_count(states[cid]) for cid in clients} if states is not None else {}
    if any(counts.values()):
        return counts, "the checkpoint's per-client release counters"
    rounds = sum(1 for r in records if "dp_releases" in r.get("train_metrics", {}))
    if rounds:
        return ({cid: rounds for cid in clients},
                "the rounds with a release in metrics.jsonl (at most one per client and round: an upper bound)")
    return {cid: 1 for cid in clients}, "one release per client (the style is sent once)"


def receiver_epsilon(privacy: StylePrivacy, releases: dict[int, int]) -> dict[str, Any]:
    """``epsilon``: eps over every release of the sender with the most (the receiver sees them all);
    ``epsilon_per_release``; ``releases``: that sender's count. Without noise: epsilon None."""
    most = max(releases.values(), default=0)
    if privacy.noise == 0:
        return {"epsilon": None, "epsilon_per_release": None, "releases": most}
    return {"epsilon": privacy.total_epsilon(most), "epsilon_per_release": privacy.epsilon(), "releases": most}


def public_clip_scores(surface: Surface, public_images: list[torch.Tensor], quantile: float = 0.5) -> dict[str, float]:
    """``public_clip``: C from the public contributions' norms (their ``quantile``); ``public_clipped_share``:
    the share of those the run's C clips. {} for a surface without clipping."""
    privacy = surface.privacy
    if privacy is None or privacy.clip <= 0:
        return {}
    norms = torch.linalg.vector_norm(surface.image_vectors(torch.cat(public_images)).double(), dim=1)
    return {"public_clip": clip_from_public(norms, quantile),
            "public_clipped_share": float((norms > privacy.clip).double().mean())}
