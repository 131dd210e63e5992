"""Image-level style transfer backends (see :mod:`fedstyle.style.transfer.base`).

``TRANSFER_BACKENDS.get(name)(**options)`` builds a backend: ``lite`` (the offline default,
AdaIN over EfficientNet-Lite0 features), ``adain`` (VGG-19 with the public AdaIN weights).
"""

from fedstyle.style.transfer.base import TRANSFER_BACKENDS, Style, StyleMismatchError, StyleTransfer
from fedstyle.style.transfer.feature_adain import FeatureAdaIN
from fedstyle.style.transfer import adain as _adain  # noqa: F401  (registers "adain")
from fedstyle.style.transfer import lite as _lite  # noqa: F401  (registers "lite")
from fedstyle.style.transfer import fft as _fft  # noqa: F401  (registers "fft", FedDG amplitude exchange)

#: the backend used when none is named: works offline with the weights shipped in the package
DEFAULT_BACKEND = "lite"

__all__ = ["DEFAULT_BACKEND", "FeatureAdaIN", "Style", "StyleMismatchError", "StyleTransfer", "TRANSFER_BACKENDS"]
