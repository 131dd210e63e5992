"""The privacy audit (issue 24): what an honest-but-curious receiver learns from a run's shared styles.

Entry points: ``fedstyle audit privacy RUN_DIR`` and, in Python,
``fedstyle.audit.run.audit_privacy([run_dir], settings=AuditSettings(...))`` (one run:
:func:`fedstyle.audit.run.audit_run`).

- :mod:`fedstyle.audit.surfaces`: what each method sends beyond weights, as functions of images.
- :mod:`fedstyle.audit.playbook`: every attack on one surface, scored against the truth and a guess.
- :mod:`fedstyle.audit.reconstruction`: inversion and retrieval attacks, scored beside the best uninformed
  guess (:mod:`fedstyle.audit.guess`).
- :mod:`fedstyle.audit.baseline`: gradient inversion of one FedAvg step, the scale of every verdict.
- :mod:`fedstyle.audit.accounting`: the receiver's eps over every release, the clip norm from public data.
- :mod:`fedstyle.audit.canary`: a canary audit, an empirical lower bound on eps beside the analytic one
  (``--canary N``).
- :mod:`fedstyle.audit.run` / :mod:`fedstyle.audit.report` / :mod:`fedstyle.audit.plots`: run directories in,
  tables and PNGs out.
- The attack library: :mod:`~fedstyle.audit.metrics` (PSNR, SSIM, ROC AUC, best match),
  :mod:`~fedstyle.audit.invert` (images from statistics), :mod:`~fedstyle.audit.gradient_inversion`,
  :mod:`~fedstyle.audit.membership`, :mod:`~fedstyle.audit.attributes` (linear probes).
  Intervals: :func:`~fedstyle.audit.metrics.bootstrap_interval`, :func:`~fedstyle.audit.metrics.wilson_interval`.

Nothing is imported here; import the submodule you need.
"""
