"""The critical-difference diagram (Demšar 2006, Fig. 1): the rows' average ranks on an axis (1, the best, on the
left), each row's name on a line from its rank, coloured by :func:`fedstyle.colours.colour_for` as in every fedstyle
figure, and a bar joining each maximal group of rows whose ranks differ by less than the critical difference (the
Nemenyi test cannot tell them apart). Drawn here rather than by ``autorank.plot_stats`` because that one draws every
row in black: the leaderboard's figures keep one colour per method.
"""

from __future__ import annotations

from pathlib import Path

from fedstyle.colours import colour_for


def cliques(ranks: list[float], cd: float) -> list[tuple[int, int]]:
    """Maximal runs (first, last index) of sorted ``ranks`` spanning less than ``cd``, of two rows or more."""
    groups = []
    for i in range(len(ranks)):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] - ranks[i] < cd:
            j += 1
        if j > i and not any(a <= i and j <= b for a, b in groups):
            groups.append((i, j))
    return groups


def draw_cd(result, title: str, paths: list[Path], method_of: dict[str, str] | None = None) -> list[Path]:
    """Write the diagram of ``result`` (a :class:`~fedstyle.experiments.leaderboard.ranks.RankResult`) to each of
    ``paths`` (PNG, PDF: by suffix); ``method_of`` maps a row's label to its method, whose colour it takes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result.mean_ranks)
    ranks = [result.mean_ranks[label] for label in labels]
    k = len(labels)
    half = (k + 1) // 2
    low, high = 1, max(k, 2)
    groups = cliques(ranks, result.cd) if result.cd else []
    top = 0.5 + 0.2 * len(groups)  # the labels' lines start below the bars of the groups
    height = 1.4 + 0.28 * half + 0.06 * len(groups)
    fig, ax = plt.subplots(figsize=(7.5, height))
    ax.set_xlim(low - 0.5, high + 0.5)
    ax.set_ylim(top + half + 0.6, -1.6)
    ax.axis("off")
    ax.hlines(0, low, high, color="black", linewidth=1)
    for tick in range(low, high + 1):
        ax.vlines(tick, -0.15, 0, color="black", linewidth=1)
        ax.text(tick, -0.3, str(tick), ha="center", va="bottom", fontsize=8)
    if result.cd:
        ax.hlines(-1.1, low, low + result.cd, color="black", linewidth=1.5)
        ax.text(low + result.cd / 2, -1.2, f"CD = {result.cd:.2f}", ha="center", va="bottom", fontsize=8)
    for i, (label, rank) in enumerate(zip(labels, ranks)):
        colour = colour_for((method_of or {}).get(label, label))
        left = i < half
        y = (i if left else k - 1 - i) * 0.9 + top + 0.4
        x_text = low - 0.4 if left else high + 0.4
        ax.vlines(rank, 0, y, color=colour, linewidth=1.2)
        ax.hlines(y, min(rank, x_text), max(rank, x_text), color=colour, linewidth=1.2)
        ax.text(x_text, y, f"{label} ({rank:.2f})", ha="left" if not left else "right", va="center", fontsize=8,
                color=colour)
    for n, (a, b) in enumerate(groups):
        y = 0.3 + 0.2 * n
        ax.hlines(y, ranks[a] - 0.05, ranks[b] + 0.05, color="black", linewidth=2)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    written = []
    for path in paths:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # no creation date in the PDF, no software tag in the PNG: the same ranks give the same bytes
        metadata = {"CreationDate": None} if path.suffix == ".pdf" else {"Software": None}
        fig.savefig(path, dpi=150, metadata=metadata)
        written.append(path)
    plt.close(fig)
    return written
