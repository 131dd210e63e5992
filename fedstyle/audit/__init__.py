"""Privacy audit attacks: what an honest-but-curious receiver learns from shared styles (issue 24).

- :mod:`fedstyle.audit.metrics`: PSNR, SSIM, ROC AUC, best-match scoring of reconstructions.
- :mod:`fedstyle.audit.invert`: reconstruct images from channel statistics by optimisation.
- :mod:`fedstyle.audit.gradient_inversion`: the baseline, inverting a plain FedAvg update.
- :mod:`fedstyle.audit.membership`: membership scores for per-image and per-set styles.
- :mod:`fedstyle.audit.attributes`: linear probes that infer domain or class mix from styles.

Nothing is imported here; import the submodule you need.
"""
