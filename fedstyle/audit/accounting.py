"""What the receiver gets, in (eps, delta) and in clipping: every release it sees, not one.

- :func:`releases_per_sender`: how many defended releases each sender made (StableFDG: one each round it
  was sampled; CCST: one at setup, whatever the rounds), from the per-client counts every metrics.jsonl row
  logs and the checkpoint's per-client counters.
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
from fedstyle.federation.rounds import merge_release_counts, releases_in_rows
from fedstyle.style.privacy import StylePrivacy, clip_from_public, release_count


def releases_per_sender(exp, records: list[dict[str, Any]]) -> tuple[dict[int, int], str]:
    """Defended releases per client id and where the counts come from.

    1. The per-client counts of metrics.jsonl's last row (``dp_releases_per_client``: the coordinator logs each
       client's count with every evaluation row, whatever ``--eval-every``), and the checkpoint's client states
       (``style_privacy/releases``, restored into ``exp.simulator``): each client's larger count.
    2. Else (a run made before the rows carried the counts) the last round that logged ``dp_releases``: each
       client releases at most once a round, so this bounds every client's count from above (conservative).
    3. Else one release per client (a style sent once, at setup: CCST).
    """
    clients = range(len(exp.simulator.clients))
    states = getattr(exp.simulator, "client_states", None)
    counts = {cid: release_count(states[cid]) for cid in clients} if states is not None else {}
    logged = releases_in_rows(records)
    if any(counts.values()) or logged:
        merged = merge_release_counts({c: n for c, n in counts.items() if n}, logged)
        sources = [name for name, found in (("metrics.jsonl's per-client release counts", logged),
                                            ("the checkpoint's per-client release counters", any(counts.values())))
                   if found]
        return {cid: merged.get(cid, 0) for cid in clients}, " and ".join(sources)
    rounds = [int(r["round"]) for r in records if "dp_releases" in r.get("train_metrics", {}) and "round" in r]
    if rounds:
        return ({cid: max(rounds) for cid in clients},
                "the rounds up to the last with a release in metrics.jsonl (at most one per client and round: "
                "an upper bound)")
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
